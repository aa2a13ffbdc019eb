package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// gpuContext returns a context with every kernel source loaded, or skips the test
// when no GPU is visible (RPAC_REQUIRE_GPU=1, as scripts/gpu-check.sh sets
// it, makes that a failure).
func gpuContext(t *testing.T) *driver.Context {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	fail := func(err error) {
		if os.Getenv("RPAC_REQUIRE_GPU") == "1" {
			t.Fatalf("RPAC_REQUIRE_GPU=1 and no usable GPU: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	d, err := driver.LoadDriver()
	if err != nil {
		fail(err)
	}
	c, err := d.NewContext(0)
	if err != nil {
		fail(err)
	}
	n, err := driver.LoadNVRTC()
	if err != nil {
		t.Fatalf("a GPU is present but NVRTC is not: %v", err)
	}
	if err := loadKernels(c, n); err != nil {
		t.Fatal(err)
	}
	major, minor := n.Version()
	t.Logf("GPU %s (%s, %d SMs, driver CUDA %s, NVRTC %d.%d, kernels: %s)", c.Dev.Name, c.Dev.SM, c.Dev.SMs,
		c.Dev.DriverVersionString(), major, minor, c.Images[0])
	return c
}

// devF32 uploads x and returns its buffer (freed at cleanup).
func devF32(t *testing.T, c *driver.Context, x []float32) Buffer {
	t.Helper()
	b, err := c.Alloc(uint64(4 * max(1, len(x))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Free(b) })
	if len(x) > 0 {
		if err := c.Upload(b, unsafe.Pointer(&x[0]), uint64(4*len(x))); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func hostF32(t *testing.T, c *driver.Context, b Buffer, n int) []float32 {
	t.Helper()
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, n)
	if err := c.Download(unsafe.Pointer(&out[0]), b, uint64(4*n)); err != nil {
		t.Fatal(err)
	}
	return out
}

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	worst := 0.0
	for i := range want {
		g := float64(got[i])
		if g == want[i] { // equal infinities included (|−Inf − (−Inf)| is NaN)
			continue
		}
		d := math.Abs(g-want[i]) / math.Max(1, math.Abs(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		worst = math.Max(worst, d)
	}
	if worst > tol {
		t.Errorf("%s: worst error %.3g > %.3g", what, worst, tol)
	}
}

// closeToDots: each got[i], a sum of depth products accumulated in fp32,
// equals the exact want[i] within 4·√depth units of fp32 rounding of
// scale[i], the sum of the products' magnitudes (the usual probabilistic
// bound of a long fp32 sum; the tensor cores' accumulation need not round
// like a sequential sum, so a flat relative tolerance fails deep sums on
// a GPU that pass on the simulator: the sixth run measured 1.21e-4 over
// 8,192 terms). A wrong or unwritten element misses by far more.
func closeToDots(t *testing.T, what string, got []float32, want, scale []float64, depth int) {
	t.Helper()
	tol := 4 * math.Sqrt(float64(depth)) * 0x1p-24
	worst := 0.0
	for i := range want {
		d := math.Abs(float64(got[i])-want[i]) / math.Max(scale[i], math.SmallestNonzeroFloat64)
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		worst = math.Max(worst, d)
	}
	if worst > tol {
		t.Errorf("%s: worst error %.3g of the products' magnitude > %.3g (4·√%d·2⁻²⁴)", what, worst, tol, depth)
	}
}

// absF32 is |x| elementwise.
func absF32(x []float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(math.Abs(float64(v)))
	}
	return out
}

var (
	grid1D  = [3]uint32{64, 1, 1}
	block1D = [3]uint32{256, 1, 1}
)

// TestGPUElementwise: the generic unary and gradient kernels against
// float64 references (the broadcasting binary kernel runs through the
// backend's op parity test).
func TestGPUElementwise(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(1, 2))
	const n = 10007
	a, b := randF32(r, n, 2), randF32(r, n, 2)
	da, db, dout := devF32(t, c, a), devF32(t, c, b), devF32(t, c, make([]float32, n))
	ref := func(f func(x, y float64) float64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = f(float64(a[i]), float64(b[i]))
		}
		return out
	}
	gelu := func(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
	dgelu := func(x float64) float64 {
		return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*math.Exp(-x*x/2)/math.Sqrt(2*math.Pi)
	}
	cases := []struct {
		kernel string
		args   []any
		want   []float64
	}{
		{"unary_f32", []any{dout.Ptr, da.Ptr, mustEWCode("Scale"), float32(0.5), float32(-1), float32(0), int64(n)}, ref(func(x, _ float64) float64 { return 0.5*x - 1 })},
		{"unary_f32", []any{dout.Ptr, da.Ptr, mustEWCode("GELU"), float32(0), float32(0), float32(0), int64(n)}, ref(func(x, _ float64) float64 { return gelu(x) })},
		{"grad_unary_f32", []any{dout.Ptr, db.Ptr, da.Ptr, mustEWCode("GELUGrad"), float32(0), float32(0), int64(n)}, ref(func(x, y float64) float64 { return y * dgelu(x) })},
		{"unary_f32", []any{dout.Ptr, da.Ptr, mustEWCode("ReLU"), float32(0), float32(0), float32(0), int64(n)}, ref(func(x, _ float64) float64 { return math.Max(0, x) })},
		{"unary_f32", []any{dout.Ptr, da.Ptr, mustEWCode("Sigmoid"), float32(0), float32(0), float32(0), int64(n)}, ref(func(x, _ float64) float64 { return 1 / (1 + math.Exp(-x)) })},
		{"unary_f32", []any{dout.Ptr, da.Ptr, mustEWCode("Tanh"), float32(0), float32(0), float32(0), int64(n)}, ref(func(x, _ float64) float64 { return math.Tanh(x) })},
	}
	for _, tc := range cases {
		if err := c.Launch(tc.kernel, grid1D, block1D, 0, tc.args...); err != nil {
			t.Fatal(err)
		}
		closeTo(t, tc.kernel, hostF32(t, c, dout, n), tc.want, 1e-5)
	}
}

// TestGPUBF16RoundTrip: the bf16 conversion rounds to nearest even.
func TestGPUBF16RoundTrip(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(3, 4))
	const n = 4096
	x := randF32(r, n, 10)
	dx, dh, dy := devF32(t, c, x), devF32(t, c, make([]float32, n/2+1)), devF32(t, c, make([]float32, n))
	if err := c.Launch("f32_to_bf16_kernel", grid1D, block1D, 0, dh.Ptr, dx.Ptr, int64(n)); err != nil {
		t.Fatal(err)
	}
	if err := c.Launch("bf16_to_f32_kernel", grid1D, block1D, 0, dy.Ptr, dh.Ptr, int64(n)); err != nil {
		t.Fatal(err)
	}
	got := hostF32(t, c, dy, n)
	for i, v := range x {
		u := math.Float32bits(v)
		u += 0x7fff + (u>>16)&1
		want := math.Float32frombits(u &^ 0xffff)
		if got[i] != want {
			t.Fatalf("bf16(%g) = %g, want %g", v, got[i], want)
		}
	}
}

// TestGPULayerNorm: forward and backward (a warp per row; and the fused
// backward, dx and the parameters' partials in one pass) against float64
// references, on rows of 510, on rows of 512 whose last two entries are
// padding (attribute width) and on rows of 640 (the two-kernel backward
// only); on the simulator again in differential mode.
func TestGPULayerNorm(t *testing.T) {
	differentially(t, []string{"layernorm_fwd_f32", "layernorm_bwd_dx_f32", "layernorm_bwd_params_f32", "layernorm_bwd_f32"}, func() {
		layerNormKernels(t, 510, 510)
		layerNormKernels(t, 512, 510)
		layerNormKernels(t, 640, 640)
	})
}

// layerNormRef is LayerNorm over the first W of each row of D (the rest
// padding: output and gradients 0; g and b of W) in float64: y, dx, dg, db.
func layerNormRef(x, g, b, dy []float32, rows, D, W int) (y, dx, dg, db []float64) {
	y, dx = make([]float64, rows*D), make([]float64, rows*D)
	dg, db = make([]float64, W), make([]float64, W)
	n := float64(W)
	for i := 0; i < rows; i++ {
		var mu, v float64
		for j := 0; j < W; j++ {
			mu += float64(x[i*D+j]) / n
		}
		for j := 0; j < W; j++ {
			d := float64(x[i*D+j]) - mu
			v += d * d / n
		}
		rs := 1 / math.Sqrt(v+1e-5)
		var a, cc float64
		for j := 0; j < W; j++ {
			xh := (float64(x[i*D+j]) - mu) * rs
			y[i*D+j] = xh*float64(g[j]) + float64(b[j])
			dxh := float64(dy[i*D+j]) * float64(g[j])
			a += dxh / n
			cc += dxh * xh / n
			dg[j] += float64(dy[i*D+j]) * xh
			db[j] += float64(dy[i*D+j])
		}
		for j := 0; j < W; j++ {
			xh := (float64(x[i*D+j]) - mu) * rs
			dx[i*D+j] = (float64(dy[i*D+j])*float64(g[j]) - a - xh*cc) * rs
		}
	}
	return y, dx, dg, db
}

func layerNormKernels(t *testing.T, D, W int) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(5, 6))
	const rows = 37
	// the padding holds values too: the kernels must neither read nor keep them
	x, g, b, dy := randF32(r, rows*D, 1), randF32(r, W, 1), randF32(r, W, 1), randF32(r, rows*D, 1)
	dx_, dg_, db_ := devF32(t, c, x), devF32(t, c, g), devF32(t, c, b)
	dout, dmean, drstd := devF32(t, c, make([]float32, rows*D)), devF32(t, c, make([]float32, rows)), devF32(t, c, make([]float32, rows))
	if err := c.Launch("layernorm_fwd_f32", warpGrid(rows), reduceBlock, 0, // a warp per row
		dout.Ptr, dmean.Ptr, drstd.Ptr, dx_.Ptr, dg_.Ptr, db_.Ptr, int32(rows), int32(D), int32(W), float32(1e-5)); err != nil {
		t.Fatal(err)
	}
	want, wdx, wdg, wdb := layerNormRef(x, g, b, dy, rows, D, W)
	closeTo(t, "layernorm forward", hostF32(t, c, dout, rows*D), want, 1e-5)
	ddy, ddx := devF32(t, c, dy), devF32(t, c, make([]float32, rows*D))
	ddg, ddb := devF32(t, c, make([]float32, W)), devF32(t, c, make([]float32, W))
	const chunk = 16 // several partial sums over the 37 rows
	chunks := (rows + chunk - 1) / chunk
	stats, part := devF32(t, c, make([]float32, 2*rows)), devF32(t, c, make([]float32, 4*chunks*W)) // doubles
	if err := c.Launch("layernorm_bwd_dx_f32", warpGrid(rows), reduceBlock, 0,                      // a warp per row
		ddx.Ptr, stats.Ptr, ddy.Ptr, dx_.Ptr, dg_.Ptr, int32(rows), int32(D), int32(W), float32(1e-5)); err != nil {
		t.Fatal(err)
	}
	cols := uint32((W + 127) / 128)
	if err := c.Launch("layernorm_bwd_params_f32", [3]uint32{cols, uint32(chunks), 1}, [3]uint32{128, 1, 1}, 0,
		part.Ptr, ddy.Ptr, dx_.Ptr, stats.Ptr, int32(rows), int32(D), int32(W), int32(chunk)); err != nil {
		t.Fatal(err)
	}
	if err := layerNormParamSums(c.Launch, ddg.Ptr, ddb.Ptr, part.Ptr, chunks, W); err != nil {
		t.Fatal(err)
	}
	gotDx := hostF32(t, c, ddx, rows*D)
	closeTo(t, "layernorm dx", gotDx, wdx, 1e-4)
	closeTo(t, "layernorm dg", hostF32(t, c, ddg, W), wdg, 1e-4)
	closeTo(t, "layernorm db", hostF32(t, c, ddb, W), wdb, 1e-4)
	if W > lnFusedWidth {
		return
	}
	// the fused backward, warps of 2 rows: 3 chunks of 16 over the 37 rows
	const wrows = 2
	fchunks := ceilDiv(rows, 8*wrows)
	fdx, fpart := devF32(t, c, make([]float32, rows*D)), devF32(t, c, make([]float32, 4*fchunks*W))
	if err := c.Launch("layernorm_bwd_f32", [3]uint32{uint32(fchunks), 1, 1}, reduceBlock, 0,
		fdx.Ptr, fpart.Ptr, ddy.Ptr, dx_.Ptr, dg_.Ptr, int32(rows), int32(D), int32(W), int32(wrows), float32(1e-5)); err != nil {
		t.Fatal(err)
	}
	if err := layerNormParamSums(c.Launch, ddg.Ptr, ddb.Ptr, fpart.Ptr, fchunks, W); err != nil {
		t.Fatal(err)
	}
	fused := hostF32(t, c, fdx, rows*D)
	closeTo(t, "layernorm_bwd_f32 dx", fused, wdx, 1e-4)
	if d, err := driver.LoadDriver(); err == nil && d.Simulated() && !sameBits(fused, gotDx) {
		t.Error("layernorm_bwd_f32: dx differs from layernorm_bwd_dx_f32's") // the same code (a GPU's compiler may contract it otherwise)
	}
	closeTo(t, "layernorm_bwd_f32 dg", hostF32(t, c, ddg, W), wdg, 1e-4)
	closeTo(t, "layernorm_bwd_f32 db", hostF32(t, c, ddb, W), wdb, 1e-4)
}

