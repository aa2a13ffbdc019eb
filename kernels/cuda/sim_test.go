package cuda

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
	"github.com/rpac-dev/rpac/passes"
)

// The TestSim* tests. Those about the simulator itself (its counters,
// planted defects, checks a GPU does not make) run only on the CUDA
// simulator (RPAC_CUDA_SIM=1, as .ci/run sets it) and skip elsewhere: they
// call simOnly. The parity tests (CUDA against the CPU backend or host
// references) call parityDevice: they run on the simulator under
// RPAC_CUDA_SIM=1 and on a real GPU under RPAC_REQUIRE_GPU=1 (as
// scripts/gpu-check.sh sets it), and read the simulator's counters or use
// its differential mode only when d.Simulated().

func simOnly(t *testing.T) *driver.Driver {
	t.Helper()
	if os.Getenv("RPAC_CUDA_SIM") != "1" {
		t.Skip("simulator test: run with RPAC_CUDA_SIM=1")
	}
	return simDriver(t)
}

func simDriver(t *testing.T) *driver.Driver {
	t.Helper()
	d, err := driver.LoadDriver()
	if err != nil {
		t.Fatal(err)
	}
	if !d.Simulated() {
		t.Fatal("RPAC_CUDA_SIM=1 but the driver loaded is not the simulator")
	}
	return d
}

// parityDevice returns the driver a parity test runs on: the simulator's
// under RPAC_CUDA_SIM=1, else a real GPU's under RPAC_REQUIRE_GPU=1 (a
// driver that fails to load, or is the simulator's, fails the test); it
// skips otherwise.
func parityDevice(t *testing.T) *driver.Driver {
	t.Helper()
	if os.Getenv("RPAC_CUDA_SIM") == "1" {
		return simDriver(t)
	}
	if os.Getenv("RPAC_REQUIRE_GPU") != "1" {
		t.Skip("parity test: run with RPAC_CUDA_SIM=1 (the simulator) or RPAC_REQUIRE_GPU=1 (a GPU)")
	}
	d, err := driver.LoadDriver()
	if err != nil {
		t.Fatalf("RPAC_REQUIRE_GPU=1 and no usable GPU: %v", err)
	}
	if d.Simulated() {
		t.Fatal("RPAC_REQUIRE_GPU=1 without RPAC_CUDA_SIM=1, but the driver loaded is the simulator")
	}
	return d
}

