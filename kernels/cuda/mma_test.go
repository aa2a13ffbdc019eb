package cuda

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// mmaSource is a test-only kernel source: C = alpha·(A·B + 0.5) through
// the prelude's rpac_mma tiles, one warp per 16×16 tile of C, A [M,K] and B
// [K,N] row-major fp32 staged into shared memory as bf16 in the layout the
// kernel's fragment types name (K a multiple of 16, at most 64).
// mma_gemm_nosync reads the stored tile without the __syncwarp;
// mma_divergent runs a product on half a warp; mma_load_at and
// mma_store_at load and store a tile K elements into shared memory and C
// with leading dimension N.
const mmaSource = `
template <class FA, class FB>
__device__ void mma_gemm(float* C, const float* A, const float* B, int N, int K, float alpha, bool acol, bool bcol,
                         bool sync) {
    __shared__ __align__(32) bf16_t sa[16 * 64];
    __shared__ __align__(32) bf16_t sb[64 * 16];
    __shared__ __align__(32) float sc[16 * 16];
    int m0 = blockIdx.y * 16, n0 = blockIdx.x * 16, lane = threadIdx.x;
    for (int e = lane; e < 16 * K; e += 32) {
        int r = e / K, k = e % K;
        sa[acol ? k * 16 + r : r * K + k] = f32_to_bf16(A[(i64)(m0 + r) * K + k]);
    }
    for (int e = lane; e < K * 16; e += 32) {
        int k = e / 16, n = e % 16;
        sb[bcol ? n * K + k : k * 16 + n] = f32_to_bf16(B[(i64)k * N + n0 + n]);
    }
    __syncwarp();
    rpac_acc acc;
    rpac_fill(acc, 0.5f);
    for (int k0 = 0; k0 < K; k0 += 16) {
        FA fa;
        FB fb;
        rpac_load(fa, acol ? sa + k0 * 16 : sa + k0, acol ? 16 : K);
        rpac_load(fb, bcol ? sb + k0 : sb + k0 * 16, bcol ? K : 16);
        rpac_mma(acc, fa, fb, acc);
    }
    for (int e = 0; e < RPAC_ACC_N; e++) acc.x[e] *= alpha;
    rpac_store(sc, acc, 16);
    if (sync) __syncwarp();
    for (int e = lane; e < 256; e += 32) {  // column by column
        int r = e % 16, c = e / 16;
        C[(i64)(m0 + r) * N + n0 + c] = sc[r * 16 + c];
    }
}
extern "C" __global__ void mma_gemm_rr(float* C, const float* A, const float* B, int N, int K, float alpha) {
    mma_gemm<rpac_a_row, rpac_b_row>(C, A, B, N, K, alpha, false, false, true);
}
extern "C" __global__ void mma_gemm_rc(float* C, const float* A, const float* B, int N, int K, float alpha) {
    mma_gemm<rpac_a_row, rpac_b_col>(C, A, B, N, K, alpha, false, true, true);
}
extern "C" __global__ void mma_gemm_cr(float* C, const float* A, const float* B, int N, int K, float alpha) {
    mma_gemm<rpac_a_col, rpac_b_row>(C, A, B, N, K, alpha, true, false, true);
}
extern "C" __global__ void mma_gemm_cc(float* C, const float* A, const float* B, int N, int K, float alpha) {
    mma_gemm<rpac_a_col, rpac_b_col>(C, A, B, N, K, alpha, true, true, true);
}
extern "C" __global__ void mma_divergent(float* C, const float* A, const float* B, int N, int K, float alpha) {
    __shared__ __align__(32) bf16_t s[256];
    for (int e = threadIdx.x; e < 256; e += 32) s[e] = 0;
    __syncwarp();
    rpac_acc acc;
    rpac_fill(acc, 0.0f);
    rpac_a_row a;
    rpac_b_row b;
    rpac_load(a, s, 16);
    rpac_load(b, s, 16);
    if (threadIdx.x < 16) rpac_mma(acc, a, b, acc);  // half the warp: not allowed
    rpac_store(C, acc, N);
}
extern "C" __global__ void mma_load_at(float* C, const float* A, const float* B, int N, int K, float alpha) {
    __shared__ __align__(32) bf16_t s[16 * 40];
    for (int e = threadIdx.x; e < 16 * 40; e += 32) s[e] = 0;
    __syncwarp();
    rpac_b_col b;
    rpac_load(b, s + K, N);
}
extern "C" __global__ void mma_store_at(float* C, const float* A, const float* B, int N, int K, float alpha) {
    rpac_acc acc;
    rpac_fill(acc, alpha);
    rpac_store(C + K, acc, N);
}
extern "C" __global__ void mma_gemm_nosync(float* C, const float* A, const float* B, int N, int K, float alpha) {
    mma_gemm<rpac_a_row, rpac_b_row>(C, A, B, N, K, alpha, false, false, false);
}
`

