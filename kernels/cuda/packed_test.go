package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/perf"
	"github.com/rpac-dev/rpac/passes"
)

// packedGraph: h = GELU(x·s + b) with dropout (a chain with a broadcast
// input and a drawing step) of R×N, then y = h·Wᵀ, dW = dyᵀ·h and
// dx = dy2·W2 (dy2 = h2, a dense chain of R×M only LinearGradX reads),
// and y3 = LayerNorm(x)·W3ᵀ.
// With alsoRead, h is a graph output too, so only GEMMs no longer read it.
func packedGraph(R, K, N, M int, alsoRead bool) *ir.Graph {
	g := ir.New("packed")
	x := g.Input("x", ir.Shape{R, N}, ir.F32)
	b := g.Input("b", ir.Shape{N}, ir.F32)
	h := g.Op1("FusedElementwise", ir.Attrs{"shape": []int{R, N}, "body": ir.FusedBody{
		{Op: "Add", Args: []int{0, 1}},
		{Op: "GELU", Args: []int{2}},
		{Op: "Dropout", Attrs: ir.Attrs{"p": 0.2, "stream": 3}, Args: []int{3}},
	}}, x, b)
	W := g.Param("w", ir.Shape{K, N})
	g.SetOutput("y", g.Op1("Linear", nil, h, W))
	dy := g.Input("dy", ir.Shape{R, K}, ir.F32)
	g.SetOutput("dw", g.Op1("LinearGradW", nil, dy, h))
	z := g.Input("z", ir.Shape{R, M}, ir.F32)
	h2 := g.Op1("FusedElementwise", ir.Attrs{"shape": []int{R, M}, "body": ir.FusedBody{
		{Op: "Scale", Attrs: ir.Attrs{"alpha": 0.75, "beta": 0.125}, Args: []int{0}},
	}}, z)
	W2 := g.Param("w2", ir.Shape{M, N})
	g.SetOutput("dx", g.Op1("LinearGradX", nil, h2, W2))
	ln := g.Op1("LayerNorm", ir.Attrs{"eps": 1e-5}, x, g.Param("ln.g", ir.Shape{N}), g.Param("ln.b", ir.Shape{N}))
	g.SetOutput("y3", g.Op1("Linear", nil, ln, W))
	if alsoRead {
		g.SetOutput("h", h)
	}
	return g
}

// TestGPUPackedChainOutputs: under bf16 GEMMs a chain or a LayerNorm whose
// result only GEMMs read writes it as the padded bf16 copy (rows of 37 and 13
// elements: padding in every row), no conversion kernel runs for it, and
// the GEMMs' results equal those of the fp32 result converted, bit for
// bit; a result also read otherwise, and every result under fp32 GEMMs,
// stays fp32. On the simulator all of it again in differential mode.
func TestGPUPackedChainOutputs(t *testing.T) {
	differentially(t, []string{"f32_to_bf16_pad_kernel", "layernorm_fwd_bf16pad"}, func() { packedChainOutputs(t) })
}

