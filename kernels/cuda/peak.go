package cuda

import (
	"strings"

	"github.com/rpac-dev/rpac/ir"
)

// densePeaks are datasheet dense peaks in TFLOP/s (no sparsity): bf16 on the
// tensor cores, and fp32 without TF32 (cuBLASLt's CUBLAS_COMPUTE_32F, what
// fp32 GEMMs run). Matched in order against the device name.
var densePeaks = []struct {
	name       string
	bf16, fp32 float64
}{
	{"GH200", 989.4, 66.9},
	{"H200", 989.4, 66.9},
	{"H100 PCIe", 756.5, 51.2},
	{"H100 NVL", 835.5, 60.0},
	{"H100", 989.4, 66.9}, // SXM
	{"A100", 312.0, 19.5},
}

// DensePeakTFLOPS is the GPU's datasheet dense GEMM peak for precision p,
// or 0 for a GPU the table does not know.
func DensePeakTFLOPS(device string, p ir.Precision) float64 {
	for _, d := range densePeaks {
		if strings.Contains(device, d.name) {
			if p == ir.BF16 {
				return d.bf16
			}
			return d.fp32
		}
	}
	return 0
}

// GEMM is the backend's GEMM precision.
func (b *Backend) GEMM() ir.Precision { return b.gemm }
