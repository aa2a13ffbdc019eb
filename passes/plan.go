package passes

import (
	"sort"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// Plan lays out the intermediate float values of g into reusable slots.
// A value's slot is taken when its node runs and given back after the last
// node that reads it; graph outputs stay live to the end. A node's outputs
// never share a slot with its own inputs. Free slots are reused best-fit.
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
	p := &kernels.Plan{Slot: map[int]int{}}
	var free []int // slot indices, kept sorted by size
	insertFree := func(s int) {
		i := sort.Search(len(free), func(i int) bool { return p.SlotElems[free[i]] >= p.SlotElems[s] })
		free = append(free, 0)
		copy(free[i+1:], free[i:])
		free[i] = s
	}
	for i, n := range g.Nodes {
		for _, o := range n.Outputs {
			if o.DType != ir.F32 {
				continue
			}
			need := max(1, o.Shape.Numel())
			p.Naive += need
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
			if _, used := last[o]; !used { // dead output: free right after the node
				last[o] = i
			}
		}
		// Free values whose last reader is this node (inputs and dead outputs).
		seen := map[*ir.Value]bool{}
		for _, v := range append(append([]*ir.Value(nil), n.Inputs...), n.Outputs...) {
			if seen[v] || v.Kind != ir.Intermediate || v.DType != ir.F32 {
				continue
			}
			seen[v] = true
			if last[v] == i {
				insertFree(p.Slot[v.ID])
			}
		}
	}
	for _, e := range p.SlotElems {
		p.Peak += e
	}
	for _, n := range g.Nodes {
		if def := ir.Ops[n.Op]; def != nil && def.Scratch != nil {
			p.ScratchElems += def.Scratch(n)
		}
	}
	return p
}
