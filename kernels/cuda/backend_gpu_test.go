package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
)

// opCase is one op of the IR table run on both backends.
type opCase struct {
	op    ir.OpName
	attrs ir.Attrs
	in    []ir.Shape
	ids   map[int]int // input index -> vocabulary of its i32 ids
	// ignore sets every third id of the i32 inputs to ir.IgnoreTarget (the
	// cross-entropy ops' targets).
	ignore bool
	pos    bool // positive float inputs (Log, Div, Sinkhorn)
	// build, when set, builds the graph instead of one Apply (ops that come
	// in pairs).
	build func(g *ir.Graph, in []*ir.Value) []*ir.Value
	// tol is the case's bound on the error relative to max(1, |cpu|)
	// (0: 1e-5).
	tol float64
}

// opCases covers every op of the IR table (TestOpCasesCoverTable checks).
func opCases() []opCase {
	s357 := ir.Shape{3, 5, 7}
	lmhead := func(g *ir.Graph, in []*ir.Value) []*ir.Value {
		a := ir.Attrs{"label_smoothing": 0.1, "chunk": 5}
		out := g.Apply("LMHeadCrossEntropy", a, in[0], in[1], in[2])
		grads := g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(0.7), in[0], in[1], in[2])
		return append(out, grads...)
	}
	cases := []opCase{
		{op: "Gather", in: []ir.Shape{{50, 13}, {4, 7}}, ids: map[int]int{1: 50}},
		{op: "GatherGrad", attrs: ir.Attrs{"vocab": 50}, in: []ir.Shape{{4, 7, 13}, {4, 7}}, ids: map[int]int{1: 50}},
		{op: "Slice", attrs: ir.Attrs{"axis": 1, "start": 1, "end": 4}, in: []ir.Shape{s357}},
		{op: "SliceGrad", attrs: ir.Attrs{"axis": 1, "start": 1, "end": 4, "shape": []int{3, 5, 7}}, in: []ir.Shape{{3, 3, 7}}},
		{op: "Reshape", attrs: ir.Attrs{"shape": []int{15, 7}}, in: []ir.Shape{s357}},
		{op: "Transpose", attrs: ir.Attrs{"perm": []int{2, 0, 1}}, in: []ir.Shape{s357}},
		{op: "BroadcastTo", attrs: ir.Attrs{"shape": []int{3, 5, 7}}, in: []ir.Shape{{5, 1}}},
		{op: "SumTo", attrs: ir.Attrs{"shape": []int{5, 1}}, in: []ir.Shape{s357}},
		{op: "SumToProduct", attrs: ir.Attrs{"shape": []int{5, 1}}, in: []ir.Shape{s357, s357}},
		{op: "Linear", in: []ir.Shape{s357, {9, 7}, {9}}},
		{op: "LinearGradX", in: []ir.Shape{{3, 5, 9}, {9, 7}}},
		{op: "LinearGradW", in: []ir.Shape{{3, 5, 9}, s357}},
		{op: "MatMul", in: []ir.Shape{{2, 3, 5, 7}, {2, 3, 7, 4}}},
		{op: "MatMul", attrs: ir.Attrs{"transA": true, "transB": true}, in: []ir.Shape{{2, 3, 7, 5}, {2, 3, 4, 7}}},
		{op: "Add", in: []ir.Shape{s357, {7}}},
		{op: "Sub", in: []ir.Shape{{5, 1}, s357}},
		{op: "Mul", in: []ir.Shape{s357, s357}},
		{op: "Div", in: []ir.Shape{s357, {3, 1, 7}}, pos: true},
		// Each op code once with both operands of the output's shape
		// (binary_dense_f32) and once broadcast (binary_f32): the Mul
		// above is the dense one, the Add, Sub and Div above broadcast.
		{op: "Add", in: []ir.Shape{s357, s357}},
		{op: "Sub", in: []ir.Shape{{1000}, {1000}}},
		{op: "Mul", in: []ir.Shape{{5, 1}, s357}},
		{op: "Div", in: []ir.Shape{s357, s357}, pos: true},
		{op: "ReduceSum", attrs: ir.Attrs{"axes": []int{1}, "keepdims": true}, in: []ir.Shape{s357}},
		{op: "ReduceMean", attrs: ir.Attrs{"axes": []int{0, 2}}, in: []ir.Shape{s357}},
		{op: "Softmax", in: []ir.Shape{{6, 33}}},
		{op: "SoftmaxGrad", in: []ir.Shape{{6, 33}, {6, 33}}},
		{op: "CausalMask", in: []ir.Shape{{2, 9, 9}}},
		{op: "LayerNorm", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{6, 33}, {33}, {33}}},
		// compiler/model's aligned widths: a head-blocked weight, a bias, a gradient
		{op: "Pad", attrs: ir.Attrs{"rows": []int{3, 85, 88}, "cols": []int{1, 37, 40}}, in: []ir.Shape{{255, 37}}},
		{op: "Pad", attrs: ir.Attrs{"cols": []int{1, 1021, 1024}}, in: []ir.Shape{{1021}}},
		{op: "PadGrad", attrs: ir.Attrs{"rows": []int{1, 37, 40}, "cols": []int{3, 85, 88}, "shape": []int{37, 255}}, in: []ir.Shape{{40, 264}}},
		{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{300, 33}, {300, 33}, {33}}},
		{op: "Dropout", attrs: ir.Attrs{"p": 0.3}, in: []ir.Shape{{6, 33}}},
		{op: "DropoutGrad", attrs: ir.Attrs{"p": 0.3, "stream": 5}, in: []ir.Shape{{6, 33}}},
		{op: "GumbelNoise", in: []ir.Shape{{6, 33}}},
		{op: "TopKMask", attrs: ir.Attrs{"k": 2}, in: []ir.Shape{{10, 4}}},
		{op: "CrossEntropy", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{12, 50}, {12}}, ids: map[int]int{1: 50}},
		{op: "CrossEntropyGrad", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{}, {12, 50}, {12}}, ids: map[int]int{2: 50}},
		{op: "LMHeadCrossEntropy", in: []ir.Shape{{12, 16}, {50, 16}, {12}}, ids: map[int]int{2: 50}, build: lmhead},
		{op: "LMHeadCrossEntropyGrad", in: []ir.Shape{{12, 16}, {50, 16}, {12}}, ids: map[int]int{2: 50}, build: lmhead},
		{op: "GaussianMembership", in: []ir.Shape{{12, 16}, {4, 16}, {4}}},
		{op: "GaussianMembershipGrad", in: []ir.Shape{{12, 4}, {12, 16}, {4, 16}, {4}, {12, 4}}},
		{op: "Sinkhorn", attrs: ir.Attrs{"iters": 3}, in: []ir.Shape{{4, 4}}, pos: true},
		{op: "SinkhornGrad", attrs: ir.Attrs{"iters": 3}, in: []ir.Shape{{4, 4}, {4, 4}}, pos: true},
		{op: "ZScore", in: []ir.Shape{{9, 9}}},
		{op: "ZScoreGrad", in: []ir.Shape{{9, 9}, {9, 9}}},
		{op: "FusedAttention", attrs: ir.Attrs{"scale": 0.4, "causal": true}, in: []ir.Shape{{2, 3, 9, 5}, {2, 3, 9, 5}, {2, 3, 9, 5}, {9, 9}}},
		{op: "FusedAttention", attrs: ir.Attrs{"scale": 0.4, "causal": true, "dropout": 0.25, "stream": 5}, in: []ir.Shape{{2, 3, 9, 5}, {2, 3, 9, 5}, {2, 3, 9, 5}}},
		{op: "FusedAttentionGrad", attrs: ir.Attrs{"scale": 0.4, "causal": true},
			in: []ir.Shape{{2, 3, 9, 5}, {2, 3, 9, 5}, {2, 3, 9, 5}, {2, 3, 9, 5}, {9, 9}}},
		{op: "FusedAttentionGrad", attrs: ir.Attrs{"scale": 0.4, "causal": true, "dropout": 0.25, "stream": 5},
			in: []ir.Shape{{2, 3, 9, 5}, {2, 3, 9, 5}, {2, 3, 9, 5}, {2, 3, 9, 5}, {9, 9}}},
		// the [B,T,H,Hd] layout
		{op: "FusedAttention", attrs: bthd(ir.Attrs{"scale": 0.4, "causal": true, "dropout": 0.25, "stream": 5}),
			in: []ir.Shape{{2, 9, 3, 5}, {2, 9, 3, 5}, {2, 9, 3, 5}, {9, 9}}},
		{op: "FusedAttentionGrad", attrs: bthd(ir.Attrs{"scale": 0.4, "causal": true, "dropout": 0.25, "stream": 5}),
			in: []ir.Shape{{2, 9, 3, 5}, {2, 9, 3, 5}, {2, 9, 3, 5}, {2, 9, 3, 5}, {9, 9}}},
		{op: "FusedElementwise", attrs: ir.Attrs{"shape": []int{3, 5, 7}, "body": ir.FusedBody{
			{Op: "Add", Args: []int{0, 1}},
			{Op: "Scale", Attrs: ir.Attrs{"alpha": 1.5, "beta": -0.25}, Args: []int{3}},
			{Op: "GELU", Args: []int{4}},
			{Op: "GELUGrad", Args: []int{2, 5}},
			{Op: "Mul", Args: []int{6, 1}},
			{Op: "Clamp", Attrs: ir.Attrs{"lo": -0.5, "hi": 0.5}, Args: []int{7}},
			{Op: "Sub", Args: []int{8, 0}},
		}}, in: []ir.Shape{s357, {7}, s357}},
		// dropout steps: each draws its stream's mask, as Dropout and
		// DropoutGrad do alone (p 0 keeps everything)
		{op: "FusedElementwise", attrs: ir.Attrs{"shape": []int{3, 5, 7}, "body": ir.FusedBody{
			{Op: "Mul", Args: []int{0, 1}},
			{Op: "Dropout", Attrs: ir.Attrs{"p": 0.3, "stream": 11}, Args: []int{2}},
			{Op: "DropoutGrad", Attrs: ir.Attrs{"p": 0.1, "stream": 12}, Args: []int{3}},
			{Op: "Dropout", Attrs: ir.Attrs{"p": 0.0, "stream": 13}, Args: []int{4}},
			{Op: "Add", Args: []int{5, 0}},
		}}, in: []ir.Shape{s357, {5, 1}}},
		// 300 tokens (two chunks of the route's scan), 12 wide, hidden 20:
		// tiles cut at the edges; the weights zero outside each token's
		// top 2 of 4 (one expert forward, one backward with dropout, one
		// without). The gradients sum products of the forward's values,
		// which carry the two backends' GEMM orders: 1.3e-5 measured
		{op: "ExpertFFN", in: expertIn, build: expertCase(1, 0.25, false)},
		{op: "ExpertFFNGrad", in: expertIn, build: expertCase(2, 0.25, true), tol: 3e-5},
		{op: "ExpertFFNGrad", in: expertIn, build: expertCase(0, 0, true), tol: 3e-5},
		{op: "Concat", attrs: ir.Attrs{"axis": 1}, in: []ir.Shape{{3, 2, 7}, s357, {3, 1, 7}}},
		{op: "Concat", attrs: ir.Attrs{"axis": -1}, in: []ir.Shape{{2, 3, 9, 5}, {2, 3, 9, 3}}},
	}
	cases = append(cases, opCase{op: "StopGradient", in: []ir.Shape{s357}})
	return append(cases, elementwiseCases(s357)...)
}

