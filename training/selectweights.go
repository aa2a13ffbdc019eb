package training

import (
	"fmt"
	"strings"

	"github.com/rpac-dev/rpac/internal/enum"
	"github.com/rpac-dev/rpac/kernels"
)

// WeightSet is a set of a checkpoint's weights: the trained values or one
// of the averages the trainer keeps beside them. It is spelled "last",
// "ema" or "swa" on the command line, in result.json and in a manifest's
// provenance.
type WeightSet uint8

const (
	WeightsAuto WeightSet = iota // ema when the checkpoint has it, else last
	WeightsLast                  // the trained values as they are
	WeightsEMA                   // the exponential moving average ("ema.<param>")
	WeightsSWA                   // SWA-select's average ("swa.<param>")
)

var weightSetNames = enum.Names[WeightSet]{"", "last", "ema", "swa"}

func (w WeightSet) String() string { return weightSetNames.String("weights", w) }

// ParseWeightSet reads --weights: ema, swa or last; empty is WeightsAuto.
func ParseWeightSet(s string) (WeightSet, error) {
	if s == "" {
		return WeightsAuto, nil
	}
	return weightSetNames.Parse("--weights", s)
}

// MarshalText writes the set's spelling.
func (w WeightSet) MarshalText() ([]byte, error) { return weightSetNames.Marshal("weights", w) }

// UnmarshalText reads the set's spelling.
func (w *WeightSet) UnmarshalText(b []byte) error {
	return weightSetNames.Unmarshal("weights", w, b)
}

// Prefix is the names' prefix of an averaged set's tensors in a checkpoint
// ("ema."), empty for the trained values.
func (w WeightSet) Prefix() string {
	if w == WeightsEMA || w == WeightsSWA {
		return w.String() + "."
	}
	return ""
}

// SelectWeights makes the store's parameters the chosen weight set: the
// trained values as they are, or the averaged weights the trainer stores
// as "ema.<param>" / "swa.<param>"; WeightsAuto picks ema when the
// checkpoint has it, else last. It drops the averaged sets from the store
// and returns the set used.
func SelectWeights(st *kernels.Store, params []string, which WeightSet) (WeightSet, error) {
	has := func(prefix string) (n int, missing []string) {
		for _, p := range params {
			if st.Get(prefix+p) != nil {
				n++
			} else {
				missing = append(missing, prefix+p)
			}
		}
		return n, missing
	}
	switch which {
	case WeightsAuto:
		if n, _ := has(WeightsEMA.Prefix()); n == len(params) && n > 0 {
			which = WeightsEMA
		} else {
			which = WeightsLast
		}
	case WeightsLast, WeightsEMA, WeightsSWA:
	default:
		return 0, fmt.Errorf("weight set %v: want %s", which, weightSetNames.List())
	}
	if which != WeightsLast {
		prefix := which.Prefix()
		n, missing := has(prefix)
		if len(missing) > 0 {
			what := strings.ToUpper(which.String())
			if n == 0 {
				return 0, fmt.Errorf("the checkpoint has no %s weights: want tensors named %s<param> in model.safetensors (e.g. %s), and it has none; train with %s enabled or use --weights last",
					what, prefix, missing[0], what)
			}
			return 0, fmt.Errorf("the checkpoint's %s weights are incomplete: %d of %d parameters are missing (first: %s); use --weights last",
				what, len(missing), len(params), missing[0])
		}
		for _, p := range params {
			src, dst := st.Get(prefix+p), st.Get(p)
			if dst == nil {
				if _, err := st.Ensure(p, src.Shape); err != nil {
					return 0, err
				}
				dst = st.Get(p)
			}
			if !dst.Shape.Equal(src.Shape) {
				return 0, fmt.Errorf("%s%s has shape %v, %s has %v", prefix, p, src.Shape, p, dst.Shape)
			}
			dst.SetFloat64s(src.Float64s())
		}
	}
	for name := range st.Tensors {
		if strings.HasPrefix(name, WeightsEMA.Prefix()) || strings.HasPrefix(name, WeightsSWA.Prefix()) {
			delete(st.Tensors, name)
		}
	}
	order := st.Order[:0]
	for _, n := range st.Order {
		if st.Tensors[n] != nil {
			order = append(order, n)
		}
	}
	st.Order = order
	return which, nil
}
