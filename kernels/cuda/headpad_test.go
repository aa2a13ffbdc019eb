package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
)

// TestGPUHeadPad: the fused LM head with its GEMMs over the vocabulary and
// width rounded up to 8 (headPad, Options.HeadPad, the default: 1,111 → 1,112 and
// 85 → 88, chunks of 16 rows over 37, the weight a store tensor whose bf16
// copy has the extra row; dx and dW accumulated in rows of 88 and
// compacted by LMHeadGrad) matches the CPU within bf16's bounds, as the
// unpadded head does, and the two agree to fp32 rounding (the zero terms
// add nothing; only the order of the sums may differ).
func TestGPUHeadPad(t *testing.T) {
	const R, D, V = 37, 85, 1111
	g := ir.New("head")
	x := g.Input("x", ir.Shape{R, D}, ir.F32)
	w := g.Param("w", ir.Shape{V, D})
	tg := g.Input("t", ir.Shape{R}, ir.I32)
	a := ir.Attrs{"label_smoothing": 0.1, "chunk": 16}
	outs := g.Apply("LMHeadCrossEntropy", a, x, w, tg)
	outs = append(outs, g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(0.3), x, w, tg)...)
	names := []string{"sum", "ce", "pred", "dx", "dw"}
	for i, o := range outs {
		g.SetOutput(names[i], o)
	}
	r := rand.New(rand.NewPCG(71, 72))
	weights := map[string]*kernels.Tensor{"w": {Shape: ir.Shape{V, D}, F32: randF32(r, V*D, 1)}}
	ids := make([]int32, R)
	for i := range ids {
		ids[i] = int32(r.IntN(V))
	}
	feeds := map[string]*kernels.Tensor{"x": {Shape: ir.Shape{R, D}, F32: randF32(r, R*D, 1)}, "t": kernels.IntTensor(ir.Shape{R}, ids)}

	want := cpuOutputs(t, g, weights, feeds, names)
	be := gpuBackend(t, ir.BF16)
	be.headPad = false
	plain := runOn(t, be, g, weights, feeds, names)
	be.headPad = true
	padded := runOn(t, be, g, weights, feeds, names)
	grown, wide := 0, 0
	for _, s := range padded.gemms {
		if s.N == 1112 || s.K == 1112 || s.M == 1112 {
			grown++
		}
		if s.N == 88 {
			wide++
		}
	}
	// three chunks: logits, dx and dW each over the padded vocabulary, dx
	// and dW over the padded width, both compacted once by LMHeadGrad
	if compacted := padded.launches["compact_rows_f32"]; grown != 9 || wide != 6 || compacted != 2 {
		t.Errorf("%d GEMMs over the padded vocabulary (want 9), %d over the padded width (want 6), %d compactions (want 2)", grown, wide, compacted)
	}
	for _, n := range names {
		if want[n] == nil {
			continue
		}
		ref := make([]float64, len(want[n]))
		for i, v := range want[n] {
			ref[i] = float64(v)
		}
		for form, got := range map[string][]float32{"unpadded": plain.outs[n], "padded": padded.outs[n]} {
			if worst, l2 := attnErrors(got, ref); worst > 3e-2 || l2 > 1e-2 {
				t.Errorf("%s %s: worst %.3g, L2 %.3g against the CPU (bounds 3e-2, 1e-2)", form, n, worst, l2)
			}
		}
		// the same products summed in another order (other kernels, or
		// OpenBLAS's blocking on the simulator): fp32 rounding apart
		if worst, _ := attnErrors(padded.outs[n], float64s(plain.outs[n])); worst > 1e-4 {
			t.Errorf("%s: padded and unpadded %.3g apart", n, worst)
		}
	}
}

// cpuOutputs runs g once on the CPU backend over weights and feeds and
// reads the named outputs.
func cpuOutputs(t *testing.T, g *ir.Graph, weights, feeds map[string]*kernels.Tensor, names []string) map[string][]float32 {
	t.Helper()
	st := kernels.NewStore(ir.FP32)
	for name, w := range weights {
		copy(must(st.Ensure(name, w.Shape)).F32, w.F32)
	}
	p, err := cpu.New(ir.FP32).Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	res := map[string][]float32{}
	for _, n := range names {
		if o := p.Output(n); o.F32 != nil {
			res[n] = append([]float32(nil), o.F32...)
		}
	}
	return res
}

// TestGPUPaddedGradW: a weight gradient whose dims are not multiples of 8
// (37 × 85 over 300 rows, the rows of dy and x a lazy mix of a staged
// activation and a store tensor's layout) runs over 40 × 88 into the
// workspace and is compacted (padGradW, Options.PadGradW, the
// default), and equals the bf16 product and the unpadded GEMM within fp32
// accumulation's rounding; again in differential mode on the simulator.
func TestGPUPaddedGradW(t *testing.T) {
	differentially(t, []string{"compact_rows_f32"}, func() { paddedGradW(t) })
}

func paddedGradW(t *testing.T) {
	const R, N, K = 300, 37, 85
	g, feeds := gradWCase(R, N, K, 91)
	be := gpuBackend(t, ir.BF16)
	be.padGradW = false
	plain := runOn(t, be, g, nil, feeds, []string{"dw"})
	be.padGradW = true
	padded := runOn(t, be, g, nil, feeds, []string{"dw"})
	if len(padded.gemms) != 1 || padded.gemms[0].M != 40 || padded.gemms[0].N != 88 || padded.launches["compact_rows_f32"] != 1 {
		t.Fatalf("padded: GEMMs %+v, %d compactions; want one 40 × 88 GEMM and one compaction", padded.gemms, padded.launches["compact_rows_f32"])
	}
	if len(plain.gemms) != 1 || plain.gemms[0].M != N || plain.launches["compact_rows_f32"] != 0 {
		t.Fatalf("unpadded: GEMMs %+v, %d compactions", plain.gemms, plain.launches["compact_rows_f32"])
	}
	want := matmulRef(feeds["dy"].F32, feeds["x"].F32, 1, N, K, R, true, false, true)
	scale := matmulRef(absF32(feeds["dy"].F32), absF32(feeds["x"].F32), 1, N, K, R, true, false, true)
	closeToDots(t, "padded dw", padded.outs["dw"], want, scale, R)
	closeToDots(t, "padded against unpadded dw", padded.outs["dw"], float64s(plain.outs["dw"]), scale, R)
}

// float64s widens x.
func float64s(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// gradWCase is dw = LinearGradW(dy, x) over R rows, dy [R,N] and x [R,K]
// random in [−1, 1).
func gradWCase(R, N, K int, seed uint64) (*ir.Graph, map[string]*kernels.Tensor) {
	g := ir.New("gradw")
	dy := g.Input("dy", ir.Shape{R, N}, ir.F32)
	x := g.Input("x", ir.Shape{R, K}, ir.F32)
	g.SetOutput("dw", g.Op1("LinearGradW", nil, dy, x))
	r := rand.New(rand.NewPCG(seed, seed+1))
	return g, map[string]*kernels.Tensor{"dy": {Shape: ir.Shape{R, N}, F32: randF32(r, R*N, 1)}, "x": {Shape: ir.Shape{R, K}, F32: randF32(r, R*K, 1)}}
}