func packedChainOutputs(t *testing.T) {
	const R, K, N, M = 45, 21, 37, 13
	r := rand.New(rand.NewPCG(91, 92))
	feeds := map[string]*kernels.Tensor{"x": randTensor(r, ir.Shape{R, N}), "b": randTensor(r, ir.Shape{N}),
		"dy": randTensor(r, ir.Shape{R, K}), "z": randTensor(r, ir.Shape{R, M})}
	weights := map[string]*kernels.Tensor{"w": randTensor(r, ir.Shape{K, N}), "w2": randTensor(r, ir.Shape{M, N}),
		"ln.g": randTensor(r, ir.Shape{N}), "ln.b": randTensor(r, ir.Shape{N})}
	names := []string{"y", "dw", "dx", "y3"}
	run := func(prec ir.Precision, pack, alsoRead bool) packRun {
		return runPacked(t, packedGraph(R, K, N, M, alsoRead), prec, pack, weights, feeds, names)
	}
	on, off := run(ir.BF16, true, false), run(ir.BF16, false, false)
	if on.packed != 3 || off.packed != 0 {
		t.Fatalf("bf16: %d results packed (want 3), %d with packing off (want 0)", on.packed, off.packed)
	}
	// h for y and for dw (two sides), h2 for dx, the LayerNorm's for y3
	if cvt := "f32_to_bf16_pad_kernel"; off.launches[cvt]-on.launches[cvt] != 4 {
		t.Errorf("bf16: %d conversions packed, %d not; want 4 fewer", on.launches[cvt], off.launches[cvt])
	}
	sameOutputs(t, "bf16", on, off)
	if read := run(ir.BF16, true, true); read.packed != 2 {
		t.Errorf("h also an output: %d results packed, want 2 (h2, the LayerNorm's)", read.packed)
	} else {
		sameOutputs(t, "h also an output", read, off)
	}
	if f32 := run(ir.FP32, true, false); f32.packed != 0 {
		t.Errorf("fp32 GEMMs: %d chains packed", f32.packed)
	}
	h2 := make([]float32, R*M) // dx against its own reference: dy2 = 0.75·z + 0.125
	for i, v := range feeds["z"].F32 {
		h2[i] = 0.75*v + 0.125
	}
	closeTo(t, "dx", on.outs["dx"], matmulRef(h2, weights["w2"].F32, 1, R, N, M, false, false, true), 1e-4)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestSoftmaxCEAndAlign: a row of logits past the shared memory's opt-in
// takes the kernel that reads it twice; fp32 GEMMs keep the model's
// widths unpadded.
func TestSoftmaxCEAndAlign(t *testing.T) {
	// a row of logits past the shared memory's opt-in: the kernel that reads it twice
	if be, err := NewDryRun(ir.BF16, CandidateOptions()); err != nil {
		t.Fatal(err)
	} else if k, shared := be.softmaxCE(60000); k != "softmax_ce_fused_f32" || shared != 0 {
		t.Errorf("60,000 logits a row: %s with %d bytes of shared memory; want softmax_ce_fused_f32 with none", k, shared)
	}
	// fp32 GEMMs gain nothing from the padded widths: their graphs keep the model's
	be, err := NewDryRun(ir.FP32, CandidateOptions())
	if err != nil {
		t.Fatal(err)
	}
	if a := be.Capabilities().Align; a != 0 {
		t.Errorf("fp32 GEMMs: alignment %d; want 0", a)
	}
}

// twinGraph: h = 1.5·a − 0.25 (R×N), read by y = h·Wᵀ and by its column
// sum sh (a bias gradient's shape of read); and the joined gradients of
// three Linears over parts c_i = 0.5·u_i + 0.125 of widths 13, 30 and 21
// (odd: the parts' columns share the Concat's 16-byte groups), each part
// also summed (sc_i): D = Concat(c_i) (lazy), dw = LinearGradW(D, x),
// dx = LinearGradX(D, Concat(w_i)).
func twinGraph(R, K, N int, widths []int) *ir.Graph {
	g := ir.New("twins")
	a := g.Input("a", ir.Shape{R, N}, ir.F32)
	h := g.Op1("FusedElementwise", ir.Attrs{"shape": []int{R, N}, "body": ir.FusedBody{
		{Op: "Scale", Attrs: ir.Attrs{"alpha": 1.5, "beta": -0.25}, Args: []int{0}},
	}}, a)
	g.SetOutput("y", g.Op1("Linear", nil, h, g.Param("w", ir.Shape{K, N})))
	g.SetOutput("sh", g.Op1("SumTo", ir.Attrs{"shape": []int{N}}, h))
	var parts []*ir.Value
	for i, n := range widths {
		u := g.Input(string(rune('u'+i)), ir.Shape{R, n}, ir.F32)
		c := g.Op1("FusedElementwise", ir.Attrs{"shape": []int{R, n}, "body": ir.FusedBody{
			{Op: "Scale", Attrs: ir.Attrs{"alpha": 0.5, "beta": 0.125}, Args: []int{0}},
		}}, u)
		g.SetOutput("sc"+string(rune('0'+i)), g.Op1("SumTo", ir.Attrs{"shape": []int{n}}, c))
		parts = append(parts, c)
	}
	addJoinedGrads(g, g.Input("x", ir.Shape{R, K}, ir.F32), parts, true)
	return g
}

// TestGPUTwinCopies: under bf16 GEMMs a chain whose result a GEMM and a
// column sum read writes a bf16 copy beside it (no conversion for the
// GEMM), and the chains making a lazy Concat's parts write its bf16 rows
// (no f32_cat_to_bf16_pad_kernel); every output equals the one without
// copies bit for bit. On the simulator all of it again in differential
// mode.
func TestGPUTwinCopies(t *testing.T) {
	differentially(t, []string{"f32_to_bf16_pad_kernel"}, func() { twinCopies(t) })
}

func twinCopies(t *testing.T) {
	const R, K, N = 45, 21, 37
	widths := []int{13, 30, 21}
	r := rand.New(rand.NewPCG(93, 94))
	feeds := map[string]*kernels.Tensor{"a": randTensor(r, ir.Shape{R, N}), "x": randTensor(r, ir.Shape{R, K})}
	weights := map[string]*kernels.Tensor{"w": randTensor(r, ir.Shape{K, N})}
	for i, n := range widths {
		feeds[string(rune('u'+i))] = randTensor(r, ir.Shape{R, n})
		weights[string(rune('p'+i))] = randTensor(r, ir.Shape{n, K})
	}
	names := []string{"y", "sh", "dw", "dx", "sc0", "sc1", "sc2"}
	on := runPacked(t, twinGraph(R, K, N, widths), ir.BF16, true, weights, feeds, names)
	off := runPacked(t, twinGraph(R, K, N, widths), ir.BF16, false, weights, feeds, names)
	if on.twins != 2 || off.twins != 0 { // h's copy and the Concat's rows
		t.Fatalf("%d bf16 copies written by chains (want 2), %d with them off (want 0)", on.twins, off.twins)
	}
	if ct := "f32_cat_to_bf16_pad_kernel"; on.launches[ct] != 0 || off.launches[ct] != 1 {
		t.Errorf("Concat conversions: %d with the parts writing its rows (want 0), %d without (want 1)", on.launches[ct], off.launches[ct])
	}
	if cvt := "f32_to_bf16_pad_kernel"; off.launches[cvt]-on.launches[cvt] != 1 {
		t.Errorf("conversions: %d with copies, %d without; want 1 fewer (h for y)", on.launches[cvt], off.launches[cvt])
	}
	sameOutputs(t, "copies", on, off)
}

// TestTwinPool: a copy's buffer is reused by a later copy of the same size
// once the last node reading it has run, never while it is read, and the
// pool stops at twinPoolBytes.
func TestTwinPool(t *testing.T) {
	be, err := NewDryRun(ir.BF16, CandidateOptions())
	if err != nil {
		t.Fatal(err)
	}
	p := &program{be: be}
	a, _, _ := p.twinBuffer(1024, 0, 5)
	b, _, _ := p.twinBuffer(1024, 3, 8) // a still read
	c, _, _ := p.twinBuffer(1024, 6, 9) // a free after 5
	d, _, _ := p.twinBuffer(2048, 10, 11)
	if a.Ptr == b.Ptr || c.Ptr != a.Ptr || d.Ptr == a.Ptr || d.Ptr == b.Ptr || len(p.twinPool) != 3 {
		t.Errorf("buffers a %#x b %#x c %#x d %#x, %d in the pool; want c = a and three buffers", a.Ptr, b.Ptr, c.Ptr, d.Ptr, len(p.twinPool))
	}
	if _, ok, _ := p.twinBuffer(twinPoolBytes, 20, 21); ok {
		t.Error("a buffer past twinPoolBytes was given")
	}
	p.free()
}

// packRun is one run of a graph for the packing tests: its named outputs,
// how many values the program packed and gave twins, and the launches of
// each kernel.
type packRun struct {
	outs                map[string][]float32
	packed, twins, cats int // values packed, given twins, lazy Concats converted from their parts
	// sums: reductions folded into chains; unwritten: chains folding a
	// sum that write no fp32 result
	sums, unwritten int
	launches        map[string]int
	gemms           []GemmShape // the GEMMs run, in order
}

// runPacked compiles g with GEMM precision prec and packing as asked over
// weights, runs it once on feeds and reads the named outputs.
func runPacked(t *testing.T, g *ir.Graph, prec ir.Precision, pack bool, weights, feeds map[string]*kernels.Tensor, names []string) packRun {
	t.Helper()
	o := CandidateOptions()
	o.Pack = pack
	return runOn(t, gpuBackendWith(t, prec, o), g, weights, feeds, names)
}

// runOn compiles g on be over weights, runs it once on feeds and reads the
// named outputs (the launches and GEMMs counted are this run's: a trace
// already on be is reset).
func runOn(t *testing.T, be *Backend, g *ir.Graph, weights, feeds map[string]*kernels.Tensor, names []string) packRun {
	t.Helper()
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	tr.Reset()
	st := kernels.NewStore(ir.FP32)
	for name, w := range weights {
		copy(must(st.Ensure(name, w.Shape)).F32, w.F32)
	}
	p, err := be.Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Release(st)
	defer p.Close()
	if err := p.Run(feeds, 5); err != nil {
		t.Fatal(err)
	}
	prog := p.(*program)
	res := packRun{outs: map[string][]float32{}, packed: len(prog.packed), twins: len(prog.twins), cats: len(prog.cats),
		sums: len(prog.sums), launches: map[string]int{}}
	for name, src := range prog.gen {
		if reportName(name) == fusedGenSum && !strings.Contains(src, "out[i] =") {
			res.unwritten++
		}
	}
	for _, name := range names {
		res.outs[name] = append([]float32(nil), p.Output(name).F32...)
	}
	for _, e := range tr.Events() {
		res.launches[e.Name]++
		if e.Kind == perf.EvGEMM {
			res.gemms = append(res.gemms, e.Shape)
		}
	}
	return res
}

// sameOutputs fails unless a's outputs are b's, bit for bit.
func sameOutputs(t *testing.T, what string, a, b packRun) {
	t.Helper()
	for name, x := range b.outs {
		for i, v := range x {
			if a.outs[name][i] != v {
				t.Fatalf("%s: %s[%d] = %g, %g without", what, name, i, a.outs[name][i], v)
			}
		}
	}
}

// randTensor is a tensor of shape s with N(0, 1) values.
func randTensor(r *rand.Rand, s ir.Shape) *kernels.Tensor {
	return &kernels.Tensor{Shape: s, F32: randF32(r, s.Numel(), 1)}
}

// TestGPUTwinSharedPart: a chain's result that is a part of two lazy
// Concats writes its columns of one Concat's bf16 rows only; the other
// Concat is converted from its fp32 parts; both weight gradients equal
// the run without copies bit for bit.
func TestGPUTwinSharedPart(t *testing.T) {
	const R, K = 45, 21
	g := ir.New("shared")
	x := g.Input("x", ir.Shape{R, K}, ir.F32)
	var c []*ir.Value
	for i, n := range []int{13, 30, 21} {
		u := g.Input(string(rune('u'+i)), ir.Shape{R, n}, ir.F32)
		c = append(c, g.Op1("FusedElementwise", ir.Attrs{"shape": []int{R, n}, "body": ir.FusedBody{
			{Op: "Scale", Attrs: ir.Attrs{"alpha": 0.5, "beta": 0.125}, Args: []int{0}},
		}}, u))
	}
	for i, parts := range [][]*ir.Value{{c[0], c[1]}, {c[1], c[2]}} {
		d := g.Op1("Concat", ir.Attrs{"axis": -1, "lazy": true}, parts...)
		g.SetOutput("dw"+string(rune('0'+i)), g.Op1("LinearGradW", nil, d, x))
	}
	r := rand.New(rand.NewPCG(95, 96))
	feeds := map[string]*kernels.Tensor{"x": randTensor(r, ir.Shape{R, K}), "u": randTensor(r, ir.Shape{R, 13}),
		"v": randTensor(r, ir.Shape{R, 30}), "w": randTensor(r, ir.Shape{R, 21})}
	on := runPacked(t, g, ir.BF16, true, nil, feeds, []string{"dw0", "dw1"})
	off := runPacked(t, g, ir.BF16, false, nil, feeds, []string{"dw0", "dw1"})
	if on.twins != 1 || on.launches["f32_cat_to_bf16_pad_kernel"] != 1 {
		t.Errorf("%d Concats written by their parts (want 1), %d converted (want 1)", on.twins, on.launches["f32_cat_to_bf16_pad_kernel"])
	}
	sameOutputs(t, "shared part", on, off)
}

// TestGPUAttentionGradIntoConcat: the GEMM attention's backward ([B,T,H,Hd]
// operands, a bias, dropout) writes dq, dk and dv as bf16 straight into
// the rows of the lazy Concat that joins them (through their Reshapes to
// [B,T,H·Hd]), so no fp32 unpack and no f32_cat_to_bf16_pad_kernel runs
// for them; the joined gradients and the bias gradient equal the run
// without it bit for bit, whether the GEMMs write dq, dk, dv as bf16
// (Options.AGLean, the default) or fp32. On the simulator again in
// differential mode.
func TestGPUAttentionGradIntoConcat(t *testing.T) {
	differentially(t, []string{"attn_unpack_bf16"}, func() { attentionGradIntoConcat(t) })
}

// The attention tests' operands: [B,T,H,Hd] rows as the projections
// leave them (the paper's head of 85), a [T,T] bias, dropout; K is the
// width of the Linear around them.
const atB, atT, atH, atHd, atK = 2, 67, 3, 85, 21

// attnInputs adds the named [B,T,H,Hd] inputs and the bias to g, with
// random feeds (x [B,T,K] too), and returns the attention's attributes.
func attnInputs(g *ir.Graph, r *rand.Rand, names ...string) ([]*ir.Value, map[string]*kernels.Tensor, ir.Attrs) {
	attrs := ir.Attrs{"scale": 1 / math.Sqrt(atHd), "causal": true, "dropout": 0.1, "stream": 3}
	ir.AttnBTHD.Set(attrs)
	feeds := map[string]*kernels.Tensor{}
	var in []*ir.Value
	for _, name := range append(names, "bias") {
		s := ir.Shape{atB, atT, atH, atHd}
		if name == "bias" {
			s = ir.Shape{atT, atT}
		}
		in = append(in, g.Input(name, s, ir.F32))
		feeds[name] = randTensor(r, s)
	}
	feeds["x"] = randTensor(r, ir.Shape{atB, atT, atK})
	return in, feeds, attrs
}

func attentionGradIntoConcat(t *testing.T) {
	const B, T, H, Hd, K = atB, atT, atH, atHd, atK
	g := ir.New("attn-concat")
	r := rand.New(rand.NewPCG(97, 98))
	in, feeds, attrs := attnInputs(g, r, "dO", "q", "k", "v")
	grads := g.Apply("FusedAttentionGrad", attrs, in...)
	var parts []*ir.Value
	for _, j := range []int{2, 1, 0} { // dv, dk, dq, as the train graph joins them
		parts = append(parts, g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, H * Hd}}, grads[j]))
	}
	g.SetOutput("db", grads[3])
	addJoinedGrads(g, g.Input("x", ir.Shape{B, T, K}, ir.F32), parts, true)
	weights := map[string]*kernels.Tensor{}
	for i := range parts {
		weights[string(rune('p'+i))] = randTensor(r, ir.Shape{H * Hd, K})
	}
	names := []string{"dw", "dx", "db"}
	on := runPacked(t, g, ir.BF16, true, weights, feeds, names)
	off := runPacked(t, g, ir.BF16, false, weights, feeds, names)
	if on.launches["attn_unpack_bf16"] != 3 || on.launches["f32_cat_to_bf16_pad_kernel"] != 0 {
		t.Errorf("%d bf16 unpacks (want 3), %d Concat conversions (want 0)", on.launches["attn_unpack_bf16"], on.launches["f32_cat_to_bf16_pad_kernel"])
	}
	if off.launches["attn_unpack_bf16"] != 0 || off.launches["f32_cat_to_bf16_pad_kernel"] != 1 {
		t.Errorf("without: %d bf16 unpacks (want 0), %d Concat conversions (want 1)", off.launches["attn_unpack_bf16"], off.launches["f32_cat_to_bf16_pad_kernel"])
	}
	sameOutputs(t, "attention gradients into the Concat", on, off)
	// fp32 GEMM results, which attn_unpack_bf16 rounds (AGLean off)
	lean := CandidateOptions()
	lean.AGLean = false
	whole := runOn(t, gpuBackendWith(t, ir.BF16, lean), g, weights, feeds, names)
	if whole.launches["attn_unpack_bf16"] != 3 {
		t.Errorf("AGLean off: %d bf16 unpacks (want 3)", whole.launches["attn_unpack_bf16"])
	}
	sameOutputs(t, "attention gradients into the Concat from fp32 results", whole, off)
}

