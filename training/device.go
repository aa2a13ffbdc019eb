package training

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// Device is where a run computes.
type Device uint8

const (
	DeviceCPU  Device = iota
	DeviceCUDA        // one NVIDIA GPU (the first visible)
	DeviceAuto        // CUDA when a GPU is usable, else the CPU
	// DeviceCUDASim is the CUDA backend on rpac's CUDA simulator: every
	// kernel runs on the CPU from its CUDA source (kernels/cuda/cudasim).
	// It checks the CUDA code; it says nothing of a GPU's speed.
	DeviceCUDASim
)

// isCUDA: the device runs the CUDA backend (on a GPU or the simulator).
func (d Device) isCUDA() bool { return d == DeviceCUDA || d == DeviceCUDASim }

func (d Device) String() string {
	switch d {
	case DeviceCUDA:
		return "cuda"
	case DeviceAuto:
		return "auto"
	case DeviceCUDASim:
		return "cuda-sim"
	}
	return "cpu"
}

// ParseDevice reads --device.
func ParseDevice(s string) (Device, error) {
	switch s {
	case "", "cpu":
		return DeviceCPU, nil
	case "cuda":
		return DeviceCUDA, nil
	case "auto":
		return DeviceAuto, nil
	case "cuda-sim":
		return DeviceCUDASim, nil
	}
	return 0, fmt.Errorf("--device %q: want cpu, cuda, cuda-sim or auto", s)
}

// Target is a device resolved for a run (ResolveDevice), which
// OpenBackend opens.
type Target struct {
	Device    Device       // cpu, cuda or cuda-sim: never auto
	Precision ir.Precision // fp32 or bf16: never the default
	// Ordinal is the GPU (cuda): a data-parallel rank's LOCAL_RANK, modulo
	// the GPUs visible (a launcher that gives each rank one GPU through
	// CUDA_VISIBLE_DEVICES leaves it one).
	Ordinal int
}

// resolveDevice turns auto into cpu or cuda (cuda when a GPU is usable),
// and checks the precision against the device. The precision it returns
// is the one mapping of --precision to a backend's arithmetic: fp32 on the
// CPU; on CUDA the GEMM inputs' type the backend is opened with (cuda.New,
// cuda.NewDryRun), bf16 unless fp32 is asked for.
func resolveDevice(d Device, p ir.Precision) (Device, ir.Precision, error) {
	if d == DeviceAuto {
		d = DeviceCPU
		if driver.Available() == nil {
			d = DeviceCUDA
		}
	}
	switch {
	case p != ir.PrecisionDefault && p != ir.FP32 && p != ir.BF16:
		return 0, 0, fmt.Errorf("--precision %s: want bf16 or fp32", p)
	case d > DeviceCUDASim:
		return 0, 0, fmt.Errorf("device %d: want cpu, cuda, cuda-sim or auto", d)
	case d == DeviceCPU && p == ir.BF16:
		return 0, 0, fmt.Errorf("--precision bf16 needs --device cuda (the CPU backend computes in fp32)")
	case d == DeviceCPU:
		p = ir.FP32
	case p == ir.PrecisionDefault:
		p = ir.BF16
	}
	return d, p, nil
}

// ResolveDevice is the one place a run resolves its device: auto becomes
// cuda or cpu, the precision is defaulted and checked against the device,
// and a GPU or the simulator is checked usable (what is missing named when
// it is not).
func ResolveDevice(d Device, p ir.Precision) (Target, error) {
	auto := d == DeviceAuto
	d, p, err := resolveDevice(d, p)
	if err != nil {
		return Target{}, err
	}
	if d == DeviceCUDA && !auto { // auto took cuda only for a usable GPU
		if err := driver.Available(); err != nil {
			return Target{}, fmt.Errorf("--device cuda: %w. Use --device cpu (or auto, or cuda-sim to run the CUDA code on the CPU)", err)
		}
	}
	if d == DeviceCUDASim {
		if err := checkSimulator(); err != nil {
			return Target{}, fmt.Errorf("--device cuda-sim: %w", err)
		}
	}
	return Target{Device: d, Precision: p}, nil
}

