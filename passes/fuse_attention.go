package passes

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
)

// attnMatch is one causal attention core as compiler/model builds it:
//
//	s0 = MatMul(q, k; transB)   [B,H,T,T]
//	s1 = Scale(s0; alpha)       (beta 0)
//	s2 = Add(s1, bias)          (optional; bias [T,T])
//	s3 = CausalMask(s2)         (fill -Inf)
//	p  = Softmax(s3)
//	o  = MatMul(p, v)
//
// with every intermediate read once.
type attnMatch struct {
	q, k, v, bias *ir.Value
	scale         float64
	add, mask     *ir.Node // add may be nil
	soft, out     *ir.Node
	drop          *ir.Node // Dropout on the weights (training graphs), or nil
}

// FuseAttention rewrites each causal attention core of g for the chosen
// lowering:
//
//   - AttentionOp: one FusedAttention node (ONNX Attention, opset 23) with
//     scale and causal set and the bias, when there is one, as its float
//     mask;
//   - AttentionPlain: when the bias is a constant (a folded RPA prior) or
//     absent, the Add and the CausalMask become one Add of a constant [T,T]
//     mask that holds the bias on and below the diagonal and -Inf above it;
//     a bias computed at run time (fold none) is left as it is;
//   - AttentionNone: nothing.
//
// Cores that do not match exactly are left alone. The replaced nodes become
// dead; DCE removes them.
func FuseAttention(g *ir.Graph, mode AttentionMode) error {
	if mode == AttentionNone {
		return nil
	}
	if mode != AttentionOp && mode != AttentionPlain {
		return fmt.Errorf("fuse attention: lowering %v is not one FuseAttention makes (want op, plain or none)", mode)
	}
	uses := g.Uses()
	masks := map[*ir.Value]*ir.Value{} // bias (nil: none) -> causal constant mask
	for _, n := range append([]*ir.Node(nil), g.Nodes...) {
		m, ok := matchAttention(g, n, uses, false)
		if !ok {
			continue
		}
		T := m.soft.Outputs[0].Shape[2]
		constMask := func() *ir.Value {
			if cm, ok := masks[m.bias]; ok {
				return cm
			}
			data := make([]float64, T*T)
			for i := 0; i < T; i++ {
				for j := 0; j < T; j++ {
					switch {
					case j > i:
						data[i*T+j] = math.Inf(-1)
					case m.bias != nil:
						data[i*T+j] = m.bias.Data[i*T+j]
					}
				}
			}
			name := fmt.Sprintf("attn.causal_mask.T%d", T)
			if m.bias != nil {
				name = m.bias.Name + ".causal"
			}
			cm := newConst(g, name, ir.Shape{T, T}, data)
			masks[m.bias] = cm
			return cm
		}
		switch mode {
		case AttentionOp:
			ins := []*ir.Value{m.q, m.k, m.v}
			if m.bias != nil {
				ins = append(ins, m.bias)
			}
			o, err := insertAt(g, nodeIndex(g, m.out), "FusedAttention", ir.Attrs{"scale": m.scale, "causal": true}, ins...)
			if err != nil {
				return fmt.Errorf("fuse attention: %w", err)
			}
			replaceUses(g, m.out.Outputs[0], o)
		case AttentionPlain:
			if m.bias != nil && m.bias.Kind != ir.Const {
				continue
			}
			scaled := m.mask.Inputs[0]
			if m.add != nil {
				scaled = m.add.Inputs[0]
				if scaled == m.bias {
					scaled = m.add.Inputs[1]
				}
			}
			s, err := insertAt(g, nodeIndex(g, m.mask), "Add", nil, scaled, constMask())
			if err != nil {
				return fmt.Errorf("fuse attention: %w", err)
			}
			replaceUses(g, m.mask.Outputs[0], s)
		}
	}
	return nil
}

