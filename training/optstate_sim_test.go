package training

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// deviceStateOptions: the micro run with two micro-batches per step and
// every averaged set and controller that touches the weights: EMA,
// SWA-select (from the first epoch) and Guardian.
func deviceStateOptions(out string, dev Device) Options {
	o := microOptions(out)
	o.Steps, o.EvalEvery = 8, 2
	o.Device, o.Precision, o.MicroBatch = dev, ir.FP32, 2
	start := 0
	o.Control = Controls{Controller: "guardian", EMA: true, SWA: true, SWAStart: &start}
	return o
}

// TestSimDeviceTrainingState: a run whose weights, moments, gradients,
// clipping and EMA live on the device (the simulator, or a GPU) against
// the same run with them on the host, on the same backend: the checkpoints (weights,
// EMA and SWA sets, moments) agree to float32 rounding and the evaluations
// agree; the run says where its state lives; a second device run repeats
// bit for bit; stopping halfway and resuming equals the straight run bit
// for bit; and the halfway device checkpoint continues on the CPU backend
// to within the CPU tolerance.
func TestSimDeviceTrainingState(t *testing.T) {
	cu := parityDevice(t)
	dir := t.TempDir()
	run := func(name string, dev Device, mod func(o *Options)) (*Result, string) {
		o := deviceStateOptions(filepath.Join(dir, name), dev)
		if mod != nil {
			mod(&o)
		}
		return trainLogged(t, name, o)
	}
	devRes, log := run("device", cu, nil)
	if !strings.Contains(log, "training state on the device") {
		t.Errorf("the device run does not say its state is on the device:\n%s", log)
	}
	hostRes, log := run("host", cu, func(o *Options) { o.HostOptimizer = true })
	if strings.Contains(log, "training state on the device") {
		t.Errorf("--host-optimizer run says its state is on the device")
	}
	if len(devRes.SWAMembers) == 0 {
		t.Fatalf("SWA-select took no member: the test does not reach the SWA set")
	}
	dw, hw := weights(t, filepath.Join(dir, "device")), weights(t, filepath.Join(dir, "host"))
	var sets = map[string]bool{}
	worst, at := 0.0, ""
	for n, w := range hw {
		sets[strings.SplitN(n, ".", 2)[0]] = true
		if d := relDiff(dw[n], w); d > worst {
			worst, at = d, n
		}
	}
	t.Logf("device vs host state after %d steps: worst relative difference %.2g (%s); sets %v", devRes.Steps, worst, at, sets)
	if worst > 1e-6 {
		t.Errorf("device vs host training state: %s differs by %.2g", at, worst)
	}
	for _, want := range []string{"ema", "swa", "adam"} {
		if !sets[want] {
			t.Errorf("checkpoint has no %s tensors", want)
		}
	}
	for _, c := range [][3]float64{{devRes.FinalValCE, hostRes.FinalValCE}, {devRes.FinalEMACE, hostRes.FinalEMACE},
		{devRes.FinalSWACE, hostRes.FinalSWACE}} {
		if d := c[0] - c[1]; d > 1e-6 || d < -1e-6 || c[0] != c[0] {
			t.Errorf("evaluations differ: device %v, host %v", c[0], c[1])
		}
	}
	run("device2", cu, nil)
	same(t, "second device run", weights(t, filepath.Join(dir, "device2")), dw)

	half := 4
	run("resumed", cu, func(o *Options) { o.StopAfter = half })
	run("resumed", cu, func(o *Options) { o.Resume = true })
	same(t, "device run resumed halfway", weights(t, filepath.Join(dir, "resumed")), dw)

	run("tocpu", cu, func(o *Options) { o.StopAfter = half })
	run("tocpu", DeviceCPU, func(o *Options) { o.Resume = true })
	cw := weights(t, filepath.Join(dir, "tocpu"))
	worst, at = 0.0, ""
	for n, w := range dw {
		if d := relDiff(cw[n], w); d > worst {
			worst, at = d, n
		}
	}
	t.Logf("device checkpoint continued on the CPU: worst relative difference %.2g (%s)", worst, at)
	if worst > 1e-3 {
		t.Errorf("device checkpoint continued on the CPU: %s differs by %.2g", at, worst)
	}
}