// mmaProgram is the prelude followed by mmaSource, and its kernels.
func mmaProgram(t *testing.T) (string, []string) {
	t.Helper()
	pre, err := sourceFS.ReadFile("src/prelude.cuh")
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, m := range entryRE.FindAllStringSubmatch(mmaSource, -1) {
		entries = append(entries, m[1])
	}
	return string(pre) + "\n#line 1 \"mma.cu\"\n" + mmaSource, entries
}

// bf16Round is x rounded to bfloat16 (nearest even), as f32_to_bf16.
func bf16Round(x float32) float64 {
	u := math.Float32bits(x)
	u += 0x7fff + (u>>16)&1
	return float64(math.Float32frombits(u &^ 0xffff))
}

// TestMMASourceCompiles: the rpac_mma layer compiles with the real NVRTC
// for Ampere and Hopper and becomes WMMA instructions in all four layouts.
func TestMMASourceCompiles(t *testing.T) {
	n := nvrtcOrSkip(t)
	if n.Simulated() {
		t.Skip("for a real NVRTC")
	}
	src, entries := mmaProgram(t)
	for _, arch := range []string{"compute_80", "compute_90"} {
		ptx, err := n.CompilePTX("mma.cu", src, arch)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"wmma.load.a.sync.aligned.row.m16n16k16", "wmma.load.a.sync.aligned.col.m16n16k16",
			"wmma.load.b.sync.aligned.col.m16n16k16", "wmma.mma.sync.aligned.col.row.m16n16k16.f32.bf16.bf16.f32",
			"wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32", "wmma.store.d.sync.aligned.row.m16n16k16"} {
			if !strings.Contains(ptx, want) {
				t.Errorf("%s: no %s in the PTX", arch, want)
			}
		}
		for _, e := range entries {
			if !strings.Contains(ptx, ".entry "+e+"(") {
				t.Errorf("%s: kernel %s missing", arch, e)
			}
		}
	}
}

// simWMMARules: loads and stores that break WMMA's rules (a pointer not
// 32-byte aligned, ldm not a multiple of 16 bytes) fail naming the kernel,
// the call site and the rule; those that keep them run.
func simWMMARules(t *testing.T, d *driver.Driver, c *driver.Context, dC, dA, dB driver.Buffer) {
	for _, r := range []struct {
		kernel string
		N, K   int32
		want   string // "": no error
	}{
		{"mma_load_at", 16, 8, "is not 32-byte aligned"},
		{"mma_load_at", 12, 0, "ldm 12 is not a multiple of 8 (16-bit elements)"},
		{"mma_load_at", 24, 16, ""},
		{"mma_store_at", 16, 4, "is not 32-byte aligned"},
		{"mma_store_at", 18, 0, "ldm 18 is not a multiple of 4 (32-bit elements)"},
		{"mma_store_at", 20, 8, ""},
	} {
		err := c.Launch(r.kernel, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, dC.Ptr, dA.Ptr, dB.Ptr, r.N, r.K, float32(1))
		if err == nil {
			err = c.Sync()
		}
		op := map[string]string{"mma_load_at": "rpac_load", "mma_store_at": "rpac_store"}[r.kernel]
		switch {
		case r.want == "" && err != nil:
			t.Errorf("%s with N %d, K %d keeps WMMA's rules: %v", r.kernel, r.N, r.K, err)
		case r.want == "":
		case err == nil || !strings.Contains(err.Error(), "kernel "+r.kernel+": "+op+" at mma.cu:") || !strings.Contains(err.Error(), r.want):
			t.Errorf("%s with N %d, K %d: want an error naming the kernel, %s's line and %q, got %v", r.kernel, r.N, r.K, op, r.want, err)
		default:
			t.Log(err)
		}
		d.SimConfig("clear_sticky", 1)
	}
}