// TestGPUAttentionOutTwin: the GEMM attention's forward ([B,T,H,Hd], a
// bias, dropout) whose output a Linear reads through a Reshape to
// [B,T,H·Hd] and the graph reads as it is writes the Linear's bf16 copy
// beside the output (one conversion fewer); the output and the Linear's
// result equal the run without it bit for bit. On the simulator again in
// differential mode.
func TestGPUAttentionOutTwin(t *testing.T) {
	differentially(t, []string{"attn_unpack_f32"}, func() { attentionOutTwin(t) })
}

func attentionOutTwin(t *testing.T) {
	const B, T, H, Hd, K = atB, atT, atH, atHd, atK
	g := ir.New("attn-out")
	r := rand.New(rand.NewPCG(99, 100))
	in, feeds, attrs := attnInputs(g, r, "q", "k", "v")
	o := g.Op1("FusedAttention", attrs, in...)
	g.SetOutput("o", o)
	r2 := g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, H * Hd}}, o)
	g.SetOutput("y", g.Op1("Linear", nil, r2, g.Param("w", ir.Shape{K, H * Hd})))
	weights := map[string]*kernels.Tensor{"w": randTensor(r, ir.Shape{K, H * Hd})}
	on := runPacked(t, g, ir.BF16, true, weights, feeds, []string{"o", "y"})
	off := runPacked(t, g, ir.BF16, false, weights, feeds, []string{"o", "y"})
	if cvt := "f32_to_bf16_pad_kernel"; on.twins != 1 || off.twins != 0 || off.launches[cvt]-on.launches[cvt] != 1 {
		t.Errorf("copies %d and %d (want 1 and 0); conversions %d and %d (want one fewer)", on.twins, off.twins, on.launches[cvt], off.launches[cvt])
	}
	sameOutputs(t, "the attention's output copy", on, off)
}