// awkwardCases are shapes the tiny preset never has: head size 85 (the
// paper preset's), lengths that are not a multiple of any block size, rows
// longer than a block, batch one.
func awkwardCases() []opCase {
	att := ir.Shape{1, 2, 37, 85}
	return []opCase{
		{op: "FusedAttention", attrs: ir.Attrs{"scale": 0.11, "causal": true}, in: []ir.Shape{att, att, att, {37, 37}}},
		{op: "FusedAttention", attrs: ir.Attrs{"scale": 0.11, "causal": true, "dropout": 0.1, "stream": 3}, in: []ir.Shape{att, att, att}},
		{op: "FusedAttentionGrad", attrs: ir.Attrs{"scale": 0.11, "causal": true}, in: []ir.Shape{att, att, att, att, {37, 37}}},
		{op: "FusedAttentionGrad", attrs: ir.Attrs{"scale": 0.11, "causal": true, "dropout": 0.1, "stream": 3}, in: []ir.Shape{att, att, att, att, {37, 37}}},
		{op: "LayerNorm", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{37, 85}, {85}, {85}}},
		{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{37, 85}, {37, 85}, {85}}},
		{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5}, in: []ir.Shape{{1, 1029}, {1, 1029}, {1029}}},
		// rows of 88 whose last 3 entries are padding (compiler/model's aligned widths)
		{op: "LayerNorm", attrs: ir.Attrs{"eps": 1e-5, "width": 85}, in: []ir.Shape{{37, 88}, {85}, {85}}},
		{op: "LayerNormGrad", attrs: ir.Attrs{"eps": 1e-5, "width": 85}, in: []ir.Shape{{37, 88}, {37, 88}, {85}}},
		{op: "Softmax", in: []ir.Shape{{3, 1029}}},
		// The inputs are N(0,1), not a softmax: Σ dy·y over 1,029 entries is
		// about 32 in size, summed in fp32 in another order than the CPU's.
		{op: "SoftmaxGrad", in: []ir.Shape{{3, 1029}, {3, 1029}}, tol: 1e-4},
		{op: "CrossEntropy", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{5, 1111}, {5}}, ids: map[int]int{1: 1111}},
		{op: "CrossEntropyGrad", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{}, {5, 1111}, {5}}, ids: map[int]int{2: 1111}},
		{op: "GaussianMembership", in: []ir.Shape{{37, 85}, {4, 85}, {4}}},
		{op: "GaussianMembershipGrad", in: []ir.Shape{{37, 4}, {37, 85}, {4, 85}, {4}, {37, 4}}},
		{op: "ZScore", in: []ir.Shape{{37, 37}}},
		{op: "ZScoreGrad", in: []ir.Shape{{37, 37}, {37, 37}}},
		{op: "Linear", in: []ir.Shape{{1, 37, 85}, {9, 85}, {9}}},
		{op: "MatMul", attrs: ir.Attrs{"transB": true}, in: []ir.Shape{{1, 2, 37, 85}, {1, 2, 37, 85}}},
		{op: "Transpose", attrs: ir.Attrs{"perm": []int{0, 2, 1, 3}}, in: []ir.Shape{att}},
		{op: "ReduceSum", attrs: ir.Attrs{"axes": []int{0, 1}}, in: []ir.Shape{{1, 37, 85}}},
		{op: "Dropout", attrs: ir.Attrs{"p": 0.1}, in: []ir.Shape{{1, 37, 85}}},
		{op: "GELU", in: []ir.Shape{{1, 257}}},
		{op: "Gather", in: []ir.Shape{{1111, 85}, {1, 37}}, ids: map[int]int{1: 1111}},
		{op: "GatherGrad", attrs: ir.Attrs{"vocab": 1111}, in: []ir.Shape{{1, 37, 85}, {1, 37}}, ids: map[int]int{1: 1111}},
		{op: "LMHeadCrossEntropy", in: []ir.Shape{{37, 85}, {1111, 85}, {37}}, ids: map[int]int{2: 1111},
			build: func(g *ir.Graph, in []*ir.Value) []*ir.Value {
				a := ir.Attrs{"label_smoothing": 0.1, "chunk": 16}
				out := g.Apply("LMHeadCrossEntropy", a, in[0], in[1], in[2])
				return append(out, g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(0.3), in[0], in[1], in[2])...)
			}},
		// ignored targets (ir.IgnoreTarget): no loss, zero gradient rows
		{op: "CrossEntropy", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{5, 1111}, {5}}, ids: map[int]int{1: 1111}, ignore: true},
		{op: "CrossEntropyGrad", attrs: ir.Attrs{"label_smoothing": 0.1}, in: []ir.Shape{{}, {5, 1111}, {5}}, ids: map[int]int{2: 1111}, ignore: true},
		{op: "LMHeadCrossEntropy", in: []ir.Shape{{37, 85}, {1111, 85}, {37}}, ids: map[int]int{2: 1111}, ignore: true,
			build: func(g *ir.Graph, in []*ir.Value) []*ir.Value {
				a := ir.Attrs{"label_smoothing": 0.1, "chunk": 16}
				out := g.Apply("LMHeadCrossEntropy", a, in[0], in[1], in[2])
				return append(out, g.Apply("LMHeadCrossEntropyGrad", a, g.Scalar(0.3), in[0], in[1], in[2])...)
			}},
	}
}

// checkParity runs cases on be and the CPU and compares every output.
func checkParity(t *testing.T, be *Backend, cases []opCase, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 32))
	for _, c := range cases {
		g, feeds := caseGraph(c, r)
		for name, pair := range runBoth(t, string(c.op), g, feeds, be) {
			want, got := pair[0], pair[1]
			if got == nil {
				t.Fatalf("%s output %s: no result from the CUDA backend", c.op, name)
			}
			if want.I32 != nil {
				for i := range want.I32 {
					if want.I32[i] != got.I32[i] {
						t.Errorf("%s output %s[%d]: cuda %d, cpu %d", c.op, name, i, got.I32[i], want.I32[i])
						break
					}
				}
				continue
			}
			tol := c.tol
			if tol == 0 {
				tol = 1e-5
			}
			closeTo(t, string(c.op)+" output "+name, got.F32, want.Float64s(), tol)
		}
	}
}

