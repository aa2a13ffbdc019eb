package training

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/training/data"
)

func TestMeanStd(t *testing.T) {
	m, s := MeanStd([]float64{1, 2, 3, 4})
	if m != 2.5 || math.Abs(s-math.Sqrt(5.0/3)) > 1e-12 {
		t.Fatalf("mean %g std %g", m, s)
	}
	if m, s := MeanStd([]float64{7}); m != 7 || !math.IsNaN(s) {
		t.Fatalf("one value: mean %g std %g", m, s)
	}
}

// TestAblate runs the four stages on the micro model for one seed, checks
// the tables, and checks that a second call reuses the finished runs.
func TestAblate(t *testing.T) {
	dir := t.TempDir()
	base := microOptions(dir)
	base.Steps, base.EvalEvery = 4, 2
	ao := AblationOptions{Base: base, Seeds: 1, Contexts: []int{16, 32}, Progress: &strings.Builder{}}
	res, err := Ablate(context.Background(), ao)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d stages, want 4", len(res))
	}
	rows := Summarize(res)
	for i, r := range rows {
		if r.Params <= 0 || r.Steps != 4 || r.Tokens != rows[0].Tokens || math.IsNaN(r.CE) {
			t.Fatalf("row %d: %+v", i, r)
		}
	}
	if rows[0].Contexts[0] != 32 || len(rows[1].Contexts) != 2 {
		t.Errorf("contexts: baseline %v, game %v", rows[0].Contexts, rows[1].Contexts)
	}
	if rows[2].Weights != WeightsEMA.String() || math.IsNaN(rows[2].EMACE) {
		t.Errorf("stage 3 should report EMA weights: %+v", rows[2])
	}
	if rows[0].DeltaBase != 0 || math.Abs(rows[3].DeltaPrev-(rows[3].CE-rows[2].CE)) > 1e-12 {
		t.Errorf("deltas: %+v", rows)
	}
	table, err := WriteAblation(dir, []string{"- test"}, rows)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Baseline (no RPA/Guardian/SWA/Context)", "+ SWA-select (Final)", "| Params |"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	csv, err := os.ReadFile(filepath.Join(dir, "ablation.csv"))
	if err != nil || strings.Count(string(csv), "\n") != 5 {
		t.Fatalf("ablation.csv: %v\n%s", err, csv)
	}
	if _, err := os.Stat(filepath.Join(dir, "baseline", "seed3", "checkpoint")); !os.IsNotExist(err) {
		t.Error("the run's checkpoint should be removed without KeepCheckpoints")
	}
	// A second call reuses every finished run.
	again, err := Ablate(context.Background(), ao)
	if err != nil {
		t.Fatal(err)
	}
	if again[3].Runs[0].ValCE != res[3].Runs[0].ValCE || again[3].Runs[0].Seconds != res[3].Runs[0].Seconds {
		t.Error("the second call did not reuse the finished runs")
	}
	// --lr-flat/--lr-floor replace a stage's own schedule (cosine to zero
	// for the comparison stages).
	flat, floor := 1.0, 0.5
	lr := AblationOptions{Base: base, Seeds: 1, Stages: []string{"transformer"}, LRFlat: &flat, LRFloor: &floor, Progress: &strings.Builder{}}
	lr.Base.Out = t.TempDir()
	got, err := Ablate(context.Background(), lr)
	if err != nil {
		t.Fatal(err)
	}
	if su := got[0].Runs[0].Setup; !strings.Contains(su, `"LRFlat":1`) || !strings.Contains(su, `"LRFloor":0.5`) {
		t.Errorf("the schedule override is not in the run's settings: %s", su)
	}
	// Other settings in the same directory are refused, naming what changed.
	changed := ao
	changed.Base.LR = 1e-4
	if _, err := Ablate(context.Background(), changed); err == nil || !strings.Contains(err.Error(), "other settings (LR 0, now 0.0001)") {
		t.Errorf("a finished run under other settings: %v", err)
	}
	if _, err := Ablate(context.Background(), AblationOptions{Base: base, Seeds: 1, Stages: []string{"nope"}}); err == nil ||
		!strings.Contains(err.Error(), "unknown stage") {
		t.Errorf("unknown stage: %v", err)
	}
}

