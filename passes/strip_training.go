package passes

import (
	"fmt"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// StripTraining removes everything of a forward graph that exists only for
// training, so that what remains is the deterministic eval-mode function:
//
//   - Dropout and GumbelNoise nodes become the identity (their first input
//     takes the place of their output; a Dropout mask that something still
//     reads is an error);
//   - StopGradient nodes (.detach()) become the identity;
//   - every training-only buffer (bias warm-in scale, chaos factor,
//     Guardian's λ_sat) becomes a constant holding its current value in st;
//   - the training hooks go: the outputs that only training reads (the
//     statistics of Guardian, the context game and the running statistics,
//     and the objective "loss"), as the model's builder lists them in hooks.
//
// Any other op that the op table marks training-only is an error, and the
// verifier that runs after this pass rejects an export graph that still
// holds one.
func StripTraining(g *ir.Graph, hooks []string, st *kernels.Store) error {
	for _, name := range hooks {
		delete(g.Outputs, name)
	}
	uses := g.Uses()
	kept := g.Nodes[:0]
	var drop []*ir.Node
	for _, n := range g.Nodes {
		switch n.Op {
		case ir.OpDropout, ir.OpGumbelNoise, ir.OpStopGradient:
			for _, o := range n.Outputs[1:] {
				if len(uses[o]) > 0 || isOutput(g, o) {
					return fmt.Errorf("strip training: %s node %d: its mask %s is still read (strip the forward graph, not a training step)", n.Op, n.ID, o)
				}
			}
			drop = append(drop, n)
		default:
			if def := ir.Ops[n.Op]; def != nil && (def.TrainingOnly || def.Random) {
				return fmt.Errorf("strip training: no rule to remove training-only op %s (node %d)", n.Op, n.ID)
			}
			kept = append(kept, n)
		}
	}
	g.Nodes = kept
	alias := map[*ir.Value]*ir.Value{}
	for _, n := range drop {
		src := n.Inputs[0]
		if a, ok := alias[src]; ok {
			src = a
		}
		alias[n.Outputs[0]] = src
	}
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if a, ok := alias[in]; ok {
				n.Inputs[i] = a
			}
		}
	}
	for k, v := range g.Outputs {
		if a, ok := alias[v]; ok {
			g.Outputs[k] = a
		}
	}

	// Training-only buffers become constants with their current value.
	var missing []string
	for _, v := range g.Values {
		if v.Kind != ir.Buffer || !v.TrainingOnly {
			continue
		}
		t := storedValue(st, v)
		if t == nil {
			missing = append(missing, v.Name)
			continue
		}
		v.Kind = ir.Const
		v.Data = t.Float64s()
		v.TrainingOnly = false
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("strip training: training-only buffer(s) %s have no value in the checkpoint to freeze", strings.Join(missing, ", "))
	}
	g.Prune()
	return nil
}

func isOutput(g *ir.Graph, v *ir.Value) bool {
	for _, o := range g.Outputs {
		if o == v {
			return true
		}
	}
	return false
}

// storedValue returns st's tensor of v's name when it has v's shape, else
// nil (also for a nil st).
func storedValue(st *kernels.Store, v *ir.Value) *kernels.Tensor {
	if st == nil {
		return nil
	}
	if t := st.Get(v.Name); t != nil && t.Shape.Equal(v.Shape) {
		return t
	}
	return nil
}
