package training

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/training/data"
)

// Stage is one step of the paper's stepwise ablation path (Table "Stepwise
// ablation path (WT2)"). Each stage adds components to the previous one.
type Stage struct {
	Name  string // directory name
	Label string // table row
	// Weights the stage reports: WeightsLast (raw), WeightsEMA or
	// WeightsSWA (falling back to EMA, then raw, when SWA-select chose no
	// epoch).
	Weights WeightSet
	apply   func(o *Options, contexts []int)
}

// AblationStages are the paper's four stages under equal compute (same
// steps, same tokens per step):
//
//  1. baseline: the fuzzy model with the listing's legacy bias (no RPA
//     alignment), one context, no controller, no EMA/SWA, no chaos or glide,
//     warmup + cosine decay to zero (no flat prelude, no LR floor);
//  2. + context game + Sinkhorn alignment;
//  3. + Guardian and the late-phase schedules: flat prelude + cosine to a
//     10% LR floor, EMA (reported), chaos warm-in, dropout glide;
//  4. + SWA-select (reported: the SWA average).
func AblationStages() []Stage {
	zero := 0.0
	base := func(o *Options, _ []int) {
		o.NoAlign = true
		o.Control = Controls{LRFlat: &zero, LRFloor: &zero}
	}
	cg := func(o *Options, c []int) {
		base(o, c)
		o.NoAlign = false
		o.Control.Contexts = c
	}
	late := func(o *Options, c []int) {
		cg(o, c)
		o.Control.Controller = "guardian"
		o.Control.LRFlat, o.Control.LRFloor = nil, nil
		o.Control.EMA, o.Control.Chaos, o.Control.DropoutGlide = true, true, true
	}
	swa := func(o *Options, c []int) {
		late(o, c)
		o.Control.SWA = true
	}
	return []Stage{
		{Name: "baseline", Label: "Baseline (no RPA/Guardian/SWA/Context)", Weights: WeightsLast, apply: base},
		{Name: "cg_align", Label: "+ Context game + Sinkhorn align", Weights: WeightsLast, apply: cg},
		{Name: "guardian_late", Label: "+ Guardian + late-phase schedules (no SWA-select)", Weights: WeightsEMA, apply: late},
		{Name: "swa_select", Label: "+ SWA-select (Final)", Weights: WeightsSWA, apply: swa},
	}
}

// ComparisonStages isolate the attention prior, selectable with --stages
// (not part of the default path): the same schedule as the "baseline"
// stage (one context, no controllers, cosine to zero) for
//
//   - transformer: the plain pre-LN transformer (model baseline, same
//     active FFN width),
//   - fuzzy_legacy: the fuzzy model with the listing's legacy bias,
//   - fuzzy_rpa: the fuzzy model with the RPA (Sinkhorn-aligned) prior.
//
// On the synthetic corpus they measure the long-span recall claim.
func ComparisonStages() []Stage {
	zero := 0.0
	plain := func(kind model.Kind, noAlign bool) func(o *Options, _ []int) {
		return func(o *Options, _ []int) {
			o.Model, o.NoAlign = kind, noAlign
			o.Control = Controls{LRFlat: &zero, LRFloor: &zero}
		}
	}
	return []Stage{
		{Name: "transformer", Label: "Transformer (no fuzzy gating, no prior)", Weights: WeightsLast, apply: plain(model.Baseline, false)},
		{Name: "fuzzy_legacy", Label: "Fuzzy, legacy bias (no RPA alignment)", Weights: WeightsLast, apply: plain(model.Fuzzy, true)},
		{Name: "fuzzy_rpa", Label: "Fuzzy + RPA prior (Sinkhorn-aligned)", Weights: WeightsLast, apply: plain(model.Fuzzy, false)},
	}
}

