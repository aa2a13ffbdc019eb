package cuda

import (
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// The two-rank tests run this test binary twice more, as the ranks of one
// communicator (the simulator's NCCL stand-in, processes exchanging through
// shared memory); the scenario and rank come in the environment.
const (
	envScenario = "RPAC_TEST_NCCL_SCENARIO"
	envRank     = "RPAC_TEST_NCCL_RANK"
	envID       = "RPAC_TEST_NCCL_ID"
)

// simCollectiveBackend is a backend on the simulator's device without the
// kernels (the collectives need none), or a skip.
func simCollectiveBackend(t *testing.T) *Backend {
	t.Helper()
	d, err := driver.LoadDriver()
	if err != nil || !d.Simulated() {
		t.Skip("the two-rank collective tests run on the CUDA simulator (RPAC_CUDA_SIM=1)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := d.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	return newBackend(&gpu{ctx: c}, ir.FP32, DefaultOptions())
}

// runRanks runs scenario on two ranks and returns their outputs; each
// rank must exit as wantOK says.
func runRanks(t *testing.T, scenario string, wantOK [2]bool) [2]string {
	t.Helper()
	id, err := NewCollectiveID()
	if err != nil {
		t.Fatal(err)
	}
	var cmds [2]*exec.Cmd
	var outs [2]strings.Builder
	for r := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSimCollectiveRank$", "-test.v")
		cmd.Env = append(os.Environ(), envScenario+"="+scenario, envRank+"="+strconv.Itoa(r), envID+"="+hex.EncodeToString(id.Internal[:]))
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	var res [2]string
	for r, cmd := range cmds {
		err := cmd.Wait()
		res[r] = outs[r].String()
		if (err == nil) != wantOK[r] {
			t.Errorf("%s: rank %d exited with %v, want success %v; its output:\n%s", scenario, r, err, wantOK[r], res[r])
		}
	}
	return res
}

// TestSimCollectiveRank is one rank of a two-rank scenario (it does
// nothing when the test binary is not run as a rank).
func TestSimCollectiveRank(t *testing.T) {
	scenario := os.Getenv(envScenario)
	if scenario == "" {
		t.Skip("run by the two-rank tests as one of the ranks")
	}
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	raw, err := hex.DecodeString(os.Getenv(envID))
	if err != nil {
		t.Fatal(err)
	}
	var id driver.UniqueID
	copy(id.Internal[:], raw)
	be := simCollectiveBackend(t)
	c, err := be.JoinCollective(id, 2, rank, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	switch scenario {
	case "values":
		collectiveValues(t, be, c, rank, 2, c.SumGrads)
	case "values-overlap":
		if err := c.Overlap(); err != nil {
			t.Fatal(err)
		}
		collectiveValues(t, be, c, rank, 2, func(bufs []Buffer, counts []int) error { return sumOverlapped(c, bufs, counts) })
	case "mismatch":
		x := make([]float64, 3+rank)
		err := c.SumHost(x)
		if err == nil || !strings.Contains(err.Error(), "invalid usage") {
			t.Fatalf("a reduction of %d values against the other rank's %d: %v, want an invalid-usage error", len(x), 4-rank, err)
		}
		t.Logf("rank %d: %v", rank, err)
	case "death":
		if rank == 1 {
			os.Exit(3) // dies before the collective
		}
		t0 := time.Now()
		err := c.SumHost([]float64{1})
		if err == nil {
			t.Fatal("the all-reduce succeeded with a dead rank")
		}
		t.Logf("rank 0 after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	case "hang", "hang-overlap":
		if rank == 1 {
			time.Sleep(8 * time.Second) // alive, never joining the collective
			return
		}
		var err error
		if scenario == "hang-overlap" {
			err = hangOverlapped(t, be, c)
		} else {
			err = c.SumHost([]float64{1})
		}
		if err == nil || !strings.Contains(err.Error(), "did not finish within") {
			t.Fatalf("the all-reduce with a hung rank: %v, want the timeout", err)
		}
		t.Logf("rank 0: %v", err)
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
}

// sumOverlapped sums the gradients as the overlapped all-reduce does:
// each bucket started on the communication stream, the last first (as the
// backward finishes them), then the wait for all.
func sumOverlapped(c *Collective, bufs []Buffer, counts []int) error {
	b := c.Buckets(counts)
	if len(b) < 2 {
		return fmt.Errorf("%d buckets, the test wants several", len(b))
	}
	for i := len(b) - 1; i >= 0; i-- {
		if err := c.SumBucketAsync(bufs[b[i][0]:b[i][1]], counts[b[i][0]:b[i][1]]); err != nil {
			return err
		}
	}
	return c.WaitGrads()
}

// hangOverlapped starts a bucket's all-reduce on the communication stream
// that the other rank never joins.
func hangOverlapped(t *testing.T, be *Backend, c *Collective) error {
	if err := c.Overlap(); err != nil {
		t.Fatal(err)
	}
	unbind, err := be.bind()
	if err != nil {
		t.Fatal(err)
	}
	b, err := be.dev.alloc(16)
	unbind()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SumBucketAsync([]Buffer{b}, []int{4}); err != nil {
		return err
	}
	return c.WaitGrads()
}

// collectiveValues checks the sums (the gradients' by sum) and the
// broadcast of one rank of a world-rank communicator.
func collectiveValues(t *testing.T, be *Backend, c *Collective, rank, world int, sum func([]Buffer, []int) error) {
	W := float64(world)
	ranks := W * (W + 1) / 2 // the sum of rank+1 over the ranks
	x := []float64{float64(rank + 1), 0.5 * float64(rank), -1}
	if err := c.SumHost(x); err != nil {
		t.Fatal(err)
	}
	if want := []float64{ranks, 0.5 * (ranks - W), -W}; x[0] != want[0] || x[1] != want[1] || x[2] != want[2] {
		t.Fatalf("sum of scalars: %v, want %v", x, want)
	}
	// two gradients, one larger than the stand-in's staging slot, in two
	// buckets
	counts := []int{3, 1<<20 + 7}
	var bufs []Buffer
	unbind, err := be.bind()
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range counts {
		b, err := be.dev.alloc(uint64(4 * n))
		if err != nil {
			t.Fatal(err)
		}
		h := make([]float32, n)
		for j := range h {
			h[j] = float32((rank+1)*(j%97)) + float32(i)
		}
		if err := be.dev.upload(b, unsafe.Pointer(&h[0]), uint64(4*n)); err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	unbind()
	c.BucketBytes = 64
	if err := sum(bufs, counts); err != nil {
		t.Fatal(err)
	}
	unbind, err = be.bind()
	if err != nil {
		t.Fatal(err)
	}
	defer unbind()
	for i, n := range counts {
		h := make([]float32, n)
		if err := be.dev.download(unsafe.Pointer(&h[0]), bufs[i], uint64(4*n)); err != nil {
			t.Fatal(err)
		}
		for j, v := range h {
			if want := float32(ranks)*float32(j%97) + float32(world*i); v != want {
				t.Fatalf("gradient %d element %d: %v, want %v", i, j, v, want)
			}
		}
	}
	w := []float32{float32(10 * (rank + 1)), float32(rank)}
	if err := c.BroadcastHost(w); err != nil {
		t.Fatal(err)
	}
	if w[0] != 10 || w[1] != 0 {
		t.Fatalf("broadcast: %v, want rank 0's [10 0]", w)
	}
	fmt.Printf("rank %d: values agree\n", rank)
}

// TestSimCollective runs the collectives on two ranks: sums in rank order
// (scalars in float64, gradients in float32 buckets larger than the
// staging slot) and the broadcast of rank 0's values; the gradients both
// after the backward and overlapped (each bucket on the communication
// stream, the last first).
func TestSimCollective(t *testing.T) {
	simCollectiveBackend(t)
	for _, scenario := range []string{"values", "values-overlap"} {
		outs := runRanks(t, scenario, [2]bool{true, true})
		for r, out := range outs {
			if !strings.Contains(out, fmt.Sprintf("rank %d: values agree", r)) {
				t.Errorf("%s: rank %d did not check its values:\n%s", scenario, r, out)
			}
		}
	}
}

// TestSimCollectiveMismatch: ranks calling one collective with different
// sizes both fail with a clear error (the stand-in names both sides).
func TestSimCollectiveMismatch(t *testing.T) {
	simCollectiveBackend(t)
	outs := runRanks(t, "mismatch", [2]bool{true, true})
	if !strings.Contains(outs[0], "differs between ranks") || !strings.Contains(outs[0], "of 4 elements") {
		t.Errorf("rank 0's output does not explain the mismatch:\n%s", outs[0])
	}
}

// TestSimCollectiveDeath: a rank that died makes the other's collective
// fail promptly instead of hanging, and a rank that hangs makes it fail at
// the timeout, the overlapped gradients' all-reduce too.
func TestSimCollectiveDeath(t *testing.T) {
	simCollectiveBackend(t)
	t0 := time.Now()
	outs := runRanks(t, "death", [2]bool{true, false})
	if !strings.Contains(outs[0], "has exited") {
		t.Errorf("rank 0 does not name the exited rank:\n%s", outs[0])
	}
	if d := time.Since(t0); d > 20*time.Second {
		t.Errorf("the dead rank was noticed after %v", d)
	}
	runRanks(t, "hang", [2]bool{true, true})
	runRanks(t, "hang-overlap", [2]bool{true, true})
}
