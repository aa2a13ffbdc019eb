package training

import (
	"fmt"
	"strings"

	"github.com/rpac-dev/rpac/kernels"
)

// SelectWeights makes the store's parameters the chosen weight set:
// "last" (the trained values as they are), "ema" or "swa" (the averaged
// weights the trainer stores as "ema.<param>" / "swa.<param>"), or ""
// (ema when the checkpoint has it, else last). It drops the averaged sets
// from the store and returns the set used.
func SelectWeights(st *kernels.Store, params []string, which string) (string, error) {
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
	case "":
		if n, _ := has("ema."); n == len(params) && n > 0 {
			which = "ema"
		} else {
			which = "last"
		}
	case "last", "ema", "swa":
	default:
		return "", fmt.Errorf("--weights %q: want ema, swa or last", which)
	}
	if which != "last" {
		prefix := which + "."
		n, missing := has(prefix)
		if len(missing) > 0 {
			what := strings.ToUpper(which)
			if n == 0 {
				return "", fmt.Errorf("the checkpoint has no %s weights: want tensors named %s<param> in model.safetensors (e.g. %s), and it has none; train with %s enabled or use --weights last",
					what, prefix, missing[0], what)
			}
			return "", fmt.Errorf("the checkpoint's %s weights are incomplete: %d of %d parameters are missing (first: %s); use --weights last",
				what, len(missing), len(params), missing[0])
		}
		for _, p := range params {
			src, dst := st.Get(prefix+p), st.Get(p)
			if dst == nil {
				if _, err := st.Ensure(p, src.Shape); err != nil {
					return "", err
				}
				dst = st.Get(p)
			}
			if !dst.Shape.Equal(src.Shape) {
				return "", fmt.Errorf("%s%s has shape %v, %s has %v", prefix, p, src.Shape, p, dst.Shape)
			}
			dst.SetFloat64s(src.Float64s())
		}
	}
	for name := range st.Tensors {
		if strings.HasPrefix(name, "ema.") || strings.HasPrefix(name, "swa.") {
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
