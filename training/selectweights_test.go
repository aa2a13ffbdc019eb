package training

import (
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/kernels"
)

// weightStore is a random-init store of cfg's weights.
func weightStore(t *testing.T, cfg *model.Config) *kernels.Store {
	t.Helper()
	mg, err := model.Build(cfg, model.Opts{T: 8, B: 1, Mode: model.Eval, Logits: true, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(kernels.F32)
	if err := model.InitStore(mg.Specs, st, 7); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSelectWeights(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	cfg := p.Config
	cfg.Model = "baseline"
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
	if w, err := SelectWeights(st, params, ""); err != nil || w != "last" {
		t.Fatalf("default without EMA: %q %v", w, err)
	}
	for _, which := range []string{"ema", "swa"} {
		_, err := SelectWeights(mk(), params, which)
		if err == nil || !strings.Contains(err.Error(), which+".") || !strings.Contains(err.Error(), "--weights last") {
			t.Errorf("%s missing: want an error naming %s.<param>, got %v", which, which, err)
		}
	}
	st = mk("ema.")
	if w, err := SelectWeights(st, params, ""); err != nil || w != "ema" {
		t.Fatalf("default with EMA: %q %v", w, err)
	}
	if st.Get(params[0]).At(0) != 0.5 || st.Get("ema."+params[0]) != nil {
		t.Fatal("EMA weights were not moved into the parameters")
	}
	st = mk("ema.", "swa.")
	if w, err := SelectWeights(st, params, "swa"); err != nil || w != "swa" || st.Get(params[0]).At(0) != 0.5 {
		t.Fatalf("swa: %q %v", w, err)
	}
	if _, err := SelectWeights(mk(), params, "best"); err == nil {
		t.Fatal("unknown weight set accepted")
	}
}
