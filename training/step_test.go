package training

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/training/checkpoint"
)

// stepFixture is a small model, its store and one batch of tokens.
type stepFixture struct {
	cfg   model.Config
	store *kernels.Store
	x, y  []int32
	T, B  int
}

func newStepFixture(t *testing.T, kind model.Kind, T, B int, mods ...func(*model.Config)) *stepFixture {
	t.Helper()
	p, _ := model.LookupPreset("tiny")
	cfg := p.Config
	cfg.Model, cfg.Vocab, cfg.DModel, cfg.Layers, cfg.Heads, cfg.MaxLen, cfg.Dropout = kind, 97, 16, 2, 2, T, 0
	for _, m := range mods {
		m(&cfg)
	}
	mg, err := model.Build(&cfg, model.Opts{T: T, B: 1, Mode: model.Train})
	if err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP32)
	if err := model.InitStore(mg.Specs, st, 7); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	f := &stepFixture{cfg: cfg, store: st, T: T, B: B, x: make([]int32, B*T), y: make([]int32, B*T)}
	for i := range f.x {
		f.x[i], f.y[i] = int32(r.IntN(cfg.Vocab)), int32(r.IntN(cfg.Vocab))
	}
	return f
}

// run executes a step of batch sequences in micro-batches of micro on
// x, y and returns copies of its loss, CE and gradients.
func (f *stepFixture) run(t *testing.T, batch, micro int, x, y []int32, seed uint64) (float64, float64, map[string][]float32) {
	t.Helper()
	s, err := CompileStep(&f.cfg, f.store, cpu.New(ir.FP32), f.T, batch, micro, f.cfg.Dropout, nil)
	return runStepCopy(t, s, err, x, y, seed)
}

func maxRelDiff(t *testing.T, a, b map[string][]float32) float64 {
	t.Helper()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("gradient sets differ: %d and %d tensors", len(a), len(b))
	}
	worst := 0.0
	for n, ga := range a {
		gb := b[n]
		var num, den float64
		for i := range ga {
			d := float64(ga[i] - gb[i])
			num += d * d
			den += float64(ga[i]) * float64(ga[i])
		}
		if den > 0 {
			worst = math.Max(worst, math.Sqrt(num/den))
		}
	}
	return worst
}

// TestMicroBatchEquivalenceBaseline: for the baseline model a step over
// micro-batches is the step over the whole batch (loss, CE and every
// gradient) to float32 rounding.
func TestMicroBatchEquivalenceBaseline(t *testing.T) {
	f := newStepFixture(t, model.Baseline, 16, 8)
	loss, ce, full := f.run(t, 8, 8, f.x, f.y, 11)
	for _, micro := range []int{4, 2, 1} {
		l, c, g := f.run(t, 8, micro, f.x, f.y, 11)
		if math.Abs(l-loss) > 1e-5*math.Abs(loss) || math.Abs(c-ce) > 1e-5*math.Abs(ce) {
			t.Errorf("micro %d: loss %.7f ce %.7f, whole batch %.7f %.7f", micro, l, c, loss, ce)
		}
		if d := maxRelDiff(t, full, g); d > 2e-5 {
			t.Errorf("micro %d: gradients differ from the whole batch's by %.2e (relative)", micro, d)
		}
	}
}

