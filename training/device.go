package training

import (
	"fmt"

	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/kernels/cuda"
)

// Device is where a run computes.
type Device uint8

const (
	DeviceCPU  Device = iota
	DeviceCUDA        // one NVIDIA GPU (the first visible)
	DeviceAuto        // CUDA when a GPU is usable, else the CPU
)

func (d Device) String() string {
	switch d {
	case DeviceCUDA:
		return "cuda"
	case DeviceAuto:
		return "auto"
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
	}
	return 0, fmt.Errorf("--device %q: want cpu, cuda or auto", s)
}

// Precision is the arithmetic of a run's GEMMs.
type Precision uint8

const (
	PrecisionDefault Precision = iota // bf16 on CUDA, fp32 on the CPU
	PrecisionFP32
	PrecisionBF16
)

func (p Precision) String() string {
	switch p {
	case PrecisionFP32:
		return "fp32"
	case PrecisionBF16:
		return "bf16"
	}
	return "default"
}

// ParsePrecision reads --precision.
func ParsePrecision(s string) (Precision, error) {
	switch s {
	case "":
		return PrecisionDefault, nil
	case "fp32":
		return PrecisionFP32, nil
	case "bf16":
		return PrecisionBF16, nil
	}
	return 0, fmt.Errorf("--precision %q: want bf16 or fp32", s)
}

// resolveDevice turns auto into cpu or cuda, and checks the precision
// against the device.
func resolveDevice(d Device, p Precision) (Device, Precision, error) {
	if d == DeviceAuto {
		d = DeviceCPU
		if cuda.Available() == nil {
			d = DeviceCUDA
		}
	}
	switch {
	case d > DeviceAuto:
		return 0, 0, fmt.Errorf("device %d: want cpu, cuda or auto", d)
	case d == DeviceCPU && p == PrecisionBF16:
		return 0, 0, fmt.Errorf("--precision bf16 needs --device cuda (the CPU backend computes in fp32)")
	case d == DeviceCPU:
		p = PrecisionFP32
	case p == PrecisionDefault:
		p = PrecisionBF16
	}
	return d, p, nil
}

// CheckDevice reports whether the device can be opened (and names what is
// missing when it cannot).
func CheckDevice(d Device, p Precision) error {
	d, _, err := resolveDevice(d, p)
	if err != nil {
		return err
	}
	if d == DeviceCUDA {
		if err := cuda.Available(); err != nil {
			return fmt.Errorf("--device cuda: %w. Use --device cpu (or auto)", err)
		}
	}
	return nil
}

// OpenBackend opens the backend of a device.
func OpenBackend(d Device, p Precision) (kernels.Backend, error) {
	d, p, err := resolveDevice(d, p)
	if err != nil {
		return nil, err
	}
	if d == DeviceCPU {
		return cpu.New(kernels.F32), nil
	}
	gemm := cuda.GEMMF32
	if p == PrecisionBF16 {
		gemm = cuda.GEMMBF16
	}
	be, err := cuda.New(0, gemm)
	if err != nil {
		return nil, fmt.Errorf("--device cuda: %w", err)
	}
	return be, nil
}

// gpuBudgetFraction is the share of the GPU's memory a CUDA run plans for
// (the rest: cuBLASLt, the driver, fragmentation).
const gpuBudgetFraction = 0.9

// memBudget is the default memory budget of a run on d: the host's
// (DefaultMemBudget), lowered on CUDA to gpuBudgetFraction of the GPU's
// memory, where the step programs live.
func memBudget(d Device, p Precision) (int64, error) {
	budget, err := DefaultMemBudget()
	if err != nil {
		return 0, err
	}
	d, _, err = resolveDevice(d, p)
	if err != nil || d != DeviceCUDA {
		return budget, err
	}
	drv, err := cuda.LoadDriver()
	if err != nil {
		return 0, err
	}
	devs, err := drv.Devices()
	if err != nil || len(devs) == 0 {
		return 0, fmt.Errorf("--device cuda: no GPU visible (%v)", err)
	}
	return min(budget, int64(gpuBudgetFraction*float64(devs[0].TotalMemory))), nil
}
