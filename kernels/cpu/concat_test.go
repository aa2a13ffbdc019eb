package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// concatCases check Concat's forward and its gradient (each input gets its
// slice of dy) against finite differences, on several axes.
func concatCases() []gradCase {
	var cs []gradCase
	for _, tc := range []struct {
		shapes []ir.Shape
		axis   int
	}{
		{[]ir.Shape{{2, 3, 4}, {2, 3, 2}}, -1},
		{[]ir.Shape{{2, 1, 3}, {2, 4, 3}, {2, 2, 3}}, 1},
		{[]ir.Shape{{1, 5}, {3, 5}}, 0},
	} {
		tc := tc
		ins := make([]spec, len(tc.shapes))
		for i, s := range tc.shapes {
			ins[i] = in(s...)
		}
		cs = append(cs, gradCase{
			name: fmt.Sprintf("Concat%v/%d", tc.shapes, tc.axis),
			ins:  ins,
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				return op1(g, "Concat", ir.Attrs{"axis": tc.axis}, x...)
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				ax := tc.axis
				if ax < 0 {
					ax += len(y.Shape)
				}
				out := make([]*ir.Value, len(x))
				at := 0
				for i, v := range x {
					out[i] = op1(g, "Slice", ir.Attrs{"axis": ax, "start": at, "end": at + v.Shape[ax]}, dy)
					at += v.Shape[ax]
				}
				return out
			},
		})
	}
	return cs
}
