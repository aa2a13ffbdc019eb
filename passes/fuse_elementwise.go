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
func FuseElementwise(g *ir.Graph) error {
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
	return emitFused(g, groups)
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
