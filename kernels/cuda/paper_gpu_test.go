package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
)

// cpuOp runs one IR op on the CPU backend in float64: the reference of the
// CUDA kernels' parity tests.
func cpuOp(t *testing.T, op ir.OpName, a ir.Attrs, shapes []ir.Shape, ins ...[]float32) [][]float64 {
	t.Helper()
	g := ir.New(string(op))
	feeds := map[string]*kernels.Tensor{}
	var vals []*ir.Value
	for i, x := range ins {
		name := string(rune('a' + i))
		vals = append(vals, g.Input(name, shapes[i], ir.F32))
		tt := kernels.NewTensor(ir.FP64, shapes[i])
		for j, v := range x {
			tt.F64[j] = float64(v)
		}
		feeds[name] = tt
	}
	return runGraph(t, g, g.Apply(op, a, vals...), feeds)
}

// runGraph runs g on the CPU backend in float64 with outs as its outputs
// p, q, ... and returns them.
func runGraph(t *testing.T, g *ir.Graph, outs []*ir.Value, feeds map[string]*kernels.Tensor) [][]float64 {
	t.Helper()
	for i, o := range outs {
		g.SetOutput(string(rune('p'+i)), o)
	}
	p, err := cpu.New(ir.FP64).Compile(g, nil, kernels.NewStore(ir.FP64))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	res := make([][]float64, len(outs))
	for i := range outs {
		res[i] = p.Output(string(rune('p' + i))).Float64s()
	}
	return res
}

