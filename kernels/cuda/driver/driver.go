package driver

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Driver is the CUDA driver API, bound at run time.
type Driver struct {
	handle uintptr

	init           func(flags uint32) int32
	driverVersion  func(v *int32) int32
	deviceGetCount func(n *int32) int32
	deviceGet      func(dev *int32, ordinal int32) int32
	deviceGetName  func(name unsafe.Pointer, size int32, dev int32) int32
	deviceGetAttr  func(v *int32, attr int32, dev int32) int32
	deviceTotalMem func(bytes *uint64, dev int32) int32
	primaryRetain  func(ctx *uintptr, dev int32) int32
	ctxSetCurrent  func(ctx uintptr) int32
	ctxSynchronize func() int32
	moduleLoadData func(mod *uintptr, image unsafe.Pointer) int32
	moduleGetFunc  func(fn *uintptr, mod uintptr, name string) int32
	memAlloc       func(ptr *uint64, bytes uint64) int32
	memFree        func(ptr uint64) int32
	memcpyHtoD     func(dst uint64, src unsafe.Pointer, bytes uint64) int32
	memcpyDtoH     func(dst unsafe.Pointer, src uint64, bytes uint64) int32
	memsetD8       func(dst uint64, v uint8, n uint64) int32
	launchKernel   func(fn uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) int32
	funcSetAttr    func(fn uintptr, attr int32, v int32) int32
	getErrorString func(r int32, s **byte) int32

	// Streams and events (streams.go), bound when the library has them.
	streamCreate  func(s *uintptr, flags uint32) int32
	streamDestroy func(s uintptr) int32
	streamSync    func(s uintptr) int32
	streamWait    func(s, e uintptr, flags uint32) int32
	eventCreate   func(e *uintptr, flags uint32) int32
	eventRecord   func(e, s uintptr) int32
	eventDestroy  func(e uintptr) int32
	streams       bool

	// The CUDA simulator's own controls (kernels/cuda/cudasim), bound when
	// the library loaded is the simulator; nil for a real driver.
	simConfig func(key string, v int64) int64
	simStat   func(key string) int64
}

// Device attributes (CUdevice_attribute).
const (
	attrComputeCapabilityMajor = 75
	attrComputeCapabilityMinor = 76
	attrMultiprocessorCount    = 16
	attrSharedOptin            = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
)

// funcAttrMaxDynamicShared is CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
// a kernel launched with more than sharedDefault bytes of dynamic shared
// memory needs it set to at least that first.
const (
	funcAttrMaxDynamicShared = 8
	sharedDefault            = 48 << 10
)

// LoadDriver binds the CUDA driver and initialises it (once per process).
func LoadDriver() (*Driver, error) { return loadDriver() }

var loadDriver = sync.OnceValues(func() (*Driver, error) {
	d := &Driver{}
	var err error
	if d.handle, err = bind(LibDriver, []symbol{
		{&d.init, "cuInit"}, {&d.driverVersion, "cuDriverGetVersion"}, {&d.deviceGetCount, "cuDeviceGetCount"},
		{&d.deviceGet, "cuDeviceGet"}, {&d.deviceGetName, "cuDeviceGetName"}, {&d.deviceGetAttr, "cuDeviceGetAttribute"},
		{&d.deviceTotalMem, "cuDeviceTotalMem_v2"}, {&d.primaryRetain, "cuDevicePrimaryCtxRetain"},
		{&d.ctxSetCurrent, "cuCtxSetCurrent"}, {&d.ctxSynchronize, "cuCtxSynchronize"},
		{&d.moduleLoadData, "cuModuleLoadData"}, {&d.moduleGetFunc, "cuModuleGetFunction"},
		{&d.memAlloc, "cuMemAlloc_v2"}, {&d.memFree, "cuMemFree_v2"}, {&d.memcpyHtoD, "cuMemcpyHtoD_v2"},
		{&d.memcpyDtoH, "cuMemcpyDtoH_v2"}, {&d.memsetD8, "cuMemsetD8_v2"}, {&d.launchKernel, "cuLaunchKernel"},
		{&d.funcSetAttr, "cuFuncSetAttribute"}, {&d.getErrorString, "cuGetErrorString"},
	}); err != nil {
		return nil, err
	}
	d.streams = bindOptional(d.handle, []symbol{
		{&d.streamCreate, "cuStreamCreate"}, {&d.streamDestroy, "cuStreamDestroy_v2"}, {&d.streamSync, "cuStreamSynchronize"},
		{&d.streamWait, "cuStreamWaitEvent"}, {&d.eventCreate, "cuEventCreate"}, {&d.eventRecord, "cuEventRecord"},
		{&d.eventDestroy, "cuEventDestroy_v2"},
	})
	bindOptional(d.handle, []symbol{{&d.simConfig, "rpacsim_config"}, {&d.simStat, "rpacsim_stat"}}) // the simulator's own
	if err := d.check(d.init(0), "cuInit"); err != nil {
		return nil, fmt.Errorf("%w (is an NVIDIA GPU visible to this process?)", err)
	}
	return d, nil
})

