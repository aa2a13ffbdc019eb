package driver

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// NVRTC is the runtime compiler, bound at run time.
type NVRTC struct {
	handle uintptr

	version         func(major, minor *int32) int32
	createProgram   func(prog *uintptr, src, name string, numHeaders int32, headers, includeNames unsafe.Pointer) int32
	compileProgram  func(prog uintptr, numOptions int32, options unsafe.Pointer) int32
	getProgramLogSz func(prog uintptr, size *uint64) int32
	getProgramLog   func(prog uintptr, log unsafe.Pointer) int32
	getPTXSize      func(prog uintptr, size *uint64) int32
	getPTX          func(prog uintptr, ptx unsafe.Pointer) int32
	// nvrtcGetCUBINSize/nvrtcGetCUBIN (NVRTC 11.1 and later); nil when
	// the library lacks them, and then only PTX can be had.
	getCUBINSize     func(prog uintptr, size *uint64) int32
	getCUBIN         func(prog uintptr, cubin unsafe.Pointer) int32
	destroyProgram   func(prog *uintptr) int32
	getErrorString   func(result int32) string
	compileSerialize sync.Mutex
}

// LoadNVRTC binds NVRTC (once per process).
func LoadNVRTC() (*NVRTC, error) { return loadNVRTC() }

var loadNVRTC = sync.OnceValues(func() (*NVRTC, error) {
	n := &NVRTC{}
	var err error
	if n.handle, err = bind(LibNVRTC, []symbol{
		{&n.version, "nvrtcVersion"}, {&n.createProgram, "nvrtcCreateProgram"},
		{&n.compileProgram, "nvrtcCompileProgram"}, {&n.getProgramLogSz, "nvrtcGetProgramLogSize"},
		{&n.getProgramLog, "nvrtcGetProgramLog"}, {&n.getPTXSize, "nvrtcGetPTXSize"}, {&n.getPTX, "nvrtcGetPTX"},
		{&n.destroyProgram, "nvrtcDestroyProgram"}, {&n.getErrorString, "nvrtcGetErrorString"},
	}); err != nil {
		return nil, err
	}
	bindOptional(n.handle, []symbol{{&n.getCUBINSize, "nvrtcGetCUBINSize"}, {&n.getCUBIN, "nvrtcGetCUBIN"}}) // NVRTC 11.1 and later
	return n, nil
})

// Simulated reports whether this is the CUDA simulator's NVRTC (it
// reports version 0.N and compiles for the CPU; see kernels/cuda/cudasim).
func (n *NVRTC) Simulated() bool {
	major, _ := n.Version()
	return major == 0
}

// Version is NVRTC's version (e.g. 11, 8).
func (n *NVRTC) Version() (major, minor int) {
	var a, b int32
	n.version(&a, &b)
	return int(a), int(b)
}

func (n *NVRTC) check(r int32, what string) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("NVRTC %s: %s (%d)", what, n.getErrorString(r), r)
}

// CompileError carries NVRTC's log.
type CompileError struct {
	Name, Arch, Log string
	Err             error
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("compiling %s for %s: %v\n%s", e.Name, e.Arch, e.Err, strings.TrimSpace(e.Log))
}

// CompilePTX compiles one self-contained CUDA C++ source for a virtual
// architecture such as "compute_90" and returns the PTX, which the driver
// compiles to machine code when it loads it (and cannot, with
// CUDA_ERROR_UNSUPPORTED_PTX_VERSION, when NVRTC is newer than the driver).
func (n *NVRTC) CompilePTX(name, src, arch string, extra ...string) (string, error) {
	if !strings.HasPrefix(arch, "compute_") {
		return "", fmt.Errorf("architecture %q: want compute_NN", arch)
	}
	b, _, err := n.compile(name, src, arch, extra, "PTX", n.getPTXSize, n.getPTX)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\x00"), nil
}

// CompileCUBIN compiles one self-contained CUDA C++ source for a real
// architecture such as "sm_90" and returns the cubin: machine code the
// driver loads as it is, whatever NVRTC's version (the driver only has to
// know the architecture).
func (n *NVRTC) CompileCUBIN(name, src, arch string, extra ...string) ([]byte, error) {
	b, _, err := n.CompileCUBINLog(name, src, arch, extra)
	return b, err
}

// CompileCUBINLog is CompileCUBIN that also returns NVRTC's log
// (ptxas's report when asked for with --ptxas-options=-v).
func (n *NVRTC) CompileCUBINLog(name, src, arch string, extra []string) ([]byte, string, error) {
	if !strings.HasPrefix(arch, "sm_") {
		return nil, "", fmt.Errorf("architecture %q: want sm_NN", arch)
	}
	if n.getCUBIN == nil {
		major, minor := n.Version()
		return nil, "", fmt.Errorf("NVRTC %d.%d has no nvrtcGetCUBIN (11.1 or later has)", major, minor)
	}
	return n.compile(name, src, arch, extra, "cubin", n.getCUBINSize, n.getCUBIN)
}

// compile runs NVRTC on src for arch and fetches the result with
// getSize/get (PTX or cubin).
func (n *NVRTC) compile(name, src, arch string, extra []string, what string,
	getSize func(uintptr, *uint64) int32, get func(uintptr, unsafe.Pointer) int32) ([]byte, string, error) {
	// NVRTC programs are independent, but one at a time keeps the log
	// handling simple and NVRTC's memory low.
	n.compileSerialize.Lock()
	defer n.compileSerialize.Unlock()
	var prog uintptr
	if err := n.check(n.createProgram(&prog, src, name, 0, nil, nil), "create program "+name); err != nil {
		return nil, "", err
	}
	defer n.destroyProgram(&prog)
	opts := append(compileOptions(arch), extra...)
	cstrs := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts))
	for i, o := range opts {
		cstrs[i] = append([]byte(o), 0)
		ptrs[i] = &cstrs[i][0]
	}
	r := n.compileProgram(prog, int32(len(ptrs)), unsafe.Pointer(&ptrs[0]))
	runtime.KeepAlive(cstrs)
	runtime.KeepAlive(ptrs)
	if r != 0 {
		return nil, "", &CompileError{Name: name, Arch: arch, Log: n.log(prog), Err: n.check(r, "compile")}
	}
	var size uint64
	if err := n.check(getSize(prog, &size), what+" size"); err != nil {
		return nil, "", err
	}
	if size == 0 {
		return nil, "", fmt.Errorf("NVRTC returned an empty %s for %s", what, arch)
	}
	buf := make([]byte, size)
	if err := n.check(get(prog, unsafe.Pointer(&buf[0])), what); err != nil {
		return nil, "", err
	}
	return buf, n.log(prog), nil
}

// compileOptions are NVRTC's options for arch (part of the cache key).
func compileOptions(arch string) []string {
	return []string{"--gpu-architecture=" + arch, "--std=c++17"}
}

func (n *NVRTC) log(prog uintptr) string {
	var size uint64
	if n.getProgramLogSz(prog, &size) != 0 || size <= 1 {
		return ""
	}
	buf := make([]byte, size)
	if n.getProgramLog(prog, unsafe.Pointer(&buf[0])) != 0 {
		return ""
	}
	return strings.TrimRight(string(buf), "\x00")
}
