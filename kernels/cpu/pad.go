package cpu

import "github.com/rpac-dev/rpac/ir"

// ---- Pad / PadGrad (the aligned-width graphs' padded parameters) ----

// padMap is, for each stored element of Pad's output in order, the index
// of the logical input element it holds, or -1 for padding.
func padMap(x ir.Shape, a ir.Attrs) ([]int, error) {
	rows, cols, err := ir.PadSpans(x, a)
	if err != nil {
		return nil, err
	}
	m := make([]int, 0, rows.Stored()*cols.Stored())
	for r := 0; r < rows.Stored(); r++ {
		sr := rows.Source(r)
		for c := 0; c < cols.Stored(); c++ {
			sc := cols.Source(c)
			if sr < 0 || sc < 0 {
				m = append(m, -1)
			} else {
				m = append(m, sr*cols.Logical()+sc)
			}
		}
	}
	return m, nil
}

func padKernels[T float](k kernelTable[T]) {
	k.add("Pad", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		m, err := padMap(in[0].shape, n.Attrs)
		if err != nil {
			return nil, err
		}
		x, y := in[0], out[0]
		return func() error {
			for i, s := range m {
				if s < 0 {
					y.f[i] = 0
				} else {
					y.f[i] = x.f[s]
				}
			}
			return nil
		}, nil
	})
	k.add("PadGrad", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		m, err := padMap(out[0].shape, n.Attrs)
		if err != nil {
			return nil, err
		}
		dy, dx := in[0], out[0]
		return func() error {
			for i, s := range m {
				if s >= 0 {
					dx.f[s] = dy.f[i]
				}
			}
			return nil
		}, nil
	})
}
