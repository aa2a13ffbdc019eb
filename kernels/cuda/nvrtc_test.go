package cuda

import (
	"bytes"
	"errors"
	"fmt"
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
			sm := "sm_" + strings.TrimPrefix(arch, "compute_")
			cubin, err := n.CompileCUBIN(name, src, sm)
			if err != nil {
				t.Errorf("%v", err)
			} else if !bytes.HasPrefix(cubin, []byte("\x7fELF")) {
				t.Errorf("%s %s: the cubin is not an ELF object", name, sm)
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
	name := SourceNames()[0]
	for _, arch := range []string{"compute_80", "sm_80"} {
		first, hit, err := n.CompileCached(name, arch)
		if err != nil || hit {
			t.Fatalf("%s, first compile: hit %v, %v", arch, hit, err)
		}
		second, hit, err := n.CompileCached(name, arch)
		if err != nil || !hit || !bytes.Equal(second.Data, first.Data) || second.Kind != first.Kind {
			t.Fatalf("%s, second compile: hit %v, same %v, %v", arch, hit, bytes.Equal(second.Data, first.Data), err)
		}
		if want := map[string]string{"compute_80": "ptx", "sm_80": "cubin"}[arch]; first.Kind != want {
			t.Errorf("%s compiled to %s, want %s", arch, first.Kind, want)
		}
	}
	if _, hit, _ := n.CompileCached(name, "compute_90"); hit {
		t.Fatal("another architecture hit the cache")
	}
	if _, _, err := n.CompileCached(name, "gfx90a"); err == nil {
		t.Fatal("accepted an architecture that is neither sm_NN nor compute_NN")
	}
	src, _ := Source(name)
	ptxPath, _ := n.CachePath(src, "compute_90")
	cubinPath, _ := n.CachePath(src, "sm_90")
	major, minor := n.Version()
	ver := fmt.Sprintf("nvrtc-%d.%d", major, minor)
	if !strings.HasSuffix(ptxPath, ".ptx") || !strings.HasSuffix(cubinPath, ".cubin") ||
		!strings.Contains(ptxPath, "/"+ver+"/compute_90/") || !strings.Contains(cubinPath, "/"+ver+"/sm_90/") {
		t.Errorf("cache paths not keyed by NVRTC version, architecture and kind: %s, %s", ptxPath, cubinPath)
	}
}