// AblationOptions configure Ablate.
type AblationOptions struct {
	// Base holds what every run shares: preset, data, steps, tokens per
	// step, evaluation. Base.Out is the ablation's directory; each run goes
	// to Out/<stage>/seed<k>. Base.Control and Base.NoAlign are set per stage.
	Base     Options
	Seeds    int      // runs per stage (seeds FirstSeed, FirstSeed+1, …)
	Contexts []int    // the context game's lengths (nil: DefaultGameContexts)
	Stages   []string // subset of stage names (nil: all)
	// LRFlat and LRFloor, when set, replace every stage's schedule: the
	// fraction of steps at the peak LR before the cosine, and the floor as
	// a fraction of the peak (nil: each stage's own).
	LRFlat, LRFloor *float64
	// KeepCheckpoints keeps each run's checkpoint (about 140 MB for tiny).
	KeepCheckpoints bool
	// AtLengths, when set, scores every run at other context lengths once
	// it is trained (before its checkpoint goes): rpac ablate
	// --eval-lengths, through the folded export (app/lengtheval).
	AtLengths *LengthEval
	// Log receives the events of the ablation and its runs (nil: one
	// human-readable line each on Progress, which is nil for stderr).
	Log      *slog.Logger
	Progress io.Writer
}

// RunResult is one finished run of the ablation (also its result.json).
type RunResult struct {
	Stage    string    `json:"stage"`
	Seed     uint64    `json:"seed"`
	Weights  WeightSet `json:"weights"` // the weights reported
	ValCE    float64   `json:"val_ce"`  // of the reported weights
	RawCE    float64   `json:"raw_ce"`
	EMACE    *float64  `json:"ema_ce,omitempty"`
	SWACE    *float64  `json:"swa_ce,omitempty"`
	Members  []int     `json:"swa_members,omitempty"`
	Params   int       `json:"params"`
	Steps    int       `json:"steps"`
	Tokens   int64     `json:"tokens"`
	Seconds  float64   `json:"seconds"`
	Contexts []int     `json:"contexts"`
	// Recall is the final evaluation's recall accuracy at the synthetic
	// corpus's answer positions (raw weights), and RecallN its count.
	Recall  *float64 `json:"recall_acc,omitempty"`
	RecallN int      `json:"recall_n,omitempty"`
	// RecallByDist is the final evaluation's recall by query distance (the
	// MQAR corpus).
	RecallByDist []data.RecallBucket `json:"recall_by_dist,omitempty"`
	// AtLengths: the run's CE at each length of AblationOptions.AtLengths.
	AtLengths []LengthCE `json:"length_ce,omitempty"`
	// Setup describes the options the run was trained with (runSetup); a
	// finished run is reused only under the same setup.
	Setup string `json:"setup"`
}

// LengthCE is a trained run's mean cross-entropy over Tokens tokens of its
// evaluation split, cut into chunks of T tokens (the MQAR corpus: of
// sequences of T tokens), and, where the text has answers, its recall at
// them (RecallN answers).
type LengthCE struct {
	T       int      `json:"T"`
	CE      float64  `json:"ce"`
	Tokens  int      `json:"tokens"`
	Recall  *float64 `json:"recall_acc,omitempty"`
	RecallN int      `json:"recall_n,omitempty"`
}

// LengthEval scores a finished run at other lengths than it trained at.
type LengthEval struct {
	Lengths []int
	// Score evaluates the run in dir (its checkpoint/ still there) under
	// the weights it reports (last, ema or swa) at every length.
	Score func(ctx context.Context, dir string, weights WeightSet) ([]LengthCE, error)
}

// ceAt is the run's CE at length T (ok false: not scored there).
func (r RunResult) ceAt(T int) (float64, bool) {
	for _, l := range r.AtLengths {
		if l.T == T {
			return l.CE, true
		}
	}
	return 0, false
}

// recallAt is the run's recall at length T (ok false: none there).
func (r RunResult) recallAt(T int) (float64, bool) {
	for _, l := range r.AtLengths {
		if l.T == T && l.Recall != nil {
			return *l.Recall, true
		}
	}
	return 0, false
}

// scoredAt reports whether the run has a CE at every length.
func (r RunResult) scoredAt(lengths []int) bool {
	for _, T := range lengths {
		if _, ok := r.ceAt(T); !ok {
			return false
		}
	}
	return true
}

