package cuda

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// nvrtcOrSkip loads NVRTC; without it the test skips, or fails under CI=true.
func nvrtcOrSkip(t *testing.T) *driver.NVRTC {
	t.Helper()
	n, err := driver.LoadNVRTC()
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
