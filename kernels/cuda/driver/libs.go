package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/ebitengine/purego"
)

// Library is one shared library the backend loads.
type Library struct {
	Name string // what it is, for messages
	// Files are the file names to look for, preferred first.
	Files []string
	// Provide says how to get it.
	Provide string
}

// The libraries of the backend.
var (
	LibDriver = Library{Name: "CUDA driver", Files: []string{"libcuda.so.1", "libcuda.so"},
		Provide: "install the NVIDIA driver (it ships libcuda.so.1)"}
	LibNVRTC = Library{Name: "NVRTC", Files: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"},
		Provide: "install the CUDA toolkit's NVRTC (pip package nvidia-cuda-nvrtc, Debian non-free libnvrtc11.2) or point $RPAC_CUDA_LIBS at its folder"}
	LibCublasLt = Library{Name: "cuBLASLt", Files: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
		Provide: "install cuBLAS (pip package nvidia-cublas) or point $RPAC_CUDA_LIBS at its folder"}
)

// SearchDirs lists the folders searched for a library, in order:
// $RPAC_CUDA_LIBS (a colon list), $LD_LIBRARY_PATH, the usual install
// places (/usr/local/cuda*/lib64, the driver's and the distribution's
// library folders) and the Python nvidia-* wheel folders.
func SearchDirs() []string {
	var dirs []string
	add := func(ds ...string) {
		for _, d := range ds {
			if d != "" && !contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	add(filepath.SplitList(os.Getenv("RPAC_CUDA_LIBS"))...)
	add(filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))...)
	cuda, _ := filepath.Glob("/usr/local/cuda*/lib64")
	sort.Sort(sort.Reverse(sort.StringSlice(cuda)))
	add(cuda...)
	arch := "x86_64-linux-gnu"
	if runtime.GOARCH == "arm64" {
		arch = "aarch64-linux-gnu"
	}
	add("/usr/lib/"+arch, "/usr/lib64", "/usr/lib", "/usr/lib/wsl/lib", "/usr/local/nvidia/lib64")
	patterns := []string{
		"/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
		"/usr/lib/python3*/site-packages/nvidia/*/lib",
		"/usr/local/lib/python3*/site-packages/nvidia/*/lib",
		"/opt/*/lib/python3*/site-packages/nvidia/*/lib",
		"/root/.local/lib/python3*/site-packages/nvidia/*/lib",
		"/root/.pyenv/versions/*/lib/python3*/site-packages/nvidia/*/lib",
	}
	// virtual environments: $VIRTUAL_ENV, $CONDA_PREFIX and any under the
	// home directory (~/venv, ~/.venv, ~/*/.venv, ~/.virtualenvs/*, ...)
	var venvs []string
	for _, v := range []string{os.Getenv("VIRTUAL_ENV"), os.Getenv("CONDA_PREFIX")} {
		if v != "" {
			venvs = append(venvs, v+"/lib/python3*/site-packages/nvidia/*/lib")
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		for _, v := range []string{"*", ".*", "*/*", "*/.*", ".virtualenvs/*", ".local", "miniconda3", "anaconda3", "miniconda3/envs/*"} {
			venvs = append(venvs, filepath.Join(home, v, "lib/python3*/site-packages/nvidia/*/lib"))
		}
	}
	for _, pattern := range append(patterns, venvs...) {
		m, _ := filepath.Glob(pattern)
		add(m...)
	}
	return dirs
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Find returns the path of lib's first file found in dirs ("" if none).
func Find(lib Library, dirs []string) string {
	for _, f := range lib.Files {
		for _, d := range dirs {
			p := filepath.Join(d, f)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
		}
	}
	return ""
}

// MissingError names every library that could not be found or loaded.
type MissingError struct {
	Missing []Library
	Reasons []string
	Dirs    []string
}

func (e *MissingError) Error() string {
	var b strings.Builder
	b.WriteString("the CUDA backend cannot load")
	for i, l := range e.Missing {
		sep := ";"
		if i == 0 {
			sep = ":"
		}
		fmt.Fprintf(&b, "%s %s (%s: %s)", sep, l.Name, e.Reasons[i], l.Provide)
	}
	fmt.Fprintf(&b, ". Searched $RPAC_CUDA_LIBS, $LD_LIBRARY_PATH, the usual folders and Python virtual environments (%s), then the loader's own path; set RPAC_CUDA_LIBS=dir1:dir2 to add folders",
		strings.Join(e.Dirs, ", "))
	return b.String()
}

// open loads the libraries, reporting every one that is missing at once.
func open(libs ...Library) ([]uintptr, error) {
	dirs := SearchDirs()
	handles := make([]uintptr, len(libs))
	miss := &MissingError{Dirs: dirs}
	for i, l := range libs {
		path := Find(l, dirs)
		if path == "" {
			path = l.Files[0] // the loader's own search (ld.so.cache)
		}
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			miss.Missing = append(miss.Missing, l)
			miss.Reasons = append(miss.Reasons, fmt.Sprintf("none of %s found", strings.Join(l.Files, ", ")))
			continue
		}
		handles[i] = h
	}
	if len(miss.Missing) > 0 {
		for _, h := range handles {
			if h != 0 {
				purego.Dlclose(h)
			}
		}
		return nil, miss
	}
	return handles, nil
}

// symbol binds a Go function variable to a library's function.
type symbol struct {
	fn   any // pointer to a func variable
	name string
}

// bind loads lib and binds every symbol, or says which is missing.
func bind(lib Library, syms []symbol) (uintptr, error) {
	if runtime.GOOS != "linux" {
		return 0, errNotLinux
	}
	hs, err := open(lib)
	if err != nil {
		return 0, err
	}
	for _, s := range syms {
		if _, err := purego.Dlsym(hs[0], s.name); err != nil {
			return 0, fmt.Errorf("%s: %s is missing (a version too old?): %v", lib.Name, s.name, err)
		}
		purego.RegisterLibFunc(s.fn, hs[0], s.name)
	}
	return hs[0], nil
}

// bindOptional binds syms, an optional part of a loaded library's API,
// when the library has them all; it reports whether it did.
func bindOptional(handle uintptr, syms []symbol) bool {
	for _, s := range syms {
		if _, err := purego.Dlsym(handle, s.name); err != nil {
			return false
		}
	}
	for _, s := range syms {
		purego.RegisterLibFunc(s.fn, handle, s.name)
	}
	return true
}

// errNotLinux is returned on systems the backend does not support.
var errNotLinux = errors.New("the CUDA backend runs on Linux only")