// runSetup is the part of a run's options that decides its result (what
// is trained, on what, for how long, how, and where), as JSON.
func runSetup(o Options) string {
	b, _ := json.Marshal(struct {
		Preset                                                string
		Model                                                 model.Kind
		Dataset, TrainSplit, EvalSplit                        string
		Synthetic                                             data.SyntheticConfig
		MQAR                                                  data.MQARConfig
		Context, TokensPerStep, Steps, EvalEvery, EvalBatches int
		FinalEvalBatches, WarmIn                              int
		LR, Dropout, GradClip                                 float64
		NoAlign, HostOptimizer                                bool
		Control                                               Controls
		Device                                                string
		Precision                                             string
		Loss                                                  LossTargets
		ConfigFile                                            string
		Sizes                                                 model.Overrides
	}{o.Preset, o.Model, o.Dataset, o.TrainSplit, o.EvalSplit, o.Synthetic, o.MQAR, o.Context, o.TokensPerStep, o.Steps,
		o.EvalEvery, o.EvalBatches, o.FinalEvalBatches, o.WarmIn, o.LR, o.Dropout, o.GradClip, o.NoAlign, o.HostOptimizer,
		o.Control, o.Device.String(), o.Precision.String(), o.Loss, o.ConfigFile, o.Sizes})
	return string(b)
}

// setupDiff names the fields in which two runSetup texts differ.
func setupDiff(old, now string) string {
	var a, b map[string]any
	if json.Unmarshal([]byte(old), &a) != nil {
		return "settings not recorded"
	}
	_ = json.Unmarshal([]byte(now), &b)
	var diff []string
	for k, v := range b {
		if fmt.Sprint(a[k]) != fmt.Sprint(v) {
			diff = append(diff, fmt.Sprintf("%s %v, now %v", k, a[k], v))
		}
	}
	slices.Sort(diff)
	return strings.Join(diff, "; ")
}

// StageResult gathers a stage's runs.
type StageResult struct {
	Stage Stage
	Runs  []RunResult
}

// Ablate runs the stages for every seed (skipping runs whose result.json is
// already there, so an interrupted ablation continues) and returns the
// results in stage order.
func Ablate(ctx context.Context, ao AblationOptions) ([]StageResult, error) {
	if ao.Seeds < 1 {
		return nil, fmt.Errorf("--seeds %d: want at least 1", ao.Seeds)
	}
	if ao.Base.Out == "" {
		return nil, errors.New("--out is required: the directory for the ablation's runs and tables")
	}
	if ao.Progress == nil {
		ao.Progress = os.Stderr
	}
	if ao.Log == nil {
		ao.Log = logging.New(ao.Progress, logging.Text, slog.LevelInfo)
	}
	stages := AblationStages()
	if len(ao.Stages) > 0 {
		all := append(slices.Clone(stages), ComparisonStages()...)
		var sel []Stage
		for _, n := range ao.Stages {
			i := slices.IndexFunc(all, func(s Stage) bool { return s.Name == n })
			if i < 0 {
				var names []string
				for _, s := range all {
					names = append(names, s.Name)
				}
				return nil, fmt.Errorf("unknown stage %q (choose from %s)", n, strings.Join(names, ", "))
			}
			sel = append(sel, all[i])
		}
		stages = sel
	}
	contexts := ao.Contexts
	if len(contexts) == 0 {
		contexts = DefaultGameContexts(ao.Base.Preset, ao.Base.Context)
	}
	if len(contexts) < 2 {
		return nil, fmt.Errorf("the context game needs at least two lengths, got %v", contexts)
	}
	if ao.Base.Context == 0 {
		ao.Base.Context = slices.Max(contexts) // every stage evaluates at the same length
	}
	seed0 := ao.Base.Seed
	if seed0 == 0 {
		seed0 = 1
	}
	// Seed by seed, every stage: an interrupted ablation leaves complete
	// pairs.
	out := make([]StageResult, len(stages))
	for k := 0; k < ao.Seeds; k++ {
		for i, st := range stages {
			out[i].Stage = st
			rr, err := ablationRun(ctx, ao, st, seed0+uint64(k), contexts)
			if err != nil {
				return nil, err
			}
			out[i].Runs = append(out[i].Runs, rr)
		}
	}
	return out, nil
}

