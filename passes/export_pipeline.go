package passes

import (
	"errors"
	"fmt"

	"github.com/rpac-dev/rpac/internal/enum"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// FoldMode is what the export pipeline does with the RPA prior (rpac
// export --fold; "fold" in manifests and provenance).
type FoldMode uint8

// Fold modes of the export pipeline.
const (
	FoldRPAMode FoldMode = iota // the RPA subgraph of every layer becomes a constant bias (the default)
	// FoldRankMode and FoldRankApproxMode (fold_rank.go) write the prior
	// into the attention dot product.
	FoldRankMode
	FoldRankApproxMode
	FoldNoneMode // the RPA computation stays in the graph (parity checks, measuring the fold)
)

var foldNames = enum.Names[FoldMode]{"rpa", "rank", "rank-approx", "none"}

func (f FoldMode) String() string { return foldNames.String("fold", f) }

// ParseFold reads --fold: rpa, rank, rank-approx or none.
func ParseFold(s string) (FoldMode, error) { return foldNames.Parse("--fold", s) }

// MarshalText writes the mode's spelling.
func (f FoldMode) MarshalText() ([]byte, error) { return foldNames.Marshal("fold", f) }

// UnmarshalText reads the mode's spelling.
func (f *FoldMode) UnmarshalText(b []byte) error { return foldNames.Unmarshal("fold", f, b) }

// AttentionMode is how the export pipeline lowers attention (rpac export
// --attention; "attention" in manifests and provenance).
type AttentionMode uint8

// Attention lowerings of the export pipeline.
const (
	AttentionOp       AttentionMode = iota // one FusedAttention node per layer (ONNX Attention, opset 23; the default)
	AttentionOpPadded                      // AttentionOp with padded heads (pad_heads.go)
	AttentionPlain                         // MatMul, Add of one constant mask, Softmax, MatMul
	AttentionNone                          // leave the attention subgraph as built
)

var attentionNames = enum.Names[AttentionMode]{"op", "op8", "plain", "none"}

func (a AttentionMode) String() string { return attentionNames.String("attention", a) }

// ParseAttention reads --attention: op, op8, plain or none.
func ParseAttention(s string) (AttentionMode, error) {
	return attentionNames.Parse("--attention", s)
}

// MarshalText writes the lowering's spelling.
func (a AttentionMode) MarshalText() ([]byte, error) { return attentionNames.Marshal("attention", a) }

// UnmarshalText reads the lowering's spelling.
func (a *AttentionMode) UnmarshalText(b []byte) error {
	return attentionNames.Unmarshal("attention", a, b)
}

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
	Backend   kernels.Backend
	Fold      FoldMode
	Attention AttentionMode
	// Report receives FoldRPA's per-layer statistics.
	Report *FoldReport
}

func exportOptions(c *Context) (*ExportOptions, error) {
	if c == nil || c.ExportOptions == nil {
		return nil, errors.New("no export options (Context.ExportOptions)")
	}
	o := c.ExportOptions
	if o.Fold > FoldNoneMode {
		return nil, fmt.Errorf("fold mode %v: want %s", o.Fold, foldNames.List())
	}
	if o.Attention > AttentionNone {
		return nil, fmt.Errorf("attention lowering %v: want %s", o.Attention, attentionNames.List())
	}
	return o, nil
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
