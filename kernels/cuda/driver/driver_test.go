package driver

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
)

// TestMain puts the CUDA simulator under the package's simulator tests
// when RPAC_CUDA_SIM=1 (cudasim.EnableForTests).
func TestMain(m *testing.M) {
	cudasim.EnableForTests("driver")
	os.Exit(m.Run())
}

// nvrtcOrSkip loads NVRTC; without it the test skips, or fails under CI=true.
func nvrtcOrSkip(t *testing.T) *NVRTC {
	t.Helper()
	n, err := LoadNVRTC()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and NVRTC is unavailable: %v", err)
		}
		t.Skipf("NVRTC unavailable: %v", err)
	}
	return n
}

// simContext is a context on the simulator's device (RPAC_CUDA_SIM=1);
// the test skips elsewhere.
func simContext(t *testing.T) *Context {
	t.Helper()
	if os.Getenv("RPAC_CUDA_SIM") != "1" {
		t.Skip("simulator test: run with RPAC_CUDA_SIM=1")
	}
	d, err := LoadDriver()
	if err != nil {
		t.Fatal(err)
	}
	if !d.Simulated() {
		t.Fatal("RPAC_CUDA_SIM=1 but the driver loaded is not the simulator")
	}
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	c, err := d.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// devF32 uploads x into a new buffer of c, freed when the test ends.
func devF32(t *testing.T, c *Context, x []float32) Buffer {
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

func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// TestCompileErrorHasLog: a source that does not compile gives NVRTC's log.
func TestCompileErrorHasLog(t *testing.T) {
	n := nvrtcOrSkip(t)
	_, err := n.CompilePTX("bad.cu", `extern "C" __global__ void k(float* x) { x[0] = undefined_name; }`, "compute_80")
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Log, "undefined_name") {
		t.Fatalf("want a compile error with the log, got %v", err)
	}
	if _, err := n.CompilePTX("k.cu", "", "sm_90"); err == nil {
		t.Fatal("accepted a real architecture name where a virtual one is needed")
	}
	if _, err := n.CompileCUBIN("k.cu", "", "compute_90"); err == nil {
		t.Fatal("accepted a virtual architecture name where a real one is needed")
	}
}

// TestMissingLibrariesNamed: a library that cannot be found is named with
// how to provide it.
func TestMissingLibrariesNamed(t *testing.T) {
	t.Setenv("RPAC_CUDA_LIBS", t.TempDir())
	lib := Library{Name: "Imaginary", Files: []string{"libimaginary-rpac.so.7"}, Provide: "install imaginary"}
	_, err := open(lib, Library{Name: "Other", Files: []string{"libother-rpac.so.1"}, Provide: "install other"})
	var me *MissingError
	if !errors.As(err, &me) || len(me.Missing) != 2 {
		t.Fatalf("want both libraries reported, got %v", err)
	}
	for _, w := range []string{"Imaginary", "libimaginary-rpac.so.7", "install imaginary", "Other", "RPAC_CUDA_LIBS"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message lacks %q: %v", w, err)
		}
	}
	if d := SearchDirs(); len(d) == 0 || d[0] != os.Getenv("RPAC_CUDA_LIBS") {
		t.Errorf("$RPAC_CUDA_LIBS is not searched first: %v", d)
	}
}

// TestCompileCache: a second compile of the same source reads the cache;
// another architecture, or a cubin where PTX was cached, compiles again.
func TestCompileCache(t *testing.T) {
	n := nvrtcOrSkip(t)
	t.Setenv("RPAC_CUDA_CACHE", t.TempDir())
	name, src := "k.cu", `extern "C" __global__ void k(float* x) { x[0] = 1; }`
	for _, arch := range []string{"compute_80", "sm_80"} {
		first, hit, err := n.CompileCached(name, src, arch)
		if err != nil || hit {
			t.Fatalf("%s, first compile: hit %v, %v", arch, hit, err)
		}
		second, hit, err := n.CompileCached(name, src, arch)
		if err != nil || !hit || !bytes.Equal(second.Data, first.Data) || second.Kind != first.Kind {
			t.Fatalf("%s, second compile: hit %v, same %v, %v", arch, hit, bytes.Equal(second.Data, first.Data), err)
		}
		if want := map[string]string{"compute_80": "ptx", "sm_80": "cubin"}[arch]; first.Kind != want {
			t.Errorf("%s compiled to %s, want %s", arch, first.Kind, want)
		}
	}
	if _, hit, _ := n.CompileCached(name, src, "compute_90"); hit {
		t.Fatal("another architecture hit the cache")
	}
	if _, _, err := n.CompileCached(name, src, "gfx90a"); err == nil {
		t.Fatal("accepted an architecture that is neither sm_NN nor compute_NN")
	}
	ptxPath, _ := n.CachePath(src, "compute_90")
	cubinPath, _ := n.CachePath(src, "sm_90")
	major, minor := n.Version()
	ver := fmt.Sprintf("nvrtc-%d.%d", major, minor)
	if !strings.HasSuffix(ptxPath, ".ptx") || !strings.HasSuffix(cubinPath, ".cubin") ||
		!strings.Contains(ptxPath, "/"+ver+"/compute_90/") || !strings.Contains(cubinPath, "/"+ver+"/sm_90/") {
		t.Errorf("cache paths not keyed by NVRTC version, architecture and kind: %s, %s", ptxPath, cubinPath)
	}
}

