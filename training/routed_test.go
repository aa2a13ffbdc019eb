package training

import (
	"math"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/passes"
)

// dispatchingCPU is the CPU backend choosing the routed or the dense
// experts (kernels.Capabilities.RoutedExperts), optionally with widths
// padded to 8.
type dispatchingCPU struct {
	kernels.Backend
	routed bool
	align  int
}

func (b dispatchingCPU) Capabilities() kernels.Capabilities {
	return kernels.Capabilities{RoutedExperts: b.routed, Align: b.align}
}

// TestRoutedStepMatchesDense: the step whose experts run on their routed
// tokens only (ExpertFFN) gives the dense step's loss and gradients: in
// float64 to 1e-10 of the largest entry, with dropout on (the same masks:
// the routed experts draw the dense Dropouts' streams at the tokens'
// elements) and the gates' Gumbel noise, with E = 4 and top_k 1, 2 and 4,
// padded and not, in micro-batches; in float32 the loss to 1e-6. The
// routed step holds ExpertFFN nodes and no expert Linear.
func TestRoutedStepMatchesDense(t *testing.T) {
	for _, tc := range []struct {
		name        string
		topK, align int
	}{{"top2", 2, 0}, {"top1", 1, 0}, {"top4", 4, 0}, {"top2/aligned", 2, 8}} {
		f := newStepFixture(t, model.Fuzzy, 12, 4, func(c *model.Config) {
			c.DModel, c.Heads, c.FFMult, c.Experts, c.TopK, c.Dropout = 30, 2, 2, 4, tc.topK, 0.2
		})
		routed, dense := dispatchingCPU{cpu.New(ir.FP32), true, tc.align}, dispatchingCPU{cpu.New(ir.FP32), false, tc.align}
		checkRoutedGraph(t, tc.name, f, routed)
		checkStepWork(t, tc.name, f, routed, dense)
		lr, _, _ := f.stepOn(t, routed, 2, 5)
		ld, _, _ := f.stepOn(t, dense, 2, 5)
		if math.Abs(lr-ld) > 1e-6*math.Abs(ld) {
			t.Errorf("%s: routed loss %.8f, dense %.8f", tc.name, lr, ld)
		}
		want := f.step64On(t, dispatchingCPU{cpu.New(ir.FP64), false, tc.align}, 2, 5)
		got := f.step64On(t, dispatchingCPU{cpu.New(ir.FP64), true, tc.align}, 2, 5)
		if len(got) != len(want) || len(want) == 0 {
			t.Fatalf("%s: %d gradients routed, %d dense", tc.name, len(got), len(want))
		}
		worst, at := 0.0, ""
		for n, g := range want {
			var d, m float64
			for i := range g {
				d, m = max(d, math.Abs(got[n][i]-g[i])), max(m, math.Abs(g[i]))
			}
			if d /= max(m, 1e-300); d > worst {
				worst, at = d, n
			}
		}
		t.Logf("%s: loss %.7f routed, %.7f dense; worst float64 gradient %s, max |Δ| / max |g| %.2g", tc.name, lr, ld, at, worst)
		if worst > 1e-10 {
			t.Errorf("%s: gradient of %s differs by %.2g between the routed and dense steps", tc.name, at, worst)
		}
	}
}

