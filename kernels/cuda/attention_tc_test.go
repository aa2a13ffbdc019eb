package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// tcAttentionCases: FusedAttention and its gradient on shapes that stress
// flash.cu's tiles and the GEMM path's blocks: lengths that are not a
// multiple of 64 or 32 (37, 67, 20, 300: the GEMM path's blocks of 128,
// the last partial), the paper's head size 85 and small ones (9, 12) padded to 16, 35
// (sequence, head) pairs, with and without the bias and dropout (blocks
// that take several pairs: TestGPUAttentionTensorCores), and in the
// [B,T,H,Hd] layout (ir.AttnBTHD: rows H·Hd apart).
func tcAttentionCases() []opCase {
	var cases []opCase
	add := func(s ir.Shape, bias bool, dropout float64, lay ir.AttnLayout) {
		a := ir.Attrs{"scale": 1 / math.Sqrt(float64(s[3])), "causal": true}
		lay.Set(a)
		if dropout > 0 {
			a["dropout"], a["stream"] = dropout, 3
		}
		_, _, T, _ := lay.Dims(s)
		fwd, grad := []ir.Shape{s, s, s}, []ir.Shape{s, s, s, s}
		if bias {
			fwd, grad = append(fwd, ir.Shape{T, T}), append(grad, ir.Shape{T, T})
		}
		cases = append(cases, opCase{op: "FusedAttention", attrs: a, in: fwd}, opCase{op: "FusedAttentionGrad", attrs: a, in: grad})
	}
	add(ir.Shape{2, 3, 67, 85}, true, 0, ir.AttnBHTD)
	add(ir.Shape{1, 2, 37, 85}, true, 0.1, ir.AttnBHTD)
	add(ir.Shape{1, 2, 37, 9}, false, 0.1, ir.AttnBHTD)
	add(ir.Shape{1, 1, 20, 12}, false, 0, ir.AttnBHTD)
	add(ir.Shape{5, 7, 20, 12}, true, 0.1, ir.AttnBHTD)
	add(ir.Shape{2, 67, 3, 85}, true, 0.1, ir.AttnBTHD)
	add(ir.Shape{5, 20, 7, 12}, true, 0, ir.AttnBTHD)
	add(ir.Shape{1, 300, 2, 12}, true, 0.1, ir.AttnBTHD) // three query blocks of the GEMM path (agBlock)
	return cases
}

// attnErrors is the worst error relative to max(1, |cpu|) (closeTo's
// measure) and the relative L2 error ‖got − cpu‖ / ‖cpu‖.
func attnErrors(got []float32, want []float64) (worst, l2 float64) {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		if math.IsNaN(d) {
			return math.Inf(1), math.Inf(1)
		}
		worst = math.Max(worst, math.Abs(d)/math.Max(1, math.Abs(w)))
		num += d * d
		den += w * w
	}
	return worst, math.Sqrt(num / math.Max(den, 1e-30))
}

// Bounds of the tensor-core attention against the fp32 CPU: bf16 inputs
// (q, k, v, dO and the weights P and dS rounded to 8 significant bits, a
// relative 2⁻⁹ each) with fp32 accumulation. Measured over these cases
// and TestGPUAttentionTensorCores': L2 2.2e-3 to 6.0e-3 for every output
// (lse 2e-4 to 5e-4); the worst entry 0.5e-2 to 2.7e-2 for o, dq, dk, dv
// and up to 8.7e-2 for the bias gradient (a sum of dS over every sequence
// and head, 35 of them, with sums of several units).
const (
	tcAttnWorst = 0.1  // relative to max(1, |cpu|)
	tcAttnL2    = 1e-2 // ‖got − cpu‖ / ‖cpu‖
	// tcAttnBiasWorst: the bias gradient's worst entry where dropout
	// scales dS by 1/(1 − p) (TestGPUAttentionBandMask: 0.105 at p = 0.1).
	tcAttnBiasWorst = 0.15
)

// attnPathKernels are the kernels each tensor-core path launches for a
// forward and its gradient with a bias.
var attnPathKernels = map[AttentionPath][]string{
	AttentionFlash: {"attention_fwd_bf16", "attention_bwd_dq_bf16", "attention_bwd_dkdv_bf16", "attention_dbias_reduce_f32"},
	AttentionGEMM: {"attn_pack_bf16", "attn_softmax_fwd_f32", "attn_unpack_f32", "attn_pack_do_bf16", "attn_softmax_bwd_f32",
		"attention_dbias_reduce_f32"},
}