// halfGraph: y = x·Wᵀ + b and dx = dy·W, each read only by a chain of
// exact steps (negation, then a doubling: −2·v, whose bf16 rounding is the
// rounding of v doubled and negated).
func halfGraph(R, N, K int) *ir.Graph {
	g := ir.New("half")
	w, b := g.Param("w", ir.Shape{N, K}), g.Param("b", ir.Shape{N})
	x := g.Input("x", ir.Shape{R, K}, ir.F32)
	dy := g.Input("dy", ir.Shape{R, N}, ir.F32)
	twice := func(v *ir.Value) *ir.Value {
		return g.Op1("Scale", ir.Attrs{"alpha": 2.0, "beta": 0.0}, g.Op1("Neg", nil, v))
	}
	g.SetOutput("y", twice(g.Op1("Linear", nil, x, w, b)))
	g.SetOutput("dx", twice(g.Op1("LinearGradX", nil, dy, w)))
	return g
}

// TestSimHalfOutputs: with Options.BF16Act a Linear's and a
// LinearGradX's results that only a generated chain reads are written as
// bf16 by the GEMM (the bias added before the rounding; a device whose
// cuBLASLt has no bf16 result with an fp32 bias keeps the biased Linear's
// fp32, which the simulator's has) and the chain reads
// them so: its output is the fp32 run's rounded to bf16 (bit for bit on the
// simulator, whose GEMM sums in the same order whatever C's type; within
// one bf16 step on a GPU), and the step moves fewer bytes. On the simulator
// again in differential mode.
func TestSimHalfOutputs(t *testing.T) {
	differentially(t, []string{fusedGenPrefix + "*"}, func() { halfOutputs(t) })
}