// TestSimOpParity: every op of the IR table (and the awkward shapes) on the
// simulator or a GPU against the CPU backend, then, on the simulator, again
// in differential mode (each launch run twice, in reverse block and thread
// order with another shared-memory poison, results compared bit for bit).
func TestSimOpParity(t *testing.T) {
	d := parityDevice(t)
	be := gpuBackend(t, ir.FP32)
	cases := append(opCases(), awkwardCases()...)
	t0 := time.Now()
	checkParity(t, be, cases, 31)
	t.Logf("%d cases in normal mode: %v", len(cases), time.Since(t0))
	if t.Failed() || !d.Simulated() {
		return
	}
	d.SimConfig("diff", 1)
	defer d.SimConfig("diff", 0)
	before := d.SimStat("diff_launches")
	t0 = time.Now()
	checkParity(t, be, cases, 31)
	n := d.SimStat("diff_launches") - before
	t.Logf("%d cases in differential mode (%d launches compared): %v", len(cases), n, time.Since(t0))
	if n < int64(len(cases)) {
		t.Errorf("only %d launches ran in differential mode", n)
	}
}

// differentially runs body, then, on the simulator, once more in
// differential mode (each launch run a second time in reverse block and
// thread order with another shared-memory poison, every allocation it
// reaches compared bit for bit), and fails unless each kernel named ran
// there. On a GPU body runs once.
func differentially(t *testing.T, kernels []string, body func()) {
	t.Helper()
	body()
	d, err := driver.LoadDriver()
	if err != nil || !d.Simulated() || t.Failed() {
		return
	}
	before := make([]int64, len(kernels))
	for i, k := range kernels {
		before[i] = d.SimStat("diff:" + k)
	}
	d.SimConfig("diff", 1)
	defer d.SimConfig("diff", 0)
	body()
	for i, k := range kernels {
		if n := d.SimStat("diff:"+k) - before[i]; n <= 0 {
			t.Errorf("%s: no launch ran in differential mode", k)
		}
	}
}

// TestSimReleaseFrees: Backend.Release frees the stored tensors' device
// copies (it binds the context first; unbound frees fail).
func TestSimReleaseFrees(t *testing.T) {
	d := simOnly(t)
	be := gpuBackend(t, ir.FP32)
	base := d.SimStat("allocs")
	g := ir.New("params")
	w := g.Param("w", ir.Shape{7, 5})
	x := g.Input("x", ir.Shape{3, 5}, ir.F32)
	g.SetOutput("y", g.Op1("Linear", nil, x, w))
	st := kernels.NewStore(ir.FP32)
	if _, err := st.Ensure("w", ir.Shape{7, 5}); err != nil {
		t.Fatal(err)
	}
	p, err := be.Compile(g, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{3, 5})}, 0); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if n := d.SimStat("allocs"); n != base+1 {
		t.Fatalf("after Close: %d allocations, want %d (the parameter's device copy)", n, base+1)
	}
	be.Release(st)
	if n := d.SimStat("allocs"); n != base {
		t.Fatalf("after Release: %d allocations, want %d", n, base)
	}
}

// plant is a defect planted in the kernel sources: rewrite must change
// source, and the tests that run then match must fail with output that
// reason matches (what catches the defect).
type plant struct {
	source  string
	rewrite func(string) string
	run     string
	reason  *regexp.Regexp
}

// parityFailure: the parity test's comparison with the CPU, or the
// differential run, caught the defect.
var parityFailure = regexp.MustCompile(`worst error .* > |differential run of kernel`)

