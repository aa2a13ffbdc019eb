package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// chainSumGraph has the reads a chain's column sum comes with in a train
// step, over rows of B·T:
//   - h = dropout(GELU(a + b)) [B,T,N], read by a Linear and summed to [N]
//     (a bias gradient beside a GEMM: the chain writes the bf16 copy and
//     the sum, no fp32 result);
//   - h2 = 0.75·a2 + 0.125 [B,T,M], its mean over B and T taken and the
//     value a graph output too (the fp32 result stays);
//   - h3 = a3·gate, gate [B,T,1] broadcast (a two-dim view), only summed;
//   - parts c_i = 0.5·u_i − 0.25 [B·T, w_i], each summed and joined by a
//     lazy Concat into two GEMMs (the Concat's columns and the sums);
//   - h4 = a3 − 1, summed over its last axis (a row sum);
//   - e = 2·s [5,7,9] summed over its first two axes (35 rows: one chunk);
//   - h5 = 0.5·a3 + 0.25, only the row sums of its products with z read
//     (SumToProduct(h5, z) to [B,T,1], a gate's gradient), and h6 = a2 − 2,
//     the column sums of z·h6 (the chain's result the second factor);
//   - h8 = 3·z, the row sums of h8·h8 (a factor twice: not folded).
func chainSumGraph(B, T, N, M, K int, widths []int) *ir.Graph {
	g := ir.New("chain-sums")
	chain := func(shape []int, body ir.FusedBody, in ...*ir.Value) *ir.Value {
		return g.Op1("FusedElementwise", ir.Attrs{"shape": shape, "body": body}, in...)
	}
	scale := func(alpha, beta float64) ir.FusedBody {
		return ir.FusedBody{{Op: "Scale", Attrs: ir.Attrs{"alpha": alpha, "beta": beta}, Args: []int{0}}}
	}
	a := g.Input("a", ir.Shape{B, T, N}, ir.F32)
	h := chain([]int{B, T, N}, ir.FusedBody{
		{Op: "Add", Args: []int{0, 1}},
		{Op: "GELU", Args: []int{2}},
		{Op: "Dropout", Attrs: ir.Attrs{"p": 0.2, "stream": 3}, Args: []int{3}},
	}, a, g.Input("b", ir.Shape{N}, ir.F32))
	g.SetOutput("y", g.Op1("Linear", nil, h, g.Param("w", ir.Shape{K, N})))
	g.SetOutput("sh", g.Op1("SumTo", ir.Attrs{"shape": []int{N}}, h))

	h2 := chain([]int{B, T, M}, scale(0.75, 0.125), g.Input("a2", ir.Shape{B, T, M}, ir.F32))
	g.SetOutput("mh2", g.Op1("ReduceMean", ir.Attrs{"axes": []int{0, 1}}, h2))
	g.SetOutput("h2", h2)

	a3 := g.Input("a3", ir.Shape{B, T, M}, ir.F32)
	h3 := chain([]int{B, T, M}, ir.FusedBody{{Op: "Mul", Args: []int{0, 1}}}, a3, g.Input("gate", ir.Shape{B, T, 1}, ir.F32))
	g.SetOutput("sh3", g.Op1("ReduceSum", ir.Attrs{"axes": []int{0, 1}}, h3))
	h4 := chain([]int{B, T, M}, scale(1, -1), a3)
	g.SetOutput("sh4", g.Op1("ReduceSum", ir.Attrs{"axes": []int{2}}, h4))

	var parts []*ir.Value
	for i, w := range widths {
		c := chain([]int{B * T, w}, scale(0.5, -0.25), g.Input(string(rune('u'+i)), ir.Shape{B * T, w}, ir.F32))
		g.SetOutput("sc"+string(rune('0'+i)), g.Op1("SumTo", ir.Attrs{"shape": []int{w}}, c))
		parts = append(parts, c)
	}
	addJoinedGrads(g, g.Input("x", ir.Shape{B * T, K}, ir.F32), parts, true)

	e := chain([]int{5, 7, 9}, scale(2, 0), g.Input("s", ir.Shape{5, 7, 9}, ir.F32))
	g.SetOutput("se", g.Op1("SumTo", ir.Attrs{"shape": []int{9}}, e))

	z := g.Input("z", ir.Shape{B, T, M}, ir.F32)
	h5 := chain([]int{B, T, M}, scale(0.5, 0.25), a3)
	g.SetOutput("p5", g.Op1("SumToProduct", ir.Attrs{"shape": []int{B, T, 1}}, h5, z))
	h6 := chain([]int{B, T, M}, scale(1, -2), h2)
	g.SetOutput("p6", g.Op1("SumToProduct", ir.Attrs{"shape": []int{M}}, z, h6))
	h8 := chain([]int{B, T, M}, scale(3, 0), z)
	g.SetOutput("p8", g.Op1("SumToProduct", ir.Attrs{"shape": []int{B, T, 1}}, h8, h8))
	return g
}

