package passes

import "github.com/rpac-dev/rpac/ir"

// DCE removes nodes none of whose outputs reach a graph output, then prunes
// values nothing refers to any more.
func DCE(g *ir.Graph) error {
	live := map[*ir.Value]bool{}
	for _, v := range g.Outputs {
		live[v] = true
	}
	keep := make([]bool, len(g.Nodes))
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		for _, o := range n.Outputs {
			if live[o] {
				keep[i] = true
				break
			}
		}
		if keep[i] {
			for _, in := range n.Inputs {
				live[in] = true
			}
		}
	}
	nodes := g.Nodes[:0]
	for i, n := range g.Nodes {
		if keep[i] {
			nodes = append(nodes, n)
		}
	}
	g.Nodes = nodes
	g.Prune()
	return nil
}
