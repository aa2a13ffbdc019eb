package training

import (
	"math"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
)

// aligningCPU is the CPU backend asking for graphs with widths padded to
// multiples of 8 (the CUDA backend's, model.Opts.Align), optionally with
// fused attention as well (its other capabilities the CPU's).
type aligningCPU struct {
	kernels.Backend
	fused bool
}

func (b aligningCPU) Capabilities() kernels.Capabilities {
	c := b.Backend.Capabilities()
	c.Align, c.FusedAttention = 8, b.fused
	return c
}

// TestAlignedStepMatchesUnaligned: a model whose widths are no multiple of
// 8 (d 30, heads of 15, expert width 60), trained through graphs that hold
// them padded to 32, 16 and 64, gives the gradients of the unpadded graphs
// (float64, to 1e-10): the fuzzy model with the RPA prior and the legacy
// bias, with type-2 memberships and sinusoidal positions, and the
// baseline, with rotary positions and smeared keys, with
// attention fused and not, in micro-batches, the Gumbel noise of the gates
// drawn the same. In float32 the loss agrees to 1e-6. Every GEMM of the
// padded graph over the model's widths has its dims multiples of 8.
func TestAlignedStepMatchesUnaligned(t *testing.T) {
	cases := []struct {
		name  string
		kind  model.Kind
		mod   func(*model.Config)
		fused bool
	}{
		{"fuzzy", model.Fuzzy, nil, false},
		{"fuzzy/fused", model.Fuzzy, nil, true},
		{"fuzzy/legacy", model.Fuzzy, func(c *model.Config) { c.UseRPA = false }, false},
		{"fuzzy/type2+sinusoid", model.Fuzzy, func(c *model.Config) { c.Type2, c.PosInit = true, "sinusoid" }, true},
		{"baseline/rope+smear", model.Baseline, func(c *model.Config) { c.RoPE, c.SmearKeys = true, true }, true},
		{"baseline", model.Baseline, nil, false},
	}
	for _, tc := range cases {
		mods := []func(*model.Config){func(c *model.Config) { c.DModel, c.Heads, c.FFMult = 30, 2, 2 }}
		if tc.mod != nil {
			mods = append(mods, tc.mod)
		}
		f := newStepFixture(t, tc.kind, 12, 4, mods...)
		be := aligningCPU{cpu.New(ir.FP32), tc.fused}
		s, err := CompileStep(&f.cfg, f.store, be, f.T, f.B, 2, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkAlignedGEMMs(t, tc.name, s, f.cfg)
		s.Close()
		loss, _, _ := f.stepOn(t, cpu.New(ir.FP32), 2, 5)
		if al, _, _ := f.stepOn(t, be, 2, 5); math.Abs(al-loss) > 1e-6*math.Abs(loss) {
			t.Errorf("%s: aligned loss %.8f, unaligned %.8f", tc.name, al, loss)
		}
		want := f.step64(t, 2, 5)
		got := f.step64On(t, aligningCPU{cpu.New(ir.FP64), tc.fused}, 2, 5)
		if len(got) != len(want) {
			t.Fatalf("%s: %d gradients aligned, %d unaligned", tc.name, len(got), len(want))
		}
		worst, at := 0.0, ""
		for n, g := range want {
			if len(got[n]) != len(g) {
				t.Fatalf("%s: gradient of %s has %d entries aligned, %d unaligned", tc.name, n, len(got[n]), len(g))
			}
			var d, m float64
			for i := range g {
				d, m = max(d, math.Abs(got[n][i]-g[i])), max(m, math.Abs(g[i]))
			}
			if d /= max(m, 1e-300); d > worst {
				worst, at = d, n
			}
		}
		t.Logf("%s: loss %.7f both ways; worst float64 gradient %s, max |Δ| / max |g| %.2g", tc.name, loss, at, worst)
		// a wrong padding moves gradients by O(1); the float64 sums of the
		// padded and unpadded GEMMs differ in OpenBLAS's blocking (which
		// depends on the CPU's kernels): 7.9e-13 measured on AVX-512
		if worst > 1e-10 {
			t.Errorf("%s: gradient of %s differs by %.2g between the aligned and unaligned steps", tc.name, at, worst)
		}
	}
}

// checkAlignedGEMMs: every Linear of the step whose inner dim is one of the
// model's padded widths (not the few memberships, experts or heads that
// the gates read) has K and N multiples of 8, but for the tied LM head's
// vocabulary (the CUDA backend pads that one itself).
func checkAlignedGEMMs(t *testing.T, name string, s *Step, cfg model.Config) {
	t.Helper()
	n := 0
	for _, node := range s.graph.Graph.Nodes {
		if node.Op != ir.OpLinear {
			continue
		}
		x, w := node.Inputs[0].Shape, node.Inputs[1].Shape
		K, N := x[len(x)-1], w[0]
		if K <= max(cfg.R, cfg.Experts, cfg.Heads) || N == cfg.Vocab {
			continue
		}
		n++
		if K%8 != 0 || (N%8 != 0 && N > max(cfg.R, cfg.Experts, cfg.Heads)) {
			t.Errorf("%s: Linear %s: K %d, N %d", name, node.Outputs[0].Name, K, N)
		}
	}
	if n == 0 {
		t.Fatalf("%s: no Linear over the model's widths", name)
	}
}

// TestAlignedEvalMatchesUnaligned: the evaluator's padded graph gives the
// unpadded one's CE.
func TestAlignedEvalMatchesUnaligned(t *testing.T) {
	f := newStepFixture(t, model.Fuzzy, 12, 4, func(c *model.Config) { c.DModel, c.Heads, c.FFMult = 30, 2, 2 })
	plain, aligned := evalCESum(t, f, cpu.New(ir.FP32)), evalCESum(t, f, aligningCPU{cpu.New(ir.FP32), true})
	if d := math.Abs(aligned-plain) / plain; d > 1e-6 {
		t.Errorf("eval CE sum: aligned %.8f, unaligned %.8f", aligned, plain)
	}
}