// gpuBackendPath is a bf16 backend that prefers the given attention path.
func gpuBackendPath(t *testing.T, choice AttentionPath) *Backend {
	o := CandidateOptions()
	o.Attention = choice
	return gpuBackendWith(t, ir.BF16, o)
}

// TestGPUFusedAttentionBF16: under bf16 GEMMs the backend runs
// FusedAttention(Grad) on the tensor cores, through the GEMM path
// (attngemm.go) by default and flash.cu's kernels when asked (the trace
// says which); o, dq, dk, dv and the bias gradient match the CPU backend
// within bf16's bounds, a second run is bit-identical, and on the
// simulator the differential run (reverse block and thread order, another
// shared-memory poison) agrees.
func TestGPUFusedAttentionBF16(t *testing.T) {
	for _, choice := range []AttentionPath{AttentionGEMM, AttentionFlash} {
		t.Run(choice.String(), func(t *testing.T) { fusedAttentionBF16(t, gpuBackendPath(t, choice), choice) })
	}
}

func fusedAttentionBF16(t *testing.T, be *Backend, choice AttentionPath) {
	tr, err := be.StartTrace()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(19, 2))
	for _, c := range tcAttentionCases() {
		g, feeds := caseGraph(c, r)
		what := fmt.Sprintf("%s %v %v", c.op, c.in[0], c.attrs)
		first := runBoth(t, what, g, feeds, be)
		for name, pair := range first {
			worst, l2 := attnErrors(pair[1].F32, pair[0].Float64s())
			t.Logf("%s output %s: worst %.2e, L2 %.2e", what, name, worst, l2)
			if worst > tcAttnWorst || l2 > tcAttnL2 {
				t.Errorf("%s output %s: worst %.3g (bound %g), L2 %.3g (bound %g)", what, name, worst, tcAttnWorst, l2, tcAttnL2)
			}
		}
		for name, pair := range runBoth(t, what, g, feeds, be) {
			if !sameBits(pair[1].F32, first[name][1].F32) {
				t.Errorf("%s output %s: a second run differs", what, name)
			}
		}
	}
	seen := map[string]bool{}
	for _, e := range tr.Events() {
		seen[e.Name] = true
	}
	for _, k := range attnPathKernels[choice] {
		if !seen[k] {
			t.Errorf("kernel %s never ran", k)
		}
	}
	for other, ks := range attnPathKernels {
		if other != choice && seen[ks[0]] {
			t.Errorf("%s ran, a kernel of the other path", ks[0])
		}
	}
	if seen["attention_fwd_f32"] {
		t.Error("the scalar attention ran under bf16 GEMMs")
	}
	// a head of 8 (SmallGEMMDim) stays on the fp32 kernels, as close to the
	// CPU as under fp32 GEMMs
	tr.Reset()
	small := opCase{op: "FusedAttentionGrad", attrs: ir.Attrs{"scale": 0.35, "causal": true}, in: []ir.Shape{{1, 2, 20, 8}, {1, 2, 20, 8}, {1, 2, 20, 8}, {1, 2, 20, 8}, {20, 20}}}
	checkParity(t, be, []opCase{small}, 7)
	for _, e := range tr.Events() {
		if e.Name == attnPathKernels[choice][0] {
			t.Error("a head of 8 ran on the tensor cores")
		}
	}
	d, err := driver.LoadDriver()
	if err != nil || !d.Simulated() {
		return
	}
	d.SimConfig("diff", 1)
	defer d.SimConfig("diff", 0)
	cases := tcAttentionCases()
	checkParity(t, be, []opCase{withTol(cases[3], tcAttnWorst), withTol(cases[9], tcAttnWorst), withTol(cases[11], tcAttnWorst), withTol(cases[13], tcAttnWorst)}, 5)
}