// TestPairedDiff: differences are taken seed by seed (seeds only one side
// has are left out) and the 95% interval uses Student's t: diffs 0.1, 0.2,
// 0.3 give 0.2 ± t(0.975, 2)·0.1/√3 = 0.2 ± 0.2484.
func TestPairedDiff(t *testing.T) {
	a := []RunResult{{Seed: 1, ValCE: 5.1}, {Seed: 2, ValCE: 5.4}, {Seed: 3, ValCE: 5.3}, {Seed: 9, ValCE: 1}}
	b := []RunResult{{Seed: 3, ValCE: 5.0}, {Seed: 1, ValCE: 5.0}, {Seed: 2, ValCE: 5.2}}
	p := Paired(a, b)
	if p.N != 3 || math.Abs(p.Mean-0.2) > 1e-12 || math.Abs(p.Half-4.302652729911275*0.1/math.Sqrt(3)) > 1e-9 {
		t.Errorf("paired %+v: want n 3, mean 0.2, half %.6f", p, 4.302652729911275*0.1/math.Sqrt(3))
	}
	if got := p.String(); got != "+0.200 ± 0.248 (n 3)" {
		t.Errorf("text %q", got)
	}
	one := Paired(a[:1], b)
	if one.N != 1 || !math.IsNaN(one.Half) || one.String() != "+0.100 (n 1)" {
		t.Errorf("one pair: %+v %q", one, one.String())
	}
	if none := Paired(a[3:], b); none.N != 0 || none.String() != "—" {
		t.Errorf("no pairs: %+v", none)
	}
}

// TestRecallByDistanceTable: recall per distance bucket, mean ± std over
// seeds, and after the first stage the paired difference from it; buckets
// without answers are left out, and runs without the breakdown give "".
func TestRecallByDistanceTable(t *testing.T) {
	run := func(seed uint64, near, far int) RunResult {
		return RunResult{Seed: seed, RecallByDist: []data.RecallBucket{{Lo: 1, Hi: 4, Correct: near, Total: 10},
			{Lo: 4, Hi: 8, Correct: far, Total: 10}, {Lo: 8, Hi: 16}}}
	}
	rs := []StageResult{
		{Stage: Stage{Label: "A"}, Runs: []RunResult{run(1, 5, 1), run(2, 7, 3)}},
		{Stage: Stage{Label: "B"}, Runs: []RunResult{run(2, 9, 3), run(1, 6, 2)}},
	}
	got := RecallByDistanceTable(rs)
	for _, want := range []string{"| Stage | distance [1,4) | distance [4,8) |\n",
		"| A | 0.600 ± 0.141 | 0.200 ± 0.141 |\n",
		"| B | 0.750 ± 0.212; Δ +0.150 ± 0.635 (n 2) | 0.250 ± 0.071; Δ +0.050 ± 0.635 (n 2) |\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "[8,16)") {
		t.Errorf("a bucket without answers is listed:\n%s", got)
	}
	if s := RecallByDistanceTable([]StageResult{{Runs: []RunResult{{Seed: 1}}}}); s != "" {
		t.Errorf("no breakdown: %q", s)
	}
}

