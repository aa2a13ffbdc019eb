package passes

import (
	"slices"

	"github.com/rpac-dev/rpac/ir"
)

// headsPerm is the Transpose between [B,T,H,D] and [B,H,T,D] (its own
// inverse).
var headsPerm = []int{0, 2, 1, 3}

// AttentionLayout gives the layout bthd (ir.AttnBTHD) to each FusedAttention
// whose q, k and v are Transposes (perm 0,2,1,3) of [B,T,H,D] values, and
// to its FusedAttentionGrad nodes: they read those values as they are (the
// projections' rows), their output and gradients come out as [B,T,H,D], and
// the Transposes on both sides lose their readers (DCE removes them). A
// core changes only when every reader of its transposed q, k, v and of its
// outputs is the core, its gradient or such a Transpose, and its
// gradient's dO is such a Transpose too; the others keep [B,H,T,D]. The
// dropout draws stay those of the original node (its stream). Values are
// unchanged.
func AttentionLayout(g *ir.Graph) error {
	uses := g.Uses()
	outputs := map[*ir.Value]bool{}
	for _, v := range g.Outputs {
		outputs[v] = true
	}
	repl := map[*ir.Value]*ir.Value{}
	put := map[*ir.Node]*ir.Node{}
	for _, f := range g.Nodes {
		if f.Op != ir.OpFusedAttention || ir.AttnLayoutOf(f.Attrs) != ir.AttnBHTD {
			continue
		}
		grads := gradsOf(g, f)
		m, ok := matchLayout(f, grads, uses, outputs)
		if !ok {
			continue
		}
		if err := m.rewrite(g, f, grads, repl, put); err != nil {
			return err
		}
	}
	if len(put) == 0 {
		return nil
	}
	splice(g, put, nil, repl)
	return DCE(g)
}

// gradsOf lists the FusedAttentionGrad nodes on f's q, k, v and mask.
func gradsOf(g *ir.Graph, f *ir.Node) []*ir.Node {
	var out []*ir.Node
	for _, n := range g.Nodes {
		if n.Op != ir.OpFusedAttentionGrad {
			continue
		}
		in, _, _ := ir.SplitAttentionGrad(n.Attrs, n.Inputs)
		if len(in) == len(f.Inputs)+1 && slices.Equal(in[1:], f.Inputs) {
			out = append(out, n)
		}
	}
	return out
}

// untransposed is x when v = Transpose(x; perm 0,2,1,3), else nil.
func untransposed(v *ir.Value) *ir.Value {
	if d := v.Def; d != nil && d.Op == ir.OpTranspose && slices.Equal(d.Attrs.Ints("perm"), headsPerm) {
		return d.Inputs[0]
	}
	return nil
}

// transposeReaders reports whether every reader of v is a Transpose (perm
// 0,2,1,3) or one of also.
func transposeReaders(v *ir.Value, uses map[*ir.Value][]*ir.Node, also []*ir.Node) bool {
	for _, r := range uses[v] {
		if !slices.Contains(also, r) && (r.Op != ir.OpTranspose || !slices.Equal(r.Attrs.Ints("perm"), headsPerm)) {
			return false
		}
	}
	return true
}

// layoutMatch holds a core's untransposed q, k, v and its gradients' dO.
type layoutMatch struct {
	qkv []*ir.Value
	dO  []*ir.Value // one per gradient node
}

// matchLayout checks the conditions of AttentionLayout for f and its
// gradient nodes (none of whose [B,H,T,D] values may be a graph output).
func matchLayout(f *ir.Node, grads []*ir.Node, uses map[*ir.Value][]*ir.Node, outputs map[*ir.Value]bool) (layoutMatch, bool) {
	var m layoutMatch
	users := append([]*ir.Node{f}, grads...)
	for _, x := range f.Inputs[:3] {
		src := untransposed(x)
		if src == nil || outputs[x] ||
			slices.ContainsFunc(uses[x], func(r *ir.Node) bool { return !slices.Contains(users, r) }) {
			return m, false
		}
		m.qkv = append(m.qkv, src)
	}
	if outputs[f.Outputs[0]] || !transposeReaders(f.Outputs[0], uses, grads) {
		return m, false
	}
	for _, gr := range grads {
		dO := untransposed(gr.Inputs[0])
		if dO == nil {
			return m, false
		}
		for _, o := range gr.Outputs[:3] {
			if outputs[o] || !transposeReaders(o, uses, nil) {
				return m, false
			}
		}
		m.dO = append(m.dO, dO)
	}
	return m, true
}

// rewrite makes the bthd nodes of a matched core: f's stand-in (its stream
// kept, so that its draws and its gradients' stay the same) and one per
// gradient, recorded in put (node to replace) and repl (old value to new:
// each Transpose back to [B,T,H,D] by the new output).
func (m layoutMatch) rewrite(g *ir.Graph, f *ir.Node, grads []*ir.Node, repl map[*ir.Value]*ir.Value, put map[*ir.Node]*ir.Node) error {
	a := f.Attrs.Clone()
	ir.AttnBTHD.Set(a)
	if a.Float("dropout", 0) > 0 && a.Int("stream", -1) < 0 {
		a["stream"] = f.ID
	}
	in := append(slices.Clone(m.qkv), f.Inputs[3:]...)
	nf, err := place(g, "FusedAttention", a, in)
	if err != nil {
		return err
	}
	put[f] = nf[0].Def
	backOf(f.Outputs[0], nf[0], repl, g)
	for i, gr := range grads {
		ga := gr.Attrs.Clone()
		ir.AttnBTHD.Set(ga)
		main, _, has := ir.SplitAttentionGrad(gr.Attrs, gr.Inputs)
		gin := append([]*ir.Value{m.dO[i]}, m.qkv...)
		gin = append(gin, main[4:]...)
		if has {
			gin = append(gin, nf[0])
		}
		vs, err := place(g, "FusedAttentionGrad", ga, gin)
		if err != nil {
			return err
		}
		put[gr] = vs[0].Def
		for j, o := range gr.Outputs {
			if j < 3 {
				backOf(o, vs[j], repl, g)
			} else {
				repl[o] = vs[j] // the mask's gradient, [T,S] either way
			}
		}
	}
	return nil
}

// place applies op and takes the node off the end of the graph (the caller
// puts it in place of the node it replaces).
func place(g *ir.Graph, op ir.OpName, a ir.Attrs, in []*ir.Value) ([]*ir.Value, error) {
	vs, err := g.TryApply(op, a, in...)
	if err != nil {
		return nil, err
	}
	g.Nodes = g.Nodes[:len(g.Nodes)-1]
	return vs, nil
}

// backOf maps the output of every Transpose back from old (to [B,T,H,D])
// to now, which holds that layout already.
func backOf(old, now *ir.Value, repl map[*ir.Value]*ir.Value, g *ir.Graph) {
	for _, n := range g.Nodes {
		if n.Op == ir.OpTranspose && len(n.Inputs) == 1 && n.Inputs[0] == old {
			repl[n.Outputs[0]] = now
		}
	}
}
