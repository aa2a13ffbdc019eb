// Package passes holds rpac's graph passes and the ordered tables that run
// them. As in Go's SSA backend, passes are plain functions listed in order
// with a name; the verifier runs after every pass; a flag dumps the graph
// after any named pass; and a list of ordering constraints is checked at
// start-up so that nobody reorders passes by accident.
package passes

import (
	"fmt"
	"io"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// Context carries what passes need besides the graph.
type Context struct {
	Loss      string    // autodiff: the scalar output to differentiate
	DumpAfter string    // pass name after which to print the graph ("all" for every pass)
	Dump      io.Writer // where dumps go
	Export    bool      // verify as an export graph (no training-only ops)
	// FuseAttention asks the train and eval pipelines to fuse each
	// attention core (FuseTrainingAttention), for backends whose attention
	// kernels never hold the [B,H,T,T] weights.
	FuseAttention bool
	// FuseElementwise asks the train and eval pipelines to fuse chains of
	// elementwise ops (FuseElementwise), for backends with a
	// FusedElementwise kernel that saves the intermediates' traffic.
	FuseElementwise bool
	// AttentionLayout asks the train and eval pipelines to give the fused
	// attention cores the [B,T,H,D] layout (AttentionLayout), for backends
	// whose attention kernels take it.
	AttentionLayout bool
	// LMHeadChunk, when positive, is the chunk of rows the train and eval
	// pipelines give the fused LM heads (LMHeadChunk), for backends whose
	// GEMMs want more rows than ir.LMHeadChunk.
	LMHeadChunk int
	// JoinGrads asks the train pipeline to join the backward GEMMs of
	// Linears that read one input (JoinSiblingGrads), for backends whose
	// GEMMs gain from more output tiles and a deeper K.
	JoinGrads bool
	// RematDropout asks elementwise fusion to give each chain that reads
	// a Dropout's result a copy of the Dropout (FuseElementwiseRemat).
	RematDropout bool
	// Align is the width multiple the backend's graphs are built with
	// (kernels.Capabilities.Align): the builder's, read here by the
	// callers that build the graph this context then runs on.
	Align int
	// Experts is the dispatch of the mixture of experts asked for, and
	// RoutedExperts the backend's choice for DispatchAuto (set by
	// ForBackend); ExpertDispatch resolves the two. Like Align, they are
	// read by the callers that build the graph.
	Experts       Dispatch
	RoutedExperts bool
	// Model describes the graph's model (length, mode, running statistics);
	// the builder provides it (compiler/model's Graph.Info).
	Model *ModelInfo
	// ExportOptions are the inputs of the export passes (the store, the
	// backend that evaluates folded subgraphs, the fold and attention modes);
	// the export pipeline refuses to run without them.
	ExportOptions *ExportOptions
}

// ForBackend sets what a backend asks of the train and eval pipelines
// (FuseAttention, FuseElementwise, RematDropout, AttentionLayout,
// LMHeadChunk, JoinGrads, Align, RoutedExperts) from its capabilities.
func (c *Context) ForBackend(caps kernels.Capabilities) *Context {
	c.FuseAttention, c.FuseElementwise, c.AttentionLayout = caps.FusedAttention, caps.FusedElementwise, caps.AttentionBTHD
	c.RematDropout = caps.RematDropout
	c.LMHeadChunk, c.JoinGrads, c.Align = caps.LMHeadChunk, caps.JoinGrads, caps.Align
	c.RoutedExperts = caps.RoutedExperts
	return c
}

// ModelInfo is what the passes know of a model graph, given as types by
// the graph's builder rather than read back from names.
type ModelInfo struct {
	T, B int
	// Eval graphs are deterministic; BatchStats eval graphs take the RPA
	// statistics from the batch (they cannot be folded).
	Eval, BatchStats bool
	// Running lists the running-statistics buffers the graph reads.
	Running []RunningBuffer
	// Hooks are the outputs only training reads (StripTraining drops them).
	Hooks []string
	// Layers are the blocks with an attention bias, in order.
	Layers []LayerInfo
}

// LayerInfo is one block with an attention bias, as the builder made it.
type LayerInfo struct {
	Index int
	// Stored names the parameters and buffers of the block that its
	// attention bias is computed from (τ_att, the warm-in scale, the running
	// statistics).
	Stored []string
}

// layerOwners maps each stored tensor of Layers to its layer index.
func (m *ModelInfo) layerOwners() map[string]int {
	owner := map[string]int{}
	for _, l := range m.Layers {
		for _, name := range l.Stored {
			owner[name] = l.Index
		}
	}
	return owner
}

// RunningBuffer is one running-statistics buffer of a layer.
type RunningBuffer struct {
	Name  string
	Layer int
}

// Pass is one entry of a pipeline.
type Pass struct {
	Name string
	Fn   func(g *ir.Graph, c *Context) error
	// ExportAfter: from this pass on the graph must verify as an export graph.
	ExportAfter bool
}

// TrainPipeline turns a forward graph into a training step.
var TrainPipeline = []Pass{
	{Name: "fuse training attention", Fn: fuseIfAsked},
	{Name: "autodiff", Fn: func(g *ir.Graph, c *Context) error { return Autodiff(g, c.Loss) }},
	{Name: "dce", Fn: func(g *ir.Graph, c *Context) error { return DCE(g) }},
	{Name: "join sibling grads", Fn: joinGradsIfAsked},
	{Name: "attention layout", Fn: attentionLayoutIfAsked},
	{Name: "fuse elementwise", Fn: fuseElementwiseIfAsked},
	{Name: "fuse product sums", Fn: fuseProductSumsIfAsked},
	{Name: "lm head chunk", Fn: lmHeadChunkIfAsked},
}

// EvalPipeline cleans a forward graph for evaluation.
var EvalPipeline = []Pass{
	{Name: "fuse training attention", Fn: fuseIfAsked},
	{Name: "dce", Fn: func(g *ir.Graph, c *Context) error { return DCE(g) }},
	{Name: "attention layout", Fn: attentionLayoutIfAsked},
	{Name: "fuse elementwise", Fn: fuseElementwiseIfAsked},
	{Name: "lm head chunk", Fn: lmHeadChunkIfAsked},
}

func lmHeadChunkIfAsked(g *ir.Graph, c *Context) error {
	if c.LMHeadChunk <= 0 {
		return nil
	}
	LMHeadChunk(g, c.LMHeadChunk)
	return nil
}

// LMHeadChunk gives every LMHeadCrossEntropy and LMHeadCrossEntropyGrad
// node without a chunk attribute of its own a chunk of rows rows.
func LMHeadChunk(g *ir.Graph, rows int) {
	for _, n := range g.Nodes {
		if (n.Op == ir.OpLMHeadCrossEntropy || n.Op == ir.OpLMHeadCrossEntropyGrad) && n.Attrs.Int("chunk", 0) <= 0 {
			if n.Attrs == nil {
				n.Attrs = ir.Attrs{}
			}
			n.Attrs["chunk"] = rows
		}
	}
}

func joinGradsIfAsked(g *ir.Graph, c *Context) error {
	if !c.JoinGrads {
		return nil
	}
	return JoinSiblingGrads(g)
}

func attentionLayoutIfAsked(g *ir.Graph, c *Context) error {
	if !c.AttentionLayout {
		return nil
	}
	return AttentionLayout(g)
}

// fuseProductSumsIfAsked: backends that fuse elementwise chains also sum
// products without writing them (FuseProductSums).
func fuseProductSumsIfAsked(g *ir.Graph, c *Context) error {
	if !c.FuseElementwise {
		return nil
	}
	return FuseProductSums(g)
}

func fuseElementwiseIfAsked(g *ir.Graph, c *Context) error {
	if !c.FuseElementwise {
		return nil
	}
	if c.RematDropout {
		return FuseElementwiseRemat(g)
	}
	return FuseElementwise(g)
}

func fuseIfAsked(g *ir.Graph, c *Context) error {
	if !c.FuseAttention {
		return nil
	}
	return FuseTrainingAttention(g)
}

// Constraint says pass A must run before pass B in any pipeline holding both.
type Constraint struct{ A, B, Why string }

// Constraints are checked against every pipeline at start-up.
var Constraints = []Constraint{
	{"autodiff", "dce", "autodiff adds gradient outputs; dce must see them or it drops the backward pass"},
	{"fuse training attention", "autodiff", "the fused core's gradient is FusedAttentionGrad; fusing after autodiff would leave the unfused backward"},
	{"strip training", "fold rpa", "the fold must see frozen scales (bias warm-in, chaos) and no dropout"},
	{"fold rpa", "const fold", "the folded bias is what makes the RPA subgraph constant"},
	{"const fold", "dce", "folding leaves the old subgraph dead"},
	{"dce", "fuse attention", "fusion pattern-matches the cleaned graph"},
	{"autodiff", "fuse elementwise", "fused ops have no gradient rule: the backward must exist before fusion"},
	{"fuse training attention", "fuse elementwise", "attention fusion pattern-matches the unfused scale, mask and dropout ops"},
	{"dce", "fuse elementwise", "dead readers would keep intermediates from fusing"},
	{"fuse training attention", "attention layout", "the layout is a fused core's"},
	{"autodiff", "attention layout", "the core and its gradient change layout together"},
	{"autodiff", "join sibling grads", "it joins the gradient GEMMs autodiff makes"},
	{"join sibling grads", "fuse elementwise", "fusion would take the Adds it replaces into chains"},
	{"fuse elementwise", "fuse product sums", "a sum takes only the products fusion left as ops of their own; a Mul inside a chain keeps that chain's one write"},
	{"autodiff", "fuse product sums", "SumToProduct has no gradient rule: the backward must exist first"},
	{"autodiff", "lm head chunk", "the head's gradient node, which autodiff adds, takes the chunk too"},
}

// Pipelines lists every registered pipeline by name (export pipelines add
// themselves in their own files).
var Pipelines = map[string][]Pass{
	"train": TrainPipeline,
	"eval":  EvalPipeline,
}

// CheckOrder verifies a pipeline against Constraints.
func CheckOrder(p []Pass) error {
	pos := map[string]int{}
	for i, ps := range p {
		if _, dup := pos[ps.Name]; dup && ps.Name != "dce" {
			return fmt.Errorf("pass %q listed twice", ps.Name)
		}
		if _, seen := pos[ps.Name]; !seen {
			pos[ps.Name] = i
		}
	}
	for _, c := range Constraints {
		a, okA := pos[c.A]
		b, okB := pos[c.B]
		if okA && okB && a > b {
			return fmt.Errorf("pass %q must run before %q: %s", c.A, c.B, c.Why)
		}
	}
	return nil
}

func init() {
	for name, p := range Pipelines {
		if err := CheckOrder(p); err != nil {
			panic(fmt.Sprintf("passes: pipeline %s: %v", name, err))
		}
	}
}

// Run applies the passes in order, verifying after each one and dumping the
// graph after the pass named in c.DumpAfter.
func Run(g *ir.Graph, p []Pass, c *Context) error {
	if c == nil {
		c = &Context{}
	}
	if err := CheckOrder(p); err != nil {
		return err
	}
	if err := ir.Verify(g, false); err != nil {
		return fmt.Errorf("before passes: %w", err)
	}
	export := c.Export
	for _, ps := range p {
		if err := ps.Fn(g, c); err != nil {
			return fmt.Errorf("pass %s: %w", ps.Name, err)
		}
		export = export || ps.ExportAfter
		if err := ir.Verify(g, export); err != nil {
			return fmt.Errorf("after pass %s: %w", ps.Name, err)
		}
		if c.Dump != nil && (c.DumpAfter == ps.Name || c.DumpAfter == "all") {
			fmt.Fprintf(c.Dump, "// after pass %s\n%s", ps.Name, g)
		}
	}
	return nil
}

// Names lists a pipeline's pass names (for --dump-ir help).
func Names(p []Pass) []string {
	out := make([]string, len(p))
	for i, ps := range p {
		out[i] = ps.Name
	}
	return out
}
