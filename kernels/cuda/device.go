package cuda

import (
	"runtime"
	"unsafe"
)

// device is what the backend needs of a GPU. gpu is the real one; the
// tests' fake device checks every launch against the kernel's signature and
// every pointer against the allocations, without a GPU.
type device interface {
	Info() DeviceInfo
	// bind makes the device current for the calling goroutine (locked to
	// its thread); the returned func releases the lock.
	bind() (func(), error)
	alloc(bytes uint64) (Buffer, error)
	free(b Buffer)
	upload(b Buffer, src unsafe.Pointer, bytes uint64) error
	download(dst unsafe.Pointer, b Buffer, bytes uint64) error
	zero(b Buffer, bytes uint64) error
	launch(name string, grid, block [3]uint32, shared uint32, args ...any) error
	gemm(s GemmShape, alpha float32, A, B Buffer, ab DType, beta float32, C Buffer) error
	sync() error
}

// gpu is a device behind the driver API and cuBLASLt.
type gpu struct {
	ctx  *Context
	blas *BLAS
}

func (g *gpu) Info() DeviceInfo { return g.ctx.Dev }

func (g *gpu) bind() (func(), error) {
	runtime.LockOSThread()
	if err := g.ctx.d.check(g.ctx.d.ctxSetCurrent(g.ctx.ctx), "cuCtxSetCurrent"); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return runtime.UnlockOSThread, nil
}

func (g *gpu) alloc(bytes uint64) (Buffer, error) { return g.ctx.Alloc(bytes) }
func (g *gpu) free(b Buffer)                      { g.ctx.Free(b) }
func (g *gpu) upload(b Buffer, src unsafe.Pointer, bytes uint64) error {
	return g.ctx.Upload(b, src, bytes)
}
func (g *gpu) download(dst unsafe.Pointer, b Buffer, bytes uint64) error {
	return g.ctx.Download(dst, b, bytes)
}
func (g *gpu) zero(b Buffer, bytes uint64) error {
	return g.ctx.d.check(g.ctx.d.memsetD8(b.Ptr, 0, bytes), "cuMemsetD8")
}
func (g *gpu) launch(name string, grid, block [3]uint32, shared uint32, args ...any) error {
	return g.ctx.Launch(name, grid, block, shared, args...)
}
func (g *gpu) gemm(s GemmShape, alpha float32, A, B Buffer, ab DType, beta float32, C Buffer) error {
	return g.blas.GemmBatched(s, alpha, A, B, ab, beta, C)
}
func (g *gpu) sync() error { return g.ctx.Sync() }
