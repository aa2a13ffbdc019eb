package model_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/optim"
)

// microConfig is a model small enough for finite differences on every parameter.
func microConfig(kind model.Kind) model.Config {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.Model = kind
	c.Vocab, c.DModel, c.Layers, c.Heads, c.R, c.Experts, c.TopK, c.FFMult, c.MaxLen = 13, 8, 2, 2, 3, 3, 2, 2, 8
	c.Dropout = 0.1
	c.EntFloorEta = 1.2 // keep the entropy floor active so its gradient is checked
	return c
}

func feeds(rng *rand.Rand, vocab, B, T int) map[string]*kernels.Tensor {
	ids := make([]int32, B*T)
	tg := make([]int32, B*T)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
		tg[i] = int32(rng.IntN(vocab))
	}
	return map[string]*kernels.Tensor{
		"input_ids": kernels.IntTensor(ir.Shape{B, T}, ids),
		"targets":   kernels.IntTensor(ir.Shape{B * T}, tg),
	}
}

func compile(t *testing.T, g *ir.Graph, st *kernels.Store, prec ir.Precision) kernels.Program {
	t.Helper()
	prog, err := cpu.New(prec).Compile(g, passes.Plan(g), st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prog.Close)
	return prog
}

// TestModelGradients checks every parameter gradient of the whole fuzzy
// (RPA and legacy bias) and baseline models against float64 central finite
// differences, in training mode (dropout and Gumbel noise drawn from a fixed
// seed, so the loss is a deterministic function of the parameters).
func TestModelGradients(t *testing.T) {
	cases := []struct {
		name string
		cfg  func() model.Config
	}{
		{"fuzzy-rpa", func() model.Config { return microConfig(model.Fuzzy) }},
		{"fuzzy-legacy", func() model.Config { c := microConfig(model.Fuzzy); c.UseRPA = false; return c }},
		{"fuzzy-nodetach", func() model.Config { c := microConfig(model.Fuzzy); c.RPADetach = false; return c }},
		{"baseline", func() model.Config { return microConfig(model.Baseline) }},
		{"baseline-rope", func() model.Config { c := microConfig(model.Baseline); c.RoPE = true; return c }},
		// head dimension 3: one rotated pair and a dimension left as it is
		{"baseline-rope-odd", func() model.Config {
			c := microConfig(model.Baseline)
			c.RoPE, c.DModel, c.RoPEBase = true, 6, 50
			return c
		}},
		{"fuzzy-rope", func() model.Config { c := microConfig(model.Fuzzy); c.RoPE = true; return c }},
		{"baseline-smear", func() model.Config { c := microConfig(model.Baseline); c.SmearKeys = true; return c }},
		{"fuzzy-smear-rope", func() model.Config { c := microConfig(model.Fuzzy); c.SmearKeys, c.RoPE = true, true; return c }},
		{"baseline-rope-nopos", func() model.Config { c := microConfig(model.Baseline); c.RoPE, c.PosInit = true, "none"; return c }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg()
			const B, T = 2, 6
			mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Train})
			if err != nil {
				t.Fatal(err)
			}
			g, specs := mg.Graph, mg.Specs
			// A detached value (StopGradient) is a constant to the gradient, so
			// finite differences run on a second graph in which every
			// StopGradient input is frozen at its value for the base parameters.
			var sgs []*ir.Node
			for _, n := range g.Nodes {
				if n.Op == ir.OpStopGradient {
					g.SetOutput(fmt.Sprintf("sg:%d", len(sgs)), n.Inputs[0])
					sgs = append(sgs, n)
				}
			}
			if err := passes.Run(g, passes.TrainPipeline, &passes.Context{Loss: "loss"}); err != nil {
				t.Fatal(err)
			}
			st := kernels.NewStore(ir.FP64)
			if err := model.InitStore(specs, st, 7); err != nil {
				t.Fatal(err)
			}
			if tb := st.Get(model.LambdaSat); tb != nil {
				tb.F64[0] = 0.3
			}
			prog := compile(t, g, st, ir.FP64)
			fd := feeds(rand.New(rand.NewPCG(1, 2)), cfg.Vocab, B, T)
			const seed = 99
			if err := prog.Run(fd, seed); err != nil {
				t.Fatal(err)
			}
			mg, err = model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Train})
			if err != nil {
				t.Fatal(err)
			}
			g2 := mg.Graph
			k := 0
			for _, n := range g2.Nodes {
				if n.Op == ir.OpStopGradient {
					v := prog.Output(fmt.Sprintf("sg:%d", k))
					n.Inputs[0] = g2.Const(fmt.Sprintf("frozen%d", k), v.Shape, v.Float64s())
					k++
				}
			}
			if k != len(sgs) {
				t.Fatalf("%d StopGradient nodes in the second build, %d in the first", k, len(sgs))
			}
			if err := passes.Run(g2, passes.EvalPipeline, &passes.Context{}); err != nil {
				t.Fatal(err)
			}
			fdProg := compile(t, g2, st, ir.FP64)
			loss := func() float64 {
				if err := fdProg.Run(fd, seed); err != nil {
					t.Fatal(err)
				}
				return fdProg.Output("loss").At(0)
			}
			if l0, l1 := loss(), prog.Output("loss").At(0); math.Abs(l0-l1) > 1e-12 {
				t.Fatalf("frozen graph loss %v differs from the training graph's %v", l0, l1)
			}
			grads := map[string][]float64{}
			for _, s := range specs {
				if !s.Param {
					continue
				}
				if gv := prog.Output(passes.GradName(s.Name)); gv != nil {
					grads[s.Name] = gv.Float64s()
				}
			}
			checked, worst := 0, 0.0
			rng := rand.New(rand.NewPCG(3, 4))
			for _, s := range specs {
				if !s.Param {
					continue
				}
				w := st.Get(s.Name).F64
				idx := rng.Perm(len(w))
				if len(idx) > 6 {
					idx = idx[:6]
				}
				for _, i := range idx {
					const eps = 1e-6
					old := w[i]
					w[i] = old + eps
					lp := loss()
					w[i] = old - eps
					lm := loss()
					w[i] = old
					num := (lp - lm) / (2 * eps)
					var ana float64
					if gs, ok := grads[s.Name]; ok {
						ana = gs[i]
					}
					err := math.Abs(num-ana) / math.Max(1e-3, math.Abs(num)+math.Abs(ana))
					worst = math.Max(worst, err)
					if err > 1e-4 {
						t.Errorf("%s[%d]: analytic %.8g, numeric %.8g (rel err %.2g)", s.Name, i, ana, num, err)
					}
					checked++
				}
			}
			t.Logf("%d parameter entries checked, worst relative error %.2g", checked, worst)
		})
	}
}

