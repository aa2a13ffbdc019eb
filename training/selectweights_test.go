package training

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// weightStore is a random-init store of cfg's weights.
func weightStore(t *testing.T, cfg *model.Config) *kernels.Store {
	t.Helper()
	mg, err := model.Build(cfg, model.Opts{T: 8, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP32)
	if err := model.InitStore(mg.Specs, st, 7); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSelectWeights(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	cfg := p.Config
	cfg.Model = model.Baseline
	cfg.Vocab, cfg.DModel, cfg.Heads, cfg.Layers, cfg.MaxLen = 97, 32, 2, 2, 32
	params, err := model.Params(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(prefixes ...string) *kernels.Store {
		st := weightStore(t, &cfg)
		for _, pre := range prefixes {
			for _, p := range params {
				src := st.Get(p)
				d, _ := st.Ensure(pre+p, src.Shape)
				for i := 0; i < d.Len(); i++ {
					d.Set(i, 0.5)
				}
			}
		}
		return st
	}
	st := mk()
	if w, err := SelectWeights(st, params, WeightsAuto); err != nil || w != WeightsLast {
		t.Fatalf("default without EMA: %v %v", w, err)
	}
	for _, which := range []WeightSet{WeightsEMA, WeightsSWA} {
		_, err := SelectWeights(mk(), params, which)
		if err == nil || !strings.Contains(err.Error(), which.Prefix()) || !strings.Contains(err.Error(), "--weights last") {
			t.Errorf("%s missing: want an error naming %s.<param>, got %v", which, which, err)
		}
	}
	st = mk("ema.")
	if w, err := SelectWeights(st, params, WeightsAuto); err != nil || w != WeightsEMA {
		t.Fatalf("default with EMA: %v %v", w, err)
	}
	if st.Get(params[0]).At(0) != 0.5 || st.Get("ema."+params[0]) != nil {
		t.Fatal("EMA weights were not moved into the parameters")
	}
	st = mk("ema.", "swa.")
	if w, err := SelectWeights(st, params, WeightsSWA); err != nil || w != WeightsSWA || st.Get(params[0]).At(0) != 0.5 {
		t.Fatalf("swa: %v %v", w, err)
	}
	if _, err := SelectWeights(mk(), params, WeightSet(9)); err == nil {
		t.Fatal("unknown weight set accepted")
	}
}

// TestWeightSetSpelling: --weights and result.json spell the sets as
// before; an unknown spelling is refused with the valid ones.
func TestWeightSetSpelling(t *testing.T) {
	for s, want := range map[string]WeightSet{"": WeightsAuto, "last": WeightsLast, "ema": WeightsEMA, "swa": WeightsSWA} {
		if w, err := ParseWeightSet(s); err != nil || w != want {
			t.Errorf("ParseWeightSet(%q) = %v, %v; want %v", s, w, err, want)
		}
	}
	if _, err := ParseWeightSet("best"); err == nil || !strings.Contains(err.Error(), `--weights "best": want last, ema or swa`) {
		t.Errorf("ParseWeightSet(best): %v", err)
	}
	var r RunResult
	if err := json.Unmarshal([]byte(`{"stage":"swa_select","weights":"ema"}`), &r); err != nil || r.Weights != WeightsEMA {
		t.Fatalf("result.json weights: %v, %v", r.Weights, err)
	}
	if b, _ := json.Marshal(RunResult{Weights: WeightsSWA}); !strings.Contains(string(b), `"weights":"swa"`) {
		t.Errorf("result.json written as %s", b)
	}
}
