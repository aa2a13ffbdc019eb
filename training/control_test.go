package training

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/metrics"
)

// allOnOptions is the micro run with every controller on: Guardian, the
// context game over {16, 32}, EMA, SWA-select (joining every epoch with a
// measurable gain), chaos, dropout glide (0.1 → 0.08) and the LR floor.
func allOnOptions(out string) Options {
	o := microOptions(out)
	o.Steps, o.EvalEvery = 8, 2
	start, band, gain := 0, 0.0, -1.0
	o.Control = Controls{
		Controller: "guardian", Guardian: control.GuardianConfig{BetaStart: 0, BetaRamp: 1},
		Contexts: []int{16, 32}, GameEvery: 3,
		EMA: true, SWA: true, SWAStart: &start, SWABand: &band, SWAMinGain: &gain,
		Chaos: true, DropoutGlide: true,
	}
	return o
}

// stateControl returns the "control" object of a checkpoint's state.json.
func stateControl(t *testing.T, dir string) string {
	t.Helper()
	ck, err := checkpoint.Load(filepath.Join(dir, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]json.RawMessage
	if err := json.Unmarshal(ck.State, &st); err != nil {
		t.Fatal(err)
	}
	return string(st["control"]) + string(st["data_rngs"]) + string(st["running_initialised"])
}

// TestResumeIsExactAllControllers: with every controller on, N steps
// straight and N/2 + resume + N/2 give the same weights (raw, EMA, SWA),
// optimizer moments, running statistics and controller state (Guardian's
// policy and Adam moments, the context game, chaos, SWA members, RNGs), bit
// for bit, whether the stop falls on an evaluation or between two.
func TestResumeIsExactAllControllers(t *testing.T) {
	ctx := context.Background()
	a := t.TempDir()
	if _, err := Train(ctx, allOnOptions(a)); err != nil {
		t.Fatal(err)
	}
	wa := weights(t, a)
	for _, stop := range []int{3, 4} {
		b := t.TempDir()
		o := allOnOptions(b)
		o.StopAfter = stop
		if _, err := Train(ctx, o); err != nil {
			t.Fatal(err)
		}
		o = allOnOptions(b)
		o.Resume = true
		res, err := Train(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if res.Steps != 8 {
			t.Fatalf("stop %d: resumed run ended at step %d, want 8", stop, res.Steps)
		}
		wb := weights(t, b)
		if len(wa) != len(wb) {
			t.Fatalf("stop %d: %d tensors straight, %d resumed", stop, len(wa), len(wb))
		}
		for name, x := range wa {
			y, ok := wb[name]
			if !ok || len(x) != len(y) {
				t.Fatalf("stop %d: %s missing or resized after resume", stop, name)
			}
			for i := range x {
				if x[i] != y[i] {
					t.Fatalf("stop %d: %s[%d]: straight %v, resumed %v", stop, name, i, x[i], y[i])
				}
			}
		}
		if ca, cb := stateControl(t, a), stateControl(t, b); ca != cb {
			t.Fatalf("stop %d: controller state differs after resume:\n%s\n%s", stop, ca[:min(400, len(ca))], cb[:min(400, len(cb))])
		}
	}
	// The averaged weights are stored for every parameter, and no
	// controller state is stored among the model's tensors.
	var params, ema, swa int
	for name := range wa {
		switch {
		case strings.HasPrefix(name, "ema."):
			ema++
		case strings.HasPrefix(name, "swa."):
			swa++
		case strings.HasPrefix(name, "guardian") || strings.Contains(name, "policy"):
			t.Fatalf("controller tensor %s in the checkpoint's weights", name)
		case strings.HasPrefix(name, "adam.") || strings.Contains(name, ".T16") || strings.Contains(name, ".T32"):
		case strings.HasSuffix(name, "bias_scale") || name == "train.lambda_sat":
		default:
			params++
		}
	}
	if ema == 0 || ema != swa || ema != params {
		t.Fatalf("%d parameters, %d ema.*, %d swa.* tensors: want one of each per parameter", params, ema, swa)
	}
}

// TestAllControllersMetrics: a run with every component on records every
// per-evaluation diagnostic at each evaluation, writes B(T) snapshots, and
// Guardian, SWA-select and the context game actually act.
func TestAllControllersMetrics(t *testing.T) {
	dir := t.TempDir()
	if _, err := Train(context.Background(), allOnOptions(dir)); err != nil {
		t.Fatal(err)
	}
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var evals []metrics.Record
	contexts := map[int]bool{}
	for _, r := range recs {
		switch r.Kind() {
		case metrics.KindEval:
			evals = append(evals, r)
		case metrics.KindStep:
			contexts[r.Context] = true
		}
	}
	if len(evals) != 4 {
		t.Fatalf("%d evaluations, want 4", len(evals))
	}
	want := []struct {
		name string
		has  func(r *metrics.Record) bool
	}{
		{"val_ce", func(r *metrics.Record) bool { return r.ValCE.Present() }},
		{"val_ce_ema", func(r *metrics.Record) bool { return r.ValCEEMA.Present() }},
		{"tau_att", func(r *metrics.Record) bool { return r.TauAtt != nil }},
		{"guardian_reward", func(r *metrics.Record) bool { return r.GuardianReward.Present() }},
		{"lambda_sat", func(r *metrics.Record) bool { return r.LambdaSat.Present() }},
		{"lambda_delta", func(r *metrics.Record) bool { return r.LambdaDelta.Present() }},
		{"mu_entropy", func(r *metrics.Record) bool { return r.MuEntropy.Present() }},
		{"mu_entropy_layers", func(r *metrics.Record) bool { return r.MuEntropyLayers != nil }},
		{"sat_frac", func(r *metrics.Record) bool { return r.SatFrac.Present() }},
		{"expert_usage", func(r *metrics.Record) bool { return r.ExpertUsage != nil }},
		{"gate_delta", func(r *metrics.Record) bool { return r.GateDelta.Present() }},
		{"q_context", func(r *metrics.Record) bool { return r.QContext != nil }},
		{"contexts", func(r *metrics.Record) bool { return r.Contexts != nil }},
		{"swa_members", func(r *metrics.Record) bool { return r.SWAMembers != nil }},
		{"swa_count", func(r *metrics.Record) bool { return r.SWACount != nil }},
		{"lr", func(r *metrics.Record) bool { return r.LR.Present() }},
	}
	for i, r := range evals {
		for _, k := range want {
			if !k.has(&r) {
				t.Errorf("evaluation %d lacks %q", i, k.name)
			}
		}
		if i < len(evals)-1 {
			if a := r.GuardianAction; len(a) != 3 {
				t.Errorf("evaluation %d: guardian_action %v, want 3 numbers", i, a)
			}
		}
		if tau := r.TauAtt; len(tau) != 2 {
			t.Errorf("tau_att %v: want one per layer", tau)
		}
	}
	learned := false
	for _, r := range evals {
		if !math.IsNaN(r.GuardianAdvantage.Value()) {
			learned = true
		}
	}
	if !learned {
		t.Error("Guardian never took a policy-gradient step")
	}
	moved := false
	for _, r := range evals {
		before, after := r.TauAtt, r.TauAttAfter
		if len(before) == 2 && len(after) == 2 && before[0] != after[0] {
			moved = true
		}
	}
	if !moved {
		t.Error("Guardian never moved τ_att (tau_att equals tau_att_after at every evaluation)")
	}
	last := evals[len(evals)-1]
	if last.SWACount == nil || *last.SWACount < 1 || !last.ValCESWA.Present() {
		t.Errorf("SWA-select never joined: %v", last.SWAMembers)
	}
	if !contexts[16] || !contexts[32] {
		t.Errorf("trained at contexts %v, want both 16 and 32", contexts)
	}
	q := last.QContext
	if s := q[0] + q[1]; math.Abs(s-1) > 1e-9 {
		t.Errorf("q(c) sums to %g", s)
	}
	for _, f := range []string{"early", "late"} {
		ts, meta, err := checkpoint.LoadWeightsFile(filepath.Join(dir, "bias", f+".safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 2 || !reflect.DeepEqual(ts[0].Shape, []int{32, 32}) || meta["T"] != "32" {
			t.Fatalf("bias/%s: %d tensors of shape %v, meta %v", f, len(ts), ts[0].Shape, meta)
		}
	}
}

// TestScriptedAndNoAlign: the scripted controller sets τ_att from
// Algorithm 1 and the legacy-bias model trains and records B(T).
func TestScriptedAndNoAlign(t *testing.T) {
	dir := t.TempDir()
	o := microOptions(dir)
	o.NoAlign = true
	o.Control = Controls{Controller: "scripted", ScriptedTauMin: 0.6, ScriptedTauMax: 1.6}
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	w := weights(t, dir)
	s, _ := control.NewScripted(0.6, 1.6, o.WarmIn, o.Steps)
	// τ is set before each step and AdamW then moves it a little: it must lie
	// near the schedule's last value.
	want := s.Base(o.Steps)
	for _, n := range []string{"blocks.0.attn.tau_att", "blocks.1.attn.tau_att"} {
		if got := float64(w[n][0]); math.Abs(got-want) > 0.05 {
			t.Errorf("%s = %g, want about %g", n, got, want)
		}
	}
	if _, ok := w["blocks.0.attn.kappa"]; !ok {
		t.Error("NoAlign should train the legacy bias (blocks.*.attn.kappa)")
	}
}
