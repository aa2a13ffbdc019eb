package training

import (
	"math"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
)

// fusingCPU is the CPU backend asking for fused attention, as the CUDA
// backend does: the fused graphs then run on the CPU's FusedAttention and
// FusedAttentionGrad kernels (its other capabilities the CPU's).
type fusingCPU struct{ kernels.Backend }

func (b fusingCPU) Capabilities() kernels.Capabilities {
	c := b.Backend.Capabilities()
	c.FusedAttention = true
	return c
}

// TestFusedAttentionStepMatchesUnfused: with attention fused (the CUDA
// backend's graphs), a training step of the fuzzy and baseline models, with
// dropout on the attention weights and micro-batches, gives the unfused
// step's loss and gradients, and its graph holds no [B,H,T,T] tensor.
func TestFusedAttentionStepMatchesUnfused(t *testing.T) {
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		f := newStepFixture(t, kind, 24, 4)
		f.cfg.Dropout = 0.2
		loss, ce, grads := f.stepOn(t, cpu.New(ir.FP32), 2, 11)
		fused := fusingCPU{cpu.New(ir.FP32)}
		s, err := CompileStep(&f.cfg, f.store, fused, f.T, f.B, 2, f.cfg.Dropout, nil)
		if err != nil {
			t.Fatal(err)
		}
		nf := 0
		for _, n := range s.graph.Graph.Nodes {
			if n.Op == ir.OpFusedAttention || n.Op == ir.OpFusedAttentionGrad {
				nf++
			}
			for _, v := range n.Outputs {
				if r := len(v.Shape); r == 4 && v.Shape[r-1] == f.T && v.Shape[r-2] == f.T {
					t.Errorf("%s: the fused step still holds %s%v (%s)", kind, v, v.Shape, n.Op)
				}
			}
		}
		s.Close()
		if nf != 2*f.cfg.Layers {
			t.Fatalf("%s: %d fused attention nodes, want %d", kind, nf, 2*f.cfg.Layers)
		}
		fl, fce, fg := f.stepOn(t, fused, 2, 11)
		if d := math.Abs(fl-loss) / math.Abs(loss); d > 1e-6 {
			t.Errorf("%s: fused loss %.8f, unfused %.8f", kind, fl, loss)
		}
		if d := math.Abs(fce-ce) / math.Abs(ce); d > 1e-6 {
			t.Errorf("%s: fused CE %.8f, unfused %.8f", kind, fce, ce)
		}
		worst, at := 0.0, ""
		for n, g := range grads {
			if d := relDiff(fg[n], g); d > worst {
				worst, at = d, n
			}
		}
		t.Logf("%s: loss %.7f both ways; worst gradient %s rel %.2g", kind, loss, at, worst)
		if worst > 1e-5 {
			t.Errorf("%s: gradient of %s differs by %.2g between the fused and unfused steps", kind, at, worst)
		}
	}
}

// TestFusedAttentionEvalMatchesUnfused: the evaluator's fused graph gives
// the unfused one's CE.
func TestFusedAttentionEvalMatchesUnfused(t *testing.T) {
	f := newStepFixture(t, model.Fuzzy, 24, 4)
	unfused, fused := evalCESum(t, f, cpu.New(ir.FP32)), evalCESum(t, f, fusingCPU{cpu.New(ir.FP32)})
	if d := math.Abs(fused-unfused) / unfused; d > 1e-6 {
		t.Errorf("eval CE sum: fused %.8f, unfused %.8f", fused, unfused)
	}
}

