package training

import (
	"github.com/rpac-dev/rpac/ir"
	"math"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
)

// devBenchOptions: a small fuzzy model, two micro-batches per step (the
// device accumulates them), dropout on.
func devBenchOptions(dev Device) Options {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.DModel, c.Layers, c.Heads, c.MaxLen, c.Dropout, c.Vocab = 16, 2, 2, 32, 0.1, 97
	return Options{Preset: "tiny", Config: &c, Context: 16, TokensPerStep: 64, MicroBatch: 2, Seed: 3, Dropout: -1,
		Device: dev, Precision: ir.FP32, MemBudget: 1 << 30}
}

func benchWeights(t *testing.T, b *Bench) map[string][]float32 {
	t.Helper()
	if b.dev != nil {
		if err := b.dev.SyncToHost(); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string][]float32{}
	for n, w := range b.params {
		out[n] = append([]float32(nil), w...)
	}
	return out
}

func runBench(t *testing.T, b *Bench, from, to int) {
	t.Helper()
	for s := from; s < to; s++ {
		if err := b.Step(uint64(s)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSimDeviceOptimizerTraining: training steps with the weights,
// moments, gradients and clipping on the device (the simulator, or a GPU)
// against the CPU with the host optimizer (weights within 1e-3 relative
// after 4 steps); a second device run is bit-identical; 2 steps, a checkpoint of
// the device state (weights and moments to the host), a fresh device
// optimizer importing it and 2 more steps equal 4 steps bit for bit; and
// the same checkpoint continued on the CPU stays within the CPU tolerance.
func TestSimDeviceOptimizerTraining(t *testing.T) {
	cu := parityDevice(t)
	const N = 4
	open := func(dev Device) *Bench {
		b, err := NewBench(devBenchOptions(dev))
		if err != nil {
			t.Fatal(err)
		}
		if dev.isCUDA() != (b.dev != nil) {
			t.Fatalf("%s: device optimizer %v", dev, b.dev != nil)
		}
		return b
	}
	cpu := open(DeviceCPU)
	defer cpu.Close()
	runBench(t, cpu, 0, N)
	want := benchWeights(t, cpu)

	sim := open(cu)
	defer sim.Close()
	if sim.Length().Micro >= sim.Length().Batch {
		t.Fatalf("plan %+v: want several micro-batches", sim.Length())
	}
	runBench(t, sim, 0, N)
	got := benchWeights(t, sim)
	worst, at := 0.0, ""
	for n, w := range want {
		if d := relDiff(got[n], w); d > worst {
			worst, at = d, n
		}
	}
	t.Logf("after %d steps: worst relative difference device against CPU %.2g (%s)", N, worst, at)
	if worst > 1e-3 || math.IsNaN(worst) {
		t.Errorf("device-optimizer weights differ from the CPU's: %s by %.2g", at, worst)
	}

	again := open(cu)
	runBench(t, again, 0, N)
	same(t, "second device run", benchWeights(t, again), got)
	again.Close()

	// checkpoint after N/2 steps: weights and moments to the host
	first := open(cu)
	runBench(t, first, 0, N/2)
	ckW := benchWeights(t, first)
	ckO, ckSteps, err := exportDevice(first.dev)
	if err != nil {
		t.Fatal(err)
	}
	first.Close()

	resumed := open(cu)
	defer resumed.Close()
	for n, w := range ckW {
		copy(resumed.params[n], w)
	}
	if err := resumed.dev.UploadWeights(); err != nil {
		t.Fatal(err)
	}
	if err := importDevice(resumed.dev, resumed.opt.Config(), ckO, ckSteps); err != nil {
		t.Fatal(err)
	}
	runBench(t, resumed, N/2, N)
	same(t, "device run resumed from a device checkpoint", benchWeights(t, resumed), got)

	onCPU := open(DeviceCPU)
	defer onCPU.Close()
	for n, w := range ckW {
		copy(onCPU.params[n], w)
	}
	if err := onCPU.opt.Import(ckO, ckSteps); err != nil {
		t.Fatal(err)
	}
	runBench(t, onCPU, N/2, N)
	cw := benchWeights(t, onCPU)
	worst = 0
	for n, w := range want {
		if d := relDiff(cw[n], w); d > worst {
			worst, at = d, n
		}
	}
	t.Logf("device checkpoint resumed on the CPU: worst relative difference %.2g (%s)", worst, at)
	if worst > 1e-3 || math.IsNaN(worst) {
		t.Errorf("a device checkpoint continued on the CPU: %s differs by %.2g", at, worst)
	}
}
