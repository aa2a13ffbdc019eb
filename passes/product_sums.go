package passes

import "github.com/rpac-dev/rpac/ir"

// FuseProductSums turns SumTo(Mul(x, y)) into SumToProduct(x, y) where the
// Mul is an op of its own (elementwise fusion left it: its inputs have
// other readers), of inputs of its own shape, read only by the SumTo: the
// gradients of per-row and per-sequence gates (the experts' weights, the
// residual gate η, value_gamma) are such sums of a product over the model
// width. The product is never written: per paper-preset node a [24576,510]
// fp32 write and read less. The sums are the unfused ones bit for bit.
func FuseProductSums(g *ir.Graph) error {
	uses := g.Uses()
	outs := map[*ir.Value]bool{}
	for _, v := range g.Outputs {
		outs[v] = true
	}
	put := map[*ir.Node]*ir.Node{}
	drop := map[*ir.Node]bool{}
	for _, n := range g.Nodes {
		if n.Op != ir.OpSumTo {
			continue
		}
		m := n.Inputs[0].Def
		if m == nil || m.Op != ir.OpMul || len(uses[m.Outputs[0]]) != 1 || outs[m.Outputs[0]] {
			continue
		}
		x, y := m.Inputs[0], m.Inputs[1]
		if !x.Shape.Equal(m.Outputs[0].Shape) || !y.Shape.Equal(x.Shape) || x.DType != ir.F32 || y.DType != ir.F32 {
			continue
		}
		r := &ir.Node{ID: g.NewID(), Op: "SumToProduct", Inputs: []*ir.Value{x, y}, Attrs: n.Attrs.Clone(), Outputs: n.Outputs}
		for _, o := range r.Outputs {
			o.Def = r
		}
		put[n] = r
		drop[m] = true
	}
	splice(g, put, drop, nil)
	return nil
}