// plants are the defects planted in the kernel sources.
var plants = map[string]plant{
	// every grid-stride loop runs one element past its end
	"grid-stride": {"graph.cu", func(s string) string {
		return strings.Replace(s, "i < (n); i += (i64)gridDim.x", "i <= (n); i += (i64)gridDim.x", 1)
	}, "^TestSimOpParity$", regexp.MustCompile(`invalid (read|write|access) .*past the end of the`)},
	// one of block_reduce's three __syncthreads removed (block_sum and
	// block_max are both block_reduce)
	"block_reduce-sync1": {"graph.cu", func(s string) string { return removeSync(s, 0) }, "^TestSimOpParity$", parityFailure},
	"block_reduce-sync2": {"graph.cu", func(s string) string { return removeSync(s, 1) }, "^TestSimOpParity$", parityFailure},
	"block_reduce-sync3": {"graph.cu", func(s string) string { return removeSync(s, 2) }, "^TestSimOpParity$", parityFailure},
	// flash.cu scales each accumulator element by the factor of row e/16,
	// its position were the whole tile in one lane, instead of the row
	// fa_row_ids learnt from the tensor cores: the fragment layout differs
	// (on a GPU, and on the simulator by construction), so the attention's
	// output fails its comparison with float64.
	"flash-layout": {"flash.cu", func(s string) string {
		return strings.Replace(s, "acc[nn].x[e] *= f[(int)ids.x[e]];", "acc[nn].x[e] *= f[e >> 4];", 1)
	}, "^TestGPUAttentionTensorCores$", regexp.MustCompile(`(?m)^\s*attention_gpu_test\.go:\d+: o: worst \S+ \(bound \S+\), L2`)},
}

func removeSync(s string, k int) string {
	i := strings.Index(s, "float block_reduce(")
	j := strings.Index(s[i:], "float block_sum(")
	body := s[i : i+j]
	parts := strings.Split(body, "__syncthreads();")
	if len(parts) != 4 {
		return s + "\n#error block_reduce does not have three __syncthreads\n"
	}
	out := ""
	for n, p := range parts {
		out += p
		if n < 3 && n != k {
			out += "__syncthreads();"
		}
	}
	return s[:i] + out + s[i+j:]
}

