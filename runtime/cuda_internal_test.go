package runtime

import (
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
)

func touch(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The CUDA provider's libraries are looked for next to libonnxruntime.so
// (the provider libraries) and in the search folders (the rest); the
// error names each missing one with what provides it.
func TestMissingCUDALibraries(t *testing.T) {
	root := t.TempDir()
	ortDir, cudaDir := filepath.Join(root, "ort"), filepath.Join(root, "cuda")
	touch(t, ortDir, "libonnxruntime.so", "libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so")
	touch(t, cudaDir, "libcudart.so.13", "libcublas.so.13", "libcuda.so.1", "libcurand.so.10")
	// A folder of the right name is not a library.
	if err := os.MkdirAll(filepath.Join(cudaDir, "libcudnn.so.9"), 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(ortDir, "libonnxruntime.so")
	var got []string
	for _, l := range MissingCUDALibraries(lib, []string{filepath.Join(root, "nothing"), cudaDir}) {
		got = append(got, l.Name)
	}
	if want := "libcublasLt.so.13 libcudnn.so.9"; strings.Join(got, " ") != want {
		t.Fatalf("missing %v, want %s", got, want)
	}
	t.Setenv("LD_LIBRARY_PATH", cudaDir)
	err := cudaProviderError(lib, errors.New("provider failed"))
	for _, part := range []string{"libcublasLt.so.13", "cuBLASLt", "libcudnn.so.9", "cuDNN 9", "LD_LIBRARY_PATH", "provider failed", lib} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not name %q", err, part)
		}
	}
	if strings.Contains(err.Error(), "libcudart") {
		t.Errorf("error %q names a library that is there", err)
	}
	// A CPU-only onnxruntime (no provider libraries next to it) points at
	// the --cuda fetch.
	cpu := filepath.Join(root, "cpu", "libonnxruntime.so.1")
	touch(t, filepath.Dir(cpu), filepath.Base(cpu))
	err = cudaProviderError(cpu, errors.New("not built with CUDA"))
	if !strings.Contains(err.Error(), "fetch-onnxruntime.sh --cuda") || !strings.Contains(err.Error(), "libonnxruntime_providers_cuda.so") {
		t.Errorf("CPU-only library: error %q does not point at the CUDA fetch", err)
	}
}

// ld.so.conf folders are read with their includes.
func TestLdConf(t *testing.T) {
	dir := t.TempDir()
	touch(t, filepath.Join(dir, "conf.d"))
	if err := os.WriteFile(filepath.Join(dir, "conf.d", "a.conf"), []byte("# cuda\n/opt/cuda/lib64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ld.so.conf"), []byte("include conf.d/*.conf\n/usr/local/lib # local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ldConf(filepath.Join(dir, "ld.so.conf"), 0), " "); got != "/opt/cuda/lib64 /usr/local/lib" {
		t.Errorf("ldConf: %q", got)
	}
}

// A provider without a kernel for the export's precision points at the
// CUDA provider or another dtype, not at a fresh export.
func TestLoadHint(t *testing.T) {
	for _, c := range []struct{ msg, want string }{
		{"Could not find an implementation for Add(14) node with name 'Add_2'", "--provider cuda"},
		{"Type Error: Type parameter (T) of Optype (Add) bound to different types (tensor(bfloat16) and tensor(float) in node ().", "--dtype"},
		{"Protobuf parsing failed.", "export it again"},
	} {
		if got := loadHint(errors.New(c.msg)); !strings.Contains(got, c.want) {
			t.Errorf("%q: hint %q, want %q in it", c.msg, got, c.want)
		}
	}
}

// On arm64 the --cuda fetch has no library: the hint says to build one and
// still names the fetch (as x86-64 only), ORT_LIB and the provider library.
func TestCUDABuildHint(t *testing.T) {
	for _, goarch := range []string{"amd64", "arm64"} {
		h := cudaBuildHint(goarch)
		for _, part := range []string{"fetch-onnxruntime.sh --cuda", LibraryEnv} {
			if !strings.Contains(h, part) {
				t.Errorf("%s: hint %q does not name %q", goarch, h, part)
			}
		}
	}
	if h := cudaBuildHint("arm64"); !strings.Contains(h, "x86-64 only") || !strings.Contains(h, "docs/EXPORT.md") || !strings.Contains(h, "libonnxruntime_providers_cuda.so") {
		t.Errorf("arm64 hint %q does not say the fetch is x86-64 only and where to look", h)
	}
}

// The cache folder is per architecture, named as onnxruntime-node's.
func TestCachedLibraryPathPerArch(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/c")
	if goruntime.GOARCH != "amd64" && goruntime.GOARCH != "arm64" {
		t.Skipf("no onnxruntime-node library for %s", goruntime.GOARCH)
	}
	want := "/c/rpac/onnxruntime-" + ORTVersion + "-linux-" + map[string]string{"amd64": "x64", "arm64": "arm64"}[goruntime.GOARCH] + "/libonnxruntime.so.1"
	if got := CachedLibraryPath(); got != want {
		t.Errorf("CachedLibraryPath() = %q, want %q", got, want)
	}
	if ortArch("amd64") != "x64" || ortArch("arm64") != "arm64" {
		t.Errorf("ortArch: amd64 → %q, arm64 → %q", ortArch("amd64"), ortArch("arm64"))
	}
}