// TestSimMMAGEMM: the tiles in every layout (simulated, or a GPU's tensor
// cores) against a host GEMM of the bf16-rounded inputs (the products are
// exact in fp32, so only the fp32 summation differs); on the simulator, a
// read of a stored tile without __syncwarp is caught (the other lanes'
// shares are still poison), and so is a product on half a warp (undefined
// on a GPU, so never launched there).
func TestSimMMAGEMM(t *testing.T) {
	d := parityDevice(t)
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
	src, entries := mmaProgram(t)
	img, err := n.CompileCUBIN("mma.cu", src, c.Dev.SM)
	if err == nil {
		err = c.LoadImage(img, entries)
	}
	if err != nil && !d.Simulated() {
		// as LoadKernels does: PTX for the virtual architecture when the
		// driver refuses the cubin
		t.Logf("the cubin for %s: %v; loading PTX for %s", c.Dev.SM, err, c.Dev.Arch)
		var ptx string
		if ptx, err = n.CompilePTX("mma.cu", src, c.Dev.Arch); err == nil {
			err = c.LoadPTX(ptx, entries)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	const M, N, K, alpha = 32, 48, 64, 0.75
	r := rand.New(rand.NewPCG(5, 6))
	a, b := randF32(r, M*K, 1), randF32(r, K*N, 1)
	want := make([]float64, M*N)
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			s := 0.5
			for k := 0; k < K; k++ {
				s += bf16Round(a[i*K+k]) * bf16Round(b[k*N+j])
			}
			want[i*N+j] = alpha * s
		}
	}
	dA, dB, dC := devF32(t, c, a), devF32(t, c, b), devF32(t, c, make([]float32, M*N))
	run := func(kernel string) []float32 {
		if err := c.Launch(kernel, [3]uint32{N / 16, M / 16, 1}, [3]uint32{32, 1, 1}, 0,
			dC.Ptr, dA.Ptr, dB.Ptr, int32(N), int32(K), float32(alpha)); err != nil {
			t.Fatal(err)
		}
		return hostF32(t, c, dC, M*N)
	}
	for _, k := range []string{"mma_gemm_rr", "mma_gemm_rc", "mma_gemm_cr", "mma_gemm_cc"} {
		closeTo(t, k, run(k), want, 1e-5)
	}
	if !d.Simulated() {
		return // the rest checks the simulator's poison and lane checks
	}
	nan := 0
	for _, x := range run("mma_gemm_nosync") {
		if x != x {
			nan++
		}
	}
	if nan == 0 {
		t.Error("mma_gemm_nosync read the stored tile without __syncwarp and saw no poison")
	}
	defer d.SimConfig("clear_sticky", 1)
	simWMMARules(t, d, c, dC, dA, dB)
	err = c.Launch("mma_divergent", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, dC.Ptr, dA.Ptr, dB.Ptr, int32(N), int32(K), float32(alpha))
	if err == nil {
		err = c.Sync()
	}
	if err == nil || !strings.Contains(err.Error(), "kernel mma_divergent") || !strings.Contains(err.Error(), "rpac_mma at mma.cu:") || !strings.Contains(err.Error(), "has exited") {
		t.Errorf("a product on half a warp: want an error naming the kernel and the exited lanes, got %v", err)
	} else {
		t.Log(err)
	}
}
