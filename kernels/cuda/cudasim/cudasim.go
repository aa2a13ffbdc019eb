// Package cudasim builds and locates rpac's CUDA simulator: a shared library
// (C++, csrc/) that exports the subset of the CUDA driver API, NVRTC and
// cuBLASLt that kernels/cuda binds at run time, and executes every kernel on
// the CPU from its unchanged CUDA source (compiled with the host C++
// compiler against a simulation header), every CUDA thread of a block a
// fiber of its own. With the simulator's folder first in RPAC_CUDA_LIBS, the
// CUDA backend runs unchanged, binding code included. See docs/CUDASIM.md.
package cudasim

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

//go:embed csrc/*
var csrc embed.FS

// LibNames are the file names the simulator library is installed under,
// one per library kernels/cuda looks for (each is preferred to any older
// version a real installation may have).
var LibNames = []string{"libcuda.so.1", "libnvrtc.so.13", "libcublasLt.so.13"}

// headers are installed beside the library: the simulation header the
// simulator's NVRTC compiles every kernel with, and what it includes.
var headers = []string{"cudasim_kernel.h", "cudasim_abi.h"}

// NCCLName is the file name of the simulator's NCCL stand-in
// (csrc/cudasim_nccl.cpp), a library of its own beside the simulator: the
// collectives of a data-parallel job whose ranks are processes of one
// machine, exchanged through shared memory.
const NCCLName = "libnccl.so.2"

// Compiler is the C++ compiler: $RPAC_CUDASIM_CXX, else g++.
func Compiler() string {
	if c := os.Getenv("RPAC_CUDASIM_CXX"); c != "" {
		return c
	}
	return "g++"
}

// sourceHash identifies the simulator's sources (and so its build).
func sourceHash() (string, uint32, error) {
	h := sha256.New()
	ents, err := csrc.ReadDir("csrc")
	if err != nil {
		return "", 0, err
	}
	for _, e := range ents {
		b, err := csrc.ReadFile("csrc/" + e.Name())
		if err != nil {
			return "", 0, err
		}
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(b))
		h.Write(b)
	}
	sum := h.Sum(nil)
	f := fnv.New32a()
	f.Write(sum)
	return hex.EncodeToString(sum[:8]), f.Sum32() & 0x7fffffff, nil
}

// Dir is where the simulator is built: $RPAC_CUDASIM_DIR, else
// ${XDG_CACHE_HOME:-~/.cache}/rpac/cudasim-HASH.
func Dir() (string, error) {
	if d := os.Getenv("RPAC_CUDASIM_DIR"); d != "" {
		return d, nil
	}
	hash, _, err := sourceHash()
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "rpac", "cudasim-"+hash), nil
}

var (
	buildMu sync.Mutex
)

// Build compiles the simulator into Dir() unless it is there already, and
// returns the folder.
func Build() (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	if Built(dir) {
		return dir, nil
	}
	return dir, BuildInto(dir)
}

// Built reports whether dir holds a complete simulator.
func Built(dir string) bool {
	for _, n := range append(headers, append([]string{"libcudasim.so", NCCLName}, LibNames...)...) {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return false
		}
	}
	return true
}

// BuildInto compiles the simulator into dir (always).
func BuildInto(dir string) error {
	cxx := Compiler()
	if _, err := exec.LookPath(cxx); err != nil {
		return fmt.Errorf("the CUDA simulator needs a C++ compiler (%s): %w; install g++ (apt-get install g++) or set RPAC_CUDASIM_CXX", cxx, err)
	}
	_, rev, err := sourceHash()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ents, _ := csrc.ReadDir("csrc")
	for _, e := range ents {
		b, _ := csrc.ReadFile("csrc/" + e.Name())
		if err := os.WriteFile(filepath.Join(tmp, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	lib := filepath.Join(tmp, "libcudasim.so")
	args := []string{"-std=c++17", "-O2", "-g", "-ffp-contract=off", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
		fmt.Sprintf("-DRPAC_SIM_REV=%d", rev), "-o", lib, filepath.Join(tmp, "cudasim.cpp"), "-ldl"}
	out, err := exec.Command(cxx, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("building the CUDA simulator: %s %s: %v\n%s", cxx, strings.Join(args, " "), err, out)
	}
	nccl := filepath.Join(tmp, NCCLName)
	nargs := []string{"-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
		"-Wl,-soname," + NCCLName, "-o", nccl, filepath.Join(tmp, "cudasim_nccl.cpp"), "-lrt"}
	if out, err := exec.Command(cxx, nargs...).CombinedOutput(); err != nil {
		return fmt.Errorf("building the CUDA simulator's NCCL stand-in: %s %s: %v\n%s", cxx, strings.Join(nargs, " "), err, out)
	}
	// Install: the libraries, the simulator's links and the simulation header.
	if err := os.Rename(nccl, filepath.Join(dir, NCCLName)); err != nil {
		return err
	}
	if err := os.Rename(lib, filepath.Join(dir, "libcudasim.so")); err != nil {
		return err
	}
	for _, h := range headers {
		if err := os.Rename(filepath.Join(tmp, h), filepath.Join(dir, h)); err != nil {
			return err
		}
	}
	for _, n := range LibNames {
		p := filepath.Join(dir, n)
		os.Remove(p)
		if err := os.Symlink("libcudasim.so", p); err != nil {
			return err
		}
	}
	return nil
}

// EnableForTests is a test binary's TestMain step: with RPAC_CUDA_SIM=1
// (.ci/run sets it) it enables the simulator and requires the package's
// GPU tests to run (RPAC_REQUIRE_GPU=1), so that every kernel runs on the
// CPU from its CUDA source through the unchanged binding code. A simulator
// that cannot be built (no C++ compiler) exits the binary with status 1:
// a failure, not a skip. It reports whether the simulator is on.
func EnableForTests(pkg string) bool {
	if os.Getenv("RPAC_CUDA_SIM") != "1" {
		return false
	}
	dir, err := Enable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "RPAC_CUDA_SIM=1 and the CUDA simulator cannot be built: %v\n", err)
		os.Exit(1)
	}
	os.Setenv("RPAC_REQUIRE_GPU", "1")
	fmt.Fprintf(os.Stderr, "%s tests on the CUDA simulator (%s)\n", pkg, dir)
	return true
}

// Enable builds the simulator (if needed) and puts its folder first in
// RPAC_CUDA_LIBS, so the next load of the CUDA libraries binds it. It must
// run before anything in the process loads them.
func Enable() (string, error) {
	dir, err := Build()
	if err != nil {
		return "", err
	}
	libs := dir
	if old := os.Getenv("RPAC_CUDA_LIBS"); old != "" {
		libs += string(os.PathListSeparator) + old
	}
	return dir, os.Setenv("RPAC_CUDA_LIBS", libs)
}

// ErrNoCompiler reports a missing C++ compiler.
var ErrNoCompiler = errors.New("no C++ compiler")