// Simulated reports whether the driver is rpac's CUDA simulator.
func (d *Driver) Simulated() bool { return d.simConfig != nil }

// SimConfig sets one of the simulator's settings ("diff": 1 runs every
// launch twice, in another block and thread order with another shared
// memory poison, and compares) and returns the previous value; -1 on a real
// driver or for an unknown key.
func (d *Driver) SimConfig(key string, v int64) int64 {
	if d.simConfig == nil {
		return -1
	}
	return d.simConfig(key, v)
}

// SimStat reads one of the simulator's counters ("allocs", "alloc_bytes",
// "launches", "blocks", "gemms", "diff_launches", "cubin_loads",
// "ptx_loads", "sticky", "lt_descs", "lt_layouts", "lt_live",
// "lt_heuristics"); -1 on a real driver.
func (d *Driver) SimStat(key string) int64 {
	if d.simStat == nil {
		return -1
	}
	return d.simStat(key)
}

func (d *Driver) check(r int32, what string) error {
	if r == 0 {
		return nil
	}
	var s *byte
	msg := "unknown error"
	if d.getErrorString(r, &s) == 0 && s != nil {
		msg = cString(s)
	}
	return fmt.Errorf("CUDA %s: %s (%d)", what, msg, r)
}

func cString(p *byte) string {
	var b strings.Builder
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b.WriteByte(*(*byte)(q))
	}
	return b.String()
}

// DeviceInfo describes one GPU.
type DeviceInfo struct {
	Ordinal       int    `json:"ordinal"`
	Name          string `json:"name"`
	Major, Minor  int    `json:"-"`
	Arch          string `json:"arch"` // compute_NN: the virtual architecture (PTX)
	SM            string `json:"sm"`   // sm_NN: the real one (cubin)
	SMs           int    `json:"sms"`
	SharedOptin   int    `json:"shared_optin"` // the most shared memory a block may have (with the opt-in), bytes
	TotalMemory   uint64 `json:"total_memory"`
	DriverVersion int    `json:"driver_version"` // cuDriverGetVersion: 1000*major + 10*minor
}

// DriverVersionString is the driver's CUDA version as "12.8".
func (d DeviceInfo) DriverVersionString() string { return cudaVersion(d.DriverVersion) }

func cudaVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// Version is the CUDA version the driver supports (cuDriverGetVersion), e.g.
// "12.8".
func (d *Driver) Version() string {
	var v int32
	if d.driverVersion(&v) != 0 {
		return "unknown"
	}
	return cudaVersion(int(v))
}

