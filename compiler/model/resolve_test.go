package model_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
)

func ip(v int) *int { return &v }

func tinyConfig(t *testing.T) model.Config {
	t.Helper()
	p, err := model.LookupPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return p.Config
}

// TestResolve: preset ← file ← overrides, then validation.
func TestResolve(t *testing.T) {
	cases := []struct {
		name    string
		file    string // file content; "" means no file, "<missing>" a path that does not exist
		ov      model.Overrides
		check   func(t *testing.T, c model.Config)
		wantErr []string // substrings of the error; nil means success
	}{
		{name: "preset only", check: func(t *testing.T, c model.Config) {
			if c != tinyConfig(t) {
				t.Errorf("got %+v, want the preset unchanged", c)
			}
		}},
		{name: "overrides", ov: model.Overrides{DModel: ip(96), Layers: ip(3), Heads: ip(3), R: ip(3), Experts: ip(6), TopK: ip(3), FFMult: ip(4), MaxLen: ip(512)},
			check: func(t *testing.T, c model.Config) {
				want := tinyConfig(t)
				want.DModel, want.Layers, want.Heads, want.R, want.Experts, want.TopK, want.FFMult, want.MaxLen = 96, 3, 3, 3, 6, 3, 4, 512
				if c != want {
					t.Errorf("got %+v, want %+v", c, want)
				}
			}},
		{name: "partial file", file: "{\n  \"d_model\": 96,\n  \"heads\": 3,\n  \"layers\": 3,\n  \"dropout\": 0.1,\n  \"use_rpa\": false\n}\n",
			check: func(t *testing.T, c model.Config) {
				want := tinyConfig(t)
				want.DModel, want.Heads, want.Layers, want.Dropout, want.UseRPA = 96, 3, 3, 0.1, false
				if c != want {
					t.Errorf("got %+v, want %+v", c, want)
				}
			}},
		{name: "flags beat file", file: `{"d_model": 96, "heads": 3, "R": 6}`, ov: model.Overrides{Heads: ip(4)},
			check: func(t *testing.T, c model.Config) {
				if c.DModel != 96 || c.Heads != 4 || c.R != 6 || c.Layers != tinyConfig(t).Layers {
					t.Errorf("got d_model %d heads %d R %d layers %d, want 96, 4 (flag), 6 (file), preset layers", c.DModel, c.Heads, c.R, c.Layers)
				}
			}},
		{name: "rope flag over file", file: `{"rope": false, "rope_base": 500, "smear_keys": true}`,
			ov: model.Overrides{RoPE: func() *bool { v := true; return &v }(), SmearKeys: func() *bool { v := false; return &v }()},
			check: func(t *testing.T, c model.Config) {
				if !c.RoPE || c.RoPEBase != 500 || c.SmearKeys {
					t.Errorf("got rope %v rope_base %g smear_keys %v, want true (flag), 500 (file), false (flag)", c.RoPE, c.RoPEBase, c.SmearKeys)
				}
			}},
		{name: "flag repairs file", file: `{"d_model": 100, "heads": 3}`, ov: model.Overrides{DModel: ip(99)},
			check: func(t *testing.T, c model.Config) {
				if c.DModel != 99 || c.Heads != 3 {
					t.Errorf("got d_model %d heads %d, want 99, 3", c.DModel, c.Heads)
				}
			}},
		{name: "full file round trip", file: func() string { c := tinyConfig(t); c.Model, c.DModel = model.Baseline, 64; return string(c.JSON()) }(),
			check: func(t *testing.T, c model.Config) {
				if c.Model != model.Baseline || c.DModel != 64 {
					t.Errorf("got %s d_model %d", c.Model, c.DModel)
				}
			}},
		{name: "not divisible", ov: model.Overrides{DModel: ip(100), Heads: ip(3)},
			wantErr: []string{"d_model 100 is not divisible by heads 3 (d_model must be a multiple of heads: try 99 or 102)"}},
		{name: "file values validated", file: `{"top_k": 5}`,
			wantErr: []string{"top_k 5 exceeds experts 4 (top_k must be between 1 and experts)"}},
		{name: "unknown field", file: `{"d_model": 96, "dmodel": 96, "colour": "red"}`,
			wantErr: []string{`cfg.json: unknown fields "colour", "dmodel" (did you mean "d_model"?); the valid fields are model, vocab, d_model, layers, heads, R, experts, top_k`, "ent_floor_alpha"}},
		{name: "case matters", file: `{"r": 3}`, wantErr: []string{`unknown field "r" (did you mean "R"?)`}},
		{name: "missing file", file: "<missing>", wantErr: []string{"nope.json does not exist"}},
		{name: "malformed", file: "{\n  \"d_model\": 96,,\n}", wantErr: []string{"cfg.json:2:17: malformed JSON"}},
		{name: "truncated", file: `{"d_model": 96`, wantErr: []string{"cfg.json:1:14: malformed JSON: the file ends inside the object"}},
		{name: "trailing data", file: `{"d_model": 96} x`, wantErr: []string{"cfg.json:1:17: malformed JSON: more data after the object"}},
		{name: "not an object", file: `[96]`, wantErr: []string{"cfg.json:1:1: want a JSON object"}},
		{name: "wrong type", file: "{\n  \"heads\": 2.5\n}", wantErr: []string{"cfg.json:2:", "heads: want an integer, got number 2.5"}},
		{name: "null", file: `{"heads": null}`, wantErr: []string{"heads set to null"}},
		{name: "unknown model", file: `{"model": "moe"}`, wantErr: []string{`model "moe": want fuzzy or baseline`}},
		{name: "model not a string", file: `{"model": 2}`, wantErr: []string{"model: want a string, got number"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			switch tc.file {
			case "":
			case "<missing>":
				path = filepath.Join(t.TempDir(), "nope.json")
			default:
				path = filepath.Join(t.TempDir(), "cfg.json")
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			c, err := model.Resolve(tinyConfig(t), path, tc.ov)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, c)
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// TestValidateMessages: each problem names the field, its value and the
// allowed range.
func TestValidateMessages(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(c *model.Config)
		want  string
		valid bool
	}{
		{"presets", func(c *model.Config) {}, "", true},
		{"model", func(c *model.Config) { c.Model = model.Kind(9) }, `model model(9) is unknown (want fuzzy or baseline)`, false},
		{"no model", func(c *model.Config) { c.Model = model.KindUnset }, `model is not set (want fuzzy or baseline)`, false},
		{"vocab", func(c *model.Config) { c.Vocab = 1 }, "vocab 1 is too small (at least 2 tokens)", false},
		{"d_model", func(c *model.Config) { c.DModel = 0 }, "d_model 0 must be at least 1", false},
		{"layers", func(c *model.Config) { c.Layers = 0 }, "layers 0 must be at least 1", false},
		{"heads", func(c *model.Config) { c.Heads = 0 }, "heads 0 must be at least 1", false},
		{"head dim", func(c *model.Config) { c.DModel, c.Heads = 4, 8 }, "heads 8 exceeds d_model 4 (the head dimension d_model/heads must be at least 1: use at most 4 heads)", false},
		{"divisible", func(c *model.Config) { c.Heads = 7 }, "d_model 510 is not divisible by heads 7 (d_model must be a multiple of heads: try 504 or 511)", false},
		{"ff_mult", func(c *model.Config) { c.FFMult = 0 }, "ff_mult 0 must be at least 1", false},
		{"max_len", func(c *model.Config) { c.MaxLen = 1 }, "max_len 1 is too short (at least 2 positions)", false},
		{"dropout", func(c *model.Config) { c.Dropout = 1 }, "dropout 1 is outside [0, 1)", false},
		{"label_smooth", func(c *model.Config) { c.LabelSmooth = -0.1 }, "label_smooth -0.1 is outside [0, 1)", false},
		{"R", func(c *model.Config) { c.R = 1 }, "R 1: the fuzzy model needs at least 2 regimes", false},
		{"R 2", func(c *model.Config) { c.R, c.Experts, c.TopK = 2, 2, 1 }, "", true},
		{"experts", func(c *model.Config) { c.Experts, c.TopK = 0, 1 }, "experts 0 must be at least 1", false},
		{"top_k zero", func(c *model.Config) { c.TopK = 0 }, "top_k 0 must be at least 1", false},
		{"top_k", func(c *model.Config) { c.TopK = 5 }, "top_k 5 exceeds experts 4 (top_k must be between 1 and experts)", false},
		{"rpa_K", func(c *model.Config) { c.RPAK = -1 }, "rpa_K -1 is negative", false},
		{"tau_align", func(c *model.Config) { c.TauAlign = 0 }, "tau_align 0 must be positive", false},
		{"sinkhorn_iters", func(c *model.Config) { c.SinkhornIters = 0 }, "sinkhorn_iters 0 must be at least 1", false},
		{"rpa_posmix", func(c *model.Config) { c.RPAPosmix = 1.5 }, "rpa_posmix 1.5 is outside [0, 1]", false},
		{"bias_clip", func(c *model.Config) { c.BiasClip = 0 }, "bias_clip 0 must be positive", false},
		{"tau_max", func(c *model.Config) { c.TauMax = 0.5 }, "tau_max 0.5 must be at least 0.6", false},
		{"tau_att_init low", func(c *model.Config) { c.TauAttInit = 0.2 }, "tau_att_init 0.2 is outside [0.3, tau_max 1.6]", false},
		{"tau_att_init high", func(c *model.Config) { c.TauAttInit = 2 }, "tau_att_init 2 is outside [0.3, tau_max 1.6]", false},
		{"tau_att_init edge", func(c *model.Config) { c.TauAttInit = 0.3 }, "", true},
		// The baseline reads none of the fuzzy-only fields.
		{"baseline ignores fuzzy fields", func(c *model.Config) { c.Model, c.R, c.Experts, c.TopK, c.TauMax = model.Baseline, 1, 0, 0, 0 }, "", true},
		{"baseline shared fields", func(c *model.Config) { c.Model, c.MaxLen = model.Baseline, 0 }, "max_len 0 is too short", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range model.PresetNames() {
				p, _ := model.LookupPreset(name)
				c := p.Config
				tc.edit(&c)
				err := c.Validate()
				if tc.valid {
					if err != nil {
						t.Errorf("%s: %v", name, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("%s: accepted, want %q", name, tc.want)
				}
				if name == "paper" && !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %q\ndoes not contain %q", name, err, tc.want)
				}
			}
		})
	}
}

// TestValidateAllProblems: every problem is listed in the one error.
func TestValidateAllProblems(t *testing.T) {
	c := tinyConfig(t)
	c.DModel, c.Heads, c.R, c.TopK, c.MaxLen, c.LabelSmooth, c.TauAttInit = 100, 3, 1, 9, 1, 1, 0.1
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	want := []string{
		"invalid model config: ",
		"d_model 100 is not divisible by heads 3 (d_model must be a multiple of heads: try 99 or 102)",
		"R 1:", "top_k 9 exceeds experts 4", "max_len 1 is too short", "label_smooth 1 is outside [0, 1)",
		"tau_att_init 0.1 is outside [0.3, tau_max 1.6]",
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\ndoes not contain %q", err, w)
		}
	}
	if n := strings.Count(err.Error(), "; "); n != len(want)-2 {
		t.Errorf("%d separators in %q, want %d (one per problem)", n, err, len(want)-2)
	}
}

// TestPresetParamCounts pins the parameter counts the README states, and
// checks that a size made of overrides builds.
func TestPresetParamCounts(t *testing.T) {
	want := map[string][2]int{ // fuzzy, baseline
		"mqar":  {759380, 461312},
		"tiny":  {7159508, 6861440},
		"small": {18524072, 16152320},
		"paper": {91698090, 63533250},
	}
	count := func(t *testing.T, c model.Config, T int) int {
		t.Helper()
		mg, err := model.Build(&c, model.Opts{T: T, B: 1, Mode: model.Eval, NoLoss: true})
		if err != nil {
			t.Fatal(err)
		}
		return model.CountParams(mg.Specs)
	}
	for _, name := range model.PresetNames() {
		p, _ := model.LookupPreset(name)
		c, err := model.Resolve(p.Config, "", model.Overrides{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i, kind := range []model.Kind{model.Fuzzy, model.Baseline} {
			c.Model = kind
			if got := count(t, c, p.Contexts[0]); got != want[name][i] {
				t.Errorf("%s %s: %d parameters, want %d", name, kind, got, want[name][i])
			}
		}
	}
	c, err := model.Resolve(tinyConfig(t), "", model.Overrides{DModel: ip(96), Layers: ip(3), Heads: ip(3)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := count(t, c, 64), 5436210; got != want {
		t.Errorf("d 96 × 3 layers × 3 heads: %d parameters, want %d", got, want)
	}
}

func TestSummary(t *testing.T) {
	c := tinyConfig(t)
	if got, want := c.Summary(), "model=fuzzy d_model=128 layers=2 heads=4 R=4 experts=4 top_k=2 ff_mult=2 max_len=256"; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
	c.Model = model.Baseline
	if got, want := c.Summary(), "model=baseline d_model=128 layers=2 heads=4 ff_mult=2 top_k=2 (ffn width 512) max_len=256"; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
	c.RoPE = true
	if got, want := c.Summary(), "model=baseline d_model=128 layers=2 heads=4 ff_mult=2 top_k=2 (ffn width 512) max_len=256 rope=true rope_base=10000"; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
}
