package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/cudasim"
)

// TestMain puts the CUDA simulator under the package's GPU tests when
// RPAC_CUDA_SIM=1 (cudasim.EnableForTests), with the planted defect
// RPAC_SIM_PLANT names, if any.
func TestMain(m *testing.M) {
	if cudasim.EnableForTests("cuda") {
		if name := os.Getenv("RPAC_SIM_PLANT"); name != "" {
			plant, ok := plants[name]
			if !ok {
				fmt.Fprintf(os.Stderr, "RPAC_SIM_PLANT=%s: no such planted defect\n", name)
				os.Exit(2)
			}
			plantHook = plant.rewrite
			// every source must have changed, or the plant is void
			fmt.Fprintf(os.Stderr, "planted defect %s\n", name)
		}
	}
	os.Exit(m.Run())
}
