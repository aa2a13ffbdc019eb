package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// TestSplitK: the weight gradients of the paper preset (24,576 rows) on
// 132 SMs split to fill the SMs; GEMMs whose tiles fill half of them, other
// layouts and batches do not; no slice gets shallower than
// splitKMinDepth and K must divide.
func TestSplitK(t *testing.T) {
	for _, c := range []struct {
		s    GemmShape
		want int
	}{
		{GemmShape{TransA: true, M: 510, N: 510, K: 24576}, 8},  // 16 tiles
		{GemmShape{TransA: true, M: 510, N: 1020, K: 24576}, 4}, // 32 tiles
		{GemmShape{TransA: true, M: 1530, N: 510, K: 24576}, 2}, // 48 tiles
		{GemmShape{TransA: true, M: 4080, N: 510, K: 24576}, 1}, // 128 tiles
		{GemmShape{TransA: true, M: 510, N: 510, K: 2048}, 2},   // slices of 1,024 rows at least
		{GemmShape{TransA: true, M: 510, N: 510, K: 3000}, 2},   // 3,000 = 2 · 1,500
		{GemmShape{TransA: true, M: 510, N: 510, K: 1500}, 1},   // 750-row slices: too shallow
		{GemmShape{TransA: true, M: 64, N: 64, K: 1 << 20}, 16}, // at most splitKMax
		{GemmShape{M: 510, N: 510, K: 24576}, 1},                // A not stored K rows deep
		{GemmShape{TransA: true, TransB: true, M: 510, N: 510, K: 24576}, 1},
		{GemmShape{TransA: true, M: 510, N: 510, K: 24576, Batch: 2}, 1},
	} {
		if got := splitK(c.s, 132); got != c.want {
			t.Errorf("%+v: %d slices, want %d", c.s, got, c.want)
		}
	}
}

// TestGPUSplitKWeightGradient: a weight gradient of one output tile over
// 8,192 rows, on a backend told it has 132 SMs, runs as slices (a batch of
// GEMMs and sum_slices_f32) and equals the bf16 product within fp32
// accumulation's rounding over 8,192 terms (closeToDots); the
// same program run again gives the same bits. On the simulator all of it
// again in differential mode.
func TestGPUSplitKWeightGradient(t *testing.T) {
	differentially(t, []string{"sum_slices_f32"}, func() { splitKWeightGradient(t) })
}

func splitKWeightGradient(t *testing.T) {
	be := gpuBackend(t, GEMMBF16)
	be.sms = 132
	const R, N, K = 8192, 37, 85
	s := GemmShape{TransA: true, M: N, N: K, K: R, Batch: 1}
	if splitK(s, be.sms) < 2 {
		t.Fatalf("%+v would not split", s)
	}
	g, feeds := gradWCase(R, N, K, 81)
	st := kernels.NewStore(kernels.F32)
	defer be.Release(st)
	p := runProgram(t, be, g, st, feeds)
	defer p.Close()
	got := append([]float32(nil), p.Output("dw").F32...)
	want := matmulRef(feeds["dy"].F32, feeds["x"].F32, 1, N, K, R, true, false, true)
	scale := matmulRef(absF32(feeds["dy"].F32), absF32(feeds["x"].F32), 1, N, K, R, true, false, true)
	closeToDots(t, "dw", got, want, scale, R)
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	for i, v := range p.Output("dw").F32 {
		if v != got[i] {
			t.Fatalf("second run differs at %d: %g, first %g", i, v, got[i])
		}
	}
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