// TestMicroBatchFuzzyIsPerMicroBatchStatistics: for the fuzzy model, whose
// RPA prior and entropy floor read batch statistics, a step over
// micro-batches is exactly the mean of independent steps over each
// micro-batch (their statistics, their seeds); the whole-batch step
// differs (other statistics, other Gumbel draws).
func TestMicroBatchFuzzyIsPerMicroBatchStatistics(t *testing.T) {
	f := newStepFixture(t, model.Fuzzy, 16, 4)
	const seed = 5
	loss, ce, acc := f.run(t, 4, 2, f.x, f.y, seed)
	half := len(f.x) / 2
	l0, c0, g0 := f.run(t, 2, 2, f.x[:half], f.y[:half], seed)
	l1, c1, g1 := f.run(t, 2, 2, f.x[half:], f.y[half:], seed+0x9e3779b97f4a7c15)
	ref := map[string][]float32{}
	for n := range g0 {
		ref[n] = make([]float32, len(g0[n]))
		for i := range ref[n] {
			ref[n][i] = 0.5*g0[n][i] + 0.5*g1[n][i]
		}
	}
	if math.Abs(loss-(l0+l1)/2) > 1e-6 || math.Abs(ce-(c0+c1)/2) > 1e-6 {
		t.Errorf("loss %.7f ce %.7f, mean of the micro-batches' %.7f %.7f", loss, ce, (l0+l1)/2, (c0+c1)/2)
	}
	if d := maxRelDiff(t, ref, acc); d > 1e-6 {
		t.Errorf("accumulated gradients differ from the mean of the micro-batches' by %.2e", d)
	}
	_, _, full := f.run(t, 4, 4, f.x, f.y, seed)
	d := maxRelDiff(t, full, acc)
	if d == 0 {
		t.Error("micro-batch and whole-batch gradients are identical; the fuzzy model's batch statistics should make them differ")
	}
	t.Logf("fuzzy: micro-batches vs whole batch, relative gradient difference %.2e", d)
}