// ablationRun trains stage st with seed (or reuses its finished run, made
// with the same settings) and returns its result, also written to the
// run's result.json.
func ablationRun(ctx context.Context, ao AblationOptions, st Stage, seed uint64, contexts []int) (RunResult, error) {
	dir := filepath.Join(ao.Base.Out, st.Name, fmt.Sprintf("seed%d", seed))
	o := ao.Base
	o.Out, o.Seed, o.Resume = dir, seed, false
	o.Progress, o.Log = ao.Progress, ao.Log
	o.SaveFinalOnly = true
	st.apply(&o, contexts)
	if ao.LRFlat != nil {
		o.Control.LRFlat = ao.LRFlat
	}
	if ao.LRFloor != nil {
		o.Control.LRFloor = ao.LRFloor
	}
	setup := runSetup(o)
	if rr, err := readRunResult(dir); err == nil {
		if rr.Setup != setup {
			return RunResult{}, fmt.Errorf("%s holds a finished run made with other settings (%s): give another --out, or remove it to run again",
				dir, setupDiff(rr.Setup, setup))
		}
		logging.Info(ao.Log, AblationReuseEvent{Stage: st.Name, Seed: seed, CE: rr.ValCE})
		if ao.AtLengths == nil || rr.scoredAt(ao.AtLengths.Lengths) {
			return *rr, nil
		}
		return scoreLengths(ctx, ao, dir, *rr)
	}
	if _, err := os.Stat(dir); err == nil {
		if err := os.RemoveAll(dir); err != nil { // an unfinished run: start it again
			return RunResult{}, err
		}
	}
	logging.Info(ao.Log, AblationRunEvent{Stage: st.Name, Label: st.Label, Seed: seed, Dir: dir})
	t0 := time.Now()
	res, err := Train(ctx, o)
	if err != nil {
		return RunResult{}, fmt.Errorf("ablation stage %s, seed %d: %w", st.Name, seed, err)
	}
	rr := newRunResult(st, seed, setup, res, o, time.Since(t0))
	if err := writeRunResult(dir, rr); err != nil {
		return RunResult{}, err
	}
	if ao.AtLengths != nil {
		if rr, err = scoreLengths(ctx, ao, dir, rr); err != nil {
			return RunResult{}, err
		}
	}
	if !ao.KeepCheckpoints {
		if err := os.RemoveAll(filepath.Join(dir, "checkpoint")); err != nil {
			return RunResult{}, err
		}
	}
	return rr, nil
}

// scoreLengths adds the run's CE at ao.AtLengths' lengths to rr and
// rewrites its result.json. A run whose checkpoint is gone (an ablation
// without --eval-lengths, not keeping checkpoints) cannot be scored.
func scoreLengths(ctx context.Context, ao AblationOptions, dir string, rr RunResult) (RunResult, error) {
	if _, err := os.Stat(filepath.Join(dir, "checkpoint")); err != nil {
		return RunResult{}, fmt.Errorf("%s: a finished run without a checkpoint cannot be scored at lengths %v: give another --out, or remove it to run again",
			dir, ao.AtLengths.Lengths)
	}
	at, err := ao.AtLengths.Score(ctx, dir, rr.Weights)
	if err != nil {
		return RunResult{}, fmt.Errorf("ablation stage %s, seed %d, scoring at lengths %v: %w", rr.Stage, rr.Seed, ao.AtLengths.Lengths, err)
	}
	rr.AtLengths = at
	return rr, writeRunResult(dir, rr)
}

func writeRunResult(dir string, rr RunResult) error {
	b, _ := json.MarshalIndent(rr, "", "  ")
	return os.WriteFile(filepath.Join(dir, "result.json"), b, 0o644)
}

