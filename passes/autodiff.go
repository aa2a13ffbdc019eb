package passes

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// GradName is the graph output name of a parameter's gradient.
func GradName(param string) string { return "grad:" + param }

// Autodiff appends the reverse-mode gradient of the scalar graph output
// `loss` with respect to every Param of g, and names each gradient
// GradName(param) among the graph's outputs. Params that the loss does not
// depend on get no output (callers treat a missing gradient as zero).
//
// Gradients of coarse ops are emitted as their hand-written *Grad ops (one
// kernel each, checked against finite differences in the backends); values
// read by several nodes accumulate their gradients with Add.
func Autodiff(g *ir.Graph, loss string) error {
	lv, ok := g.Outputs[loss]
	if !ok {
		return fmt.Errorf("autodiff: graph %s has no output %q", g.Name, loss)
	}
	if len(lv.Shape) != 0 {
		return fmt.Errorf("autodiff: loss %q has shape %v, want a scalar", loss, lv.Shape)
	}
	// Forward reachability from params: only those values carry gradients.
	needs := map[*ir.Value]bool{}
	for _, v := range g.Values {
		if v.Kind == ir.Param {
			needs[v] = true
		}
	}
	fwd := append([]*ir.Node(nil), g.Nodes...)
	for _, n := range fwd {
		if n.Op == ir.OpStopGradient || n.Op == ir.OpTopKMask {
			continue
		}
		for _, in := range n.Inputs {
			if needs[in] {
				for _, o := range n.Outputs {
					if o.DType == ir.F32 {
						needs[o] = true
					}
				}
				break
			}
		}
	}
	if !needs[lv] {
		return fmt.Errorf("autodiff: loss %q does not depend on any parameter", loss)
	}
	grads := map[*ir.Value]*ir.Value{}
	grads[lv] = g.Scalar(1)
	acc := func(v, d *ir.Value) {
		if d == nil || !needs[v] {
			return
		}
		if !d.Shape.Equal(v.Shape) {
			panic(fmt.Sprintf("autodiff: gradient of %s has shape %v, value %v", v, d.Shape, v.Shape))
		}
		if old, ok := grads[v]; ok {
			grads[v] = g.Op1("Add", nil, old, d)
		} else {
			grads[v] = d
		}
	}
	for i := len(fwd) - 1; i >= 0; i-- {
		n := fwd[i]
		dys := make([]*ir.Value, len(n.Outputs))
		any := false
		for j, o := range n.Outputs {
			dys[j] = grads[o]
			any = any || dys[j] != nil
		}
		if !any {
			continue
		}
		want := false
		for _, in := range n.Inputs {
			want = want || needs[in]
		}
		if !want {
			continue
		}
		rule, ok := gradRuleOf(n.Op)
		if !ok {
			return fmt.Errorf("autodiff: op %s has no gradient rule", n.Op)
		}
		dxs := rule(g, n, dys)
		for j, in := range n.Inputs {
			if j < len(dxs) {
				acc(in, dxs[j])
			}
		}
	}
	for _, v := range g.Values {
		if v.Kind == ir.Param {
			if d, ok := grads[v]; ok {
				g.SetOutput(GradName(v.Name), d)
			}
		}
	}
	return nil
}

type gradRule = ir.GradRule

// sumTo reduces a broadcast gradient back to shape s.
func sumTo(g *ir.Graph, d *ir.Value, s ir.Shape) *ir.Value {
	if d.Shape.Equal(s) {
		return d
	}
	return g.Op1("SumTo", ir.Attrs{"shape": []int(s.Clone())}, d)
}

var gradRules map[ir.OpName]gradRule