// TestGPUPaperOps: softmax, z-score, clamp, nan_to_num, top-k mask and
// Sinkhorn against the CPU backend (float64).
func TestGPUPaperOps(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(17, 18))
	const rows, n = 33, 1000
	x, dy := randF32(r, rows*n, 2), randF32(r, rows*n, 1)
	sh := ir.Shape{rows, n}
	dx, ddy, dout := devF32(t, c, x), devF32(t, c, dy), devF32(t, c, make([]float32, rows*n))

	if err := c.Launch("softmax_rows_f32", [3]uint32{rows, 1, 1}, block1D, 0, dout.Ptr, dx.Ptr, int32(rows), int32(n)); err != nil {
		t.Fatal(err)
	}
	y := hostF32(t, c, dout, rows*n)
	closeTo(t, "softmax", y, cpuOp(t, "Softmax", nil, []ir.Shape{sh}, x)[0], 1e-6)
	dY, dG := devF32(t, c, y), devF32(t, c, make([]float32, rows*n))
	if err := c.Launch("softmax_rows_bwd_f32", [3]uint32{rows, 1, 1}, block1D, 0, dG.Ptr, ddy.Ptr, dY.Ptr, int32(rows), int32(n)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "softmax backward", hostF32(t, c, dG, rows*n), cpuOp(t, "SoftmaxGrad", nil, []ir.Shape{sh, sh}, dy, y)[0], 1e-6)

	N := int64(rows * n)
	stats, sums := devF32(t, c, make([]float32, 4)), devF32(t, c, make([]float32, 4))
	zpart := devF32(t, c, make([]float32, 2*zscoreWorkspace(rows*n)))
	if err := zscoreStats(c.Launch, stats.Ptr, zpart.Ptr, dx.Ptr, rows*n); err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("zscore_fwd_f32", grid1D, block1D, 0, dout.Ptr, dx.Ptr, stats.Ptr, N); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "zscore", hostF32(t, c, dout, rows*n), cpuOp(t, "ZScore", nil, []ir.Shape{sh}, x)[0], 1e-5)
	if err := zscoreGradSums(c.Launch, sums.Ptr, zpart.Ptr, ddy.Ptr, dx.Ptr, stats.Ptr, rows*n); err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("zscore_bwd_f32", grid1D, block1D, 0, dG.Ptr, ddy.Ptr, dx.Ptr, stats.Ptr, sums.Ptr, N); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "zscore backward", hostF32(t, c, dG, rows*n), cpuOp(t, "ZScoreGrad", nil, []ir.Shape{sh, sh}, dy, x)[0], 1e-5)

	odd := append([]float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}, x[3:]...)
	dodd := devF32(t, c, odd)
	if err := c.Launch("clamp_f32", grid1D, block1D, 0, dout.Ptr, dodd.Ptr, float32(-1), float32(1.5), N); err != nil {
		t.Fatal(err)
	}
	got, want := hostF32(t, c, dout, rows*n), cpuOp(t, "Clamp", ir.Attrs{"lo": -1.0, "hi": 1.5}, []ir.Shape{sh}, odd)[0]
	if !math.IsNaN(float64(got[0])) {
		t.Errorf("clamp(NaN) = %g, want NaN", got[0])
	}
	closeTo(t, "clamp", got[1:], want[1:], 0)
	if err := c.Launch("nan_to_num_f32", grid1D, block1D, 0, dout.Ptr, dodd.Ptr, float32(0), float32(4), float32(-4), N); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "nan_to_num", hostF32(t, c, dout, rows*n),
		cpuOp(t, "NanToNum", ir.Attrs{"nan": 0.0, "posinf": 4.0, "neginf": -4.0}, []ir.Shape{sh}, odd)[0], 0)

	const E = 4
	gate := randF32(r, 500*E, 1)
	gate[1], gate[5], gate[6] = float32(math.NaN()), gate[4], gate[4] // NaN and ties
	dgate, dmask := devF32(t, c, gate), devF32(t, c, make([]float32, 500*E))
	if err := c.Launch("topk_mask_f32", grid1D, block1D, 0, dmask.Ptr, dgate.Ptr, int32(500), int32(E), int32(2)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "top-k mask", hostF32(t, c, dmask, 500*E), cpuOp(t, "TopKMask", ir.Attrs{"k": 2}, []ir.Shape{{500, E}}, gate)[0], 0)

	const R, K = 4, 4
	km := make([]float32, R*K)
	for i := range km {
		km[i] = float32(math.Exp(r.NormFloat64()))
	}
	dkm, dP, work := devF32(t, c, km), devF32(t, c, make([]float32, R*K)), devF32(t, c, make([]float32, 2*R*K))
	if err := c.Launch("sinkhorn_f32", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, dP.Ptr, dkm.Ptr, work.Ptr, int32(R), int32(K), int32(6)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "sinkhorn", hostF32(t, c, dP, R*K), cpuOp(t, "Sinkhorn", ir.Attrs{"iters": 6}, []ir.Shape{{R, K}}, km)[0], 1e-6)
}

// TestCPUReferenceHarness checks cpuOp itself (no GPU): softmax rows sum to
// one, and Sinkhorn's columns sum to one after its last round.
func TestCPUReferenceHarness(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	x := randF32(r, 3*7, 1)
	y := cpuOp(t, "Softmax", nil, []ir.Shape{{3, 7}}, x)[0]
	for i := 0; i < 3; i++ {
		var s float64
		for _, v := range y[i*7 : (i+1)*7] {
			s += v
		}
		if math.Abs(s-1) > 1e-12 {
			t.Fatalf("softmax row %d sums to %g", i, s)
		}
	}
	km := make([]float32, 16)
	for i := range km {
		km[i] = float32(math.Exp(r.NormFloat64()))
	}
	g := cpuOp(t, "GaussianMembershipGrad", nil, []ir.Shape{{3, 5}, {3, 7}, {5, 7}, {5}, {3, 5}},
		randF32(r, 15, 1), randF32(r, 21, 1), randF32(r, 35, 1), randF32(r, 5, 0.3), randF32(r, 15, 1))
	if len(g) != 3 || len(g[0]) != 21 || len(g[1]) != 35 || len(g[2]) != 5 {
		t.Fatalf("GaussianMembershipGrad reference: %d outputs", len(g))
	}
	P := cpuOp(t, "Sinkhorn", ir.Attrs{"iters": 6}, []ir.Shape{{4, 4}}, km)[0]
	for c := 0; c < 4; c++ {
		s := P[c] + P[4+c] + P[8+c] + P[12+c]
		if math.Abs(s-1) > 1e-6 {
			t.Fatalf("Sinkhorn column %d sums to %g", c, s)
		}
	}
}