func halfOutputs(t *testing.T) {
	d := parityDevice(t)
	const R, N, K = 37, 88, 64
	r := rand.New(rand.NewPCG(61, 62))
	st := kernels.NewStore(ir.FP32)
	wt, _ := st.Ensure("w", ir.Shape{N, K})
	bt, _ := st.Ensure("b", ir.Shape{N})
	copy(wt.F32, randF32(r, N*K, 1))
	copy(bt.F32, randF32(r, N, 1))
	feeds := map[string]*kernels.Tensor{
		"x":  {Shape: ir.Shape{R, K}, F32: randF32(r, R*K, 1)},
		"dy": {Shape: ir.Shape{R, N}, F32: randF32(r, R*N, 1)},
	}
	biasOK := true // the device's cuBLASLt has a bf16 result with the fp32 bias epilogue
	run := func(act bool) (y, dx []float32, gemmBytes float64) {
		o := CandidateOptions()
		o.BF16Act = act
		be := gpuBackendWith(t, ir.BF16, o)
		biasOK = be.halfBiasOK()
		g := halfGraph(R, N, K)
		if err := passes.FuseElementwise(g); err != nil {
			t.Fatal(err)
		}
		tr, err := be.StartTrace()
		if err != nil {
			t.Fatal(err)
		}
		p := runProgram(t, be, g, st, feeds)
		defer p.Close()
		for _, e := range tr.Events() {
			if e.Kind == perf.EvGEMM {
				gemmBytes += e.Bytes
			}
		}
		be.Release(st)
		return slices.Clone(p.Output("y").F32), slices.Clone(p.Output("dx").F32), gemmBytes
	}
	y32, dx32, bytes32 := run(false)
	y16, dx16, bytes16 := run(true)
	if d.Simulated() && !biasOK {
		t.Error("the simulator's cuBLASLt has no bf16 result with an fp32 bias")
	}
	halves := []struct {
		name       string
		half, full []float32
	}{{"LinearGradX", dx16, dx32}}
	saved := 2 * float64(R*K)
	if biasOK {
		halves = append(halves, struct {
			name       string
			half, full []float32
		}{"Linear", y16, y32})
		saved += 2 * float64(R*N)
	} else if !sameBits(y16, y32) { // the biased Linear keeps its fp32 result
		t.Error("Linear: the result differs though it stayed fp32")
	}
	if want := bytes32 - saved; bytes16 != want {
		t.Errorf("GEMM bytes %g with bf16 results, %g without; want 2 bytes less per result element (%g)", bytes16, bytes32, want)
	}
	for _, c := range halves {
		for i, v := range c.full {
			want := float32(roundBF16(v))
			got := c.half[i]
			if d.Simulated() && math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("%s [%d]: %g from the bf16 result, want %g (the fp32 run's %g rounded)", c.name, i, got, want, v)
			}
			if ulp := math.Abs(float64(want)) / 128; math.Abs(float64(got-want)) > ulp {
				t.Fatalf("%s [%d]: %g from the bf16 result, want %g within a bf16 step", c.name, i, got, want)
			}
		}
	}
}