// newRunResult is a finished run's result: its figures and the weights
// the stage reports (SWA, else EMA, where the stage asks and they exist).
func newRunResult(st Stage, seed uint64, setup string, res *Result, o Options, took time.Duration) RunResult {
	rr := RunResult{Stage: st.Name, Seed: seed, Setup: setup, RawCE: res.FinalValCE, Params: res.Params, Steps: res.Steps,
		Tokens: res.Tokens, Seconds: took.Seconds(), Members: res.SWAMembers, Contexts: o.Control.Contexts}
	if len(rr.Contexts) == 0 {
		rr.Contexts = []int{o.Context}
	}
	if !math.IsNaN(res.FinalRecall) {
		v := res.FinalRecall
		rr.Recall, rr.RecallN, rr.RecallByDist = &v, res.FinalRecallN, res.FinalRecallByDist
	}
	if !math.IsNaN(res.FinalEMACE) {
		v := res.FinalEMACE
		rr.EMACE = &v
	}
	if !math.IsNaN(res.FinalSWACE) {
		v := res.FinalSWACE
		rr.SWACE = &v
	}
	rr.Weights, rr.ValCE = WeightsLast, rr.RawCE
	switch {
	case st.Weights == WeightsSWA && rr.SWACE != nil:
		rr.Weights, rr.ValCE = WeightsSWA, *rr.SWACE
	case (st.Weights == WeightsSWA || st.Weights == WeightsEMA) && rr.EMACE != nil:
		rr.Weights, rr.ValCE = WeightsEMA, *rr.EMACE
	}
	return rr
}

func readRunResult(dir string) (*RunResult, error) {
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		return nil, err
	}
	var rr RunResult
	if err := json.Unmarshal(b, &rr); err != nil {
		return nil, err
	}
	return &rr, nil
}

// MeanStd is the mean and the sample standard deviation (n−1; NaN for n < 2).
func MeanStd(x []float64) (mean, std float64) {
	if len(x) == 0 {
		return math.NaN(), math.NaN()
	}
	for _, v := range x {
		mean += v
	}
	mean /= float64(len(x))
	if len(x) < 2 {
		return mean, math.NaN()
	}
	for _, v := range x {
		std += (v - mean) * (v - mean)
	}
	return mean, math.Sqrt(std / float64(len(x)-1))
}

func pm(mean, std float64, prec int) string {
	if math.IsNaN(mean) {
		return "—"
	}
	if math.IsNaN(std) {
		return fmt.Sprintf("%.*f", prec, mean)
	}
	return fmt.Sprintf("%.*f ± %.*f", prec, mean, prec, std)
}

// AblationRow is one stage's summary.
type AblationRow struct {
	Stage, Label, Weights             string
	Params                            int
	Steps                             int
	Tokens                            int64
	Seeds                             int
	CE, CEStd, PPL, PPLStd            float64
	RawCE, RawStd                     float64
	EMACE, EMAStd, SWACE, SWAStd      float64
	DeltaBase, DeltaPrev, MeanSeconds float64
	// PairedBase, PairedPrev: this stage's CE minus the first's and the
	// previous stage's, seed by seed (the same data order per seed), with
	// a 95% interval.
	PairedBase, PairedPrev PairedDiff
	// RecallVsBase: this stage's final recall minus the first stage's, seed
	// by seed, with a 95% interval (N 0 without recall figures).
	RecallVsBase      PairedDiff
	Members           float64 // mean SWA members per run
	Contexts          []int
	Recall, RecallStd float64 // NaN without recall figures
	RecallN           int     // answers per run
}

