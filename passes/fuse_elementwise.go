package passes

import (
	"fmt"
	"slices"

	"github.com/rpac-dev/rpac/ir"
)

// FuseElementwise replaces each chain of elementwise ops whose
// intermediate results have no other reader by one FusedElementwise node:
// a backend then reads the chain's inputs once and writes its output once,
// instead of writing and reading every intermediate. A producer joins its
// consumer's group when its output is read by that consumer only, is not a
// graph output, and has the consumer's output shape (the chain's inputs may
// broadcast); groups stay within ir.MaxFusedInputs inputs, ir.MaxFusedSteps
// steps and ir.MaxFusedDraws dropout steps. Values are unchanged: each step
// is the op it replaces, a Dropout step keeping its node's id as its stream
// (its draws for element i depend on the run's seed, the stream and i
// only).
func FuseElementwise(g *ir.Graph) error { return emitFused(g, fuseGroups(g)) }

// FuseElementwiseRemat is FuseElementwise after rematerialising the
// Dropouts read by several chains (rematDropouts): each such reader gets
// a copy of the Dropout of its own, which its chain takes in, so the
// mask is drawn again per chain (the same draws: the Dropout's stream)
// instead of the result being written once and read by each. A Dropout
// whose copies do not all join their readers' chains (a chain at its
// bounds) is left as it was.
func FuseElementwiseRemat(g *ir.Graph) error {
	remat := rematDropouts(g)
	groups := fuseGroups(g)
	var undo []*dropoutRemat
	for _, r := range remat {
		for _, c := range r.copies {
			if groups[c] != nil { // a group of its own: not taken into its reader's
				undo = append(undo, r)
				break
			}
		}
	}
	if len(undo) > 0 {
		for _, r := range undo {
			r.restore(g)
		}
		groups = fuseGroups(g)
	}
	return emitFused(g, groups)
}

// fuseGroups groups the graph's chains: a producer joins its consumer's
// group when its output is read by that consumer only, is not a graph
// output and has the consumer's output shape, within the bounds. It
// returns the groups by root (a node absorbed into its reader's group has
// none).
func fuseGroups(g *ir.Graph) map[*ir.Node]*fuseGroup {
	uses := g.Uses()
	outputs := map[*ir.Value]bool{}
	for _, v := range g.Outputs {
		outputs[v] = true
	}
	groups := map[*ir.Node]*fuseGroup{} // by root
	for _, n := range g.Nodes {
		if !fusable(n) {
			continue
		}
		grp := &fuseGroup{members: []*ir.Node{n}, inputs: dedupe(n.Inputs)}
		for _, v := range dedupe(n.Inputs) {
			p := v.Def
			pg := groups[p]
			if p == nil || pg == nil || len(uses[v]) != 1 || outputs[v] || !v.Shape.Equal(n.Outputs[0].Shape) {
				continue
			}
			if merged, ok := grp.absorb(pg, v); ok {
				grp = merged
				delete(groups, p)
			}
		}
		groups[n] = grp
	}
	return groups
}

// dropoutRemat is one Dropout replaced by a copy per reader.
type dropoutRemat struct {
	orig    *ir.Node
	copies  []*ir.Node
	readers []*ir.Node // readers[i] reads copies[i]
}

// rematDropouts gives each reader of a Dropout's result a copy of the
// Dropout (its input, p and stream), placed just before the reader, where
// the result is no graph output and has two or more readers, all of them
// ops fusion can take it into (fusable, of the result's shape). The
// Dropout itself leaves the graph.
func rematDropouts(g *ir.Graph) []*dropoutRemat {
	uses := g.Uses()
	outputs := map[*ir.Value]bool{}
	for _, v := range g.Outputs {
		outputs[v] = true
	}
	var out []*dropoutRemat
	before := map[*ir.Node][]*ir.Node{} // copies to place before a reader
	drop := map[*ir.Node]bool{}
	for _, d := range g.Nodes {
		if d.Op != ir.OpDropout || !fusable(d) {
			continue
		}
		v := d.Outputs[0]
		readers := dedupeNodes(uses[v])
		if len(readers) < 2 || outputs[v] || slices.ContainsFunc(readers, func(r *ir.Node) bool {
			return !fusable(r) || !r.Outputs[0].Shape.Equal(v.Shape)
		}) {
			continue
		}
		r := &dropoutRemat{orig: d, readers: readers}
		for _, rd := range readers {
			a := d.Attrs.Clone()
			a["stream"] = d.Stream()
			c := &ir.Node{ID: g.NewID(), Op: d.Op, Inputs: slices.Clone(d.Inputs), Attrs: a}
			cv := g.AddValue(&ir.Value{Shape: v.Shape.Clone(), DType: v.DType, Kind: v.Kind, Def: c})
			c.Outputs = []*ir.Value{cv}
			replaceInput(rd, v, cv)
			before[rd] = append(before[rd], c)
			r.copies = append(r.copies, c)
		}
		drop[d] = true
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil
	}
	nodes := make([]*ir.Node, 0, len(g.Nodes)+len(before))
	for _, n := range g.Nodes {
		if drop[n] {
			continue
		}
		nodes = append(append(nodes, before[n]...), n)
	}
	g.Nodes = nodes
	return out
}