// TestGPUSoftmaxCE: the fused cross-entropy's losses, argmax and gradient,
// on rows padded to ld (the LM head's chunk): the padding is neither read
// nor written; with a bf16 output the gradient goes there, bit for bit the
// bf16 rounding of the fp32 one, its padding zeroed, the logits untouched.
// TestGPUSoftmaxCE checks both forms of the fused softmax cross-entropy
// against float64 and softmax_ce_smem_f32 (the row kept in shared memory)
// against softmax_ce_fused_f32 bit for bit, normal and differential.
func TestGPUSoftmaxCE(t *testing.T) {
	c := gpuContext(t)
	kernels := []string{"softmax_ce_fused_f32", "softmax_ce_smem_f32"}
	differentially(t, kernels, func() {
		var first [][]float32
		for _, kernel := range kernels {
			outs := checkSoftmaxCE(t, c, kernel)
			if first == nil {
				first = outs
				continue
			}
			for i := range outs {
				if !sameBits(outs[i], first[i]) {
					t.Errorf("%s: output %d differs from softmax_ce_fused_f32's", kernel, i)
				}
			}
		}
	})
}

// checkSoftmaxCE runs kernel over rows of the paper's vocabulary (the fp32
// gradient in place, then the bf16 one), checks them and returns what it
// wrote: the fp32 gradient, the bf16 one, the losses and the argmax.
func checkSoftmaxCE(t *testing.T, c *driver.Context, kernel string) [][]float32 {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 8))
	const rows, V, ld = 9, 50257, 50264
	const ls, scale = 0.015, 0.25
	const pad = 1e30 // would win the argmax and overflow the sums if read
	x := randF32(r, rows*ld, 3)
	for i := 0; i < rows; i++ {
		for j := V; j < ld; j++ {
			x[i*ld+j] = pad
		}
	}
	tg := make([]float32, rows) // int32 bits, uploaded as 4-byte words
	tgi := make([]int32, rows)
	for i := range tgi {
		tgi[i] = int32(r.IntN(V))
		if i == rows-1 {
			tgi[i] = -1 // the ignored target
		}
		tg[i] = math.Float32frombits(uint32(tgi[i]))
	}
	dl, dt := devF32(t, c, x), devF32(t, c, tg)
	dsm, dce, dpred := devF32(t, c, make([]float32, rows)), devF32(t, c, make([]float32, rows)), devF32(t, c, make([]float32, rows))
	const gld = 50264
	dl2 := devF32(t, c, x)
	garbage := make([]float32, rows*gld/2) // bf16 pairs, the padding's included
	for i := range garbage {
		garbage[i] = math.Float32frombits(0x7fc17fc1)
	}
	dg := devF32(t, c, garbage)
	for _, l := range []struct {
		logits, gb uint64
		gld        int32
	}{{dl.Ptr, 0, 0}, {dl2.Ptr, dg.Ptr, gld}} {
		shared := uint32(0)
		if kernel == "softmax_ce_smem_f32" {
			shared = 4 * V
		}
		if err := c.Launch(kernel, [3]uint32{rows, 1, 1}, [3]uint32{512, 1, 1}, shared,
			l.logits, dsm.Ptr, dce.Ptr, dpred.Ptr, dt.Ptr, int32(rows), int32(V), int32(ld), float32(ls), float32(scale), l.gb, l.gld); err != nil {
			t.Fatal(err)
		}
	}
	grad := hostF32(t, c, dl, rows*ld)
	gb := hostF32(t, c, dg, rows*gld/2)
	bf := func(i int) uint16 { return uint16(math.Float32bits(gb[i/2]) >> (16 * (i % 2))) }
	for i := 0; i < rows; i++ {
		for j := 0; j < gld; j++ {
			want := uint16(0)
			if j < V {
				want = uint16(math.Float32bits(float32(roundBF16(grad[i*ld+j]))) >> 16)
			}
			if got := bf(i*gld + j); got != want {
				t.Fatalf("bf16 gradient row %d column %d: %#04x, want %#04x", i, j, got, want)
			}
		}
	}
	if !sameBits(hostF32(t, c, dl2, rows*ld), x) {
		t.Error("the launch with a bf16 gradient wrote the logits")
	}
	sm, ce, pr := hostF32(t, c, dsm, rows), hostF32(t, c, dce, rows), hostF32(t, c, dpred, rows)
	for i := 0; i < rows; i++ {
		row := x[i*ld : i*ld+V]
		for j := V; j < ld; j++ {
			if grad[i*ld+j] != pad {
				t.Fatalf("row %d: padding column %d written (%g)", i, j, grad[i*ld+j])
			}
		}
		m, arg, sx := math.Inf(-1), 0, 0.0
		for j, v := range row {
			if float64(v) > m {
				m, arg = float64(v), j
			}
			sx += float64(v)
		}
		var se float64
		for _, v := range row {
			se += math.Exp(float64(v) - m)
		}
		if got := int(math.Float32bits(pr[i])); got != arg {
			t.Errorf("row %d: argmax %d, want %d", i, got, arg)
		}
		if tgi[i] < 0 {
			if ce[i] != 0 || sm[i] != 0 || slices.ContainsFunc(grad[i*ld:i*ld+V], func(v float32) bool { return v != 0 }) {
				t.Errorf("row %d (ignored target): losses %g, %g or a gradient not zero", i, ce[i], sm[i])
			}
			continue
		}
		lse := m + math.Log(se)
		wce := lse - float64(row[tgi[i]])
		wsm := (1-ls)*wce + ls*(lse-sx/V)
		closeTo(t, "ce", ce[i:i+1], []float64{wce}, 1e-5)
		closeTo(t, "smoothed ce", sm[i:i+1], []float64{wsm}, 1e-5)
		want := make([]float64, V)
		for j, v := range row {
			tgt := ls / V
			if j == int(tgi[i]) {
				tgt += 1 - ls
			}
			want[j] = scale * (math.Exp(float64(v)-lse) - tgt)
		}
		closeTo(t, "dlogits", grad[i*ld:i*ld+V], want, 1e-6)
	}
	return [][]float32{grad, gb, sm, ce, pr}
}

