package ir

import (
	"fmt"
	"sort"
	"strings"
)

// String prints the graph in a stable, readable text form (used by
// --dump-ir and golden tests).
func (g *Graph) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "graph %s {\n", g.Name)
	if len(g.Meta) > 0 {
		keys := make([]string, 0, len(g.Meta))
		for k := range g.Meta {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  meta %s = %s\n", k, g.Meta[k])
		}
	}
	for _, v := range g.Values {
		if v.Kind == Intermediate {
			continue
		}
		extra := ""
		if v.TrainingOnly {
			extra = " training-only"
		}
		if v.Kind == Const && v.Shape.Numel() == 1 {
			extra += fmt.Sprintf(" = %g", v.Data[0])
		}
		fmt.Fprintf(&b, "  %s %s %s%s%s\n", v.Kind, v, v.DType, v.Shape, extra)
	}
	for _, n := range g.Nodes {
		outs := make([]string, len(n.Outputs))
		for i, o := range n.Outputs {
			outs[i] = fmt.Sprintf("%s%s", o, o.Shape)
		}
		ins := make([]string, len(n.Inputs))
		for i, v := range n.Inputs {
			ins[i] = v.String()
		}
		fmt.Fprintf(&b, "  %s = %s(%s)%s\n", strings.Join(outs, ", "), n.Op, strings.Join(ins, ", "), attrString(n.Attrs))
	}
	for _, name := range g.OutputNames() {
		fmt.Fprintf(&b, "  output %q = %s\n", name, g.Outputs[name])
	}
	b.WriteString("}\n")
	return b.String()
}

func attrString(a Attrs) string {
	if len(a) == 0 {
		return ""
	}
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, a[k])
	}
	return " {" + strings.Join(parts, " ") + "}"
}

// OpCounts returns how many nodes of each op the graph holds.
func (g *Graph) OpCounts() map[OpName]int {
	c := map[OpName]int{}
	for _, n := range g.Nodes {
		c[n.Op]++
	}
	return c
}
