package training

import (
	"fmt"
	"os"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
)

// TestMain puts the CUDA simulator under the package's GPU tests when
// RPAC_CUDA_SIM=1 (.ci/run sets it); without a C++ compiler that fails.
func TestMain(m *testing.M) {
	if os.Getenv("RPAC_CUDA_SIM") == "1" {
		dir, err := cudasim.Enable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "RPAC_CUDA_SIM=1 and the CUDA simulator cannot be built: %v\n", err)
			os.Exit(1)
		}
		os.Setenv("RPAC_REQUIRE_GPU", "1")
		fmt.Fprintf(os.Stderr, "training tests on the CUDA simulator (%s)\n", dir)
	}
	os.Exit(m.Run())
}