// TestSimCatchesPlantedDefects runs each planted defect's tests in a child
// process (with the defect in every source) and requires them to fail for
// the defect's reason. The WMMA fragment layouts are drawn afresh in each
// child; the seed is in the log.
func TestSimCatchesPlantedDefects(t *testing.T) {
	simOnly(t)
	if os.Getenv("RPAC_SIM_PLANT") != "" {
		t.Skip("child")
	}
	for name, pl := range plants {
		src, err := Source(pl.source)
		if err != nil {
			t.Fatal(err)
		}
		if p := pl.rewrite(src); p == src || strings.Contains(p, "#error") {
			t.Fatalf("planted defect %s does not apply to %s", name, pl.source)
		}
		t.Run(name, func(t *testing.T) {
			t0 := time.Now()
			cmd := exec.Command(os.Args[0], "-test.run", pl.run, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "RPAC_SIM_PLANT="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("%s passed with the planted defect %q:\n%s", pl.run, name, tail(string(out), 1500))
			}
			if !pl.reason.Match(out) {
				t.Fatalf("%s failed with the planted defect %q, but not as %q:\n%s", pl.run, name, pl.reason, tail(string(out), 3000))
			}
			t.Logf("caught in %v: %s", time.Since(t0).Round(time.Millisecond), firstLines(string(out), "WMMA fragment layouts", "cudasim:", "worst", "differential"))
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// firstLines returns the first line containing each marker.
func firstLines(s string, markers ...string) string {
	var out []string
	for _, m := range markers {
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); strings.Contains(l, m) && !slices.Contains(out, l) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, " | ")
}

// TestSimCubinAndPTXFallback: LoadKernels loads every source as a cubin for
// the device's sm_NN (the simulator counts the modules it loads of each
// kind), and with NVRTC unable to give a cubin (the simulator's no_cubin
// switch) falls back to PTX for compute_NN, says why, and the kernels
// still run. The cache keeps the two apart.
func TestSimCubinAndPTXFallback(t *testing.T) {
	d := simOnly(t)
	n, err := driver.LoadNVRTC()
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, c *driver.Context) {
		// one kernel through the context, against its CPU result
		x := devF32(t, c, []float32{1, -2, 3.5})
		if err := c.Launch("scale_inplace_f32", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, x.Ptr, float32(2), int64(3)); err != nil {
			t.Fatal(err)
		}
		if got := hostF32(t, c, x, 3); got[0] != 2 || got[1] != -4 || got[2] != 7 {
			t.Fatalf("scale_inplace_f32 gave %v", got)
		}
	}
	load := func(t *testing.T, cache string) *driver.Context {
		t.Setenv("RPAC_CUDA_CACHE", cache)
		c, err := d.NewContext(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := loadKernels(c, n); err != nil {
			t.Fatal(err)
		}
		if len(c.Images) != len(SourceNames()) {
			t.Fatalf("%d images loaded for %d sources", len(c.Images), len(SourceNames()))
		}
		return c
	}
	t.Run("cubin", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cache := t.TempDir()
		cubins, ptxs := d.SimStat("cubin_loads"), d.SimStat("ptx_loads")
		c := load(t, cache)
		for _, im := range c.Images {
			if im.Kind != "cubin" || im.Arch != c.Dev.SM || im.Fallback != "" || im.Cached {
				t.Errorf("%s: %s, want a fresh cubin for %s", im.Source, im, c.Dev.SM)
			}
		}
		if got := d.SimStat("cubin_loads") - cubins; got != int64(len(c.Images)) || d.SimStat("ptx_loads") != ptxs {
			t.Errorf("the driver loaded %d cubins and %d PTX modules, want %d cubins", got, d.SimStat("ptx_loads")-ptxs, len(c.Images))
		}
		run(t, c)
		if c = load(t, cache); !c.Images[0].Cached || c.Images[0].Kind != "cubin" {
			t.Errorf("second load: %s, want the cached cubin", c.Images[0])
		}
		if m, _ := filepath.Glob(filepath.Join(cache, "nvrtc-*", c.Dev.SM, "*.cubin")); len(m) != len(c.Images) {
			t.Errorf("%d cubins cached under %s, want %d", len(m), c.Dev.SM, len(c.Images))
		}
	})
	t.Run("ptx-fallback", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		d.SimConfig("no_cubin", 1)
		defer d.SimConfig("no_cubin", 0)
		cache := t.TempDir()
		ptxs := d.SimStat("ptx_loads")
		c := load(t, cache)
		for _, im := range c.Images {
			if im.Kind != "ptx" || im.Arch != c.Dev.Arch || !strings.Contains(im.Fallback, "cubin") {
				t.Errorf("%s: %s, want PTX for %s with the cubin's failure", im.Source, im, c.Dev.Arch)
			}
		}
		if got := d.SimStat("ptx_loads") - ptxs; got != int64(len(c.Images)) {
			t.Errorf("the driver loaded %d PTX modules, want %d", got, len(c.Images))
		}
		t.Logf("fallback: %s", c.Images[0])
		run(t, c)
		if m, _ := filepath.Glob(filepath.Join(cache, "nvrtc-*", c.Dev.SM, "*")); len(m) != 0 {
			t.Errorf("a failed cubin left cache entries: %v", m)
		}
		if m, _ := filepath.Glob(filepath.Join(cache, "nvrtc-*", c.Dev.Arch, "*.ptx")); len(m) != len(c.Images) {
			t.Errorf("%d PTX images cached, want %d", len(m), len(c.Images))
		}
	})
	t.Run("RPAC_CUDA_PTX", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		t.Setenv("RPAC_CUDA_PTX", "1")
		c := load(t, t.TempDir())
		if im := c.Images[0]; im.Kind != "ptx" || !strings.Contains(im.Fallback, "RPAC_CUDA_PTX") {
			t.Errorf("%s, want PTX because of RPAC_CUDA_PTX=1", im)
		}
	})
	t.Run("probe", func(t *testing.T) {
		rep := Probe()
		if rep.Code != "cubin" || rep.DriverVersion == "" || !strings.HasPrefix(rep.NVRTC, "0.") || !rep.Simulated {
			t.Errorf("probe: code %q, driver %q, NVRTC %q, simulated %v", rep.Code, rep.DriverVersion, rep.NVRTC, rep.Simulated)
		}
		for name, k := range rep.Kernels {
			if !strings.Contains(k, "cubin sm_") {
				t.Errorf("probe: %s: %s", name, k)
			}
		}
	})
}