// Devices lists the GPUs the driver sees.
func (d *Driver) Devices() ([]DeviceInfo, error) {
	var n, ver int32
	if err := d.check(d.deviceGetCount(&n), "cuDeviceGetCount"); err != nil {
		return nil, err
	}
	d.driverVersion(&ver)
	out := make([]DeviceInfo, 0, n)
	for i := int32(0); i < n; i++ {
		var dev, major, minor, sms, optin int32
		if err := d.check(d.deviceGet(&dev, i), "cuDeviceGet"); err != nil {
			return nil, err
		}
		name := make([]byte, 256)
		if err := d.check(d.deviceGetName(unsafe.Pointer(&name[0]), int32(len(name)), dev), "cuDeviceGetName"); err != nil {
			return nil, err
		}
		d.deviceGetAttr(&major, attrComputeCapabilityMajor, dev)
		d.deviceGetAttr(&minor, attrComputeCapabilityMinor, dev)
		d.deviceGetAttr(&sms, attrMultiprocessorCount, dev)
		d.deviceGetAttr(&optin, attrSharedOptin, dev)
		var mem uint64
		d.deviceTotalMem(&mem, dev)
		out = append(out, DeviceInfo{Ordinal: int(i), Name: cString(&name[0]), Major: int(major), Minor: int(minor),
			Arch: fmt.Sprintf("compute_%d%d", major, minor), SM: fmt.Sprintf("sm_%d%d", major, minor), SMs: int(sms), SharedOptin: int(optin), TotalMemory: mem, DriverVersion: int(ver)})
	}
	return out, nil
}

// Context is a device's primary context made current, with the modules
// loaded into it.
type Context struct {
	d   *Driver
	Dev DeviceInfo
	ctx uintptr
	fns map[string]uintptr
	// optedIn: the dynamic shared memory each kernel has been allowed
	// beyond sharedDefault (cuFuncSetAttribute), bytes.
	optedIn map[string]uint32
	lock    sync.Mutex
	// Images says, per kernel source, what LoadKernels loaded (a cubin, or
	// PTX and why).
	Images []LoadedImage
}

// NewContext makes device ordinal's primary context current for the calling
// OS thread (callers lock their goroutine to its thread).
func (d *Driver) NewContext(ordinal int) (*Context, error) {
	devs, err := d.Devices()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= len(devs) {
		return nil, fmt.Errorf("no CUDA device %d (%d visible)", ordinal, len(devs))
	}
	c := &Context{d: d, Dev: devs[ordinal], fns: map[string]uintptr{}, optedIn: map[string]uint32{}}
	var dev int32
	if err := d.check(d.deviceGet(&dev, int32(ordinal)), "cuDeviceGet"); err != nil {
		return nil, err
	}
	if err := d.check(d.primaryRetain(&c.ctx, dev), "cuDevicePrimaryCtxRetain"); err != nil {
		return nil, err
	}
	if err := d.check(d.ctxSetCurrent(c.ctx), "cuCtxSetCurrent"); err != nil {
		return nil, err
	}
	return c, nil
}

// Simulated reports whether the context is the simulator's.
func (c *Context) Simulated() bool { return c.d.Simulated() }

// MakeCurrent makes the context current for the calling OS thread (the
// caller locks its goroutine to the thread).
func (c *Context) MakeCurrent() error {
	return c.d.check(c.d.ctxSetCurrent(c.ctx), "cuCtxSetCurrent")
}

// LoadPTX loads a module from PTX and remembers its kernels by name.
func (c *Context) LoadPTX(ptx string, kernels []string) error {
	return c.LoadImage([]byte(ptx), kernels)
}

// LoadImage loads a module from a cubin or PTX and remembers its kernels
// by name.
func (c *Context) LoadImage(image []byte, kernels []string) error {
	img := append(append([]byte(nil), image...), 0)
	var mod uintptr
	if err := c.d.check(c.d.moduleLoadData(&mod, unsafe.Pointer(&img[0])), "cuModuleLoadData"); err != nil {
		return err
	}
	runtime.KeepAlive(img)
	c.lock.Lock()
	defer c.lock.Unlock()
	for _, k := range kernels {
		var fn uintptr
		if err := c.d.check(c.d.moduleGetFunc(&fn, mod, k), "cuModuleGetFunction "+k); err != nil {
			return err
		}
		c.fns[k] = fn
	}
	return nil
}

// Buffer is device memory.
type Buffer struct {
	Ptr   uint64
	Bytes uint64
}