// TestEvalCausality: in eval mode (running statistics) changing tokens after
// position t never changes the logits at positions <= t. With the paper's
// batch statistics (--eval-stats batch) the same change does leak backwards,
// which is why eval and export use running statistics.
func TestEvalCausality(t *testing.T) {
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		for _, batchStats := range []bool{false, true} {
			if kind == model.Baseline && batchStats {
				continue
			}
			t.Run(fmt.Sprintf("%s/batchstats=%v", kind, batchStats), func(t *testing.T) {
				cfg := microConfig(kind)
				const B, T = 2, 8
				mg, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Eval, BatchStats: batchStats, Logits: true, NoLoss: true})
				if err != nil {
					t.Fatal(err)
				}
				g, specs := mg.Graph, mg.Specs
				st := kernels.NewStore(ir.FP64)
				if err := model.InitStore(specs, st, 11); err != nil {
					t.Fatal(err)
				}
				// Non-uniform running statistics, as after training.
				rng := rand.New(rand.NewPCG(5, 6))
				for _, s := range specs {
					if s.Running != "" {
						for i := range st.Get(s.Name).F64 {
							st.Get(s.Name).F64[i] = rng.Float64()
						}
					}
				}
				prog := compile(t, g, st, ir.FP64)
				fd := feeds(rng, cfg.Vocab, B, T)
				if err := prog.Run(fd, 0); err != nil {
					t.Fatal(err)
				}
				base := prog.Output("logits").Float64s()
				V := cfg.Vocab
				leaked := false
				for cut := 0; cut < T-1; cut++ {
					ids := append([]int32(nil), fd["input_ids"].I32...)
					for b := 0; b < B; b++ {
						for j := cut + 1; j < T; j++ {
							ids[b*T+j] = int32((int(ids[b*T+j]) + 1 + j) % V)
						}
					}
					f2 := map[string]*kernels.Tensor{"input_ids": kernels.IntTensor(ir.Shape{B, T}, ids)}
					if err := prog.Run(f2, 0); err != nil {
						t.Fatal(err)
					}
					got := prog.Output("logits").Float64s()
					for b := 0; b < B; b++ {
						for p := 0; p <= cut; p++ {
							for v := 0; v < V; v++ {
								i := (b*T+p)*V + v
								if d := math.Abs(got[i] - base[i]); d > 1e-12 {
									leaked = true
									if !batchStats {
										t.Fatalf("cut %d: logit[b=%d,t=%d,v=%d] changed by %g", cut, b, p, v, d)
									}
								}
							}
						}
					}
				}
				if batchStats && !leaked {
					t.Fatalf("batch statistics were expected to leak future tokens into earlier logits")
				}
			})
		}
	}
}

// TestPresetSizes pins the parameter counts the README states.
func TestPresetSizes(t *testing.T) {
	p, _ := model.LookupPreset("paper")
	mg, err := model.Build(&p.Config, model.Opts{T: 384, B: 1, Mode: model.Eval, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	specs := mg.Specs
	n := model.CountParams(specs)
	if n < 88e6 || n > 94e6 {
		t.Fatalf("paper preset has %d parameters, want about 90M", n)
	}
	if _, err := model.LookupPreset("huge"); err == nil {
		t.Fatal("unknown preset accepted")
	}
	c := p.Config
	c.Heads = 7
	if err := c.Validate(); err == nil {
		t.Fatal("d_model not divisible by heads accepted")
	}
	if _, err := model.Build(&p.Config, model.Opts{T: 769, B: 1}); err == nil {
		t.Fatal("context beyond max_len accepted")
	}
}

// TestDecayHandles: the typed weight-decay marks select exactly the
// parameters the name rule of optim.DefaultDecay selects, for both models.
func TestDecayHandles(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	for _, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
		cfg := p.Config
		cfg.Model = kind
		mg, err := model.Build(&cfg, model.Opts{T: 16, B: 1, Mode: model.Train})
		if err != nil {
			t.Fatal(err)
		}
		decayed, n := mg.Decayed(), 0
		for _, name := range mg.Params() {
			if decayed(name) != optim.DefaultDecay(name) {
				t.Errorf("%s %s: typed decay %v, name rule %v", kind, name, decayed(name), optim.DefaultDecay(name))
			}
			if decayed(name) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: no parameter is decayed", kind)
		}
	}
}

// TestConfigLimits: sizes beyond any real model (a damaged or hostile
// state.json) are refused before a graph is built.
func TestConfigLimits(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	c := p.Config
	c.R = 100000000
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "R 100000000 is beyond") {
		t.Fatalf("R=1e8: %v", err)
	}
	if _, err := model.Build(&c, model.Opts{T: 1, B: 1, Mode: model.Eval, NoLoss: true}); err == nil {
		t.Fatal("built a model with R=1e8")
	}
}
