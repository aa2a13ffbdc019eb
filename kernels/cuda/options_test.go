package cuda

import (
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

// TestOptionsFromEnv: each path variable takes its values or nothing
// (base's choice), reaches the backend the options open (the dry run's),
// and any other value is refused with the variable named; the variables
// of removed paths are refused when set; tuning needs a choices file.
func TestOptionsFromEnv(t *testing.T) {
	onOff := map[string]bool{"": true, "on": true, "off": false}
	for name, c := range map[string]struct {
		flag   func(*Backend) bool
		values map[string]bool
	}{
		"RPAC_CUDA_ATTENTION": {func(b *Backend) bool { return b.attention == AttentionGEMM }, map[string]bool{"": true, "gemm": true, "flash": false}},
		"RPAC_CUDA_JOIN":      {func(b *Backend) bool { return b.Capabilities().JoinGrads }, onOff},
		"RPAC_CUDA_PACK":      {func(b *Backend) bool { return b.pack }, onOff},
		"RPAC_CUDA_SUMS":      {func(b *Backend) bool { return b.sums }, onOff},
		"RPAC_CUDA_HEAD_PAD":  {func(b *Backend) bool { return b.headPad }, onOff},
		"RPAC_CUDA_PAD_GRADW": {func(b *Backend) bool { return b.padGradW }, onOff},
		// the graphs' alignment follows it under bf16 GEMMs
		"RPAC_CUDA_PAD_MODEL": {func(b *Backend) bool { return b.padModel && b.Capabilities().Align == 8 }, onOff},
		"RPAC_CUDA_AG_LEAN":   {func(b *Backend) bool { return b.agLean }, onOff},
		"RPAC_CUDA_BF16_ACT":  {func(b *Backend) bool { return b.bf16Act }, onOff},
		"RPAC_CUDA_REMAT":     {func(b *Backend) bool { return b.Capabilities().RematDropout }, onOff},
		// the paper's vocabulary: a row of 201 KB within sm_90's 227 KiB
		"RPAC_CUDA_CE_SMEM": {func(b *Backend) bool { k, _ := b.softmaxCE(50257); return k == "softmax_ce_smem_f32" }, onOff},
	} {
		for v, want := range c.values {
			t.Setenv(name, v)
			o, err := OptionsFromEnv(CandidateOptions())
			if err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
			be, err := NewDryRun(ir.BF16, o)
			if err != nil || c.flag(be) != want {
				t.Errorf("%s=%q: dry run %v, path %v; want %v", name, v, err, be != nil && c.flag(be), want)
			}
		}
		t.Setenv(name, "yes")
		if _, err := OptionsFromEnv(CandidateOptions()); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=yes: %v, want a refusal naming it", name, err)
		}
		t.Setenv(name, "")
	}
	// unset, a variable keeps base's choice, not the default
	base := CandidateOptions()
	base.Pack = false
	if o, err := OptionsFromEnv(base); err != nil || o.Pack {
		t.Errorf("base without Pack: %+v, %v", o, err)
	}
	for _, gone := range []string{"RPAC_CUDA_SPLITK", "RPAC_CUDA_FUSED"} {
		t.Setenv(gone, "on")
		if _, err := OptionsFromEnv(CandidateOptions()); err == nil || !strings.Contains(err.Error(), gone) {
			t.Errorf("%s=on: %v, want a refusal naming it", gone, err)
		}
		t.Setenv(gone, "")
	}
	t.Setenv("RPAC_CUDA_GEMM_TUNE", "1")
	if _, err := OptionsFromEnv(CandidateOptions()); err == nil || !strings.Contains(err.Error(), "RPAC_CUDA_GEMM_ALGOS") {
		t.Errorf("RPAC_CUDA_GEMM_TUNE=1 alone: %v, want a refusal naming RPAC_CUDA_GEMM_ALGOS", err)
	}
	if _, err := NewDryRun(ir.BF16, Options{GEMMTune: true}); err == nil {
		t.Error("the dry run took GEMMTune without a choices file")
	}
	t.Setenv("RPAC_CUDA_GEMM_ALGOS", "/nonexistent/choices.json")
	if o, err := OptionsFromEnv(CandidateOptions()); err != nil || !o.GEMMTune || o.GEMMAlgos != "/nonexistent/choices.json" {
		t.Errorf("RPAC_CUDA_GEMM_ALGOS and _TUNE: %+v, %v", o, err)
	}
}

// TestUnmeasuredPathsOff: the defaults leave every unmeasured path off and
// the candidates turn each on, the measured paths on in both; each path's
// name parses back to it and NAME=on|off sets it alone.
func TestUnmeasuredPathsOff(t *testing.T) {
	def, cand := DefaultOptions(), CandidateOptions()
	unmeasured := map[Path]bool{}
	for _, p := range Unmeasured() {
		unmeasured[p] = true
	}
	if len(unmeasured) == 0 {
		t.Fatal("no unmeasured paths listed")
	}
	for p := range Path(len(pathNames)) {
		if def.On(p) == unmeasured[p] || !cand.On(p) {
			t.Errorf("%s: default %v, candidate %v (unmeasured: %v)", p, def.On(p), cand.On(p), unmeasured[p])
		}
		q, err := ParsePath(p.String())
		if err != nil || q != p {
			t.Errorf("%s parses as %v, %v", p, q, err)
		}
		for _, on := range []bool{true, false} {
			set := map[bool]string{true: "on", false: "off"}[on]
			q, got, err := ParsePathSetting(p.String() + "=" + set)
			if err != nil || q != p || got != on {
				t.Errorf("%s=%s: %v %v %v", p, set, q, got, err)
			}
			o := def
			o.Set(p, on)
			for r := range Path(len(pathNames)) {
				if want := map[bool]bool{true: on, false: def.On(r)}[r == p]; o.On(r) != want {
					t.Errorf("Set(%s, %v) left %s %v", p, on, r, o.On(r))
				}
			}
		}
	}
	for _, bad := range []string{"ce-smem", "ce-smem=yes", "nosuch=on"} {
		if _, _, err := ParsePathSetting(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if got := def.Describe(); !strings.Contains(got, "head-pad=on") || !strings.Contains(got, "ce-smem=off") {
		t.Errorf("Describe: %s", got)
	}
}