// matchAttention matches the core whose final MatMul is n; withDropout
// also accepts a Dropout on the weights between the Softmax and the MatMul
// (whose mask output nothing reads yet: before autodiff).
func matchAttention(g *ir.Graph, n *ir.Node, uses map[*ir.Value][]*ir.Node, withDropout bool) (attnMatch, bool) {
	var m attnMatch
	if n.Op != ir.OpMatMul || n.Attrs.Bool("transA", false) || n.Attrs.Bool("transB", false) || len(n.Inputs[0].Shape) != 4 {
		return m, false
	}
	m.out, m.v = n, n.Inputs[1]
	single := func(v *ir.Value, op ir.OpName) *ir.Node {
		if v.Kind != ir.Intermediate || v.Def.Op != op || len(uses[v]) != 1 || isOutput(g, v) {
			return nil
		}
		return v.Def
	}
	w := n.Inputs[0]
	if d := single(w, "Dropout"); withDropout && d != nil {
		m.drop, w = d, d.Inputs[0]
	}
	if m.soft = single(w, "Softmax"); m.soft == nil {
		return m, false
	}
	if m.mask = single(m.soft.Inputs[0], "CausalMask"); m.mask == nil {
		return m, false
	}
	if f := m.mask.Attrs.Float("fill", math.Inf(-1)); !math.IsInf(f, -1) {
		return m, false
	}
	x := m.mask.Inputs[0]
	if add := single(x, "Add"); add != nil {
		a, b := add.Inputs[0], add.Inputs[1]
		if sc := single(b, "Scale"); sc != nil && a.Shape.Equal(ir.Shape{x.Shape[2], x.Shape[3]}) {
			a, b = b, a
		}
		if !b.Shape.Equal(ir.Shape{x.Shape[2], x.Shape[3]}) {
			return m, false
		}
		m.add, m.bias, x = add, b, a
	}
	sc := single(x, "Scale")
	if sc == nil || sc.Attrs.Float("beta", 0) != 0 {
		return m, false
	}
	m.scale = sc.Attrs.Float("alpha", 1)
	mm := single(sc.Inputs[0], "MatMul")
	if mm == nil || mm.Attrs.Bool("transA", false) || !mm.Attrs.Bool("transB", false) {
		return m, false
	}
	m.q, m.k = mm.Inputs[0], mm.Inputs[1]
	// v may be narrower than q and k (a rank-folded prior widens q and k).
	if !m.q.Shape.Equal(m.k.Shape) || len(m.v.Shape) != 4 || !m.k.Shape[:3].Equal(m.v.Shape[:3]) {
		return m, false
	}
	return m, true
}

// FuseTrainingAttention rewrites each causal attention core of a forward
// graph that is to be differentiated (training) or evaluated into one
// FusedAttention node, the Dropout on its weights included (the node's
// dropout and stream attributes repeat that Dropout's draws, so the fused
// graph computes what the unfused one does). Autodiff then emits
// FusedAttentionGrad, and no [B,H,T,T] tensor is left in the graph for a
// backend whose attention kernels recompute the weights. Cores that do not
// match exactly are left alone.
func FuseTrainingAttention(g *ir.Graph) error {
	uses := g.Uses()
	for _, n := range append([]*ir.Node(nil), g.Nodes...) {
		m, ok := matchAttention(g, n, uses, true)
		if !ok {
			continue
		}
		ins := []*ir.Value{m.q, m.k, m.v}
		if m.bias != nil {
			ins = append(ins, m.bias)
		}
		a := ir.Attrs{"scale": m.scale, "causal": true}
		if m.drop != nil {
			if p := m.drop.Attrs.Float("p", 0); p > 0 {
				a["dropout"], a["stream"] = p, m.drop.Stream()
			}
		}
		o, err := insertAt(g, nodeIndex(g, m.out), "FusedAttention", a, ins...)
		if err != nil {
			return fmt.Errorf("fuse training attention: %w", err)
		}
		replaceUses(g, m.out.Outputs[0], o)
	}
	return nil
}
