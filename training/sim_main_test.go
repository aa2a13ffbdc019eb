package training

import (
	"os"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
)

// TestMain puts the CUDA simulator under the package's GPU tests when
// RPAC_CUDA_SIM=1 (cudasim.EnableForTests).
func TestMain(m *testing.M) {
	cudasim.EnableForTests("training")
	os.Exit(m.Run())
}