func withTol(c opCase, tol float64) opCase {
	c.tol = tol
	return c
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestAttentionParts: the bias gradient's partial sums depend on the shape
// only: one per (sequence, head) pair while they fit in 512 MiB (all 192
// at the paper's length), fewer beyond, and one per pair without a bias.
func TestAttentionParts(t *testing.T) {
	bias := &dval{}
	for _, c := range []struct {
		a    attention
		want int
	}{
		{attention{BH: 192, T: 768, bias: bias}, 192},
		{attention{BH: 192, T: 4096, bias: bias}, 8},
		{attention{BH: 192, T: 20000, bias: bias}, 1},
		{attention{BH: 6, T: 67, bias: bias}, 6},
		{attention{BH: 192, T: 768}, 192},
	} {
		if got := c.a.parts(); got != c.want {
			t.Errorf("BH %d, T %d, bias %v: %d partial sums, want %d", c.a.BH, c.a.T, c.a.bias != nil, got, c.want)
		}
	}
}

// TestAgBiasGroups: the GEMM path's bias gradient is summed over groups of
// (sequence, head) pairs, about agWarps warps of queries in all, at most
// one group per pair.
func TestAgBiasGroups(t *testing.T) {
	for _, c := range []struct {
		BH, T, want int
	}{{192, 768, 11}, {192, 384, 22}, {192, 8192, 1}, {192, 20000, 1}, {6, 67, 6}, {2, 300, 2}} {
		if got := agBiasGroups(&attention{BH: c.BH, T: c.T}); got != c.want {
			t.Errorf("BH %d, T %d: %d groups, want %d", c.BH, c.T, got, c.want)
		}
	}
}

// TestGPUAttentionBiasGroups: with groups of several (sequence, head)
// pairs, uneven ones among them (agWarps lowered to 40: 35 pairs at T = 20
// in groups of 17 and 18, 6 at T = 67 in one), the GEMM path's gradients
// and bias gradient match the CPU within bf16's bounds, and, on the
// simulator, again in differential mode.
func TestGPUAttentionBiasGroups(t *testing.T) {
	be := gpuBackendPath(t, AttentionGEMM)
	defer func(w int) { agWarps = w }(agWarps)
	agWarps = 40
	var cases []opCase
	for _, c := range tcAttentionCases() {
		if c.op == ir.OpFusedAttentionGrad && len(c.in) == 5 {
			cases = append(cases, withTol(c, tcAttnWorst))
		}
	}
	differentially(t, []string{"attn_softmax_bwd_f32", "attention_dbias_reduce_f32"}, func() { checkParity(t, be, cases, 13) })
}

// TestFlashWarpTiles: the cost model's count of flash.cu's 16×32 tiles of
// scores: the causal triangle at T = 64 (rows 0–31 see one key tile, rows
// 32–63 two; symmetric for the keys), and T = 67, whose last warp of rows
// sees three tiles and whose last warp of keys one.
func TestFlashWarpTiles(t *testing.T) {
	for _, c := range []struct {
		T    int
		keys bool
		want float64
	}{{64, false, 6}, {64, true, 6}, {67, false, 9}, {67, true, 11}} {
		if got := flashWarpTiles(c.T, c.keys); got != c.want {
			t.Errorf("T %d, keys %v: %v tiles, want %v", c.T, c.keys, got, c.want)
		}
	}
}

// TestGPUAttentionBandMask: a bias of −Inf outside a band of 24 keys (a
// sliding window) leaves the first key tiles of later rows wholly masked,
// so the one-pass forward's running maximum starts at −Inf and jumps (its
// rescale by 0, then by exp(m − m')); o, the gradients and the bias
// gradient (0 where masked) match the CPU within bf16's bounds, with and
// without dropout; the fp32 kernels (attention.cu) too, within fp32's
// bounds.
func TestGPUAttentionBandMask(t *testing.T) {
	bandMaskCase(t, gpuBackend(t, ir.FP32), ir.FP32)
	for _, choice := range []AttentionPath{AttentionGEMM, AttentionFlash} {
		bandMaskCase(t, gpuBackendPath(t, choice), ir.BF16)
	}
	d, err := driver.LoadDriver()
	if err != nil || !d.Simulated() || t.Failed() {
		return
	}
	d.SimConfig("diff", 1) // each launch again in reverse block and thread order, compared bit for bit
	defer d.SimConfig("diff", 0)
	before := d.SimStat("diff_launches")
	for _, choice := range []AttentionPath{AttentionGEMM, AttentionFlash} {
		bandMaskCase(t, gpuBackendPath(t, choice), ir.BF16)
	}
	if d.SimStat("diff_launches") == before {
		t.Error("no launch ran in differential mode")
	}
}

func bandMaskCase(t *testing.T, be kernels.Backend, prec ir.Precision) {
	r := rand.New(rand.NewPCG(23, 4))
	const B, H, T, Hd, band = 2, 3, 100, 85, 24
	s := ir.Shape{B, H, T, Hd}
	worstBound, biasBound, l2Bound := tcAttnWorst, tcAttnBiasWorst, tcAttnL2
	if prec == ir.FP32 {
		worstBound, biasBound, l2Bound = 1e-4, 1e-4, 1e-5
	}
	for _, p := range []float64{0, 0.1} {
		a := ir.Attrs{"scale": 1 / math.Sqrt(Hd), "causal": true}
		if p > 0 {
			a["dropout"], a["stream"] = p, 9
		}
		g := ir.New("band")
		feeds := map[string]*kernels.Tensor{}
		var in []*ir.Value
		for i, sh := range []ir.Shape{s, s, s, s} {
			name := string(rune('a' + i))
			in = append(in, g.Input(name, sh, ir.F32))
			feeds[name] = &kernels.Tensor{Shape: sh.Clone(), F32: randF32(r, sh.Numel(), 1)}
		}
		mask := make([]float32, T*T)
		for i := range T {
			for j := range T {
				mask[i*T+j] = float32(r.NormFloat64())
				if j < i-band {
					mask[i*T+j] = float32(math.Inf(-1))
				}
			}
		}
		in = append(in, g.Input("m", ir.Shape{T, T}, ir.F32))
		feeds["m"] = &kernels.Tensor{Shape: ir.Shape{T, T}, F32: mask}
		g.SetOutput("o", g.Apply("FusedAttention", a, in[1], in[2], in[3], in[4])[0])
		for i, v := range g.Apply("FusedAttentionGrad", a, in...) {
			g.SetOutput(string(rune('w'+i)), v)
		}
		what := fmt.Sprintf("%s, band mask, dropout %g", prec, p)
		for name, pair := range runBoth(t, what, g, feeds, be) {
			worst, l2 := attnErrors(pair[1].F32, pair[0].Float64s())
			t.Logf("%s output %s: worst %.2e, L2 %.2e", what, name, worst, l2)
			bound := worstBound
			if name == "z" {
				bound = biasBound
			}
			if worst > bound || l2 > l2Bound {
				t.Errorf("%s output %s: worst %.3g (bound %g), L2 %.3g (bound %g)", what, name, worst, bound, l2, l2Bound)
			}
			if name == "z" { // the bias gradient: nothing where the bias is −Inf
				for e, m := range mask {
					if math.IsInf(float64(m), -1) && pair[1].F32[e] != 0 {
						t.Fatalf("%s: bias gradient %g at masked entry %d", what, pair[1].F32[e], e)
					}
				}
			}
		}
	}
}

// TestSimAttentionSavedPacks: a program with an attention's forward and
// backward on the same q, k and v packs them once, in the forward, into
// buffers the backward reads (3 attn_pack_bf16 launches, not 6), and its
// outputs are those of the program that packs them again, bit for bit.
func TestSimAttentionSavedPacks(t *testing.T) {
	parityDevice(t)
	const B, H, T, Hd = 2, 3, 67, 85
	r := rand.New(rand.NewPCG(81, 82))
	s := ir.Shape{B, H, T, Hd}
	a := ir.Attrs{"scale": 1 / math.Sqrt(Hd), "causal": true, "dropout": 0.1, "stream": 5}
	g := ir.New("saved-packs")
	feeds := map[string]*kernels.Tensor{}
	var in []*ir.Value
	for i := range 4 {
		name := string(rune('a' + i))
		in = append(in, g.Input(name, s, ir.F32))
		feeds[name] = &kernels.Tensor{Shape: s.Clone(), F32: randF32(r, s.Numel(), 1)}
	}
	o := g.Apply("FusedAttention", a, in[1], in[2], in[3])[0]
	g.SetOutput("p", o)
	ga := a.Clone()
	ga["with_out"] = true // the backward reads the forward's output and log-sum-exp, as in a training step
	for i, v := range g.Apply("FusedAttentionGrad", ga, append(in, o)...) {
		g.SetOutput(string(rune('q'+i)), v)
	}
	run := func(savedCap int64) ([][]float32, int) {
		defer func(c int64) { agSavedCap = c }(agSavedCap)
		agSavedCap = savedCap
		be := gpuBackendPath(t, AttentionGEMM)
		tr, err := be.StartTrace()
		if err != nil {
			t.Fatal(err)
		}
		out := runCUDA(t, be, g, feeds)
		packs := 0
		for _, e := range tr.Events() {
			if e.Name == "attn_pack_bf16" {
				packs++
			}
		}
		return out, packs
	}
	saved, savedPacks := run(agSavedCap)
	again, packs := run(0)
	if savedPacks != 3 || packs != 6 {
		t.Errorf("attn_pack_bf16 ran %d times with saved packs (want 3), %d without (want 6)", savedPacks, packs)
	}
	for i := range again {
		if !sameBits(saved[i], again[i]) {
			t.Errorf("output %c differs with the packs saved", 'p'+i)
		}
	}
}
