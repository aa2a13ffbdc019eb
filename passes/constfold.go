package passes

import (
	"errors"
	"fmt"
	"strings"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// foldGrowth is the size up to which ConstFold materialises a value larger
// than its largest input (a broadcast scalar, a small table).
const foldGrowth = 4096

// ConstFold evaluates, once, every node whose inputs are all known when the
// model is exported, and replaces the values that the rest of the graph
// reads by constants. Known are Consts and Params (an export freezes the
// weights); Buffers are not, so running statistics stay inputs of the graph
// unless FoldRPA made them constants. The evaluation runs on be with the
// weights of st, so a folded value equals what the executor computes.
//
// A node is not folded when its result would be larger than both its
// largest input and foldGrowth elements (a folded broadcast only makes the
// file bigger), nor when it reads a large parameter that unfolded nodes also
// read (the file would hold the weight twice). The folded nodes become dead;
// DCE removes them.
func ConstFold(g *ir.Graph, st *kernels.Store, be kernels.Backend) error {
	uses := g.Uses()
	fold := map[*ir.Node]bool{}
	known := func(v *ir.Value, fold map[*ir.Node]bool) bool {
		switch v.Kind {
		case ir.Const, ir.Param:
			return true
		case ir.Intermediate:
			return fold[v.Def]
		}
		return false
	}
	for _, n := range g.Nodes {
		def := ir.Ops[n.Op]
		if def == nil || def.Random || def.TrainingOnly {
			continue
		}
		ok := true
		largest := 0
		for _, in := range n.Inputs {
			if !known(in, fold) || in.DType != ir.F32 {
				ok = false
				break
			}
			largest = max(largest, in.Shape.Numel())
		}
		for _, o := range n.Outputs {
			if o.DType != ir.F32 || (o.Shape.Numel() > largest && o.Shape.Numel() > foldGrowth) {
				ok = false
			}
		}
		if ok {
			fold[n] = true
		}
	}
	// Do not copy a large parameter that stays in the graph anyway; a node
	// whose input is no longer folded cannot fold either.
	for changed := true; changed; {
		changed = false
		for _, n := range g.Nodes {
			if !fold[n] {
				continue
			}
			for _, in := range n.Inputs {
				drop := in.Kind == ir.Intermediate && !fold[in.Def]
				if in.Kind == ir.Param && in.Shape.Numel() > foldGrowth {
					drop = drop || isOutput(g, in)
					for _, u := range uses[in] {
						drop = drop || !fold[u]
					}
				}
				if drop {
					delete(fold, n)
					changed = true
					break
				}
			}
		}
	}
	// The folded values that unfolded nodes or graph outputs read.
	targets := readOutside(g, fold, uses)
	if len(targets) == 0 {
		return nil
	}
	vals, err := evalStatic(g, targets, st, be)
	if err != nil {
		return fmt.Errorf("const fold: %w", err)
	}
	for _, v := range targets {
		c := newConst(g, foldName(v), v.Shape, vals[v])
		replaceUses(g, v, c)
	}
	return nil
}

// foldName names the constant that replaces v: the first named input of
// the node that computes v, followed by the op ("pos_emb.weight.slice").
func foldName(v *ir.Value) string {
	if v.Name != "" {
		return v.Name
	}
	n := v.Def
	for _, in := range n.Inputs {
		if in.Name != "" {
			return in.Name + "." + strings.ToLower(string(n.Op))
		}
	}
	return fmt.Sprintf("folded.%s.%d", strings.ToLower(string(n.Op)), v.ID)
}

// evalStatic computes the values in targets, which must depend on no graph
// input. It copies the nodes they depend on into a small graph, compiles it
// with be against st and runs it once.
func evalStatic(g *ir.Graph, targets []*ir.Value, st *kernels.Store, be kernels.Backend) (map[*ir.Value][]float64, error) {
	if be == nil {
		return nil, errors.New("no backend to evaluate constants with")
	}
	need := map[*ir.Node]bool{}
	stack := append([]*ir.Value(nil), targets...)
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		switch v.Kind {
		case ir.Input:
			return nil, fmt.Errorf("%s depends on the graph input %s", targets[0], v)
		case ir.Intermediate:
			if !need[v.Def] {
				need[v.Def] = true
				stack = append(stack, v.Def.Inputs...)
			}
		}
	}
	sub := ir.New(g.Name + "_fold")
	m := map[*ir.Value]*ir.Value{}
	var get func(v *ir.Value) *ir.Value
	get = func(v *ir.Value) *ir.Value {
		if nv, ok := m[v]; ok {
			return nv
		}
		var nv *ir.Value
		switch v.Kind {
		case ir.Param:
			nv = sub.Param(v.Name, v.Shape)
		case ir.Buffer:
			nv = sub.Buffer(v.Name, v.Shape)
		case ir.Const:
			nv = sub.Const(v.Name, v.Shape, v.Data)
		}
		m[v] = nv
		return nv
	}
	for _, n := range g.Nodes {
		if !need[n] {
			continue
		}
		ins := make([]*ir.Value, len(n.Inputs))
		for i, in := range n.Inputs {
			ins[i] = get(in)
		}
		outs, err := sub.TryApply(n.Op, n.Attrs, ins...)
		if err != nil {
			return nil, err
		}
		for i, o := range n.Outputs {
			m[o] = outs[i]
		}
	}
	for i, v := range targets {
		sub.SetOutput(fmt.Sprintf("t%d", i), get(v))
	}
	prog, err := be.Compile(sub, Plan(sub), st)
	if err != nil {
		return nil, err
	}
	defer prog.Close()
	if err := prog.Run(nil, 0); err != nil {
		return nil, err
	}
	out := map[*ir.Value][]float64{}
	for i, v := range targets {
		t := prog.Output(fmt.Sprintf("t%d", i))
		if t == nil {
			return nil, fmt.Errorf("no value for %s", v)
		}
		out[v] = t.Float64s()
	}
	return out, nil
}

// readOutside returns, in graph order, the outputs of the nodes of set that
// a graph output or a node outside set reads.
func readOutside(g *ir.Graph, set map[*ir.Node]bool, uses map[*ir.Value][]*ir.Node) []*ir.Value {
	var out []*ir.Value
	for _, n := range g.Nodes {
		if !set[n] {
			continue
		}
		for _, o := range n.Outputs {
			read := isOutput(g, o)
			for _, u := range uses[o] {
				read = read || !set[u]
			}
			if read {
				out = append(out, o)
			}
		}
	}
	return out
}