// restore puts the Dropout back in place of its copies: before the first
// copy, every reader reading its result again.
func (r *dropoutRemat) restore(g *ir.Graph) {
	v := r.orig.Outputs[0]
	for i, c := range r.copies {
		replaceInput(r.readers[i], c.Outputs[0], v)
	}
	nodes := make([]*ir.Node, 0, len(g.Nodes))
	placed := false
	for _, n := range g.Nodes {
		if slices.Contains(r.copies, n) {
			if !placed {
				nodes, placed = append(nodes, r.orig), true
			}
			continue
		}
		nodes = append(nodes, n)
	}
	g.Nodes = nodes
	g.Prune()
}

// replaceInput makes n read to wherever it read from.
func replaceInput(n *ir.Node, from, to *ir.Value) {
	for i, x := range n.Inputs {
		if x == from {
			n.Inputs[i] = to
		}
	}
}

func dedupeNodes(ns []*ir.Node) []*ir.Node {
	var out []*ir.Node
	for _, n := range ns {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// fusable: a single-output op on float data that fuses (ir.Fusable).
func fusable(n *ir.Node) bool {
	if !ir.Fusable(n.Op) || len(n.Outputs) != 1 {
		return false
	}
	for _, v := range append(slices.Clone(n.Inputs), n.Outputs...) {
		if v.DType != ir.F32 {
			return false
		}
	}
	return true
}

// fuseGroup is a chain being fused: its nodes in graph order (the root,
// whose output the fused node gives, last) and its external inputs.
type fuseGroup struct {
	members []*ir.Node
	inputs  []*ir.Value
}

// absorb returns the group with producer group p (whose root's output v
// feeds this group) folded in, unless that exceeds the bounds.
func (grp *fuseGroup) absorb(p *fuseGroup, v *ir.Value) (*fuseGroup, bool) {
	var in []*ir.Value
	for _, x := range p.inputs {
		in = appendNew(in, x)
	}
	for _, x := range grp.inputs {
		if x != v {
			in = appendNew(in, x)
		}
	}
	steps := len(p.members) + len(grp.members)
	if len(in) > ir.MaxFusedInputs || steps > ir.MaxFusedSteps || p.draws()+grp.draws() > ir.MaxFusedDraws {
		return nil, false
	}
	return &fuseGroup{members: append(slices.Clone(p.members), grp.members...), inputs: in}, true
}

// draws counts the group's members that draw (Dropout, DropoutGrad).
func (grp *fuseGroup) draws() int {
	n := 0
	for _, m := range grp.members {
		if ir.Ops[m.Op].ElementDraws {
			n++
		}
	}
	return n
}

// body numbers the group's registers (inputs, then one per member) and
// returns its steps.
func (grp *fuseGroup) body() ir.FusedBody {
	reg := map[*ir.Value]int{}
	for i, x := range grp.inputs {
		reg[x] = i
	}
	var b ir.FusedBody
	for j, m := range grp.members {
		args := make([]int, len(m.Inputs))
		for i, x := range m.Inputs {
			args[i] = reg[x]
		}
		a := m.Attrs.Clone()
		if ir.Ops[m.Op].ElementDraws && a.Int("stream", -1) < 0 {
			a["stream"] = m.Stream() // a Dropout's own stream
		}
		b = append(b, ir.FusedStep{Op: m.Op, Attrs: a, Args: args})
		reg[m.Outputs[0]] = len(grp.inputs) + j
	}
	return b
}

// emitFused puts one FusedElementwise node in place of each group's root
// and drops the other members.
func emitFused(g *ir.Graph, groups map[*ir.Node]*fuseGroup) error {
	drop := map[*ir.Node]bool{}
	put := map[*ir.Node]*ir.Node{}
	repl := map[*ir.Value]*ir.Value{}
	for _, root := range slices.Clone(g.Nodes) { // graph order: deterministic ids
		grp := groups[root]
		if grp == nil || len(grp.members) < 2 {
			continue
		}
		out := root.Outputs[0]
		a := ir.Attrs{"body": grp.body(), "shape": []int(out.Shape.Clone())}
		vs, err := g.TryApply("FusedElementwise", a, grp.inputs...)
		if err != nil {
			return fmt.Errorf("fuse elementwise: %w", err)
		}
		g.Nodes = g.Nodes[:len(g.Nodes)-1] // placed below, at the root
		put[root] = vs[0].Def
		repl[out] = vs[0]
		for _, m := range grp.members {
			drop[m] = true
		}
	}
	splice(g, put, drop, repl)
	g.Prune()
	return nil
}

func dedupe(vs []*ir.Value) []*ir.Value {
	var out []*ir.Value
	for _, v := range vs {
		out = appendNew(out, v)
	}
	return out
}

func appendNew(vs []*ir.Value, v *ir.Value) []*ir.Value {
	if slices.Contains(vs, v) {
		return vs
	}
	return append(vs, v)
}
