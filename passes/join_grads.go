package passes

import "github.com/rpac-dev/rpac/ir"

// JoinSiblingGrads joins the backward GEMMs of Linears that read one input
// x (the attention's q, k and v projections; the experts' up projections):
//
//	dW_i = dy_iᵀ·x          → dW = Dᵀ·x, dW_i = rows of dW
//	dx = Σ_i dy_i·W_i        → dx = D·W, W = Concat(W_i; axis 0)
//
// with D = Concat(dy_i; axis -1), lazy: a backend may convert the dy_i
// straight into its GEMMs' operand without writing D. One GEMM over all
// the siblings' output columns replaces one per sibling: the weight gradient gets n times the
// output tiles (510×510 is 16 tiles of 128×128 for 132 SMs) and the input
// gradient n times the depth K, with the sum inside the GEMM instead of
// n-1 Adds. The input gradient is joined where the Adds that autodiff
// made sum exactly the siblings' LinearGradX outputs; otherwise only the
// weight gradients are. The values are those of the separate GEMMs up to
// the order of the float32 sums. Runs after autodiff, before elementwise
// fusion (which would take the Adds into chains).
func JoinSiblingGrads(g *ir.Graph) error {
	for _, grp := range siblingGroups(g) {
		if err := joinGroup(g, grp); err != nil {
			return err
		}
	}
	return DCE(g)
}

// sibling is one Linear's backward: its weight gradient node, and its
// input gradient node where it has exactly one.
type sibling struct {
	gw, gx *ir.Node
}

// siblingGroups: the LinearGradW nodes grouped by the input x they read
// (two or more per group, each with its own dy), in graph order.
func siblingGroups(g *ir.Graph) [][]sibling {
	uses := g.Uses()
	byX := map[*ir.Value][]sibling{}
	var order []*ir.Value
	for _, n := range g.Nodes {
		if n.Op != ir.OpLinearGradW || n.Inputs[0].DType != ir.F32 {
			continue
		}
		x := n.Inputs[1]
		if _, seen := byX[x]; !seen {
			order = append(order, x)
		}
		s := sibling{gw: n}
		var gxs []*ir.Node
		for _, u := range uses[n.Inputs[0]] {
			if u.Op == ir.OpLinearGradX && u.Inputs[0] == n.Inputs[0] {
				gxs = append(gxs, u)
			}
		}
		if len(gxs) == 1 && gxs[0].Inputs[1].Shape[0] == lastDim(n.Inputs[0].Shape) {
			s.gx = gxs[0]
		}
		byX[x] = append(byX[x], s)
	}
	var groups [][]sibling
	for _, x := range order {
		if grp := byX[x]; len(grp) > 1 && distinctDy(grp) {
			groups = append(groups, grp)
		}
	}
	return groups
}

func lastDim(s ir.Shape) int { return s[len(s)-1] }

// distinctDy: every sibling has its own dy, all with the same rows (the
// leading dimensions of the first's).
func distinctDy(grp []sibling) bool {
	lead := func(v *ir.Value) ir.Shape { return v.Shape[:len(v.Shape)-1] }
	seen := map[*ir.Value]bool{}
	for _, s := range grp {
		dy := s.gw.Inputs[0]
		if seen[dy] || !lead(dy).Equal(lead(grp[0].gw.Inputs[0])) {
			return false
		}
		seen[dy] = true
	}
	return true
}