// Summarize turns stage results into table rows (Δ against the first and
// the previous stage's mean CE).
func Summarize(rs []StageResult) []AblationRow {
	var rows []AblationRow
	for i, sr := range rs {
		var ce, ppl, raw, ema, swa, secs, rec []float64
		var members int
		r := AblationRow{Stage: sr.Stage.Name, Label: sr.Stage.Label, Seeds: len(sr.Runs)}
		var ws []string
		for _, run := range sr.Runs {
			ce = append(ce, run.ValCE)
			ppl = append(ppl, math.Exp(run.ValCE))
			raw = append(raw, run.RawCE)
			if run.EMACE != nil {
				ema = append(ema, *run.EMACE)
			}
			if run.SWACE != nil {
				swa = append(swa, *run.SWACE)
			}
			secs = append(secs, run.Seconds)
			if run.Recall != nil {
				rec = append(rec, *run.Recall)
				r.RecallN = run.RecallN
			}
			members += len(run.Members)
			r.Params, r.Steps, r.Tokens, r.Contexts = run.Params, run.Steps, run.Tokens, run.Contexts
			if w := run.Weights.String(); !slices.Contains(ws, w) {
				ws = append(ws, w)
			}
		}
		r.Weights = strings.Join(ws, "/")
		r.CE, r.CEStd = MeanStd(ce)
		r.PPL, r.PPLStd = MeanStd(ppl)
		r.RawCE, r.RawStd = MeanStd(raw)
		r.EMACE, r.EMAStd = MeanStd(ema)
		r.SWACE, r.SWAStd = MeanStd(swa)
		r.MeanSeconds, _ = MeanStd(secs)
		r.Recall, r.RecallStd = MeanStd(rec)
		r.Members = float64(members) / math.Max(1, float64(len(sr.Runs)))
		r.DeltaBase, r.DeltaPrev = math.NaN(), math.NaN()
		none := PairedDiff{Mean: math.NaN(), Half: math.NaN()}
		r.PairedBase, r.PairedPrev, r.RecallVsBase = none, none, none
		if i > 0 {
			r.DeltaBase = r.CE - rows[0].CE
			r.DeltaPrev = r.CE - rows[i-1].CE
			r.PairedBase = Paired(sr.Runs, rs[0].Runs)
			r.PairedPrev = Paired(sr.Runs, rs[i-1].Runs)
			r.RecallVsBase = PairedBy(sr.Runs, rs[0].Runs, func(x RunResult) (float64, bool) {
				if x.Recall == nil {
					return 0, false
				}
				return *x.Recall, true
			})
		} else {
			r.DeltaBase = 0
		}
		rows = append(rows, r)
	}
	return rows
}

// PairedDiff is the mean of paired differences over N seeds and the half
// width of its 95% interval (Student's t with N−1 degrees of freedom; NaN
// below two pairs).
type PairedDiff struct {
	Mean, Half float64
	N          int
}

// Paired compares the reported CE of runs a and b seed by seed (the seeds
// both have): mean a − b and its 95% interval.
func Paired(a, b []RunResult) PairedDiff {
	return PairedBy(a, b, func(r RunResult) (float64, bool) { return r.ValCE, true })
}

// PairedBy is Paired for the figure f reads off a run (ok false: the run
// has none, and its seed is left out).
func PairedBy(a, b []RunResult, f func(RunResult) (float64, bool)) PairedDiff {
	bySeed := map[uint64]float64{}
	for _, r := range b {
		if v, ok := f(r); ok {
			bySeed[r.Seed] = v
		}
	}
	var d []float64
	for _, r := range a {
		x, ok := f(r)
		if v, okb := bySeed[r.Seed]; ok && okb {
			d = append(d, x-v)
		}
	}
	pd := PairedDiff{Mean: math.NaN(), Half: math.NaN(), N: len(d)}
	if len(d) == 0 {
		return pd
	}
	mean, std := MeanStd(d)
	pd.Mean = mean
	if len(d) > 1 {
		t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(len(d) - 1)}.Quantile(0.975)
		pd.Half = t * std / math.Sqrt(float64(len(d)))
	}
	return pd
}

// String is "+0.012 ± 0.008 (n 5)", without the interval below two pairs.
func (p PairedDiff) String() string {
	switch {
	case math.IsNaN(p.Mean):
		return "—"
	case math.IsNaN(p.Half):
		return fmt.Sprintf("%+.3f (n %d)", p.Mean, p.N)
	}
	return fmt.Sprintf("%+.3f ± %.3f (n %d)", p.Mean, p.Half, p.N)
}

func signed(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%+.3f", x)
}

func ints(x []int) string {
	s := make([]string, len(x))
	for i, v := range x {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, "+")
}

