package cuda

import (
	"os"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/ir"
)

// TestGPUCollectiveOneRank runs the collectives through the NCCL library
// found on this machine (the real libnccl.so.2 on a GPU, the simulator's
// stand-in under RPAC_CUDA_SIM=1) as the one rank of a communicator: the
// unique id, joining, the scalar sums, the gradient buckets on the device
// (after the backward, and overlapped: on the communication stream,
// ordered by events) and the broadcast, each leaving its values as they
// were.
func TestGPUCollectiveOneRank(t *testing.T) {
	be := gpuBackendWith(t, ir.FP32, DefaultOptions())
	id, err := NewCollectiveID()
	if err != nil {
		if os.Getenv("RPAC_REQUIRE_GPU") == "1" {
			t.Fatalf("RPAC_REQUIRE_GPU=1 and no NCCL: %v", err)
		}
		t.Skipf("no NCCL: %v", err)
	}
	c, err := be.JoinCollective(id, 1, 0, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.World() != 1 || c.Rank() != 0 {
		t.Fatalf("communicator of %d ranks, this one %d; want 1 and 0", c.World(), c.Rank())
	}
	collectiveValues(t, be, c, 0, 1, c.SumGrads)
	if err := c.Overlap(); err != nil { // the communication stream and its events
		t.Fatal(err)
	}
	collectiveValues(t, be, c, 0, 1, func(bufs []Buffer, counts []int) error { return sumOverlapped(c, bufs, counts) })
}