// TestGPUChainSums: a chain whose result a SumTo, ReduceSum or ReduceMean
// sums over all its rows or along them, or a SumToProduct sums with a
// value made earlier, folds that sum (reduce_cols_f32 and reduce_rows_f32
// do not run for it), writes no fp32 result where only the sum and its
// bf16 copy's GEMMs read it, and every output equals the run with
// separate reductions bit for bit (sums over 201 rows in four chunks and
// over 35 in one; a mean; a two-dim broadcast; Concat parts; row sums;
// products with the chain's result either factor; a product of the result
// with itself left alone). The sums of the affine chains match a float64
// reference. On the simulator all of it again in differential mode (the
// separate reductions, reduce_cols_f32 and reduce_rows_f32, too).
func TestGPUChainSums(t *testing.T) {
	differentially(t, []string{fusedGenPrefix + "sum_*", "reduce_cols_f32", "reduce_rows_f32", "reduce_parts_f32"}, func() { chainSums(t) })
}

func chainSums(t *testing.T) {
	const B, T, N, M, K = 3, 67, 37, 40, 21
	widths := []int{13, 30}
	r := rand.New(rand.NewPCG(101, 102))
	feeds := map[string]*kernels.Tensor{}
	for name, s := range map[string]ir.Shape{"a": {B, T, N}, "b": {N}, "a2": {B, T, M}, "a3": {B, T, M}, "gate": {B, T, 1},
		"x": {B * T, K}, "s": {5, 7, 9}, "z": {B, T, M}} {
		feeds[name] = randTensor(r, s)
	}
	weights := map[string]*kernels.Tensor{"w": randTensor(r, ir.Shape{K, N})}
	for i, w := range widths {
		feeds[string(rune('u'+i))] = randTensor(r, ir.Shape{B * T, w})
		weights[string(rune('p'+i))] = randTensor(r, ir.Shape{w, K})
	}
	names := []string{"y", "sh", "mh2", "h2", "sh3", "sh4", "sc0", "sc1", "dw", "dx", "se", "p5", "p6", "p8"}
	run := func(sums bool) packRun {
		be := gpuBackend(t, ir.BF16)
		be.sums = sums
		return runOn(t, be, chainSumGraph(B, T, N, M, K, widths), weights, feeds, names)
	}
	on, off := run(true), run(false)
	// h, h2, h3, h4, both parts, e, h5, h6; h8's product with itself stays
	if on.sums != 9 || off.sums != 0 {
		t.Fatalf("%d sums folded (want 9), %d with folding off (want 0)", on.sums, off.sums)
	}
	if on.unwritten != 8 { // all but h2, a graph output
		t.Errorf("%d folding chains write no fp32 result, want 8", on.unwritten)
	}
	if rc := "reduce_cols_f32"; on.launches[rc] != 0 || off.launches[rc] != 7 {
		t.Errorf("reduce_cols_f32: %d launches folded (want 0), %d separate (want 7)", on.launches[rc], off.launches[rc])
	}
	if rr := "reduce_rows_f32"; on.launches[rr] != 1 || off.launches[rr] != 3 || on.launches[fusedGenSum] != 9 {
		t.Errorf("reduce_rows_f32 %d folded (want 1: h8's), %d separate (want 3); folding chains %d (want 9)", on.launches[rr],
			off.launches[rr], on.launches[fusedGenSum])
	}
	if on.twins != 2 { // h's copy, the Concat's rows
		t.Errorf("%d bf16 copies, want 2", on.twins)
	}
	sameOutputs(t, "folded sums", on, off)

	mean := make([]float64, M) // h2's mean over B·T rows, as float32 elements
	for i, v := range feeds["a2"].F32 {
		mean[i%M] += float64(0.75*v+0.125) / (B * T)
	}
	closeTo(t, "mh2", on.outs["mh2"], mean, 1e-5)
	se := make([]float64, 9)
	for i, v := range feeds["s"].F32 {
		se[i%9] += float64(2 * v)
	}
	closeTo(t, "se", on.outs["se"], se, 1e-5)
	p5 := make([]float64, B*T) // Σ_m (0.5·a3 + 0.25)·z along each row
	for i, v := range feeds["a3"].F32 {
		p5[i/M] += float64((0.5*v + 0.25) * feeds["z"].F32[i])
	}
	closeTo(t, "p5", on.outs["p5"], p5, 1e-5)
}