// TestMemoryBudget: --mem-budget picks smaller micro-batches, and a budget
// too small for one sequence fails before anything is written.
func TestMemoryBudget(t *testing.T) {
	o := microOptions(filepath.Join(t.TempDir(), "run"))
	o.TokensPerStep = 512 // 16 sequences of 32
	p, err := Setup(o, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l := p.Lengths[0]; l.Micro != l.Batch || l.Batch != 16 {
		t.Fatalf("ample memory: micro %d of %d, want the whole batch of 16", l.Micro, l.Batch)
	}
	full := p.Memory.Total
	o.MemBudget = p.Memory.Static + (full-p.Memory.Static)/3
	p2, err := Setup(o, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l := p2.Lengths[0]; l.Micro >= 16 || 16%l.Micro != 0 || p2.Memory.Total > o.MemBudget {
		t.Fatalf("budget %d: micro %d (plan %d); want a divisor of 16 below 16 within the budget", o.MemBudget, l.Micro, p2.Memory.Total)
	}
	o.MemBudget = p.Memory.Static / 2
	if _, err := Setup(o, nil, nil); err == nil || !errors.Is(err, errNoFit) || !strings.Contains(err.Error(), "one sequence") {
		t.Fatalf("tiny budget: %v", err)
	}
	if _, err := Train(context.Background(), o); err == nil {
		t.Fatal("Train accepted a budget too small for one sequence")
	}
	if _, err := os.Stat(o.Out); !os.IsNotExist(err) {
		t.Fatalf("a run that does not fit wrote %s (%v)", o.Out, err)
	}
	o.MemBudget, o.MicroBatch = 0, 3
	if _, err := Setup(o, nil, nil); err == nil || !strings.Contains(err.Error(), "does not divide") {
		t.Fatalf("micro-batch 3 of 16: %v", err)
	}
}

// TestTrainMicroBatchedRun: a run with micro-batches trains, records its
// micro-batch, and resumes with it.
func TestTrainMicroBatchedRun(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.MicroBatch = 2
	res, err := Train(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if l := res.Plan.Lengths[0]; l.Micro != 2 || l.Batch != 4 {
		t.Fatalf("plan %+v, want micro 2 of 4", l)
	}
	r, err := OpenRun(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.State.Lengths) != 1 || r.State.Lengths[0].Micro != 2 {
		t.Fatalf("state records lengths %+v", r.State.Lengths)
	}
}

// TestRecallEveryEval: a synthetic run logs recall_acc and its count at
// every evaluation.
func TestRecallEveryEval(t *testing.T) {
	out := t.TempDir()
	if _, err := Train(context.Background(), microOptions(out)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	evals := 0
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		if _, ok := rec["val_ce"]; !ok {
			continue
		}
		evals++
		acc, ok1 := rec["recall_acc"].(float64)
		n, ok2 := rec["recall_n"].(float64)
		if !ok1 || !ok2 || n < 1 || acc < 0 || acc > 1 {
			t.Fatalf("eval record without a recall figure: %s", line)
		}
	}
	if evals != 2 {
		t.Fatalf("%d evaluations, want 2", evals)
	}
}

// TestInitOnly: --steps 0 writes the initialised checkpoint at step 0.
func TestInitOnly(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.InitOnly = true
	res, err := Train(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenRun(out)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 0 || r.State.Step != 0 || r.Store.Get("tok_emb.weight") == nil {
		t.Fatalf("steps %d, checkpoint step %d", res.Steps, r.State.Step)
	}
}

// TestOpenRunFromPrevious: a run directory left with checkpoint.prev and no
// checkpoint (a crash between the save's renames) opens, and resumes.
func TestOpenRunFromPrevious(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.StopAfter = 3
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(out, "checkpoint")
	if err := os.Rename(ck, ck+".prev"); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRun(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.State.Step != 3 || r.Checkpoint != ck+".prev" {
		t.Fatalf("opened step %d from %s", r.State.Step, r.Checkpoint)
	}
	if _, err := Train(context.Background(), microOptions(out)); err == nil || !strings.Contains(err.Error(), "--resume") {
		t.Fatalf("a fresh run over checkpoint.prev: %v (want a refusal that points to --resume)", err)
	}
	if _, err := os.Stat(ck + ".prev"); err != nil {
		t.Fatalf("the refused run touched checkpoint.prev: %v", err)
	}
	o = microOptions(out)
	o.Resume = true
	res, err := Train(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 6 {
		t.Fatalf("resumed to step %d", res.Steps)
	}
	if _, err := checkpoint.Load(ck); err != nil {
		t.Fatal(err)
	}
}

// TestResumeRefusesMissingParameter: a checkpoint that lacks a parameter is
// refused on --resume, naming it, instead of re-initialising it silently.
func TestResumeRefusesMissingParameter(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.StopAfter = 2
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, "checkpoint")
	ck, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kept []checkpoint.Named
	for _, w := range ck.Weights {
		if w.Name != "blocks.1.attn.Wq.weight" {
			kept = append(kept, w)
		}
	}
	ck.Weights = kept
	if err := checkpoint.Save(dir, ck); err != nil {
		t.Fatal(err)
	}
	o = microOptions(out)
	o.Resume = true
	_, err = Train(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "blocks.1.attn.Wq.weight") {
		t.Fatalf("resume with a missing parameter: %v", err)
	}
}

// TestNonFiniteStepsStopCleanly: with a learning rate that makes the loss
// NaN, the bad steps are skipped and logged, the run stops with a clear
// message after maxBadSteps in a row, and the checkpoint left behind holds
// finite weights and resumes.
func TestNonFiniteStepsStopCleanly(t *testing.T) {
	for _, kind := range []model.Kind{model.Baseline, model.Fuzzy} {
		t.Run(kind.String(), func(t *testing.T) { nonFiniteRun(t, kind) })
	}
}

func nonFiniteRun(t *testing.T, kind model.Kind) {
	out := t.TempDir()
	o := microOptions(out)
	o.Model, o.LR, o.Steps, o.EvalEvery, o.EvalBatches = kind, 1e6, 30, 1, 1
	_, err := Train(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "non-finite") || !strings.Contains(err.Error(), "--lr") {
		t.Fatalf("want a stop naming the non-finite steps and --lr, got %v", err)
	}
	b, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"skipped":true`); n != maxBadSteps {
		t.Fatalf("%d skipped-step records, want %d", n, maxBadSteps)
	}
	r, err := OpenRun(out)
	if err != nil {
		t.Fatalf("the checkpoint left behind does not open: %v", err)
	}
	if name := nonFinite(r.Store); name != "" {
		t.Fatalf("the checkpoint holds a non-finite %s", name)
	}
	if err := r.SelectWeights(WeightsLast); err != nil {
		t.Fatal(err)
	}
	r.Store.Get("ln_f.weight").F32[0] = float32(math.NaN())
	if err := r.SelectWeights(WeightsLast); err == nil || !strings.Contains(err.Error(), "ln_f.weight") {
		t.Fatalf("export accepted a NaN weight: %v", err)
	}
}

// TestResumeTruncatesMetrics: records written after the checkpoint a run
// resumes from are dropped, so every step appears once.
func TestResumeTruncatesMetrics(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.StopAfter = 3
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	// Records of steps the checkpoint does not hold (a crash after them).
	f, err := os.OpenFile(filepath.Join(out, "metrics.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"step":4,"loss":1}` + "\n" + `{"step":5,"loss":1}` + "\n")
	f.Close()
	o = microOptions(out)
	o.Resume = true
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[float64]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if s, ok := rec["step"].(float64); ok && rec["loss"] != nil {
			seen[s]++
		}
	}
	for s := 1.0; s <= 6; s++ {
		if seen[s] != 1 {
			t.Errorf("step %v has %d training records, want 1", s, seen[s])
		}
	}
}

// TestResumeRefusesOtherData: a changed --seed or --train-split on resume
// is refused, naming the flag.
func TestResumeRefusesOtherData(t *testing.T) {
	out := t.TempDir()
	o := microOptions(out)
	o.StopAfter = 2
	if _, err := Train(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o = microOptions(out)
	o.Resume, o.Seed = true, 99
	if _, err := Train(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--seed 99") {
		t.Fatalf("changed seed: %v", err)
	}
	o = microOptions(out)
	o.Resume, o.LR = true, 1e-4
	var progress bytes.Buffer
	o.Progress = &progress
	if _, err := Train(context.Background(), o); err != nil || !strings.Contains(progress.String(), "another peak LR") {
		t.Fatalf("changed LR: %v, warning shown: %v", err, strings.Contains(progress.String(), "another peak LR"))
	}
}

// runLoss is run with the loss over the given targets.
func (f *stepFixture) runLoss(t *testing.T, batch, micro int, x, y []int32, loss LossTargets) (float64, float64, map[string][]float32) {
	t.Helper()
	s, err := CompileStepLoss(&f.cfg, f.store, cpu.New(ir.FP32), f.T, batch, micro, f.cfg.Dropout, loss, nil)
	return runStepCopy(t, s, err, x, y, 1)
}

// TestAnswerLossStep: the counted-mean loss (LossAnswers) with every
// target kept is the plain loss; with the second half of the batch's rows
// ignored it is the plain loss of the first half alone (the baseline's
// rows are independent), whatever the micro-batches; and ignored targets
// spread unevenly over the micro-batches give the whole batch's mean.
func TestAnswerLossStep(t *testing.T) {
	f := newStepFixture(t, model.Baseline, 16, 8)
	near := func(what string, a, b float64, ga, gb map[string][]float32) {
		t.Helper()
		if math.Abs(a-b) > 1e-5*math.Abs(b) {
			t.Errorf("%s: %.7f, want %.7f", what, a, b)
		}
		if d := maxRelDiff(t, ga, gb); d > 2e-5 {
			t.Errorf("%s: gradients differ by %.2e (relative)", what, d)
		}
	}
	l0, c0, g0 := f.runLoss(t, 8, 8, f.x, f.y, LossAll)
	l1, c1, g1 := f.runLoss(t, 8, 8, f.x, f.y, LossAnswers)
	near("every target kept: loss", l1, l0, g1, g0)
	near("every target kept: CE", c1, c0, g1, g0)

	half := f.B / 2 * f.T
	y := append([]int32(nil), f.y...)
	for i := half; i < len(y); i++ {
		y[i] = ir.IgnoreTarget
	}
	wl, wc, wg := f.runLoss(t, 4, 4, f.x[:half], f.y[:half], LossAll)
	for _, micro := range []int{8, 4, 2} {
		l, c, g := f.runLoss(t, 8, micro, f.x, y, LossAnswers)
		near(fmt.Sprintf("half ignored, micro %d: loss", micro), l, wl, g, wg)
		near(fmt.Sprintf("half ignored, micro %d: CE", micro), c, wc, g, wg)
	}

	for i := range y { // every other target of rows 1..7 ignored, row 0 whole
		y[i] = f.y[i]
		if i >= f.T && i%2 == 1 {
			y[i] = ir.IgnoreTarget
		}
	}
	l8, c8, g8 := f.runLoss(t, 8, 8, f.x, y, LossAnswers)
	l2, c2, g2 := f.runLoss(t, 8, 2, f.x, y, LossAnswers)
	near("uneven: loss", l2, l8, g2, g8)
	near("uneven: CE", c2, c8, g2, g8)
	if math.Abs(l8-l0) < 1e-6 {
		t.Errorf("ignoring targets left the loss at %g", l8)
	}
}