// expertIn are the inputs of the expert cases: x, w, W1, b1, W2, b2 and
// the output's gradient.
var expertIn = []ir.Shape{{3, 100, 12}, {3, 100, 4}, {20, 12}, {20}, {12, 20}, {12}, {3, 100, 12}}

// expertCase builds ExpertFFN of expert e (and its gradient) on weights
// w·TopKMask(w, 2): the output, or the gradients.
func expertCase(e int, p float64, grad bool) func(g *ir.Graph, in []*ir.Value) []*ir.Value {
	return func(g *ir.Graph, in []*ir.Value) []*ir.Value {
		w := g.Op1("Mul", nil, in[1], g.Op1("TopKMask", ir.Attrs{"k": 2}, in[1]))
		a := ir.Attrs{"expert": e, "p": p, "stream": 5, "stream2": 6, "top_k": 2}
		o := g.Apply(ir.OpExpertFFN, a, in[0], w, in[2], in[3], in[4], in[5])
		if !grad {
			return o[:1]
		}
		return g.Apply(ir.OpExpertFFNGrad, a, in[6], in[0], w, in[2], in[4], o[1], o[2], o[3])
	}
}

// elementwiseCases are the test cases of every op of ir.Elementwise
// (EwSpec.Cases), each over inputs of shape s.
func elementwiseCases(s ir.Shape) []opCase {
	var cases []opCase
	for _, spec := range ir.Elementwise {
		for _, c := range spec.Cases {
			in := []ir.Shape{s}
			if spec.NumIn() == 2 {
				in = append(in, s)
			}
			cases = append(cases, opCase{op: spec.Name, attrs: c.Attrs, in: in, pos: c.Positive})
		}
	}
	return cases
}