// evalCESum is the evaluator's CE sum over the fixture's batch on be.
func evalCESum(t *testing.T, f *stepFixture, be kernels.Backend) float64 {
	t.Helper()
	ev, err := compileEvaluator(&f.cfg, f.store, be, f.T, f.B, f.B, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.prog.Close()
	feeds := map[string]*kernels.Tensor{
		"input_ids": kernels.IntTensor(ir.Shape{f.B, f.T}, f.x),
		"targets":   kernels.IntTensor(ir.Shape{f.B * f.T}, f.y),
	}
	if err := ev.prog.Run(feeds, 0); err != nil {
		t.Fatal(err)
	}
	return ev.prog.Output("ce_sum").At(0)
}

// capsCPU is the CPU backend reporting the given capabilities (the graphs
// the CUDA backend runs, on the CPU's kernels).
type capsCPU struct {
	kernels.Backend
	caps kernels.Capabilities
}

func (c capsCPU) Capabilities() kernels.Capabilities { return c.caps }

// TestFusedElementwiseStepMatchesUnfused: with elementwise chains fused (as
// on the CUDA backend), the step graphs of both models hold
// FusedElementwise nodes and give the unfused step's loss and gradients
// bit for bit on the CPU kernels.
func TestFusedElementwiseStepMatchesUnfused(t *testing.T) {
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		f := newStepFixture(t, kind, 24, 4)
		f.cfg.Dropout = 0.2
		plain := capsCPU{cpu.New(ir.FP32), kernels.Capabilities{FusedAttention: true}}
		fused := capsCPU{cpu.New(ir.FP32), kernels.Capabilities{FusedAttention: true, FusedElementwise: true}}
		s, err := CompileStep(&f.cfg, f.store, fused, f.T, f.B, 2, f.cfg.Dropout, nil)
		if err != nil {
			t.Fatal(err)
		}
		counts := s.graph.Graph.OpCounts()
		s.Close()
		if counts["FusedElementwise"] == 0 {
			t.Fatalf("%s: no FusedElementwise node in the fused step (ops %v)", kind, counts)
		}
		loss, ce, grads := f.stepOn(t, plain, 2, 11)
		fl, fce, fg := f.stepOn(t, fused, 2, 11)
		if fl != loss || fce != ce {
			t.Errorf("%s: fused loss %v CE %v, unfused %v %v", kind, fl, fce, loss, ce)
		}
		same(t, kind.String()+" fused elementwise gradients", fg, grads)
		t.Logf("%s: %d FusedElementwise nodes; loss and gradients bit-identical", kind, counts["FusedElementwise"])
	}
}

// TestAttentionLayoutStepMatches: with the [B,T,H,D] attention layout (as
// on the CUDA backend), the step graphs of both models lose every Transpose
// and give the [B,H,T,D] fused step's loss and gradients (dropout on the
// attention weights: the same draws); the evaluator's CE too.
func TestAttentionLayoutStepMatches(t *testing.T) {
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		f := newStepFixture(t, kind, 24, 4)
		f.cfg.Dropout = 0.2
		plain := capsCPU{cpu.New(ir.FP32), kernels.Capabilities{FusedAttention: true}}
		bthd := capsCPU{cpu.New(ir.FP32), kernels.Capabilities{FusedAttention: true, AttentionBTHD: true}}
		loss, ce, grads := f.stepOn(t, plain, 2, 11)
		s, err := CompileStep(&f.cfg, f.store, bthd, f.T, f.B, 2, f.cfg.Dropout, nil)
		if err != nil {
			t.Fatal(err)
		}
		counts := s.graph.Graph.OpCounts()
		layouts := 0
		for _, n := range s.graph.Graph.Nodes {
			if (n.Op == ir.OpFusedAttention || n.Op == ir.OpFusedAttentionGrad) && ir.AttnLayoutOf(n.Attrs) == ir.AttnBTHD {
				layouts++
			}
		}
		s.Close()
		if counts["Transpose"] != 0 || layouts != 2*f.cfg.Layers {
			t.Fatalf("%s: %d Transposes left, %d of %d attention nodes in bthd", kind, counts["Transpose"], layouts, 2*f.cfg.Layers)
		}
		bl, bce, bg := f.stepOn(t, bthd, 2, 11)
		if math.Abs(bl-loss)/math.Abs(loss) > 1e-6 || math.Abs(bce-ce)/math.Abs(ce) > 1e-6 {
			t.Errorf("%s: bthd loss %.8f CE %.8f, bhtd %.8f %.8f", kind, bl, bce, loss, ce)
		}
		worst, at := 0.0, ""
		for n, g := range grads {
			if d := relDiff(bg[n], g); d > worst {
				worst, at = d, n
			}
		}
		t.Logf("%s: worst gradient %s rel %.2g", kind, at, worst)
		if worst > 1e-5 {
			t.Errorf("%s: gradient of %s differs by %.2g between the layouts", kind, at, worst)
		}
	}
	f := newStepFixture(t, model.Fuzzy, 24, 4)
	bhtd := evalCESum(t, f, capsCPU{cpu.New(ir.FP32), kernels.Capabilities{FusedAttention: true}})
	bthd := evalCESum(t, f, capsCPU{cpu.New(ir.FP32), kernels.Capabilities{FusedAttention: true, AttentionBTHD: true}})
	if d := math.Abs(bthd-bhtd) / bhtd; d > 1e-6 {
		t.Errorf("eval CE sum: bthd %.8f, bhtd %.8f", bthd, bhtd)
	}
}
