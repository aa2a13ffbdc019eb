package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// buildConcat copies each input's rows into its place along the axis: the
// output is outer blocks of Σ d_i·inner elements, input i filling d_i·inner
// of each block.
func (p *program[T]) buildConcat(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	if len(in) == 0 {
		return nil, fmt.Errorf("concat without inputs")
	}
	s, ax, err := ir.ConcatShape(n.Inputs, n.Attrs.Int("axis", 0))
	if err != nil {
		return nil, err
	}
	o := out[0]
	if !s.Equal(o.shape) {
		return nil, fmt.Errorf("concat output %v, want %v", o.shape, s)
	}
	outer, inner := 1, 1
	for i := 0; i < ax; i++ {
		outer *= s[i]
	}
	for i := ax + 1; i < len(s); i++ {
		inner *= s[i]
	}
	widths := make([]int, len(in))
	for i, t := range in {
		widths[i] = t.shape[ax] * inner
	}
	row := s[ax] * inner
	return func() error {
		dst := o.f
		parallelFor(outer, max(1, grainCheap/max(row, 1)), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				at := r * row
				for i, t := range in {
					w := widths[i]
					copy(dst[at:at+w], t.f[r*w:(r+1)*w])
					at += w
				}
			}
		})
		return nil
	}, nil
}

func concatKernels[T float](k kernelTable[T]) { k.add("Concat", (*program[T]).buildConcat) }