// TestSimCuBLASLtAlgoChecks: the simulator holds cublasLtMatmul to the
// algorithm the heuristic chose: its workspace, the pointer alignment the
// preference promised (and the bias pointer had), and the descriptor and
// layouts it was chosen for.
func TestSimCuBLASLtAlgoChecks(t *testing.T) {
	c := simContext(t)
	b, err := LoadBLAS()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(47, 48))
	const M, N, K = 16, 24, 40
	dA, dB, dC := devF32(t, c, randF32(r, M*K+64)), devF32(t, c, randF32(r, K*N)), devF32(t, c, make([]float32, M*N))
	ws := devF32(t, c, make([]float32, 32<<20/4/256))
	s := GemmShape{M: M, N: N, K: K, Batch: 1}
	pl, err := b.NewPlan(GemmKey{Shape: s, AB: F32, Align: [3]uint16{256, 256, 256}}, ws.Bytes, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.DestroyPlan(pl)
	if pl.Workspace() == 0 {
		t.Fatal("the simulated algorithm asks for no workspace, so none of its checks run")
	}
	other, err := b.NewPlan(GemmKey{Shape: GemmShape{M: M, N: N, K: K, Batch: 1, LDA: K + 8}, AB: F32, Align: [3]uint16{256, 256, 256}}, ws.Bytes, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.DestroyPlan(other)
	alpha, beta := float32(1), float32(0)
	run := func(p *GemmPlan, algo *GemmPlan, A uint64, w Buffer) int32 {
		return b.matmul(b.lt, p.desc, unsafe.Pointer(&alpha), dB.Ptr, p.la, A, p.lb, unsafe.Pointer(&beta), dC.Ptr, p.lc, dC.Ptr,
			p.lc, unsafe.Pointer(&algo.res.algo), w.Ptr, w.Bytes, 0)
	}
	if st := run(pl, pl, dA.Ptr, ws); st != 0 {
		t.Fatalf("the plan as chosen: status %d", st)
	}
	biased, err := b.NewPlan(GemmKey{Shape: s, AB: F32, Align: [3]uint16{256, 256, 256}, BiasAlign: 256}, ws.Bytes, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.DestroyPlan(biased)
	for _, off := range []uint64{0, 4} {
		bias := dB.Ptr + off
		if r := b.descSet(biased.desc, descBiasPointer, unsafe.Pointer(&bias), 8); r != 0 {
			t.Fatalf("BIAS_POINTER: status %d", r)
		}
		if st := run(biased, biased, dA.Ptr, ws); (st == 0) != (off == 0) {
			t.Errorf("bias %d bytes off a 256-byte alignment: status %d", off, st)
		}
	}
	for _, bad := range []struct {
		what string
		p, a *GemmPlan
		A    uint64
		w    Buffer
	}{
		{"A 4 bytes off its 256-byte alignment", pl, pl, dA.Ptr + 4, ws},
		{"no workspace", pl, pl, dA.Ptr, Buffer{}},
		{"the algorithm of another layout", other, pl, dA.Ptr, ws},
	} {
		if st := run(bad.p, bad.a, bad.A, bad.w); st == 0 {
			t.Errorf("%s: accepted", bad.what)
		}
	}
}

// TestSimAllocationsAligned: the simulator's allocations start 256-byte
// aligned, as cuMemAlloc's on a GPU, whatever their size; a write into
// the few bytes between an allocation's end and its guard page (252 bytes
// leave 4) fails the launch as a write past the end, a write beyond them
// faults at the guard page, and a read there gives NaN.
func TestSimAllocationsAligned(t *testing.T) {
	c := simContext(t)
	for _, n := range []uint64{1, 6, 252, 256, 1000, 4096, 5000} {
		b, err := c.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if b.Ptr%256 != 0 {
			t.Errorf("a %d-byte allocation at %#x: not 256-byte aligned", n, b.Ptr)
		}
		c.Free(b)
	}
	n, err := LoadNVRTC()
	if err != nil {
		t.Fatal(err)
	}
	src := `extern "C" __global__ void poke(float* p, long long i) { p[i] = 2.0f; }
extern "C" __global__ void peek(float* out, const float* p, long long i) { out[0] = p[i]; }`
	img, err := n.CompileCUBIN("poke.cu", src, c.Dev.SM)
	if err == nil {
		err = c.LoadImage(img, []string{"poke", "peek"})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.d.SimConfig("clear_sticky", 1)
	p, out := devF32(t, c, make([]float32, 63)), devF32(t, c, []float32{0})
	one := [3]uint32{1, 1, 1}
	if err := c.Launch("peek", one, one, 0, out.Ptr, p.Ptr, int64(63)); err != nil {
		t.Fatal(err)
	}
	var got [1]float32
	if err := c.Download(unsafe.Pointer(&got[0]), out, 4); err != nil || got[0] == got[0] {
		t.Errorf("a read just past the end gave %v (%v), want NaN", got[0], err)
	}
	for _, c2 := range []struct {
		i    int64
		want string
	}{
		{63, "kernel poke: invalid write 0 bytes past the end of the 252-byte allocation"},
		{64, "invalid write of address"},
	} {
		err := c.Launch("poke", one, one, 0, p.Ptr, c2.i)
		if err == nil {
			err = c.Sync()
		}
		if err == nil || !strings.Contains(err.Error(), c2.want) {
			t.Errorf("a write at element %d of 63: want %q, got %v", c2.i, c2.want, err)
		} else {
			t.Log(err)
		}
		c.d.SimConfig("clear_sticky", 1)
	}
}
