package model

import (
	"github.com/rpac-dev/rpac/internal/fuzzlimit"
	"testing"
)

// FuzzConfigFile: any --config file is refused with an error or gives a
// config whose every field lies in its documented range, quickly.
func FuzzConfigFile(f *testing.F) {
	p, _ := LookupPreset("tiny")
	for _, s := range []string{`{}`, `{"d_model": 96, "heads": 3}`, `{"sinkhorn_iters": 1000000000}`,
		`{"vocab": 4000000, "d_model": 65536, "heads": 1}`, `{"pos_beta": 1e308, "kappa_init": -1e308}`,
		`{"layers": 1e3, "experts": 1024, "ff_mult": 256}`, `{"model": "baseline", "R": -1}`, `{"dropout": 0.99999}`,
		`{"d_model": 96} {`, "\xef\xbb\xbf{}", `{"rpa_K": 1024, "R": 1024}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzzlimit.Start().Check(t) // a slow input fails like a crash
		c, err := applyConfigJSON(p.Config, "c.json", b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			return
		}
		switch {
		case c.SinkhornIters > MaxSinkhornIters && c.Model == Fuzzy:
			t.Fatalf("accepted sinkhorn_iters %d", c.SinkhornIters)
		case c.paramEstimate() > MaxParams:
			t.Fatalf("accepted %g parameters", c.paramEstimate())
		case c.Layers > MaxLayers || c.DModel > MaxDModel || c.MaxLen > MaxLength || c.Vocab > MaxVocab:
			t.Fatalf("accepted sizes beyond the limits: %+v", c)
		}
		if c.Layers <= 4 && c.DModel <= 64 && c.MaxLen <= 64 && c.Experts <= 4 && c.R <= 8 {
			if _, err := Build(&c, Opts{T: min(c.MaxLen, 8), B: 1, Mode: Eval}); err != nil {
				t.Fatalf("a valid config does not build: %v", err)
			}
		}
	})
}
