package cuda

import "github.com/rpac-dev/rpac/kernels/cuda/driver"

// The bindings' vocabulary that the backend's own API speaks (programs'
// device outputs, traces, GEMM shapes), under the backend's names.
type (
	// Buffer is device memory (driver.Buffer).
	Buffer = driver.Buffer
	// DeviceInfo describes a GPU (driver.DeviceInfo).
	DeviceInfo = driver.DeviceInfo
	// DType is a GEMM operand's element type (driver.DType).
	DType = driver.DType
	// GemmShape is one GEMM's dimensions and layout (driver.GemmShape).
	GemmShape = driver.GemmShape
	// GemmKey is what a GEMM plan is chosen for (driver.GemmKey).
	GemmKey = driver.GemmKey
	// GemmCall is one GEMM's operands (driver.GemmCall).
	GemmCall = driver.GemmCall
)

// The GEMM operand types.
const (
	F32  = driver.F32
	BF16 = driver.BF16
)
