package training

import (
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
	"github.com/rpac-dev/rpac/training/optim"
)

// TestSimGradFinalDuringBackward: a step on the device with OnGradFinal
// reports every parameter's gradient once, on the simulator while the
// backward still has launches to run (the first report comes before the
// last launch), and leaves the gradients of the step without the hook,
// bit for bit (their global norm); two micro-batches, accumulated on the
// device.
func TestSimGradFinalDuringBackward(t *testing.T) {
	be := parityBackend(t, parityDevice(t), ir.FP32, cuda.DefaultOptions())
	f := newStepFixture(t, model.Fuzzy, 16, 2, func(c *model.Config) { c.Dropout = 0.1 })
	s, err := CompileStep(&f.cfg, f.store, be, f.T, f.B, 1, f.cfg.Dropout, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.KeepGradsOnDevice(be); err != nil {
		t.Fatal(err)
	}
	adam, err := newDeviceAdamW(be, f.store, optim.DefaultAdamW(), s.params)
	if err != nil {
		t.Fatal(err)
	}
	d, err := driver.LoadDriver()
	if err != nil {
		t.Fatal(err)
	}
	var end int64 // the simulator's launches when the step's Run returned
	norm := func() float64 {
		t.Helper()
		out, err := s.Run(f.x, f.y, 11)
		if err != nil {
			t.Fatal(err)
		}
		end = d.SimStat("launches")
		n, err := adam.ClipGlobalNorm(out.DeviceGrads, 1e9)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := norm()
	seen := map[string]int{}
	first := int64(-1)
	if err := s.OnGradFinal(func(p string) error {
		if first < 0 {
			first = d.SimStat("launches")
		}
		seen[p]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := norm()
	if got != want {
		t.Errorf("global gradient norm %v with the hook, %v without", got, want)
	}
	names, _, _ := s.GradBuffers()
	if len(names) == 0 || len(seen) != len(names) {
		t.Errorf("%d gradients reported, the step has %d", len(seen), len(names))
	}
	for _, n := range names {
		if seen[n] != 1 {
			t.Errorf("%s reported %d times", n, seen[n])
		}
	}
	if be.Simulated() {
		t.Logf("the first gradient final at the simulator's launch %d, the step's Run returned at %d", first, end)
		if first < 0 || first >= end {
			t.Errorf("the first gradient was final at launch %d, the step's launches end at %d: not during the backward", first, end)
		}
	}
}