// Alloc allocates device memory.
func (c *Context) Alloc(bytes uint64) (Buffer, error) {
	var p uint64
	if err := c.d.check(c.d.memAlloc(&p, max(bytes, 1)), fmt.Sprintf("cuMemAlloc(%d)", bytes)); err != nil {
		return Buffer{}, err
	}
	return Buffer{Ptr: p, Bytes: bytes}, nil
}

// Free releases device memory.
func (c *Context) Free(b Buffer) error { return c.d.check(c.d.memFree(b.Ptr), "cuMemFree") }

// Upload copies host bytes to b.
func (c *Context) Upload(b Buffer, src unsafe.Pointer, bytes uint64) error {
	if bytes > b.Bytes {
		return fmt.Errorf("upload of %d bytes into a %d-byte buffer", bytes, b.Bytes)
	}
	return c.d.check(c.d.memcpyHtoD(b.Ptr, src, bytes), "cuMemcpyHtoD")
}

// Download copies b to host memory.
func (c *Context) Download(dst unsafe.Pointer, b Buffer, bytes uint64) error {
	if bytes > b.Bytes {
		return fmt.Errorf("download of %d bytes from a %d-byte buffer", bytes, b.Bytes)
	}
	return c.d.check(c.d.memcpyDtoH(dst, b.Ptr, bytes), "cuMemcpyDtoH")
}

// Zero clears b.
func (c *Context) Zero(b Buffer) error { return c.Fill(b, 0) }

// Fill sets every byte of b to v.
func (c *Context) Fill(b Buffer, v byte) error {
	return c.d.check(c.d.memsetD8(b.Ptr, v, b.Bytes), "cuMemsetD8")
}

// Launch runs kernel name on a grid of blocks of threads; args are the
// kernel's parameters as Go values of their C types (uint64 device
// pointers, int32, int64, float32).
func (c *Context) Launch(name string, grid, block [3]uint32, shared uint32, args ...any) error {
	c.lock.Lock()
	fn, ok := c.fns[name]
	c.lock.Unlock()
	if !ok {
		return fmt.Errorf("kernel %s is not loaded", name)
	}
	if err := c.optIn(name, fn, shared); err != nil {
		return err
	}
	vals := make([]any, len(args))
	params := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case uint64:
			p := new(uint64)
			*p = v
			vals[i], params[i] = p, unsafe.Pointer(p)
		case int64:
			p := new(int64)
			*p = v
			vals[i], params[i] = p, unsafe.Pointer(p)
		case int32:
			p := new(int32)
			*p = v
			vals[i], params[i] = p, unsafe.Pointer(p)
		case float32:
			p := new(float32)
			*p = v
			vals[i], params[i] = p, unsafe.Pointer(p)
		default:
			return fmt.Errorf("kernel %s: argument %d has unsupported type %T", name, i, a)
		}
	}
	var pp unsafe.Pointer
	if len(params) > 0 {
		pp = unsafe.Pointer(&params[0])
	}
	r := c.d.launchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, 0, pp, nil)
	runtime.KeepAlive(vals)
	runtime.KeepAlive(params)
	return c.d.check(r, "cuLaunchKernel "+name)
}

// optIn allows kernel name shared bytes of dynamic shared memory where
// that is more than sharedDefault and more than it was allowed before.
func (c *Context) optIn(name string, fn uintptr, shared uint32) error {
	if shared <= sharedDefault {
		return nil
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.optedIn[name] >= shared {
		return nil
	}
	if err := c.d.check(c.d.funcSetAttr(fn, funcAttrMaxDynamicShared, int32(shared)), "cuFuncSetAttribute "+name); err != nil {
		return fmt.Errorf("%w (%d bytes of dynamic shared memory; the device allows %d)", err, shared, c.Dev.SharedOptin)
	}
	c.optedIn[name] = shared
	return nil
}

// Sync waits for the context's work.
func (c *Context) Sync() error { return c.d.check(c.d.ctxSynchronize(), "cuCtxSynchronize") }