// TestGPUAdamWAndNorm: the fused AdamW step and the gradient's sum of squares.
func TestGPUAdamWAndNorm(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(9, 10))
	const n = 20011
	p, g, m, v := randF32(r, n, 1), randF32(r, n, 0.1), randF32(r, n, 0.01), make([]float32, n)
	for i := range v {
		v[i] = float32(math.Abs(r.NormFloat64()) * 1e-3)
	}
	dp, dg, dm, dv := devF32(t, c, p), devF32(t, c, g), devF32(t, c, m), devF32(t, c, v)
	const lr, b1, b2, eps, wd, step = 1e-3, 0.9, 0.999, 1e-8, 0.01, 3
	bc1, bc2 := 1-math.Pow(b1, step), 1-math.Pow(b2, step)
	if err := c.Launch("adamw_f32", grid1D, block1D, 0, dp.Ptr, dg.Ptr, dm.Ptr, dv.Ptr, int64(n), float32(lr), float32(b1),
		float32(b2), float32(eps), float32(wd), float32(bc1), float32(bc2)); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, n)
	var ss float64
	for i := range want {
		gi := float64(g[i])
		mi := b1*float64(m[i]) + (1-b1)*gi
		vi := b2*float64(v[i]) + (1-b2)*gi*gi
		want[i] = float64(p[i])*(1-lr*wd) - lr*(mi/bc1)/(math.Sqrt(vi/bc2)+eps)
		ss += gi * gi
	}
	closeTo(t, "adamw", hostF32(t, c, dp, n), want, 1e-5)
	acc := devF32(t, c, make([]float32, 2)) // one double
	if err := c.Launch("sumsq_f32", grid1D, block1D, 0, acc.Ptr, dg.Ptr, int64(n)); err != nil {
		t.Fatal(err)
	}
	got := hostF32(t, c, acc, 2)
	sum := math.Float64frombits(uint64(math.Float32bits(got[0])) | uint64(math.Float32bits(got[1]))<<32)
	if math.Abs(sum-ss) > 1e-5*ss {
		t.Errorf("sum of squares %g, want %g", sum, ss)
	}
}

