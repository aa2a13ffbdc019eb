package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// expertRouting is a [2,5,4] routing mask: token 3 goes to no expert,
// expert 3 gets no token in the "unrouted" cases.
func expertRouting(unrouted bool) []float64 {
	m := make([]float64, 40)
	for t := range 10 {
		if t == 3 {
			continue
		}
		m[t*4+t%3], m[t*4+(t+1)%3] = 1, 1
		if !unrouted && t%4 == 0 {
			m[t*4+3] = 1
		}
	}
	return m
}

// expertCases: ExpertFFN's gradient (ExpertFFNGrad) against finite
// differences, with and without dropout, for an expert with tokens and
// one without. The weights w are a free input times a routing mask (as
// the model's are: a product with TopKMask), so the tokens outside the
// routing have gradient 0, which ExpertFFNGrad gives them.
func expertCases() []gradCase {
	var cs []gradCase
	for _, tc := range []struct {
		expert   int
		p        float64
		unrouted bool
	}{{0, 0, false}, {1, 0.3, false}, {3, 0.3, false}, {3, 0, true}} {
		a := ir.Attrs{"expert": tc.expert, "top_k": 2}
		if tc.p > 0 {
			a["p"], a["stream"], a["stream2"] = tc.p, 101, 102
		}
		mask := expertRouting(tc.unrouted)
		cs = append(cs, gradCase{
			name: fmt.Sprintf("ExpertFFN/e=%d,p=%v,unrouted=%v", tc.expert, tc.p, tc.unrouted),
			ins:  []spec{in(2, 5, 6), in(2, 5, 4), in(8, 6), in(8), in(6, 8), in(6)},
			fwd: func(g *ir.Graph, x []*ir.Value) *ir.Value {
				w := op1(g, "Mul", nil, x[1], g.Const("routing", ir.Shape{2, 5, 4}, mask))
				return g.Apply(ir.OpExpertFFN, a, x[0], w, x[2], x[3], x[4], x[5])[0]
			},
			bwd: func(g *ir.Graph, x []*ir.Value, y, dy *ir.Value) []*ir.Value {
				n := y.Def
				d := append([]*ir.Value(nil), g.Apply(ir.OpExpertFFNGrad, a, dy, x[0], n.Inputs[1], x[2], x[4], n.Outputs[1], n.Outputs[2], n.Outputs[3])...)
				d[1] = op1(g, "Mul", nil, d[1], n.Inputs[1].Def.Inputs[1])
				return d
			},
		})
	}
	return cs
}
