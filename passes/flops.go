package passes

import "github.com/rpac-dev/rpac/ir"

// Flops counts the multiply-add work of a graph's matrix products (2·M·N·K
// per product): Linear, LinearGradX, LinearGradW, MatMul, the two
// products inside FusedAttention, the logits product of LMHeadCrossEntropy
// (2·N·V·D) and the two products of its gradient (4·N·V·D, computed by the
// CPU backend during the forward). Other ops are
// memory-bound and not counted, so achieved FLOP/s figures are GEMM FLOP/s.
//
// A routed expert (ExpertFFN: two products, ExpertFFNGrad: four) counts
// the rows the model needs, the usual convention of a mixture of experts:
// top_k/E of the tokens per expert (ir.ExpertShare), whatever the routing
// of a step was. DenseFlops counts them over every token, as the dense
// form computes them.
func Flops(g *ir.Graph) int64 { return flops(g, false) }

// DenseFlops is Flops with every routed expert counted over all the
// tokens: the work of the same step in the dense form (passes.DispatchDense).
func DenseFlops(g *ir.Graph) int64 { return flops(g, true) }

func flops(g *ir.Graph, dense bool) int64 {
	var f int64
	for _, n := range g.Nodes {
		switch n.Op {
		case ir.OpExpertFFN, ir.OpExpertFFNGrad: // 2 or 4 products of rows×F×D
			f += expertFlops(n, dense)
		case ir.OpLinear: // x[...,K]·W[N,K]ᵀ
			out := n.Outputs[0].Shape
			k := n.Inputs[1].Shape[1]
			f += 2 * int64(out.Numel()) * int64(k)
		case ir.OpLinearGradX: // dy[...,N]·W[N,K]
			f += 2 * int64(n.Outputs[0].Shape.Numel()) * int64(n.Inputs[1].Shape[0])
		case ir.OpLinearGradW: // dyᵀ·x over rows
			dy := n.Inputs[0].Shape
			rows := dy.Numel() / dy[len(dy)-1]
			f += 2 * int64(n.Outputs[0].Shape.Numel()) * int64(rows)
		case ir.OpFusedAttention: // q·kᵀ and p·v: 2·B·H·T·S·Hd + 2·B·H·T·S·Hv
			q, k, o := n.Inputs[0].Shape, n.Inputs[1].Shape, n.Outputs[0].Shape
			f += 2 * (int64(q.Numel()) + int64(o.Numel())) * int64(k[2])
		case ir.OpLMHeadCrossEntropy: // x[N,D]·W[V,D]ᵀ
			x, w := n.Inputs[0].Shape, n.Inputs[1].Shape
			f += 2 * int64(x[0]) * int64(w[0]) * int64(w[1])
		case ir.OpLMHeadCrossEntropyGrad: // dlogits·W and dlogitsᵀ·x
			x, w := n.Inputs[1].Shape, n.Inputs[2].Shape
			f += 4 * int64(x[0]) * int64(w[0]) * int64(w[1])
		case ir.OpMatMul:
			a := n.Inputs[0].Shape
			k := a[len(a)-1]
			if n.Attrs.Bool("transA", false) {
				k = a[len(a)-2]
			}
			f += 2 * int64(n.Outputs[0].Shape.Numel()) * int64(k)
		}
	}
	return f
}

// expertFlops is the GEMM work of an ExpertFFN (two products of rows×F×D)
// or ExpertFFNGrad (four) node over its expected rows, or over every row.
func expertFlops(n *ir.Node, dense bool) int64 {
	x, w, w1 := n.Inputs[0], n.Inputs[1], n.Inputs[2]
	products := int64(2)
	if n.Op == ir.OpExpertFFNGrad {
		x, w, w1, products = n.Inputs[1], n.Inputs[2], n.Inputs[3], 4
	}
	s, err := ir.ExpertShapeOf(x.Shape, w.Shape, w1.Shape)
	if err != nil {
		return 0
	}
	rows := float64(s.N)
	if !dense {
		rows *= ir.ExpertShare(n, s.E)
	}
	return products * 2 * int64(rows) * int64(s.F) * int64(s.D)
}
