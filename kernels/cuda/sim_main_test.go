package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
)

// TestMain puts the CUDA simulator under the package's GPU tests when
// RPAC_CUDA_SIM=1 (.ci/run sets it): every kernel then runs on the CPU
// from its CUDA source through the unchanged binding code. Without a C++
// compiler that is a failure, not a skip.
func TestMain(m *testing.M) {
	if os.Getenv("RPAC_CUDA_SIM") == "1" {
		dir, err := cudasim.Enable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "RPAC_CUDA_SIM=1 and the CUDA simulator cannot be built: %v\n", err)
			os.Exit(1)
		}
		os.Setenv("RPAC_REQUIRE_GPU", "1")
		if name := os.Getenv("RPAC_SIM_PLANT"); name != "" {
			plant, ok := plants[name]
			if !ok {
				fmt.Fprintf(os.Stderr, "RPAC_SIM_PLANT=%s: no such planted defect\n", name)
				os.Exit(2)
			}
			plantHook = plant
			// every source must have changed, or the plant is void
			fmt.Fprintf(os.Stderr, "planted defect %s\n", name)
		}
		fmt.Fprintf(os.Stderr, "cuda tests on the CUDA simulator (%s)\n", dir)
	}
	os.Exit(m.Run())
}
