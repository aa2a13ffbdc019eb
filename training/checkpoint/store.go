package checkpoint

import (
	"fmt"
	"sort"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// FromStore copies the tensors of a store as float32, in the store's
// insertion order (tensors missing from Order follow, sorted by name).
func FromStore(s *kernels.Store) []Named {
	names := make([]string, 0, len(s.Tensors))
	listed := make(map[string]bool, len(s.Order))
	for _, n := range s.Order {
		if _, ok := s.Tensors[n]; ok && !listed[n] {
			listed[n] = true
			names = append(names, n)
		}
	}
	var rest []string
	for n := range s.Tensors {
		if !listed[n] {
			rest = append(rest, n)
		}
	}
	sort.Strings(rest)
	names = append(names, rest...)

	out := make([]Named, 0, len(names))
	for _, n := range names {
		t := s.Tensors[n]
		var data []float32
		switch {
		case t.I32 != nil:
			data = make([]float32, len(t.I32))
			for i, v := range t.I32 {
				data[i] = float32(v)
			}
		default:
			data = t.Float32s()
		}
		out = append(out, Named{Name: n, Shape: append([]int{}, t.Shape...), Data: data})
	}
	return out
}

// IntoStore copies tensors into a store, converting to the store's
// precision. Tensors absent from the store are created; a tensor present
// with another shape is an error (and nothing is copied). missing lists the
// store's tensors that ts does not provide, sorted, so the caller can decide
// whether a partial load is acceptable.
func IntoStore(s *kernels.Store, ts []Named) (missing []string, err error) {
	if err := validate(ts); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	for _, t := range ts {
		if cur := s.Get(t.Name); cur != nil && !cur.Shape.Equal(ir.Shape(t.Shape)) {
			return nil, fmt.Errorf("checkpoint: %s has shape %v in the checkpoint but %v in the model; the checkpoint belongs to another configuration", t.Name, t.Shape, cur.Shape)
		}
	}
	have := make(map[string]bool, len(ts))
	for _, t := range ts {
		have[t.Name] = true
		cur, err := s.Ensure(t.Name, ir.Shape(t.Shape))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		switch {
		case cur.F32 != nil:
			copy(cur.F32, t.Data)
		case cur.F64 != nil:
			for i, v := range t.Data {
				cur.F64[i] = float64(v)
			}
		case cur.I32 != nil:
			for i, v := range t.Data {
				cur.I32[i] = int32(v)
			}
		}
	}
	for n := range s.Tensors {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	return missing, nil
}