// brokenSource holds deliberately broken kernels (test only), each defect
// on a line marked "// @NAME".
const brokenSource = `#line 1 "broken.cu"
extern "C" __global__ void broken_exited_lane(float* out) {
    float v = threadIdx.x;
    if (threadIdx.x == 5) return;
    v += __shfl_down_sync(0xffffffffu, v, 1); // @exited
    out[threadIdx.x] = v;
}
extern "C" __global__ void broken_masks(float* out) {
    unsigned m = threadIdx.x < 16 ? 0xffffu : 0xffffffffu;
    float v = __shfl_sync(m, (float)threadIdx.x, 0); // @masks
    out[threadIdx.x] = v;
}
extern "C" __global__ void broken_divergent_warp(float* out) {
    float v = threadIdx.x;
    if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xffffffffu, v, 1); // @warp-a
    else v = __shfl_xor_sync(0xffffffffu, v, 2); // @warp-b
    out[threadIdx.x] = v;
}
extern "C" __global__ void broken_divergent_sync(float* out) {
    if (threadIdx.x < 32) {
        __syncthreads(); // @sync-a
    } else {
        __syncthreads(); // @sync-b
    }
    out[threadIdx.x] = 1.0f;
}
extern "C" __global__ void broken_deadlock(float* out) {
    float v = threadIdx.x;
    if (threadIdx.x == 0) v = __shfl_sync(0x3u, v, 1); // @deadlock-warp
    else __syncthreads(); // @deadlock-bar
    out[threadIdx.x] = v;
}
extern "C" __global__ void broken_uninit_shared(float* out) {
    __shared__ float s[64];
    if (threadIdx.x < 32) s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x] > 0.0f ? 1.0f : 0.0f; // reads s[32..63], never written
}
`

// brokenLine is "broken.cu:N" for the line marked // @mark.
func brokenLine(t *testing.T, mark string) string {
	t.Helper()
	for i, l := range strings.Split(brokenSource, "\n") {
		if strings.Contains(l, "// @"+mark) {
			return "broken.cu:" + strconv.Itoa(i) // line 0 is the #line directive
		}
	}
	t.Fatalf("no line marked @%s", mark)
	return ""
}

// TestSimDiagnostics: the simulator's warp, barrier and differential
// checks each catch a deliberately broken kernel, and the error names the
// kernel and (where the defect has one) the source line.
func TestSimDiagnostics(t *testing.T) {
	d := simOnly(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n, err := driver.LoadNVRTC()
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	img, err := n.CompileCUBIN("broken.cu", brokenSource, c.Dev.SM)
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, m := range entryRE.FindAllStringSubmatch(brokenSource, -1) {
		entries = append(entries, m[1])
	}
	if err := c.LoadImage(img, entries); err != nil {
		t.Fatal(err)
	}
	defer d.SimConfig("clear_sticky", 1)
	// launch runs kernel on one block of 64 threads and returns the error
	// its launch left (the context's sticky error), then clears it.
	out := devF32(t, c, make([]float32, 64))
	launch := func(t *testing.T, kernel string) error {
		t.Helper()
		unbind, err := (&gpu{ctx: c}).bind() // subtests run on other threads
		if err != nil {
			t.Fatal(err)
		}
		defer unbind()
		if err := c.Launch(kernel, [3]uint32{1, 1, 1}, [3]uint32{64, 1, 1}, 0, out.Ptr); err != nil {
			return err
		}
		err = c.Sync()
		if code := d.SimConfig("clear_sticky", 1); (code != 0) != (err != nil) {
			t.Fatalf("sticky error %d, Sync: %v", code, err)
		}
		return err
	}
	for _, tc := range []struct {
		kernel string
		want   []string // in the error, besides the kernel's name
	}{
		{"broken_exited_lane", []string{"__shfl_down_sync at " + brokenLine(t, "exited"), "lane 5 of mask 0xffffffff has exited"}},
		{"broken_masks", []string{"__shfl_sync at " + brokenLine(t, "masks"), "mismatched masks: lane 0 ran it with mask 0xffff, this lane with mask 0xffffffff"}},
		{"broken_divergent_warp", []string{"__shfl_xor_sync at " + brokenLine(t, "warp-b"), "lane 0 waits at __shfl_xor_sync at " + brokenLine(t, "warp-a") + " (mask 0xffffffff) instead"}},
		{"broken_divergent_sync", []string{"divergent __syncthreads", brokenLine(t, "sync-a"), brokenLine(t, "sync-b")}},
		{"broken_deadlock", []string{"deadlock", "__shfl_sync " + brokenLine(t, "deadlock-warp"), "__syncthreads " + brokenLine(t, "deadlock-bar")}},
	} {
		t.Run(tc.kernel, func(t *testing.T) {
			err := launch(t, tc.kernel)
			if err == nil {
				t.Fatalf("%s ran without an error", tc.kernel)
			}
			for _, w := range append([]string{"kernel " + tc.kernel}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q: %v", w, err)
				}
			}
			t.Logf("%v", err)
		})
	}
	t.Run("broken_uninit_shared", func(t *testing.T) {
		// the NaN poison reads as "not > 0", like a zero: only the
		// differential run, whose other poison reads as > 0, sees it
		if err := launch(t, "broken_uninit_shared"); err != nil {
			t.Fatalf("normal mode: %v", err)
		}
		d.SimConfig("diff", 1)
		defer d.SimConfig("diff", 0)
		err := launch(t, "broken_uninit_shared")
		if err == nil || !strings.Contains(err.Error(), "differential run of kernel broken_uninit_shared") {
			t.Fatalf("differential mode: %v", err)
		}
		t.Logf("%v", err)
	})
	// the context works again, with the real kernels
	if err := launch(t, "broken_divergent_sync"); err == nil {
		t.Fatal("the divergent barrier passed on a second launch")
	}
}