// TestLengthTable: CE per length as mean ± std over the seeds and the
// paired difference from the first stage; a length a run was not scored at
// is left out of its cells.
func TestLengthTable(t *testing.T) {
	run := func(seed uint64, ce ...float64) RunResult {
		r := RunResult{Seed: seed}
		for i, v := range ce {
			r.AtLengths = append(r.AtLengths, LengthCE{T: 64 << i, CE: v, Tokens: 640})
		}
		return r
	}
	rs := []StageResult{
		{Stage: Stage{Label: "A"}, Runs: []RunResult{run(1, 5, 6), run(2, 5.2, 6.4)}},
		{Stage: Stage{Label: "B"}, Runs: []RunResult{run(2, 5.1, 6.1), run(1, 4.8)}},
	}
	got := LengthTable(rs, []int{64, 128})
	for _, want := range []string{"| Stage | CE at T = 64 ↓ | CE at T = 128 ↓ |\n",
		"| A | 5.100 ± 0.141 | 6.200 ± 0.283 |\n",
		"| B | 4.950 ± 0.212; Δ -0.150 ± 0.635 (n 2) | 6.100; Δ -0.300 (n 1) |\n",
		"| Stage | CE at 128 − CE at 64 ↓ |\n",
		"| A | 1.100 ± 0.141 |\n",
		"| B | 1.000; Δ -0.200 (n 1) |\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if s := LengthTable([]StageResult{{Runs: []RunResult{{Seed: 1}}}}, []int{64}); s != "" {
		t.Errorf("no run scored: %q", s)
	}
	if strings.Contains(got, "recall") {
		t.Errorf("a recall table without recall:\n%s", got)
	}
	// MQAR runs: a recall table too
	withRecall := func(r RunResult, rec ...float64) RunResult {
		for i := range rec {
			r.AtLengths[i].Recall = &rec[i]
		}
		return r
	}
	rs[0].Runs[0], rs[0].Runs[1] = withRecall(rs[0].Runs[0], 1, 0.5), withRecall(rs[0].Runs[1], 0.9, 0.3)
	rs[1].Runs[0] = withRecall(rs[1].Runs[0], 0.8, 0.2)
	got = LengthTable(rs, []int{64, 128})
	for _, want := range []string{"| Stage | recall at T = 64 ↑ | recall at T = 128 ↑ |\n",
		"| A | 0.950 ± 0.071 | 0.400 ± 0.141 |\n",
		"| B | 0.800; Δ -0.100 (n 1) | 0.200; Δ -0.100 (n 1) |\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestAblateAtLengths: with AtLengths every run is scored once, its
// checkpoint still there, and its figures land in result.json; a reused run
// is not scored again, one that lacks a length is scored from its kept
// checkpoint, and without a checkpoint that is an error that says so.
func TestAblateAtLengths(t *testing.T) {
	dir := t.TempDir()
	base := microOptions(dir)
	base.Steps, base.EvalEvery = 2, 2
	var calls []string
	score := func(lengths ...int) *LengthEval {
		return &LengthEval{Lengths: lengths, Score: func(_ context.Context, run string, weights WeightSet) ([]LengthCE, error) {
			if _, err := os.Stat(filepath.Join(run, "checkpoint")); err != nil {
				t.Errorf("scored without a checkpoint: %v", err)
			}
			calls = append(calls, run+" "+weights.String())
			var out []LengthCE
			for _, T := range lengths {
				out = append(out, LengthCE{T: T, CE: float64(T), Tokens: T})
			}
			return out, nil
		}}
	}
	ao := AblationOptions{Base: base, Seeds: 1, Contexts: []int{16, 32}, Stages: []string{"transformer", "guardian_late"},
		AtLengths: score(16, 32), KeepCheckpoints: true, Progress: &strings.Builder{}}
	res, err := Ablate(context.Background(), ao)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !strings.HasSuffix(calls[0], " last") || !strings.HasSuffix(calls[1], " ema") {
		t.Fatalf("scorer calls %q: want one per run, under the weights each stage reports", calls)
	}
	if ce, ok := res[1].Runs[0].ceAt(32); !ok || ce != 32 {
		t.Errorf("stage 2's CE at 32: %v %v", ce, ok)
	}
	rr, err := readRunResult(filepath.Join(dir, "transformer", "seed3"))
	if err != nil || !rr.scoredAt([]int{16, 32}) {
		t.Fatalf("result.json lacks the lengths: %v %+v", err, rr)
	}
	calls = nil
	if _, err := Ablate(context.Background(), ao); err != nil || len(calls) != 0 {
		t.Fatalf("reused runs scored again: %v %q", err, calls)
	}
	ao.AtLengths = score(16, 32, 64)
	if _, err := Ablate(context.Background(), ao); err != nil || len(calls) != 2 {
		t.Fatalf("runs lacking a length not scored from their checkpoints: %v %q", err, calls)
	}
	if err := os.RemoveAll(filepath.Join(dir, "transformer", "seed3", "checkpoint")); err != nil {
		t.Fatal(err)
	}
	ao.AtLengths = score(8)
	if _, err := Ablate(context.Background(), ao); err == nil || !strings.Contains(err.Error(), "without a checkpoint cannot be scored") {
		t.Errorf("a run without its checkpoint: %v", err)
	}
}
