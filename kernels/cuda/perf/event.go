package perf

import "github.com/rpac-dev/rpac/kernels/cuda/driver"

// EventKind is what one traced device call did.
type EventKind uint8

const (
	EvLaunch EventKind = iota // a kernel launch
	EvGEMM                    // a cuBLASLt matmul
	EvH2D                     // host → device copy
	EvD2H                     // device → host copy
	EvMemset                  // cuMemsetD8
)

func (k EventKind) String() string {
	return [...]string{"launch", "gemm", "h2d", "d2h", "memset"}[k]
}

// CostClass says which roofline a kernel runs against (predict.go).
type CostClass uint8

const (
	// ClassStream: memory-bound grid-stride or row kernels; Little's law
	// with several loads in flight per thread.
	ClassStream CostClass = iota
	// ClassSerial: each thread walks a long dependent loop with one load
	// in flight (reduce_view_f32's general path, the single-thread
	// Sinkhorn, single-block reductions): bandwidth = threads × 4 B /
	// latency.
	ClassSerial
	// ClassSIMT: scalar fp32 FMAs with one coalesced L1 load each (at most
	// a quarter of the CUDA cores' FMA rate).
	ClassSIMT
	// ClassGEMM: a cuBLASLt matmul (tensor cores for bf16).
	ClassGEMM
	// ClassCopy: a host↔device copy over the bus.
	ClassCopy
	// ClassMMA: a kernel of rpac's own on the tensor cores (rpac_mma tiles,
	// WMMA): Flops at a fraction of the bf16 peak plus Scalar instructions
	// (its elementwise work) at the CUDA cores' issue rate.
	ClassMMA
	// ClassView: grid-stride kernels over strided views and broadcasts,
	// which work out every operand's multi-dimensional index per element
	// (64-bit divisions): memory-bound at viewStream of the bandwidth.
	ClassView
)

func (c CostClass) String() string {
	return [...]string{"stream", "serial", "simt", "gemm", "copy", "mma", "view"}[c]
}

// Event is one traced device call with its estimated work: Flops that
// count toward the roofline's compute side (GEMM: 2·M·N·K·batch), Strided
// the part of the fp32 FMAs whose warp-wide loads touch 32 cache lines
// each (per-thread dot products over rows: one FMA per SM per clock), and
// Bytes the DRAM traffic (or bus traffic for copies).
type Event struct {
	Kind    EventKind
	Name    string
	Class   CostClass
	Threads int64 // launched threads (grid × block)
	Flops   float64
	Strided float64
	Bytes   float64
	// ClassMMA only: the scalar instructions of all threads together, and
	// the blocks launched (a grid of fewer blocks than SMs leaves SMs idle).
	Scalar float64
	Blocks int64
	// GEMM only.
	Shape driver.GemmShape
	DType driver.DType
	// Measured is the call's wall time on the device, the device
	// synchronized before and after it (the backend's StartMeasuredTrace;
	// 0: not measured).
	Measured float64
}
