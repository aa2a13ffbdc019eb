package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// NVRTC is the runtime compiler, bound at run time.
type NVRTC struct {
	handle uintptr

	version          func(major, minor *int32) int32
	createProgram    func(prog *uintptr, src, name string, numHeaders int32, headers, includeNames unsafe.Pointer) int32
	compileProgram   func(prog uintptr, numOptions int32, options unsafe.Pointer) int32
	getProgramLogSz  func(prog uintptr, size *uint64) int32
	getProgramLog    func(prog uintptr, log unsafe.Pointer) int32
	getPTXSize       func(prog uintptr, size *uint64) int32
	getPTX           func(prog uintptr, ptx unsafe.Pointer) int32
	destroyProgram   func(prog *uintptr) int32
	getErrorString   func(result int32) string
	compileSerialize sync.Mutex
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr  error
)

// LoadNVRTC binds NVRTC (once per process).
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() {
		n := &NVRTC{}
		var err error
		if n.handle, err = bind(LibNVRTC, []symbol{
			{&n.version, "nvrtcVersion"}, {&n.createProgram, "nvrtcCreateProgram"},
			{&n.compileProgram, "nvrtcCompileProgram"}, {&n.getProgramLogSz, "nvrtcGetProgramLogSize"},
			{&n.getProgramLog, "nvrtcGetProgramLog"}, {&n.getPTXSize, "nvrtcGetPTXSize"}, {&n.getPTX, "nvrtcGetPTX"},
			{&n.destroyProgram, "nvrtcDestroyProgram"}, {&n.getErrorString, "nvrtcGetErrorString"},
		}); err != nil {
			nvrtcErr = err
			return
		}
		nvrtcLib = n
	})
	return nvrtcLib, nvrtcErr
}

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
// architecture such as "compute_90" and returns the PTX.
func (n *NVRTC) CompilePTX(name, src, arch string, extra ...string) (string, error) {
	if !strings.HasPrefix(arch, "compute_") {
		return "", fmt.Errorf("architecture %q: want compute_NN", arch)
	}
	// NVRTC programs are independent, but one at a time keeps the log
	// handling simple and NVRTC's memory low.
	n.compileSerialize.Lock()
	defer n.compileSerialize.Unlock()
	var prog uintptr
	if err := n.check(n.createProgram(&prog, src, name, 0, nil, nil), "create program "+name); err != nil {
		return "", err
	}
	defer n.destroyProgram(&prog)
	opts := append([]string{"--gpu-architecture=" + arch, "--std=c++17"}, extra...)
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
		return "", &CompileError{Name: name, Arch: arch, Log: n.log(prog), Err: n.check(r, "compile")}
	}
	var size uint64
	if err := n.check(n.getPTXSize(prog, &size), "PTX size"); err != nil {
		return "", err
	}
	if size == 0 {
		return "", errors.New("NVRTC returned an empty PTX")
	}
	buf := make([]byte, size)
	if err := n.check(n.getPTX(prog, unsafe.Pointer(&buf[0])), "PTX"); err != nil {
		return "", err
	}
	return strings.TrimRight(string(buf), "\x00"), nil
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