// TestSimHalfAttentionOperands: with Options.BF16Act the projections
// whose results only GEMM-path attentions read, through Reshapes to
// [B,T,H,Hd], as q, k and v, write them as bf16, which the attention's
// packs copy instead of rounding: the same bits (bit for bit on the
// simulator), and the packs read half the bytes; on the flash path, which
// reads them in fp32, they stay fp32. Normal and differential.
func TestSimHalfAttentionOperands(t *testing.T) {
	differentially(t, []string{"attn_pack_bf16"}, func() { halfAttentionOperands(t) })
}

func halfAttentionOperands(t *testing.T) {
	d := parityDevice(t)
	path := AttentionGEMM // the flash case below sets it
	const B, T, H, Hd, K = atB, atT, atH, 88, 64
	r := rand.New(rand.NewPCG(91, 92))
	g := ir.New("half-attention")
	x := g.Input("x", ir.Shape{B, T, K}, ir.F32)
	st := kernels.NewStore(ir.FP32)
	var qkv []*ir.Value
	for _, name := range []string{"wq", "wk", "wv"} {
		w, _ := st.Ensure(name, ir.Shape{H * Hd, K})
		copy(w.F32, randF32(r, H*Hd*K, 0.2))
		y := g.Op1("Linear", nil, x, g.Param(name, ir.Shape{H * Hd, K}))
		qkv = append(qkv, g.Op1("Reshape", ir.Attrs{"shape": []int{B, T, H, Hd}}, y))
	}
	attrs := ir.Attrs{"scale": 1 / math.Sqrt(Hd), "causal": true, "dropout": 0.1, "stream": 3}
	ir.AttnBTHD.Set(attrs)
	g.SetOutput("o", g.Apply("FusedAttention", attrs, qkv...)[0])
	feeds := map[string]*kernels.Tensor{"x": randTensor(r, ir.Shape{B, T, K})}
	run := func(act bool) ([]float32, float64) {
		o := CandidateOptions()
		o.Attention, o.BF16Act = path, act
		be := gpuBackendWith(t, ir.BF16, o)
		tr, err := be.StartTrace()
		if err != nil {
			t.Fatal(err)
		}
		p, err := be.Compile(g, passes.Plan(g), st) // the plan a step has: the Reshapes share their input's slot
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.Run(feeds, 0); err != nil {
			t.Fatal(err)
		}
		packBytes := 0.0
		for _, e := range tr.Events() {
			if e.Name == "attn_pack_bf16" {
				packBytes += e.Bytes
			}
		}
		be.Release(st)
		return slices.Clone(p.Output("o").F32), packBytes
	}
	full, fullBytes := run(false)
	half, halfBytes := run(true)
	if want := fullBytes - 3*2*float64(B*T*H*Hd); halfBytes != want {
		t.Errorf("the packs read %g bytes from bf16 projections, %g from fp32; want %g", halfBytes, fullBytes, want)
	}
	if d.Simulated() && !sameBits(half, full) {
		t.Error("the attention's output differs with its operands written as bf16 by their GEMMs")
	}
	closeTo(t, "attention output", half, float64s(full), 1e-5)
	// on flash.cu's kernels, which read q, k and v in fp32, the projections
	// stay fp32: the same output with and without
	path = AttentionFlash
	flash32, _ := run(false)
	flash16, _ := run(true)
	if !sameBits(flash16, flash32) {
		t.Error("the flash path: the output differs with BF16Act (a projection written as bf16 for kernels that read fp32)")
	}
}