// checkSimulator builds and enables the CUDA simulator and checks that the
// driver this process loads is its.
func checkSimulator() error {
	if _, err := cudasim.Enable(); err != nil {
		return err
	}
	drv, err := driver.LoadDriver()
	if err != nil {
		return err
	}
	if !drv.Simulated() {
		return fmt.Errorf("the CUDA driver this process loaded is not the simulator's (a real driver was loaded first)")
	}
	return nil
}

// OpenBackend opens the backend of a resolved device; the CUDA backend
// takes the paths co chooses (nil: cuda.DefaultOptions()). The plan and
// the graphs then read the backend's Capabilities.
func OpenBackend(t Target, co *cuda.Options) (kernels.Backend, error) {
	if t.Device == DeviceCPU {
		return cpu.New(ir.FP32), nil
	}
	ordinal := 0
	if t.Device == DeviceCUDA && t.Ordinal > 0 {
		var err error
		if ordinal, err = visibleOrdinal(t.Ordinal); err != nil {
			return nil, err
		}
	}
	be, err := cuda.New(ordinal, t.Precision, cudaOptions(co))
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", t.Device, err)
	}
	if t.Device == DeviceCUDASim && !be.Simulated() {
		return nil, fmt.Errorf("--device cuda-sim: the CUDA backend did not open the simulator")
	}
	return be, nil
}

// visibleOrdinal is local modulo the number of GPUs the driver sees.
func visibleOrdinal(local int) (int, error) {
	d, err := driver.LoadDriver()
	if err != nil {
		return 0, err
	}
	devs, err := d.Devices()
	if err != nil || len(devs) == 0 {
		return 0, fmt.Errorf("no GPU for local rank %d: %v", local, err)
	}
	return local % len(devs), nil
}

// cudaOptions is co, or the CUDA backend's defaults when nil.
func cudaOptions(co *cuda.Options) cuda.Options {
	if co == nil {
		return cuda.DefaultOptions()
	}
	return *co
}

// openBackend sets o.Backend, unless set already, to the backend of
// o.Device, resolved here.
func (o *Options) openBackend() error {
	if o.Backend != nil {
		return nil
	}
	t, err := ResolveDevice(o.Device, o.Precision)
	if err != nil {
		return err
	}
	t.Ordinal = o.Parallel.Env.LocalRank
	o.Backend, err = OpenBackend(t, o.CUDA)
	return err
}

// SimulatorNote is the line a run on the CUDA simulator prints ("" for
// any other backend).
func SimulatorNote(be kernels.Backend) string {
	if c, ok := be.(*cuda.Backend); ok && c.Simulated() {
		return "device: rpac's CUDA simulator (--device cuda-sim): the CUDA backend's kernels run on this CPU from their CUDA sources, " +
			"one fiber per CUDA thread, with bounds and barrier checks; no GPU is used, and its speed says nothing of a GPU's"
	}
	return ""
}

// gpuBudgetFraction is the share of the GPU's memory a CUDA run plans for
// (the rest, 8 GB of an 80 GB card: the backend's buffers outside the plan,
// the GEMM attention's work buffer of at most 2 GiB and the packed q, k, v
// its forwards keep for their backwards of at most 1 GiB, the bf16 twins'
// of at most 1 GiB and the GEMMs' staging; cuBLASLt, the driver,
// fragmentation).
const gpuBudgetFraction = 0.9

// memBudget is the default memory budget of a run on a backend with caps:
// the host's (DefaultMemBudget), lowered on a device to gpuBudgetFraction
// of its memory, where the step programs live.
func memBudget(caps kernels.Capabilities) (int64, error) {
	budget, err := DefaultMemBudget()
	if err != nil || caps.DeviceMemory == 0 {
		return budget, err
	}
	return min(budget, int64(gpuBudgetFraction*float64(caps.DeviceMemory))), nil
}

// planCapabilities are the capabilities a plan is sized for: o.Backend's,
// or the CPU backend's when o names the CPU and no backend is open yet.
func planCapabilities(o Options) (kernels.Capabilities, error) {
	if o.Backend != nil {
		return o.Backend.Capabilities(), nil
	}
	d, _, err := resolveDevice(o.Device, o.Precision)
	if err != nil {
		return kernels.Capabilities{}, err
	}
	if d != DeviceCPU {
		return kernels.Capabilities{}, fmt.Errorf("--device %s: the plan needs the opened backend (OpenBackend) to size its memory", d)
	}
	return kernels.Capabilities{}, nil
}