// AblationTable renders the rows as a Markdown table.
func AblationTable(rows []AblationRow) string {
	var b strings.Builder
	recall := slices.ContainsFunc(rows, func(r AblationRow) bool { return !math.IsNaN(r.Recall) })
	b.WriteString("| Stage | Params | Steps | Tokens | Contexts | Weights | Val CE ↓ | PPL ↓ | Δ vs base (paired, 95% CI) | Δ from prev (paired, 95% CI) | raw CE | EMA CE | SWA CE | SWA members | s/run |")
	if recall {
		b.WriteString(" Recall ↑ (raw) | Recall Δ vs base (paired, 95% CI) | answers |")
	}
	b.WriteString("\n| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	if recall {
		b.WriteString(" ---: | ---: | ---: |")
	}
	b.WriteString("\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %.0f |",
			r.Label, r.Params, r.Steps, r.Tokens, ints(r.Contexts), r.Weights, pm(r.CE, r.CEStd, 3), pm(r.PPL, r.PPLStd, 1),
			deltaText(r.DeltaBase, r.PairedBase), deltaText(r.DeltaPrev, r.PairedPrev), pm(r.RawCE, r.RawStd, 3), pm(r.EMACE, r.EMAStd, 3),
			pm(r.SWACE, r.SWAStd, 3), r.Members, r.MeanSeconds)
		if recall {
			fmt.Fprintf(&b, " %s | %s | %d |", pm(r.Recall, r.RecallStd, 3), r.RecallVsBase, r.RecallN)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// deltaText is the paired difference where there is one, else the
// difference of the means (the first stage: +0.000).
func deltaText(delta float64, p PairedDiff) string {
	if p.N > 0 {
		return p.String()
	}
	return signed(delta)
}

// AblationCSV renders the rows as CSV (one line per stage).
func AblationCSV(rows []AblationRow) string {
	var b strings.Builder
	b.WriteString("stage,label,params,steps,tokens,contexts,seeds,weights,val_ce_mean,val_ce_std,ppl_mean,ppl_std,delta_vs_base,delta_from_prev,raw_ce_mean,raw_ce_std,ema_ce_mean,ema_ce_std,swa_ce_mean,swa_ce_std,swa_members_mean,seconds_mean,recall_mean,recall_std,paired_base_mean,paired_base_ci95,paired_prev_mean,paired_prev_ci95,paired_n\n")
	f := func(x float64) string {
		if math.IsNaN(x) {
			return ""
		}
		return fmt.Sprintf("%.6g", x)
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "%s,%q,%d,%d,%d,%s,%d,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%d\n",
			r.Stage, r.Label, r.Params, r.Steps, r.Tokens, ints(r.Contexts), r.Seeds, r.Weights, f(r.CE), f(r.CEStd), f(r.PPL), f(r.PPLStd),
			f(r.DeltaBase), f(r.DeltaPrev), f(r.RawCE), f(r.RawStd), f(r.EMACE), f(r.EMAStd), f(r.SWACE), f(r.SWAStd), f(r.Members), f(r.MeanSeconds), f(r.Recall), f(r.RecallStd),
			f(r.PairedBase.Mean), f(r.PairedBase.Half), f(r.PairedPrev.Mean), f(r.PairedPrev.Half), r.PairedPrev.N)
	}
	return b.String()
}

// RecallByDistanceTable is a Markdown table of the final evaluation's
// recall per stage and query-distance bucket: mean ± std over the seeds
// and, after the first stage, the paired difference from the first stage
// with its 95% interval; "" when no run recorded recall by distance.
func RecallByDistanceTable(rs []StageResult) string {
	var buckets []data.RecallBucket
	for _, sr := range rs {
		for _, r := range sr.Runs {
			if len(r.RecallByDist) > len(buckets) {
				buckets = r.RecallByDist
			}
		}
	}
	var cols []int // the buckets some run has answers in
	for j := range buckets {
		if slices.ContainsFunc(rs, func(sr StageResult) bool {
			return slices.ContainsFunc(sr.Runs, func(r RunResult) bool { return j < len(r.RecallByDist) && r.RecallByDist[j].Total > 0 })
		}) {
			cols = append(cols, j)
		}
	}
	if len(cols) == 0 {
		return ""
	}
	heads := make([]string, len(cols))
	for k, j := range cols {
		heads[k] = fmt.Sprintf("distance [%d,%d)", buckets[j].Lo, buckets[j].Hi)
	}
	return seedTable(rs, heads, func(k int) func(RunResult) (float64, bool) {
		j := cols[k]
		return func(r RunResult) (float64, bool) {
			if j >= len(r.RecallByDist) || r.RecallByDist[j].Total == 0 {
				return 0, false
			}
			return float64(r.RecallByDist[j].Correct) / float64(r.RecallByDist[j].Total), true
		}
	})
}

// seedTable is a Markdown table with a row per stage and a column per
// heading: the figure at(k) reads off each run (ok false: the run has
// none), as mean ± std over the seeds and, after the first stage, the
// paired difference from the first stage with its 95% interval.
func seedTable(rs []StageResult, heads []string, at func(k int) func(RunResult) (float64, bool)) string {
	var b strings.Builder
	b.WriteString("| Stage |")
	for _, h := range heads {
		fmt.Fprintf(&b, " %s |", h)
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(heads)) + "\n")
	for i, sr := range rs {
		fmt.Fprintf(&b, "| %s |", sr.Stage.Label)
		for k := range heads {
			f := at(k)
			var x []float64
			for _, r := range sr.Runs {
				if v, ok := f(r); ok {
					x = append(x, v)
				}
			}
			mean, std := MeanStd(x)
			cell := pm(mean, std, 3)
			if i > 0 {
				cell += "; Δ " + PairedBy(sr.Runs, rs[0].Runs, f).String()
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// LengthTable is two Markdown tables (rpac ablate --eval-lengths): every
// stage's CE at each length of lengths, and, from the second length on, its
// rise over the CE at the first (what a longer context costs a model
// trained at the first length): mean ± std over the seeds and, after the
// first stage, the paired difference from the first stage with its 95%
// interval; "" when no run was scored at a length. Runs with recall at the
// lengths (the MQAR corpus) get a third table, of recall.
func LengthTable(rs []StageResult, lengths []int) string {
	if !slices.ContainsFunc(rs, func(sr StageResult) bool {
		return slices.ContainsFunc(sr.Runs, func(r RunResult) bool { return len(r.AtLengths) > 0 })
	}) {
		return ""
	}
	heads := make([]string, len(lengths))
	for k, T := range lengths {
		heads[k] = fmt.Sprintf("CE at T = %d ↓", T)
	}
	at := seedTable(rs, heads, func(k int) func(RunResult) (float64, bool) {
		return func(r RunResult) (float64, bool) { return r.ceAt(lengths[k]) }
	})
	if len(lengths) >= 2 {
		rise := make([]string, len(lengths)-1)
		for k, T := range lengths[1:] {
			rise[k] = fmt.Sprintf("CE at %d − CE at %d ↓", T, lengths[0])
		}
		at += "\n" + seedTable(rs, rise, func(k int) func(RunResult) (float64, bool) {
			return func(r RunResult) (float64, bool) {
				a, okA := r.ceAt(lengths[k+1])
				b, okB := r.ceAt(lengths[0])
				return a - b, okA && okB
			}
		})
	}
	if !slices.ContainsFunc(rs, func(sr StageResult) bool {
		return slices.ContainsFunc(sr.Runs, func(r RunResult) bool { _, ok := r.recallAt(lengths[0]); return ok })
	}) {
		return at
	}
	rec := make([]string, len(lengths))
	for k, T := range lengths {
		rec[k] = fmt.Sprintf("recall at T = %d ↑", T)
	}
	return at + "\n" + seedTable(rs, rec, func(k int) func(RunResult) (float64, bool) {
		return func(r RunResult) (float64, bool) { return r.recallAt(lengths[k]) }
	})
}

// WriteAblation writes ablation.md (header lines, the table, then each
// extra section that is not empty) and ablation.csv into dir and returns
// the Markdown table.
func WriteAblation(dir string, header []string, rows []AblationRow, extra ...string) (string, error) {
	table := AblationTable(rows)
	md := "# Stepwise ablation\n\n"
	for _, h := range header {
		md += h + "\n"
	}
	md += "\n" + table
	for _, e := range extra {
		if e != "" {
			md += "\n" + e
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ablation.md"), []byte(md), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "ablation.csv"), []byte(AblationCSV(rows)), 0o644); err != nil {
		return "", err
	}
	return table, nil
}
