package cpu

import "github.com/rpac-dev/rpac/ir"

// ---- Pad / PadGrad (the aligned-width graphs' padded parameters) ----

// padEach calls f for each stored element of Pad(x; a)'s output in order,
// with the index of the logical element of x it holds, or -1 for padding.
func padEach(x ir.Shape, a ir.Attrs, f func(stored, logical int)) error {
	rows, cols, err := ir.PadSpans(x, a)
	if err != nil {
		return err
	}
	i := 0
	for r := 0; r < rows.Stored(); r++ {
		sr := rows.Source(r)
		for c := 0; c < cols.Stored(); c++ {
			src := -1
			if sc := cols.Source(c); sr >= 0 && sc >= 0 {
				src = sr*cols.Logical() + sc
			}
			f(i, src)
			i++
		}
	}
	return nil
}

// buildPadOp is Pad (grad false: y from x) or PadGrad (dx from dy), both
// over the logical shape of x; the spans are checked at build time.
func buildPadOp[T float](n *ir.Node, in, out []*tensor[T], grad bool) (func() error, error) {
	src, dst := in[0], out[0]
	x := src.shape
	if grad {
		x = dst.shape
	}
	if err := padEach(x, n.Attrs, func(int, int) {}); err != nil {
		return nil, err
	}
	return func() error {
		return padEach(x, n.Attrs, func(i, s int) {
			switch {
			case grad && s >= 0:
				dst.f[s] = src.f[i]
			case !grad && s >= 0:
				dst.f[i] = src.f[s]
			case !grad:
				dst.f[i] = 0
			}
		})
	}, nil
}

func padKernels[T float](k kernelTable[T]) {
	k.add("Pad", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return buildPadOp(n, in, out, false)
	})
	k.add("PadGrad", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return buildPadOp(n, in, out, true)
	})
}
