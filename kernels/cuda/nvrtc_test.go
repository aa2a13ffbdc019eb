package cuda

import (
	"errors"
	"os"
	"strings"
	"testing"
)

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

// TestKernelSourcesCompile: every embedded kernel source compiles with NVRTC
// for Ampere (compute_80) and Hopper (compute_90) with no toolkit headers,
// and the PTX holds every kernel the source defines.
func TestKernelSourcesCompile(t *testing.T) {
	n := nvrtcOrSkip(t)
	major, minor := n.Version()
	t.Logf("NVRTC %d.%d", major, minor)
	if n.Simulated() {
		t.Skip("the CUDA simulator's NVRTC writes no PTX (the simulator tests cover it); this test is for a real NVRTC")
	}
	names := SourceNames()
	if len(names) < 5 {
		t.Fatalf("only %d kernel sources embedded: %v", len(names), names)
	}
	for _, name := range names {
		src, err := Source(name)
		if err != nil {
			t.Fatal(err)
		}
		entries, _ := Entries(name)
		if len(entries) == 0 {
			t.Errorf("%s defines no kernel", name)
		}
		for _, arch := range []string{"compute_80", "compute_90"} {
			ptx, err := n.CompilePTX(name, src, arch)
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			if !strings.Contains(ptx, ".target sm_"+strings.TrimPrefix(arch, "compute_")) {
				t.Errorf("%s %s: PTX targets another architecture", name, arch)
			}
			for _, e := range entries {
				if !strings.Contains(ptx, ".entry "+e+"(") {
					t.Errorf("%s %s: kernel %s missing from the PTX", name, arch, e)
				}
			}
		}
	}
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
// a changed cache location compiles again.
func TestCompileCache(t *testing.T) {
	n := nvrtcOrSkip(t)
	t.Setenv("RPAC_CUDA_CACHE", t.TempDir())
	name := SourceNames()[0]
	first, hit, err := n.CompileCached(name, "compute_80")
	if err != nil || hit {
		t.Fatalf("first compile: hit %v, %v", hit, err)
	}
	second, hit, err := n.CompileCached(name, "compute_80")
	if err != nil || !hit || second != first {
		t.Fatalf("second compile: hit %v, same %v, %v", hit, second == first, err)
	}
	if _, hit, _ := n.CompileCached(name, "compute_90"); hit {
		t.Fatal("another architecture hit the cache")
	}
}
