package passes

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// Fold modes of the export pipeline.
const (
	FoldRPAMode  = "rpa"  // the RPA subgraph of every layer becomes a constant bias
	FoldNoneMode = "none" // the RPA computation stays in the graph (parity checks, measuring the fold)
	// FoldRankMode and FoldRankApproxMode (fold_rank.go) write the prior
	// into the attention dot product.
)

// Attention lowerings of the export pipeline.
const (
	AttentionOp    = "op"    // one FusedAttention node per layer (ONNX Attention, opset 23)
	AttentionPlain = "plain" // MatMul, Add of one constant mask, Softmax, MatMul
	AttentionNone  = "none"  // leave the attention subgraph as built
)

// DefaultAttention is the attention lowering the export uses unless told
// otherwise. It was chosen by measuring both on onnxruntime 1.30 (CPU): the
// Attention op is as fast as MatMul/Add/Softmax at T=128 and 384 and 2-8%
// faster at T=768 on the paper preset; the figures and the command are in
// docs/EXPORT.md.
const DefaultAttention = AttentionOp

// ExportOptions are the inputs of the export passes (Context.ExportOptions).
type ExportOptions struct {
	// Store holds the weights and buffers the export freezes: training-only
	// buffers (bias warm-in scale, λ_sat), running statistics (FoldRPA) and
	// the parameters that ConstFold folds.
	Store *kernels.Store
	// Backend evaluates the subgraphs that FoldRPA and ConstFold replace by
	// constants (kernels/cpu in F32, so that folded values equal what the
	// eval-mode executor computes).
	Backend kernels.Backend
	// Fold is FoldRPAMode (default), FoldRankMode, FoldRankApproxMode or
	// FoldNoneMode.
	Fold string
	// Attention is AttentionOp, AttentionOpPadded, AttentionPlain or
	// AttentionNone (default DefaultAttention).
	Attention string
	// Report receives FoldRPA's per-layer statistics.
	Report *FoldReport
}

func exportOptions(c *Context) (*ExportOptions, error) {
	if c == nil || c.ExportOptions == nil {
		return nil, errors.New("no export options (Context.ExportOptions)")
	}
	o := c.ExportOptions
	var err error
	if o.Fold, err = oneOf("fold mode", o.Fold, FoldRPAMode, FoldRankMode, FoldRankApproxMode, FoldNoneMode); err != nil {
		return nil, err
	}
	if o.Attention, err = oneOf("attention lowering", o.Attention, DefaultAttention, AttentionOpPadded, AttentionPlain, AttentionNone); err != nil {
		return nil, err
	}
	return o, nil
}

// oneOf returns v, or def when v is "", if it is def or one of others;
// the error names the option what and lists the choices.
func oneOf(what, v, def string, others ...string) (string, error) {
	v = cmp.Or(v, def)
	choices := append([]string{def}, others...)
	if slices.Contains(choices, v) {
		return v, nil
	}
	q := make([]string, len(choices))
	for i, c := range choices {
		q[i] = strconv.Quote(c)
	}
	last := len(q) - 1
	return "", fmt.Errorf("%s %q: want %s or %s", what, v, strings.Join(q[:last], ", "), q[last])
}

// ExportPipeline turns an eval-mode forward graph (model.Build with
// Mode Eval, NoLoss, Logits) into the graph that compiler/onnx lowers.
// From "strip training" on the graph must verify as an export graph: no
// training-only op or buffer.
var ExportPipeline = []Pass{
	{Name: "strip training", ExportAfter: true, Fn: func(g *ir.Graph, c *Context) error {
		o, err := exportOptions(c)
		if err != nil {
			return err
		}
		if c.Model == nil {
			return fmt.Errorf("graph %s comes without its model description (passes.Context.Model)", g.Name)
		}
		return StripTraining(g, c.Model.Hooks, o.Store)
	}},
	{Name: "fold rpa", Fn: func(g *ir.Graph, c *Context) error {
		o, err := exportOptions(c)
		if err != nil {
			return err
		}
		if o.Fold == FoldNoneMode {
			return nil
		}
		var layers []FoldLayer
		if o.Fold == FoldRankMode || o.Fold == FoldRankApproxMode {
			rr, err := FoldRank(g, c.Model, o.Store, o.Backend, o.Fold == FoldRankApproxMode)
			if err != nil {
				return err
			}
			layers = rr.Layers
		}
		rep, err := FoldRPA(g, c.Model, o.Store, o.Backend)
		if err != nil {
			return err
		}
		if o.Report != nil {
			o.Report.Layers = append(append(o.Report.Layers, layers...), rep.Layers...)
		}
		return nil
	}},
	{Name: "const fold", Fn: func(g *ir.Graph, c *Context) error {
		o, err := exportOptions(c)
		if err != nil {
			return err
		}
		return ConstFold(g, o.Store, o.Backend)
	}},
	{Name: "dce", Fn: func(g *ir.Graph, c *Context) error { return DCE(g) }},
	{Name: "fuse attention", Fn: func(g *ir.Graph, c *Context) error {
		o, err := exportOptions(c)
		if err != nil {
			return err
		}
		if o.Attention == AttentionOpPadded {
			if err := FuseAttention(g, AttentionOp); err != nil {
				return err
			}
			return PadAttentionHeads(g, HeadAlign)
		}
		return FuseAttention(g, o.Attention)
	}},
	{Name: "dce", Fn: func(g *ir.Graph, c *Context) error { return DCE(g) }},
}

func init() {
	if err := CheckOrder(ExportPipeline); err != nil {
		panic(fmt.Sprintf("passes: pipeline export: %v", err))
	}
	Pipelines["export"] = ExportPipeline
}

// replaceUses makes every reader of old (nodes and graph outputs) read nv.
func replaceUses(g *ir.Graph, old, nv *ir.Value) {
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in == old {
				n.Inputs[i] = nv
			}
		}
	}
	for k, v := range g.Outputs {
		if v == old {
			g.Outputs[k] = nv
		}
	}
}

// newConst adds a constant value to g.
func newConst(g *ir.Graph, name string, s ir.Shape, data []float64) *ir.Value {
	return g.AddValue(&ir.Value{Name: uniqueName(g, name), Shape: s.Clone(), DType: ir.F32, Kind: ir.Const, Data: data})
}

// uniqueName returns name, or name with a numeric suffix when g already
// has a value of that name.
func uniqueName(g *ir.Graph, name string) string {
	if name == "" {
		return ""
	}
	taken := map[string]bool{}
	for _, v := range g.Values {
		taken[v.Name] = true
	}
	if !taken[name] {
		return name
	}
	for i := 2; ; i++ {
		n := fmt.Sprintf("%s.%d", name, i)
		if !taken[n] {
			return n
		}
	}
}

// insertAt applies op in g and moves the new node to index i of g.Nodes
// (TryApply appends it at the end).
func insertAt(g *ir.Graph, i int, op ir.OpName, a ir.Attrs, in ...*ir.Value) (*ir.Value, error) {
	outs, err := g.TryApply(op, a, in...)
	if err != nil {
		return nil, err
	}
	n := g.Nodes[len(g.Nodes)-1]
	copy(g.Nodes[i+1:], g.Nodes[i:len(g.Nodes)-1])
	g.Nodes[i] = n
	return outs[0], nil
}

func nodeIndex(g *ir.Graph, n *ir.Node) int {
	for i, m := range g.Nodes {
		if m == n {
			return i
		}
	}
	return -1
}