// TestSimPlanSlotsPoisoned: on the simulator a plan slot is poisoned
// (NaN) once its values are dead, and every slot at the start of a Run,
// so a value that takes a slot over finds NaN, not its predecessor's
// data. Four Softmaxes in a row take two slots in turn.
func TestSimPlanSlotsPoisoned(t *testing.T) {
	simOnly(t)
	g := ir.New("slots")
	x := g.Input("x", ir.Shape{3, 37}, ir.F32)
	a := g.Op1("Softmax", nil, x)
	b := g.Op1("Softmax", nil, a)
	c := g.Op1("Softmax", nil, b)
	g.SetOutput("d", g.Op1("Softmax", nil, c))
	plan := passes.Plan(g)
	if plan.Slot[a.ID] != plan.Slot[c.ID] || len(plan.SlotElems) != 2 {
		t.Fatalf("the plan does not hand a's slot to c: %v, %d slots", plan.Slot, len(plan.SlotElems))
	}
	be := gpuBackend(t, ir.FP32)
	prog, err := be.Compile(g, plan, kernels.NewStore(ir.FP32))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	feeds := map[string]*kernels.Tensor{"x": kernels.NewTensor(ir.FP32, ir.Shape{3, 37})}
	if err := prog.Run(feeds, 1); err != nil {
		t.Fatal(err)
	}
	p := prog.(*program)
	nans := func(v *ir.Value) int {
		unbind, err := be.bind()
		if err != nil {
			t.Fatal(err)
		}
		defer unbind()
		d := p.vals[v.ID]
		host := make([]float32, d.n)
		if err := be.dev.download(unsafe.Pointer(&host[0]), d.buf, uint64(4*d.n)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range host {
			if f != f {
				n++
			}
		}
		return n
	}
	out := g.Outputs["d"]
	if n := nans(out); n != 0 {
		t.Fatalf("the output has %d NaNs", n)
	}
	if n := nans(c); n != 111 {
		t.Errorf("c's slot, given back after the last node: %d of 111 entries NaN, want all", n)
	}
	if err := prog.Run(map[string]*kernels.Tensor{}, 1); err == nil { // no feed: fails after the poisoning
		t.Fatal("a Run without its feed succeeded")
	}
	if n := nans(out); n != 111 {
		t.Errorf("the output's slot after the start of another Run: %d of 111 entries NaN, want all", n)
	}
}
