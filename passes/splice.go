package passes

import "github.com/rpac-dev/rpac/ir"

// splice edits g in place: each node of put gives way to its replacement
// at the same position, the nodes of drop go, and every use of a value of
// repl (a node's input or a graph output) reads its replacement instead.
func splice(g *ir.Graph, put map[*ir.Node]*ir.Node, drop map[*ir.Node]bool, repl map[*ir.Value]*ir.Value) {
	nodes := g.Nodes[:0]
	for _, n := range g.Nodes {
		if r := put[n]; r != nil {
			nodes = append(nodes, r)
		} else if !drop[n] {
			nodes = append(nodes, n)
		}
	}
	g.Nodes = nodes
	for _, n := range g.Nodes {
		for i, x := range n.Inputs {
			if y := repl[x]; y != nil {
				n.Inputs[i] = y
			}
		}
	}
	for k, v := range g.Outputs {
		if y := repl[v]; y != nil {
			g.Outputs[k] = y
		}
	}
}