func init() {
	gradRules = map[ir.OpName]gradRule{
		"Gather": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{g.Op1("GatherGrad", ir.Attrs{"vocab": n.Inputs[0].Shape[0]}, d[0], n.Inputs[1]), nil}
		},
		"Slice": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			a := n.Attrs.Clone()
			a["shape"] = []int(n.Inputs[0].Shape.Clone())
			return []*ir.Value{g.Op1("SliceGrad", a, d[0])}
		},
		"Pad": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			a := n.Attrs.Clone()
			a["shape"] = []int(n.Inputs[0].Shape.Clone())
			return []*ir.Value{g.Op1("PadGrad", a, d[0])}
		},
		"Reshape": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{g.Op1("Reshape", ir.Attrs{"shape": []int(n.Inputs[0].Shape.Clone())}, d[0])}
		},
		"Transpose": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			p := n.Attrs.Ints("perm")
			inv := make([]int, len(p))
			for i, j := range p {
				inv[j] = i
			}
			return []*ir.Value{g.Op1("Transpose", ir.Attrs{"perm": inv}, d[0])}
		},
		"Concat": concatGrad,
		"BroadcastTo": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{sumTo(g, d[0], n.Inputs[0].Shape)}
		},
		"SumTo": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{g.Op1("BroadcastTo", ir.Attrs{"shape": []int(n.Inputs[0].Shape.Clone())}, d[0])}
		},
		"Linear": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			out := []*ir.Value{
				g.Op1("LinearGradX", nil, d[0], n.Inputs[1]),
				g.Op1("LinearGradW", nil, d[0], n.Inputs[0]),
			}
			if len(n.Inputs) == 3 {
				out = append(out, sumTo(g, d[0], n.Inputs[2].Shape))
			}
			return out
		},
		"MatMul": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			a, b, dc := n.Inputs[0], n.Inputs[1], d[0]
			tA, tB := n.Attrs.Bool("transA", false), n.Attrs.Bool("transB", false)
			mm := func(x, y *ir.Value, ta, tb bool) *ir.Value {
				return g.Op1("MatMul", ir.Attrs{"transA": ta, "transB": tb}, x, y)
			}
			switch {
			case !tA && !tB:
				return []*ir.Value{mm(dc, b, false, true), mm(a, dc, true, false)}
			case !tA && tB:
				return []*ir.Value{mm(dc, b, false, false), mm(dc, a, true, false)}
			case tA && !tB:
				return []*ir.Value{mm(b, dc, false, true), mm(a, dc, false, false)}
			default:
				return []*ir.Value{mm(b, dc, true, true), mm(dc, a, true, true)}
			}
		},
		"Softmax": ir.GradWith("SoftmaxGrad", true),
		"ZScore":  ir.GradWith("ZScoreGrad", false),
		"StopGradient": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return nil
		},
		"TopKMask": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value { return nil },
		"ReduceSum": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{reduceGrad(g, n, d[0], 1)}
		},
		"ReduceMean": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			cnt := n.Inputs[0].Shape.Numel() / max(1, n.Outputs[0].Shape.Numel())
			return []*ir.Value{reduceGrad(g, n, d[0], 1/float64(cnt))}
		},
		"CausalMask": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{g.Op1("CausalMask", ir.Attrs{"fill": 0.0}, d[0])}
		},
		"LayerNorm": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			o := g.Apply("LayerNormGrad", n.Attrs.Clone(), d[0], n.Inputs[0], n.Inputs[1])
			return o
		},
		"ExpertFFN": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			if d[0] == nil { // only the output has a gradient; u, a, h are saved for this
				return nil
			}
			a := n.Attrs.Clone()
			a["stream"] = n.Stream()
			in, out := n.Inputs, n.Outputs
			return g.Apply("ExpertFFNGrad", a, d[0], in[0], in[1], in[2], in[4], out[1], out[2], out[3])
		},
		"Dropout": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			if d[0] == nil {
				return nil
			}
			return []*ir.Value{g.Op1("DropoutGrad", ir.Attrs{"p": n.Attrs.Float("p", 0), "stream": n.Stream()}, d[0])}
		},
		"GumbelNoise": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value { return []*ir.Value{d[0]} },
		"FusedAttention": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			if d[0] == nil {
				return nil
			}
			a := n.Attrs.Clone()
			a["stream"] = n.Stream() // the gradient repeats this node's dropout draws
			a["with_out"] = true     // the forward's output, so a backend need not run it again
			in := append(append([]*ir.Value{d[0]}, n.Inputs...), n.Outputs[0])
			return g.Apply("FusedAttentionGrad", a, in...)
		},
		"CrossEntropy": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			if d[0] == nil {
				return nil // only the smoothed sum is differentiated
			}
			return []*ir.Value{g.Op1("CrossEntropyGrad", n.Attrs.Clone(), d[0], n.Inputs[0], n.Inputs[1]), nil}
		},
		"LMHeadCrossEntropy": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			if d[0] == nil {
				return nil // only the smoothed sum is differentiated
			}
			o := g.Apply("LMHeadCrossEntropyGrad", n.Attrs.Clone(), d[0], n.Inputs[0], n.Inputs[1], n.Inputs[2])
			return []*ir.Value{o[0], o[1], nil}
		},
		"GaussianMembership": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return g.Apply("GaussianMembershipGrad", nil, d[0], n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Outputs[0])
		},
		"Sinkhorn": func(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
			return []*ir.Value{g.Op1("SinkhornGrad", n.Attrs.Clone(), d[0], n.Inputs[0])}
		},
	}
}

// reduceGrad broadcasts the gradient of a reduction back to the input shape.
func reduceGrad(g *ir.Graph, n *ir.Node, d *ir.Value, scale float64) *ir.Value {
	in := n.Inputs[0].Shape
	keep, _ := ir.ReduceShape(in, n.Attrs.Ints("axes"), true)
	if !d.Shape.Equal(keep) {
		d = g.Op1("Reshape", ir.Attrs{"shape": []int(keep)}, d)
	}
	if scale != 1 {
		d = g.Op1("Scale", ir.Attrs{"alpha": scale}, d)
	}
	return g.Op1("BroadcastTo", ir.Attrs{"shape": []int(in.Clone())}, d)
}

// gradRuleOf is op's gradient rule: its definition's (ir.OpDef.Grad), else
// its entry in gradRules.
func gradRuleOf(op ir.OpName) (gradRule, bool) {
	if d := ir.Ops[op]; d != nil && d.Grad != nil {
		return d.Grad, true
	}
	r, ok := gradRules[op]
	return r, ok
}

// GradOps lists the ops autodiff can differentiate (for coverage tests).
func GradOps() []ir.OpName {
	var out []ir.OpName
	for k := range ir.Ops {
		if _, ok := gradRuleOf(k); ok {
			out = append(out, k)
		}
	}
	return out
}

// concatGrad hands each input its slice of dy along the concatenation axis.
func concatGrad(g *ir.Graph, n *ir.Node, d []*ir.Value) []*ir.Value {
	ax := n.Attrs.Int("axis", 0)
	if ax < 0 {
		ax += len(n.Outputs[0].Shape)
	}
	out := make([]*ir.Value, len(n.Inputs))
	at := 0
	for i, in := range n.Inputs {
		w := in.Shape[ax]
		out[i] = g.Op1("Slice", ir.Attrs{"axis": ax, "start": at, "end": at + w}, d[0])
		at += w
	}
	return out
}
