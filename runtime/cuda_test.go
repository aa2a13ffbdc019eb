package runtime_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/runtime"
)

// cudaORT is the onnxruntime with the CUDA provider that
// scripts/fetch-onnxruntime.sh --cuda caches ($RPAC_ORT_CUDA overrides).
// CI does not fetch it (about 330 MB), so its tests skip without it.
func cudaORT(t *testing.T) string {
	t.Helper()
	lib := os.Getenv("RPAC_ORT_CUDA")
	if lib == "" {
		lib = runtime.CachedCUDALibraryPath()
	}
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("no onnxruntime with the CUDA provider at %s (scripts/fetch-onnxruntime.sh --cuda fetches it)", lib)
	}
	return lib
}

// subtest runs the named tests of this binary in a child process whose
// onnxruntime is lib (onnxruntime_go loads one library per process).
func subtest(t *testing.T, lib, run string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", run, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{runtime.LibraryEnv + "=" + lib, "CI=true"}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s with %s: %v\n%s", run, lib, err, out)
	}
	if !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("%s with %s ran no test:\n%s", run, lib, out)
	}
	return string(out)
}

// onnxruntime_go runs the onnxruntime 1.29 of the CUDA fetch on the CPU
// provider: every lowered op (the Attention op and Concat included) and
// the padding of mixed lengths match the float64 reference.
func TestCUDAFetchRunsOnCPU(t *testing.T) {
	lib := cudaORT(t)
	subtest(t, lib, "^(TestOps|TestLogitsPaddingExact)$")
}

// Where the CUDA provider cannot load (no GPU, or CUDA 13 / cuDNN 9
// missing), Open names the missing libraries; where it loads, a model runs
// on it.
func TestCUDAProviderLoadOrExplain(t *testing.T) {
	lib := cudaORT(t)
	out := subtest(t, lib, "^TestCUDAProbe$", "RPAC_CUDA_PROBE=1", "RPAC_REQUIRE_GPU="+os.Getenv("RPAC_REQUIRE_GPU"))
	t.Log(strings.TrimSpace(out))
}

// TestCUDAProbe is the child of TestCUDAProviderLoadOrExplain.
func TestCUDAProbe(t *testing.T) {
	if os.Getenv("RPAC_CUDA_PROBE") != "1" {
		t.Skip("run by TestCUDAProviderLoadOrExplain")
	}
	lib := os.Getenv(runtime.LibraryEnv)
	dir := tinyExport(t, []int{8}, 1, nil)
	m, err := runtime.Open(dir, runtime.Options{Provider: "cuda"})
	if err == nil {
		defer m.Close()
		if _, err := m.Logits(context.Background(), seqs(8)); err != nil {
			t.Fatalf("the CUDA provider loaded but a run failed: %v", err)
		}
		t.Log("the CUDA provider loaded and ran")
		return
	}
	if os.Getenv("RPAC_REQUIRE_GPU") == "1" {
		t.Fatalf("RPAC_REQUIRE_GPU=1 and the CUDA provider does not load: %v", err)
	}
	missing := runtime.MissingCUDALibraries(lib, runtime.LibrarySearchDirs())
	if !strings.Contains(err.Error(), "CUDA provider") {
		t.Fatalf("error %q does not say the CUDA provider failed", err)
	}
	// The version-1 call reached the provider bridge: the library's
	// CUDA provider was looked for and could not be loaded.
	if strings.Contains(err.Error(), "version-1 options") && !strings.Contains(err.Error(), "Failed to load shared library") && !strings.Contains(err.Error(), "CUDA") {
		t.Errorf("error %q: the version-1 call did not reach the provider bridge", err)
	}
	for _, l := range missing {
		if !strings.Contains(err.Error(), l.Name) {
			t.Errorf("error %q does not name the missing %s", err, l.Name)
		}
	}
	t.Logf("CUDA provider unavailable, as explained: %v", err)
}