// TestChainSumSource: a folding chain's kernel is reduce_cols_f32's block
// over its rows (the chunk bounds and the partials' layout as constants;
// RED_AHEAD rows' inputs loaded before they are used), writes out[i] only
// when asked and names itself as a folding chain.
func TestChainSumSource(t *testing.T) {
	plan := planReduce(midAxis{A: 1, R: 201, C: 37})
	c := fusedChain{dense: []bool{true}, idx32: true, prog: []int32{int32(fusedUnary), uCopy, 0, 0}, params: make([]float32, 3), sum: plan}
	name := c.name()
	if reportName(name) != fusedGenSum {
		t.Errorf("%s reported as %s, want %s", name, reportName(name), fusedGenSum)
	}
	src := c.source(name)
	for _, want := range []string{"double* part", "i64 t = blockIdx.x % 2, k = blockIdx.x / 2;", "lo = k * 64ll",
		"j0 += RED_ROW_LANES * RED_AHEAD", "i = j * 37ll + col;", "in0[u] = x0[i];", "float r0 = in0[u];", "out[i] = r1;",
		"s += r1;", "part[col * 4ll + k] = sh[0][tx];"} {
		if !strings.Contains(src, want) {
			t.Errorf("source lacks %q:\n%s", want, src)
		}
	}
	c.skipOut = true
	if src := c.source(c.name()); strings.Contains(src, "out[i] =") || c.name() == name {
		t.Errorf("skipOut: the source writes out[i] or keeps the name %s", name)
	}
	if g := chainSumGrid(plan); g[0] != 8 {
		t.Errorf("grid %v, want 8 blocks (4 chunks × 2 column tiles)", g)
	}
	// row sums of products with ry: reduce_rows_f32's warps over rows of 700
	// in chunks of 256 (three a row), the product rounded to float
	rows := planReduce(midAxis{A: 5, R: 700, C: 1})
	c = fusedChain{dense: []bool{true}, idx32: true, prog: []int32{int32(fusedUnary), uCopy, 0, 0}, params: make([]float32, 3), sum: rows,
		sumY: true}
	src = c.source(c.name())
	for _, want := range []string{"double* part, const float* ry", "if (w >= 15ll) return;", "lo = (w - a * 3) * 256ll",
		"i = a * 700ll + j;", "in1[u] = ry[i];", "float term = r1 * in1[u];", "s += term;", "s = warp_sum_d(s);", "part[w] = s;"} {
		if !strings.Contains(src, want) {
			t.Errorf("row sums: source lacks %q:\n%s", want, src)
		}
	}
	if g := chainSumGrid(rows); g[0] != 2 {
		t.Errorf("row grid %v, want 2 blocks (15 warps)", g)
	}
}

// TestChainSumCompiles: folding chains (dense; a per-row broadcast input
// with dropout, a twin and no fp32 result) compile with NVRTC for
// compute_80, compute_90 and sm_90, where ptxas reports no stack frame and
// no spills (registers logged).
func TestChainSumCompiles(t *testing.T) {
	n := nvrtcOrSkip(t)
	if n.Simulated() {
		t.Skip("the simulator's NVRTC writes no PTX (TestGPUChainSums runs these kernels there)")
	}
	const R, C = 24576, 1020
	plan := planReduce(midAxis{A: 1, R: R, C: C})
	dense := fusedChain{dense: []bool{true, true}, idx32: true, sum: plan,
		prog:   []int32{int32(fusedBinary), mustEWCode("Mul"), 0, 1, int32(fusedUnary), uCopy, 2, 0},
		params: make([]float32, 6)}
	thresh, scale := dropoutThreshold(0.1)
	bcast := fusedChain{dense: []bool{true, false}, idx32: true, sum: plan, skipOut: true, twinCols: C, twinLD: bf16LD(C),
		view:   view{dims: []int64{R, C}, strides: [][]int64{{C, 1}, {1, 0}}},
		prog:   []int32{int32(fusedBinary), mustEWCode("Add"), 0, 1, int32(fusedDraw), 0, 2, 0},
		params: []float32{0, 0, 0, scale, math.Float32frombits(uint32(thresh)), 0}}
	kernels := map[string]string{}
	for _, c := range []fusedChain{dense, bcast} {
		kernels[c.name()] = c.source(c.name())
	}
	src, err := fusedModule(kernels)
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"compute_80", "compute_90"} {
		if _, err := n.CompilePTX("fused_gen.cu", src, arch); err != nil {
			t.Fatalf("%s: %v\n%s", arch, err, src[strings.Index(src, "#line 1 \"fused_gen.cu\""):])
		}
	}
	_, log, err := n.CompileCUBINLog("fused_gen.cu", src, "sm_90", []string{"--ptxas-options=-v"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := parsePtxasReport(log)
	if err != nil || len(res) != 2 {
		t.Fatalf("ptxas report: %d kernels, %v", len(res), err)
	}
	for _, r := range res {
		t.Log(r)
		if r.StackBytes != 0 || r.SpillStores != 0 || r.SpillLoads != 0 {
			t.Errorf("%v: a stack frame or spills", r)
		}
	}
}