// checkRoutedGraph: the routed step graph has one ExpertFFN and one
// ExpertFFNGrad per expert and layer, and no Linear reads the experts'
// weights.
func checkRoutedGraph(t *testing.T, name string, f *stepFixture, be kernels.Backend) {
	t.Helper()
	s, err := CompileStep(&f.cfg, f.store, be, f.T, f.B, 2, f.cfg.Dropout, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkRoutedStep(t, name, f, s)
}

// checkStepWork: the dense and the routed steps count the same work, the
// model's (top_k/E of the experts' products) and the dense form's, and the
// two differ by exactly the share of the experts' products not needed.
func checkStepWork(t *testing.T, name string, f *stepFixture, routed, dense kernels.Backend) {
	t.Helper()
	var work [2][2]int64
	for i, be := range []kernels.Backend{routed, dense} {
		s, err := CompileStep(&f.cfg, f.store, be, f.T, f.B, 2, f.cfg.Dropout, nil)
		if err != nil {
			t.Fatal(err)
		}
		work[i] = [2]int64{s.Flops(), s.DenseFlops()}
		s.Close()
	}
	if work[0] != work[1] {
		t.Errorf("%s: work (model, dense) %v routed, %v dense", name, work[0], work[1])
	}
	c := f.cfg
	rows := int64(f.B * f.T)
	F, D := int64(c.FFMult*c.DModel), int64(c.DModel)
	if a := routed.Capabilities().Align; a > 1 {
		F, D = (F+int64(a)-1)/int64(a)*int64(a), (D+int64(a)-1)/int64(a)*int64(a)
	}
	// 6 products of rows×F×D per expert and layer (2 forward, 4 backward)
	experts := 6 * 2 * rows * F * D * int64(c.Experts*c.Layers)
	if want := experts - experts*int64(min(c.TopK, c.Experts))/int64(c.Experts); work[0][1]-work[0][0] != want {
		t.Errorf("%s: dense %d − model %d = %d, want %d", name, work[0][1], work[0][0], work[0][1]-work[0][0], want)
	}
}

func checkRoutedStep(t *testing.T, name string, f *stepFixture, s *Step) {
	t.Helper()
	count := map[ir.OpName]int{}
	for _, n := range s.graph.Graph.Nodes {
		count[n.Op]++
		if n.Op == ir.OpLinear && n.Inputs[1].Shape[0] == f.cfg.DModel*f.cfg.FFMult {
			t.Errorf("%s: a Linear computes an expert's hidden layer densely", name)
		}
	}
	want := f.cfg.Layers * f.cfg.Experts
	if count[ir.OpExpertFFN] != want || count[ir.OpExpertFFNGrad] != want || s.Experts() != passes.DispatchRouted {
		t.Errorf("%s: %d ExpertFFN and %d ExpertFFNGrad nodes, want %d each; dispatch %s", name, count[ir.OpExpertFFN],
			count[ir.OpExpertFFNGrad], want, s.Experts())
	}
}

// TestSimRoutedStep: the routed step on the simulator (or a GPU; fp32,
// the CUDA backend's widths padded to 8, the routed dispatch asked for)
// gives the CPU's dense step's loss and the float64 dense gradients to
// 1e-4, with dropout, the Gumbel top-2 gate of 4 experts and
// micro-batches; a second run of it repeats the first bit for bit.
func TestSimRoutedStep(t *testing.T) {
	be := parityBackend(t, parityDevice(t), ir.FP32, cuda.DefaultOptions())
	f := newStepFixture(t, model.Fuzzy, 19, 3, func(c *model.Config) { c.Dropout = 0.1 })
	run := func() (float64, map[string][]float32) {
		s, err := CompileStep(&f.cfg, f.store, be, f.T, f.B, 3, f.cfg.Dropout, &passes.Context{Experts: passes.DispatchRouted})
		if err == nil {
			checkRoutedStep(t, "cuda", f, s)
		}
		l, _, g := runStepCopy(t, s, err, f.x, f.y, 11)
		return l, g
	}
	loss, grads := run()
	dense, _, _ := f.stepOn(t, dispatchingCPU{cpu.New(ir.FP32), false, 0}, 3, 11)
	if d := math.Abs(loss-dense) / math.Abs(dense); d > 1e-5 {
		t.Errorf("routed loss on cuda %.7f, dense on the cpu %.7f", loss, dense)
	}
	worst, at := gradError(grads, f.step64On(t, dispatchingCPU{cpu.New(ir.FP64), false, 0}, 3, 11))
	t.Logf("routed on cuda: worst gradient error against the float64 dense step %s %.2g", at, worst)
	if worst > 1e-4 || math.IsNaN(worst) {
		t.Errorf("routed on cuda: gradient of %s differs by %.2g", at, worst)
	}
	again, grads2 := run()
	if again != loss {
		t.Errorf("second routed run: loss %.9g, first %.9g", again, loss)
	}
	for n, g := range grads {
		if !slices.Equal(g, grads2[n]) {
			t.Errorf("second routed run: gradient of %s differs", n)
		}
	}
}

// BenchmarkStepDispatch times the tiny preset's training step (2,048
// tokens: forward, backward, clip, AdamW) with the dense and the routed
// experts on the CPU, one benchmark each (go test -bench StepDispatch).
func BenchmarkStepDispatch(b *testing.B) {
	for _, d := range []passes.Dispatch{passes.DispatchDense, passes.DispatchRouted} {
		b.Run(d.String(), func(b *testing.B) {
			bench, err := NewBench(Options{Preset: "tiny", Dropout: -1, Seed: 1, Device: DeviceCPU, Experts: d})
			if err != nil {
				b.Fatal(err)
			}
			defer bench.Close()
			if err := bench.Step(0); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if err := bench.Step(uint64(i + 1)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(bench.Flops())/1e9, "GFLOP/step")
			b.ReportMetric(float64(bench.DenseFlops())/1e9, "dense-GFLOP/step")
		})
	}
}
