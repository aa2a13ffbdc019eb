package passes

import (
	"sort"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// Plan lays out the intermediate float values of g into reusable slots.
// A value's slot is taken when its node runs and given back after the last
// node that reads it; graph outputs stay live to the end. A node's outputs
// never share a slot with its own inputs, except the output of an alias op
// (ir.OpDef.Alias: Reshape, StopGradient), which takes its input's slot:
// the slot is given back when every value in it is dead, and the op has
// nothing to do. Free slots are reused best-fit.
// The memory that kernels allocate besides the slots is counted in
// ScratchElems.
func Plan(g *ir.Graph) *kernels.Plan {
	last := map[*ir.Value]int{}
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			last[in] = i
		}
	}
	end := len(g.Nodes)
	for _, v := range g.Outputs {
		last[v] = end
	}
	late := lazyInputs(g, last)
	p := &kernels.Plan{Slot: map[int]int{}, FreedAfter: map[int][]int{}}
	var free []int // slot indices, kept sorted by size
	insertFree := func(s int) {
		i := sort.Search(len(free), func(i int) bool { return p.SlotElems[free[i]] >= p.SlotElems[s] })
		free = append(free, 0)
		copy(free[i+1:], free[i:])
		free[i] = s
	}
	live := map[int]int{} // slot -> values in it not yet dead
	for i, n := range g.Nodes {
		for _, o := range n.Outputs {
			if o.DType != ir.F32 {
				continue
			}
			need := max(1, o.Shape.Numel())
			p.Naive += need
			if _, used := last[o]; !used { // dead output: free right after the node
				last[o] = i
			}
			if s, ok := aliasSlot(p, n); ok {
				p.Slot[o.ID] = s
				live[s]++
				continue
			}
			j := sort.Search(len(free), func(j int) bool { return p.SlotElems[free[j]] >= need })
			var s int
			if j < len(free) {
				s = free[j]
				free = append(free[:j], free[j+1:]...)
			} else {
				s = len(p.SlotElems)
				p.SlotElems = append(p.SlotElems, need)
			}
			p.Slot[o.ID] = s
			live[s] = 1
		}
		// Free values whose last reader is this node (inputs and dead outputs).
		seen := map[*ir.Value]bool{}
		for _, v := range append(append(append([]*ir.Value(nil), n.Inputs...), n.Outputs...), late[i]...) {
			if seen[v] || v.Kind != ir.Intermediate || v.DType != ir.F32 {
				continue
			}
			seen[v] = true
			if s := p.Slot[v.ID]; last[v] == i {
				if live[s]--; live[s] == 0 {
					insertFree(s)
					p.FreedAfter[n.ID] = append(p.FreedAfter[n.ID], s)
				}
			}
		}
	}
	for _, e := range p.SlotElems {
		p.Peak += e
	}
	shared := 0
	for _, n := range g.Nodes {
		switch def := ir.Ops[n.Op]; {
		case def == nil || def.Scratch == nil:
		case def.SharedScratch:
			shared = max(shared, def.Scratch(n))
		default:
			p.ScratchElems += def.Scratch(n)
		}
	}
	p.ScratchElems += shared
	return p
}

// lazyInputs keeps the inputs of each lazy Concat (attribute lazy: a
// backend may leave its result unwritten and have the readers read the
// inputs) live as long as the result, moving their last reads in last; it
// returns them by the position of that last read, where the planner frees
// them (they are no input of the node there).
func lazyInputs(g *ir.Graph, last map[*ir.Value]int) map[int][]*ir.Value {
	late := map[int][]*ir.Value{}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		if n.Op != ir.OpConcat || !n.Attrs.Bool("lazy", false) {
			continue
		}
		for _, in := range n.Inputs {
			if j := last[n.Outputs[0]]; j > last[in] {
				last[in] = j
				late[j] = append(late[j], in)
			}
		}
	}
	return late
}

// aliasSlot is the slot an alias op's output shares with its input: the
// input's, when it has one of the output's size.
func aliasSlot(p *kernels.Plan, n *ir.Node) (int, bool) {
	if d := ir.Ops[n.Op]; d == nil || !d.Alias || len(n.Inputs) != 1 || len(n.Outputs) != 1 {
		return 0, false
	}
	x, o := n.Inputs[0], n.Outputs[0]
	s, ok := p.Slot[x.ID]
	if !ok || x.Kind != ir.Intermediate || x.DType != ir.F32 || x.Shape.Numel() != o.Shape.Numel() {
		return 0, false
	}
	return s, true
}
