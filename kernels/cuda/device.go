package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
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
	// poison fills b with 0xff bytes (NaN as float) on the simulator, as its
	// fresh memory is, so that memory reused for another value reads as
	// unwritten (a plan slot given back, a staging buffer converted again);
	// nothing elsewhere.
	poison(b Buffer) error
	launch(name string, grid, block [3]uint32, shared uint32, args ...any) error
	// loadModule compiles and loads a generated source (name is for
	// messages) defining kernels, unless they are all loaded already.
	loadModule(name, src string, kernels []string) error
	// gemmPlan makes the cuBLASLt state of one GEMM (descriptor, layouts,
	// algorithm needing at most maxWorkspace bytes of workspace), reused by
	// every gemm call with that key until freeGemmPlan.
	gemmPlan(k GemmKey, maxWorkspace uint64) (gemmPlan, error)
	gemm(pl gemmPlan, c GemmCall) error
	freeGemmPlan(pl gemmPlan)
	// hasAlgo: cuBLASLt offers an algorithm for key k within the GEMM
	// workspace (a probe: no plan kept, no choices file consulted).
	hasAlgo(k GemmKey) bool
	sync() error
	// separateSlots: give every plan slot its own allocation (on the
	// simulator, whose allocations end at a guard page, so an overrun from
	// one slot into the next faults).
	separateSlots() bool
}

// gemmPlan is a device's prepared GEMM.
type gemmPlan interface {
	key() GemmKey
	// workspace is the bytes of workspace the plan's algorithm needs.
	workspace() uint64
}

// gpuPlan is a cuBLASLt plan as a gemmPlan.
type gpuPlan struct{ *driver.GemmPlan }

func (p gpuPlan) key() GemmKey      { return p.Key }
func (p gpuPlan) workspace() uint64 { return p.Workspace() }

// gpu is a device behind the driver API and cuBLASLt.
type gpu struct {
	ctx  *driver.Context
	blas *driver.BLAS
	nv   *driver.NVRTC // compiles generated sources (loadModule)
	// syncEach (RPAC_CUDA_SYNC=1): synchronize after every launch and GEMM
	// and name the kernel that failed.
	syncEach bool
	// choices: the GEMM algorithm choices file (RPAC_CUDA_GEMM_ALGOS,
	// gemmtune.go); nil: every plan takes the heuristic's first
	choices *gemmChooser
}

func (g *gpu) separateSlots() bool { return g.ctx.Simulated() }

func (g *gpu) Info() DeviceInfo { return g.ctx.Dev }

func (g *gpu) bind() (func(), error) {
	runtime.LockOSThread()
	if err := g.ctx.MakeCurrent(); err != nil {
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
	return g.ctx.Zero(Buffer{Ptr: b.Ptr, Bytes: bytes})
}
func (g *gpu) poison(b Buffer) error {
	if !g.ctx.Simulated() {
		return nil
	}
	return g.ctx.Fill(b, 0xff)
}
func (g *gpu) launch(name string, grid, block [3]uint32, shared uint32, args ...any) error {
	if err := g.ctx.Launch(name, grid, block, shared, args...); err != nil {
		return err
	}
	if g.syncEach {
		if err := g.ctx.Sync(); err != nil {
			return fmt.Errorf("kernel %s (grid %v, block %v, %d bytes shared; RPAC_CUDA_SYNC=1): %w", name, grid, block, shared, err)
		}
	}
	return nil
}
func (g *gpu) loadModule(name, src string, kernels []string) error {
	if g.ctx.Loaded(kernels) {
		return nil
	}
	_, err := g.ctx.LoadSource(g.nv, name, src, kernels)
	return err
}
func (g *gpu) hasAlgo(k GemmKey) bool {
	pl, err := g.blas.NewPlan(k, gemmWorkspace, 0)
	if err == nil {
		g.blas.DestroyPlan(pl)
	}
	return err == nil
}

func (g *gpu) gemmPlan(k GemmKey, maxWorkspace uint64) (gemmPlan, error) {
	rank := 0
	if g.choices != nil {
		var err error
		rank, err = g.choices.rank(k, func(k GemmKey) ([]AlgoTime, error) {
			return g.timeAlgos(k, maxWorkspace, gemmTuneAlgos, gemmTuneReps)
		})
		if err != nil {
			return nil, err
		}
	}
	pl, err := g.blas.NewPlan(k, maxWorkspace, rank)
	if err != nil {
		return nil, err
	}
	return gpuPlan{pl}, nil
}
func (g *gpu) freeGemmPlan(pl gemmPlan) { g.blas.DestroyPlan(pl.(gpuPlan).GemmPlan) }
func (g *gpu) gemm(pl gemmPlan, c GemmCall) error {
	if err := g.blas.Matmul(pl.(gpuPlan).GemmPlan, c); err != nil {
		return err
	}
	if g.syncEach {
		if err := g.ctx.Sync(); err != nil {
			return fmt.Errorf("GEMM %+v (RPAC_CUDA_SYNC=1): %w", pl.key(), err)
		}
	}
	return nil
}
func (g *gpu) sync() error { return g.ctx.Sync() }