// TestOpCasesCoverTable: the parity table below names every op of the IR
// table (runs without a GPU).
func TestOpCasesCoverTable(t *testing.T) {
	have := map[ir.OpName]bool{}
	for _, c := range opCases() {
		have[c.op] = true
	}
	var missing []string
	for op := range ir.Ops {
		if !have[op] {
			missing = append(missing, string(op))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("ops without a CUDA parity case: %v", missing)
	}
}

// gpuBackend opens the CUDA backend, or skips (fails under
// RPAC_REQUIRE_GPU=1) without a GPU.
func gpuBackend(t *testing.T, gemm ir.Precision) *Backend {
	t.Helper()
	return gpuBackendWith(t, gemm, CandidateOptions())
}

// gpuBackendWith is gpuBackend taking the paths o chooses.
func gpuBackendWith(t *testing.T, gemm ir.Precision, o Options) *Backend {
	t.Helper()
	b, err := New(0, gemm, o)
	if err != nil {
		if os.Getenv("RPAC_REQUIRE_GPU") == "1" {
			t.Fatalf("RPAC_REQUIRE_GPU=1 and no usable GPU: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	t.Logf("%s", b.Name())
	return b
}

// bthd is a with the [B,T,H,Hd] attention layout.
func bthd(a ir.Attrs) ir.Attrs {
	ir.AttnBTHD.Set(a)
	return a
}

// caseGraph builds c's graph and random feeds.
func caseGraph(c opCase, r *rand.Rand) (*ir.Graph, map[string]*kernels.Tensor) {
	g := ir.New(string(c.op))
	feeds := map[string]*kernels.Tensor{}
	var vals []*ir.Value
	for i, s := range c.in {
		name := string(rune('a' + i))
		if V, ok := c.ids[i]; ok {
			vals = append(vals, g.Input(name, s, ir.I32))
			ids := make([]int32, s.Numel())
			for j := range ids {
				ids[j] = int32(r.IntN(V))
				if c.ignore && j%3 == 1 {
					ids[j] = ir.IgnoreTarget
				}
			}
			feeds[name] = kernels.IntTensor(s, ids)
			continue
		}
		vals = append(vals, g.Input(name, s, ir.F32))
		x := randF32(r, s.Numel(), 1)
		if c.pos {
			for j := range x {
				x[j] = float32(math.Exp(float64(x[j])))
			}
		}
		feeds[name] = &kernels.Tensor{Shape: s.Clone(), F32: x}
	}
	var outs []*ir.Value
	if c.build != nil {
		outs = c.build(g, vals)
	} else {
		outs = g.Apply(c.op, c.attrs, vals...)
	}
	for i, o := range outs {
		g.SetOutput(string(rune('p'+i)), o)
	}
	return g, feeds
}

// TestGPUBackendOpParity: every op's kernels through the CUDA backend
// against the CPU backend, both in float32, on the same inputs and seed
// (Dropout and GumbelNoise draw the same numbers on both).
func TestGPUBackendOpParity(t *testing.T) {
	checkParity(t, gpuBackend(t, ir.FP32), opCases(), 31)
}

// runBoth compiles g on the CPU and on be and returns each output as
// (cpu, cuda).
func runBoth(t *testing.T, what string, g *ir.Graph, feeds map[string]*kernels.Tensor, be kernels.Backend) map[string][2]*kernels.Tensor {
	t.Helper()
	res := map[string][2]*kernels.Tensor{}
	var progs [2]kernels.Program
	for i, b := range []kernels.Backend{cpu.New(ir.FP32), be} {
		p, err := b.Compile(g, nil, kernels.NewStore(ir.FP32))
		if err != nil {
			t.Fatalf("%s on %s: %v", what, b.Name(), err)
		}
		defer p.Close()
		if err := p.Run(feeds, 7); err != nil {
			t.Fatalf("%s on %s: %v", what, b.Name(), err)
		}
		progs[i] = p
	}
	for name := range g.Outputs {
		res[name] = [2]*kernels.Tensor{progs[0].Output(name), progs[1].Output(name)}
	}
	return res
}

// TestGPUBackendRejectsBadIDs: an id outside the table is an error, not a
// read out of bounds.
func TestGPUBackendRejectsBadIDs(t *testing.T) {
	be := gpuBackend(t, ir.FP32)
	g := ir.New("gather")
	w := g.Input("w", ir.Shape{5, 3}, ir.F32)
	ids := g.Input("ids", ir.Shape{2}, ir.I32)
	g.SetOutput("y", g.Op1("Gather", nil, w, ids))
	p, err := be.Compile(g, nil, kernels.NewStore(ir.FP32))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Run(map[string]*kernels.Tensor{"w": kernels.NewTensor(ir.FP32, ir.Shape{5, 3}),
		"ids": kernels.IntTensor(ir.Shape{2}, []int32{1, 5})}, 0)
	if err == nil {
		t.Fatal("id 5 of a 5-row table was accepted")
	}
	t.Log(err)
}

// TestOpCasesRunOnCPU: every case's graph is valid and runs on the CPU
// backend (the reference side of the parity test, checked without a GPU).
func TestOpCasesRunOnCPU(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, c := range opCases() {
		g, feeds := caseGraph(c, r)
		p, err := cpu.New(ir.FP32).Compile(g, nil, kernels.NewStore(ir.FP32))
		if err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		if err := p.Run(feeds, 7); err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		p.Close()
	}
}
