package runtime

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
)

// CUDALibrary is a shared library onnxruntime's CUDA provider loads.
type CUDALibrary struct {
	Name string // soname, e.g. "libcublasLt.so.13"
	What string // what provides it
	// NextToORT: looked for in the folder of libonnxruntime.so (the
	// provider libraries), not on the library path.
	NextToORT bool
}

// CUDALibraries are what the CUDA provider of the onnxruntime that
// scripts/fetch-onnxruntime.sh --cuda fetches (1.29.0, built against
// CUDA 13) needs: its own two provider libraries next to libonnxruntime.so,
// and on the library path the CUDA 13 runtime, cuBLAS, cuRAND, cuDNN 9 and
// the driver.
var CUDALibraries = []CUDALibrary{
	{"libonnxruntime_providers_shared.so", "onnxruntime (scripts/fetch-onnxruntime.sh --cuda)", true},
	{"libonnxruntime_providers_cuda.so", "onnxruntime's CUDA provider (scripts/fetch-onnxruntime.sh --cuda)", true},
	{"libcuda.so.1", "the NVIDIA driver", false},
	{"libcudart.so.13", "the CUDA 13 runtime (pip nvidia-cuda-runtime)", false},
	{"libcublas.so.13", "cuBLAS for CUDA 13 (pip nvidia-cublas)", false},
	{"libcublasLt.so.13", "cuBLASLt for CUDA 13 (pip nvidia-cublas)", false},
	{"libcurand.so.10", "cuRAND (pip nvidia-curand)", false},
	{"libcudnn.so.9", "cuDNN 9 (pip nvidia-cudnn-cu13)", false},
}

// LibrarySearchDirs are the folders the dynamic loader searches, as far as
// they can be read without loading anything: $LD_LIBRARY_PATH, the
// folders /etc/ld.so.conf lists (with its includes) and the system
// defaults.
func LibrarySearchDirs() []string {
	var dirs []string
	for _, d := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs, ldConf("/etc/ld.so.conf", 0)...)
	dirs = append(dirs, "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/cuda/lib64")
	return dirs
}

// ldConf reads the folders of an ld.so.conf file (following include
// lines to a small depth).
func ldConf(path string, depth int) []string {
	f, err := os.Open(path)
	if err != nil || depth > 4 {
		return nil
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case line == "":
		case strings.HasPrefix(line, "include "):
			pat := strings.TrimSpace(strings.TrimPrefix(line, "include "))
			if !filepath.IsAbs(pat) {
				pat = filepath.Join(filepath.Dir(path), pat)
			}
			files, _ := filepath.Glob(pat)
			for _, inc := range files {
				dirs = append(dirs, ldConf(inc, depth+1)...)
			}
		default:
			dirs = append(dirs, line)
		}
	}
	return dirs
}

// MissingCUDALibraries lists the CUDALibraries that are found neither
// next to ortLib (the provider libraries) nor in dirs (the others).
func MissingCUDALibraries(ortLib string, dirs []string) []CUDALibrary {
	var out []CUDALibrary
	for _, l := range CUDALibraries {
		where := dirs
		if l.NextToORT {
			where = []string{filepath.Dir(ortLib)}
		}
		found := false
		for _, d := range where {
			if st, err := os.Stat(filepath.Join(d, l.Name)); err == nil && !st.IsDir() {
				found = true
				break
			}
		}
		if !found {
			out = append(out, l)
		}
	}
	return out
}

// cudaBuildHint says where an onnxruntime with the CUDA provider comes
// from on goarch: scripts/fetch-onnxruntime.sh --cuda on x86-64; elsewhere
// (arm64: a GH200's Grace host) that fetch has no library, so a build of
// one's own.
func cudaBuildHint(goarch string) string {
	if goarch == "amd64" {
		return fmt.Sprintf("fetch an onnxruntime with the CUDA provider (scripts/fetch-onnxruntime.sh --cuda) and point %s at its libonnxruntime.so", LibraryEnv)
	}
	return fmt.Sprintf("build onnxruntime with the CUDA provider for linux/%s (scripts/fetch-onnxruntime.sh --cuda is x86-64 only; docs/EXPORT.md says how) and point %s at its libonnxruntime.so, with libonnxruntime_providers_shared.so and libonnxruntime_providers_cuda.so beside it", goarch, LibraryEnv)
}

// cudaProviderError explains why the CUDA provider of lib could not be
// used: the libraries it needs that cannot be found, or, when all are
// there, onnxruntime's own message and what else to check.
func cudaProviderError(lib string, err error) error {
	missing := MissingCUDALibraries(lib, LibrarySearchDirs())
	if len(missing) == 0 {
		return fmt.Errorf("runtime: the onnxruntime library %s cannot use the CUDA provider (%v); its libraries are all found, so check that a GPU is visible (nvidia-smi) and that the driver supports CUDA 13, or use the CPU provider", lib, err)
	}
	names := make([]string, len(missing))
	for i, l := range missing {
		names[i] = fmt.Sprintf("%s (%s)", l.Name, l.What)
	}
	hint := "add the folders holding them to LD_LIBRARY_PATH (pip's nvidia-* packages put them in site-packages/nvidia/*/lib)"
	if missing[0].NextToORT {
		hint = cudaBuildHint(goruntime.GOARCH)
	}
	return fmt.Errorf("runtime: the onnxruntime library %s cannot use the CUDA provider (%v): missing %s; %s, or use the CPU provider", lib, err, strings.Join(names, ", "), hint)
}

// ORTCUDAVersion is the onnxruntime release scripts/fetch-onnxruntime.sh
// --cuda fetches.
const ORTCUDAVersion = "1.29.0"

// CachedCUDALibraryPath is where scripts/fetch-onnxruntime.sh --cuda
// caches its libonnxruntime.so (with the provider libraries beside it).
func CachedCUDALibraryPath() string {
	p := CachedLibraryPath()
	if p == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(filepath.Dir(p)), "onnxruntime-"+ORTCUDAVersion+"-cuda", "libonnxruntime.so")
}