// TestGPUMembershipAndSinkhornGrad: GaussianMembership forward and
// backward and Sinkhorn's backward against the CPU backend.
func TestGPUMembershipAndSinkhornGrad(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(21, 22))
	const N, D, R = 300, 85, 4
	z, cen, ls, dmu := randF32(r, N*D, 1), randF32(r, R*D, 1), randF32(r, R, 0.3), randF32(r, N*R, 1)
	dz_, dc_, dls_ := devF32(t, c, z), devF32(t, c, cen), devF32(t, c, ls)
	dmu_, gmu := devF32(t, c, dmu), devF32(t, c, make([]float32, N*R))
	warps := [3]uint32{(N*32 + 255) / 256, 1, 1}
	if err := c.Launch("gaussian_membership_f32", warps, block1D, 0, gmu.Ptr, dz_.Ptr, dc_.Ptr, dls_.Ptr, int32(N), int32(D), int32(R)); err != nil {
		t.Fatal(err)
	}
	mu := hostF32(t, c, gmu, N*R)
	shapes := []ir.Shape{{N, D}, {R, D}, {R}}
	closeTo(t, "membership", mu, cpuOp(t, "GaussianMembership", nil, shapes, z, cen, ls)[0], 1e-5)
	gdz, gdz2 := devF32(t, c, make([]float32, N*D)), devF32(t, c, make([]float32, N*R))
	dss := devF32(t, c, make([]float32, N*R))
	gdc, gdls := devF32(t, c, make([]float32, R*D)), devF32(t, c, make([]float32, R))
	if err := c.Launch("gaussian_membership_bwd_rows_f32", warps, block1D, 0, gdz.Ptr, gdz2.Ptr, dss.Ptr,
		dmu_.Ptr, dz_.Ptr, dc_.Ptr, dls_.Ptr, gmu.Ptr, int32(N), int32(D), int32(R)); err != nil {
		t.Fatal(err)
	}
	mpart := devF32(t, c, make([]float32, 2*membershipParamsWorkspace(N, D, R)))
	if err := membershipParams(c.Launch, gdc.Ptr, gdls.Ptr, mpart.Ptr, gdz2.Ptr, dss.Ptr, dz_.Ptr, dc_.Ptr, dls_.Ptr, N, D, R); err != nil {
		t.Fatal(err)
	}
	want := cpuOp(t, "GaussianMembershipGrad", nil, []ir.Shape{{N, R}, {N, D}, {R, D}, {R}, {N, R}}, dmu, z, cen, ls, mu)
	closeTo(t, "membership dz", hostF32(t, c, gdz, N*D), want[0], 1e-4)
	closeTo(t, "membership dcenters", hostF32(t, c, gdc, R*D), want[1], 1e-4)
	closeTo(t, "membership dlog_sigma", hostF32(t, c, gdls, R), want[2], 1e-4)

	const K, iters = 4, 6
	km, dP := make([]float32, R*K), randF32(r, R*K, 1)
	for i := range km {
		km[i] = float32(math.Exp(r.NormFloat64()))
	}
	dkm, ddP, gdX := devF32(t, c, km), devF32(t, c, dP), devF32(t, c, make([]float32, R*K))
	work := devF32(t, c, make([]float32, 2*(2*R*K+iters*(2*R*K+R+K))))
	if err := c.Launch("sinkhorn_bwd_f32", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, gdX.Ptr, ddP.Ptr, dkm.Ptr, work.Ptr,
		int32(R), int32(K), int32(iters)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "sinkhorn backward", hostF32(t, c, gdX, R*K), cpuOp(t, "SinkhornGrad", ir.Attrs{"iters": iters}, []ir.Shape{{R, K}, {R, K}}, dP, km)[0], 1e-6)
}