// addTreeRoot: the Add node whose output is the sum of exactly the values
// of leaves, through Adds each read once (and no graph output), or nil.
func addTreeRoot(g *ir.Graph, leaves []*ir.Value) *ir.Node {
	uses := g.Uses()
	outs := map[*ir.Value]bool{}
	for _, v := range g.Outputs {
		outs[v] = true
	}
	in := map[*ir.Value]bool{}
	for _, v := range leaves {
		in[v] = true
	}
	var root *ir.Node
	for len(in) > 1 {
		var next *ir.Node
		for v := range in {
			if len(uses[v]) != 1 || outs[v] {
				return nil
			}
			u := uses[v][0]
			if u.Op == ir.OpAdd && in[u.Inputs[0]] && in[u.Inputs[1]] && u.Inputs[0] != u.Inputs[1] {
				next = u
				break
			}
		}
		if next == nil {
			return nil
		}
		delete(in, next.Inputs[0])
		delete(in, next.Inputs[1])
		in[next.Outputs[0]] = true
		root = next
	}
	return root
}

// joinGroup replaces one group's gradients by the joined GEMMs, placed
// before the first node that reads any value they replace.
func joinGroup(g *ir.Graph, grp []sibling) error {
	dys := make([]*ir.Value, len(grp))
	ws := make([]*ir.Value, len(grp))
	gxOuts := make([]*ir.Value, 0, len(grp))
	for i, s := range grp {
		dys[i] = s.gw.Inputs[0]
		if s.gx != nil {
			ws[i] = s.gx.Inputs[1]
			gxOuts = append(gxOuts, s.gx.Outputs[0])
		}
	}
	var root *ir.Node
	if len(gxOuts) == len(grp) {
		root = addTreeRoot(g, gxOuts)
	}
	replaced := map[*ir.Value]bool{}
	for _, s := range grp {
		replaced[s.gw.Outputs[0]] = true
	}
	if root != nil {
		replaced[root.Outputs[0]] = true
	}
	at := firstReader(g, replaced)
	x := grp[0].gw.Inputs[1]
	if at < afterProducers(g, append(append([]*ir.Value{x}, dys...), ws...)) {
		return nil // a replaced value is read before every operand exists
	}
	var added []*ir.Node
	apply := func(op ir.OpName, a ir.Attrs, in ...*ir.Value) (*ir.Value, error) {
		outs, err := g.TryApply(op, a, in...)
		if err != nil {
			return nil, err
		}
		added = append(added, g.Nodes[len(g.Nodes)-1])
		return outs[0], nil
	}
	d, err := apply("Concat", ir.Attrs{"axis": -1, "lazy": true}, dys...)
	if err != nil {
		return err
	}
	dw, err := apply("LinearGradW", nil, d, x)
	if err != nil {
		return err
	}
	repl := map[*ir.Value]*ir.Value{}
	off := 0
	for _, s := range grp {
		n := lastDim(s.gw.Inputs[0].Shape)
		if repl[s.gw.Outputs[0]], err = apply("Slice", ir.Attrs{"axis": 0, "start": off, "end": off + n}, dw); err != nil {
			return err
		}
		off += n
	}
	if root != nil {
		w, err := apply("Concat", ir.Attrs{"axis": 0}, ws...)
		if err != nil {
			return err
		}
		if repl[root.Outputs[0]], err = apply("LinearGradX", nil, d, w); err != nil {
			return err
		}
	}
	g.Nodes = g.Nodes[:len(g.Nodes)-len(added)]
	g.Nodes = append(g.Nodes[:at], append(added, g.Nodes[at:]...)...)
	splice(g, nil, nil, repl)
	return nil
}

// firstReader is the position of the first node that reads a value of vs
// (the end of the graph when only graph outputs do).
func firstReader(g *ir.Graph, vs map[*ir.Value]bool) int {
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			if vs[in] {
				return i
			}
		}
	}
	return len(g.Nodes)
}

// afterProducers is the position just after the last node that makes one
// of vs (nil entries skipped); 0 when none is made by a node.
func afterProducers(g *ir.Graph, vs []*ir.Value) int {
	def := map[*ir.Node]bool{}
	for _, v := range vs {
		if v != nil && v.Def != nil {
			def[v.Def] = true
		}
	}
	end := 0
	for i, n := range g.Nodes {
		if def[n] {
			end = i + 1
		}
	}
	return end
}