// TestGPUGather: embedding gather and its backward (rows grouped by id on
// the host, summed in order on the GPU).
func TestGPUGather(t *testing.T) {
	c := gpuContext(t)
	r := rand.New(rand.NewPCG(11, 12))
	const V, D, rows = 100, 64, 300
	W, dy := randF32(r, V*D, 1), randF32(r, rows*D, 1)
	ids, idw := make([]int32, rows), make([]float32, rows)
	for i := range ids {
		ids[i] = int32(r.IntN(V))
		idw[i] = math.Float32frombits(uint32(ids[i]))
	}
	dW, dids, dout := devF32(t, c, W), devF32(t, c, idw), devF32(t, c, make([]float32, rows*D))
	if err := c.Launch("gather_rows_f32", [3]uint32{rows, 1, 1}, [3]uint32{64, 1, 1}, 0, dout.Ptr, dW.Ptr, dids.Ptr, int32(rows), int32(D)); err != nil {
		t.Fatal(err)
	}
	want, wdW := make([]float64, rows*D), make([]float64, V*D)
	for i, id := range ids {
		for j := 0; j < D; j++ {
			want[i*D+j] = float64(W[int(id)*D+j])
			wdW[int(id)*D+j] += float64(dy[i*D+j])
		}
	}
	closeTo(t, "gather", hostF32(t, c, dout, rows*D), want, 0)
	ddW, ddy := devF32(t, c, make([]float32, V*D)), devF32(t, c, dy)
	csr, err := csrOf(ids, V)
	if err != nil {
		t.Fatal(err)
	}
	cw := make([]float32, len(csr))
	for i, v := range csr {
		cw[i] = math.Float32frombits(uint32(v))
	}
	uniq := (len(csr) - 1 - rows) / 2
	if err := c.Launch("gather_grad_csr_f32", [3]uint32{uint32(uniq), 1, 1}, [3]uint32{64, 1, 1}, 0, ddW.Ptr, ddy.Ptr,
		devF32(t, c, cw).Ptr, int32(uniq), int32(D)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "gather backward", hostF32(t, c, ddW, V*D), wdW, 1e-5)
}

// loadKernels loads every embedded kernel source into c.
func loadKernels(c *driver.Context, n *driver.NVRTC) error {
	srcs, err := KernelSources()
	if err != nil {
		return err
	}
	return c.LoadKernels(n, srcs)
}
