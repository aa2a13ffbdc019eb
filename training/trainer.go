// Package training drives rpac's training runs: data → compiled step →
// AdamW → running statistics → controllers (training/control) → evaluation
// → checkpoints and metrics.
//
// The paper's training method is assembled here, each part switchable
// (Options.Control): EMA of the weights (evaluated beside the raw weights),
// SWA-select, Guardian or the scripted τ schedule of Algorithm 1, the context
// game over context lengths, the chaos controller, dropout glide, bias
// warm-in and the LR floor schedule. Controllers act between steps on the
// parameter store; none of them is part of a graph.
//
// An "epoch" of the controllers is one evaluation interval (--eval-every
// steps): at each evaluation SWA-select decides on the epoch that just
// ended, Guardian receives its reward and acts, and the diagnostics of the
// epoch (membership entropy, saturation fraction, expert usage, averaged over
// its training steps) go to metrics.jsonl. The context game updates its
// distribution every GameEvery steps (default: the same interval).
//
// The pieces: setup.go resolves Options into a Plan (model, lengths,
// batches and micro-batches within a memory budget, schedule); step.go is
// the compiled step; eval.go the evaluation; controllers.go the
// controllers' hooks; rundir.go reads run directories; this file holds the
// loop.
package training

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/rpac-dev/rpac/training/metrics"
	"github.com/rpac-dev/rpac/training/optim"
)

// Result summarises a finished run.
type Result struct {
	// Steps is the step the run reached; Ran how many of them this call
	// trained (0 when a finished run is resumed).
	Steps      int
	Ran        int
	FinalValCE float64 // raw weights (a resumed run starts from its last evaluation's; NaN when none)
	FinalEMACE float64 // NaN without EMA
	FinalSWACE float64 // NaN without SWA members
	SWAMembers []int
	// InitialLoss and FinalLoss are the train CE of this invocation's
	// first and last steps (NaN when it ran none).
	InitialLoss float64
	FinalLoss   float64
	// FinalRecall is the last evaluation's recall accuracy on the synthetic
	// corpus's answer positions (NaN for other data).
	FinalRecall  float64
	FinalRecallN int
	// FinalRecallByDist is the last evaluation's recall by query distance
	// (the MQAR corpus; nil for other data).
	FinalRecallByDist []data.RecallBucket
	TokensPerS        float64
	Params            int
	Tokens            int64
	Out               string
	Plan              *Plan
}

const runningMomentum = 0.05

// Train runs (or resumes) a training run: the loop of the paper's method.
// Each step: the controllers set context, dropout, warm-in × chaos and τ;
// the step runs forward and backward over its micro-batches; the gradient
// is clipped and AdamW steps at the scheduled LR; running statistics and
// EMA follow. Each interval: evaluate, let the controllers learn, save.
func Train(ctx context.Context, o Options) (*Result, error) {
	r, err := newRun(ctx, o)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if o.InitOnly {
		return r.finish(r.save())
	}
	start := r.st.Step
	for r.st.Step < r.plan.Steps {
		if err := ctx.Err(); err != nil {
			return nil, r.interrupted()
		}
		if o.StopAfter > 0 && r.st.Step-start >= o.StopAfter {
			break
		}
		set := r.ctl.beforeStep(r.st.Step)
		out, err := r.runStep(set)
		if err != nil {
			return nil, err
		}
		gnorm, err := r.state.clip(out, r.plan.GradClip)
		if err != nil {
			return nil, err
		}
		if !finite(out.Loss) || !finite(gnorm) {
			if err := r.skipStep(set, out, gnorm); err != nil {
				return nil, err
			}
			continue
		}
		r.badRun = 0
		lr := r.plan.Schedule.LR(r.st.Step) * set.Chaos
		if err := r.state.step(out, lr); err != nil {
			return nil, err
		}
		r.updateRunning(out)
		if err := r.state.updateEMA(r.ctl.cs); err != nil {
			return nil, err
		}
		r.ctl.afterStep(set.Context, out)
		if err := r.logStep(set, out, gnorm, lr); err != nil {
			return nil, err
		}
		r.ctl.gameUpdate(r.st.Step)
		if r.intervalEnds() {
			if err := r.evaluate(lr); err != nil {
				return nil, err
			}
			if !o.SaveFinalOnly || r.st.Step == r.plan.Steps {
				if err := r.save(); err != nil {
					return nil, err
				}
			}
		}
	}
	r.progress.Finish()
	if r.st.Step < r.plan.Steps { // stopped early by StopAfter
		return r.finish(r.save())
	}
	return r.finish(nil)
}

// run is the state of a training run in progress.
type run struct {
	o        Options
	plan     *Plan
	ds       *Dataset
	st       *RunState
	store    *kernels.Store
	backend  kernels.Backend
	opt      *optim.AdamW // the host optimizer (its state moves to state)
	state    optState     // where the weights and moments are updated
	w        *weightSets
	ctl      *controllers
	batchers []*data.TrainBatcher
	steps    map[stepKey]*Step
	eval     *evaluator
	metrics  *metrics.Writer
	progress *metrics.Progress
	res      *Result
	ckDir    string
	started  time.Time
	tokens0  int64
	dumped   bool
	badRun   int // consecutive skipped steps
	lock     *runLock
	step0    int  // the step the run started (or resumed) at
	job      *job // the other ranks of a data-parallel job (nil: one rank)
}

// maxBadSteps is how many steps in a row may have a non-finite loss or
// gradient norm before the run stops.
const maxBadSteps = 3

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// skipStep leaves the weights, optimizer and statistics as they were after
// a step whose loss or gradient norm is not finite: the step is counted and
// logged, and after maxBadSteps in a row the run stops (the last checkpoint
// is kept: no checkpoint is ever written with non-finite weights).
func (r *run) skipStep(set stepSettings, out *StepResult, gnorm float64) error {
	r.badRun++
	r.st.SkippedSteps++
	r.st.Step++
	l := r.plan.Lengths[set.Context]
	r.st.Tokens += int64(l.Batch * l.T)
	rec := metrics.Record{Step: r.st.Step, Skipped: true, Loss: metrics.N(out.Loss), GradNorm: metrics.N(gnorm),
		SkippedTotal: r.st.SkippedSteps, Context: l.T}
	if err := r.metrics.Write(&rec); err != nil {
		return err
	}
	logging.Warn(r.o.Log, SkippedStepEvent{Step: r.st.Step, Loss: out.Loss, GradNorm: gnorm, Skipped: r.st.SkippedSteps})
	if r.badRun >= maxBadSteps {
		return fmt.Errorf("step %d: %d steps in a row had a non-finite loss or gradient norm (last: loss %v, gradient norm %v); the run stopped with its last good checkpoint in %s untouched: lower --lr (peak %g) or check the data",
			r.st.Step, r.badRun, out.Loss, gnorm, r.ckDir, r.plan.Schedule.Peak)
	}
	if r.intervalEnds() && r.st.Step == r.plan.Steps {
		return fmt.Errorf("step %d: the last step had a non-finite loss or gradient norm; the last good checkpoint in %s is kept", r.st.Step, r.ckDir)
	}
	return nil
}

type stepKey struct {
	T       int
	dropout int64 // dropout rate in millionths
}

// newRun resolves the plan, opens or creates the run directory, loads the
// data and builds everything the loop uses.
func newRun(ctx context.Context, o Options) (_ *run, err error) {
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	if o.Log == nil {
		o.Log = logging.New(o.Progress, logging.Text, slog.LevelInfo)
	}
	if o.Out == "" {
		return nil, errors.New("--out is required: the run directory for checkpoints and metrics")
	}
	if err = o.openBackend(); err != nil { // the device is resolved once, here
		return nil, err
	}
	// One process writes a run directory at a time. An existing directory
	// is locked before anything in it is read; a new one right after it
	// is created (and then checked again: another run may have filled it).
	var lock *runLock
	defer func() {
		if err != nil {
			lock.unlock()
		}
	}()
	primary := o.Parallel.primary() // only rank 0 locks and writes the run directory
	if st, serr := os.Stat(o.Out); serr == nil && st.IsDir() && primary {
		if lock, err = lockRunDir(o.Out, o.Parallel.Env); err != nil {
			return nil, err
		}
	}
	prev, err := openPrevious(o)
	if err != nil {
		return nil, err
	}
	if o.Loss, err = ParseLossTargets(string(o.Loss)); err != nil {
		return nil, err
	}
	ds, err := LoadDataset(ctx, o.DataSpec(), o.Log)
	if err != nil {
		return nil, err
	}
	plan, err := Setup(o, ds, prev)
	if err != nil {
		return nil, err
	}
	backend := o.Backend
	if note := SimulatorNote(backend); note != "" && o.Progress != nil {
		fmt.Fprintln(o.Progress, note)
	}
	r := &run{o: o, plan: plan, ds: ds, backend: backend, steps: map[stepKey]*Step{},
		ckDir: filepath.Join(o.Out, "checkpoint")}
	r.limitMemory()
	if err := r.initState(prev); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	if lock == nil && primary {
		if lock, err = lockRunDir(o.Out, o.Parallel.Env); err != nil {
			return nil, err
		}
		if _, _, cerr := locateCheckpoint(o.Out); cerr == nil {
			return nil, fmt.Errorf("%s already holds a run (written while this one started); pass --resume to continue it or choose another --out", o.Out)
		}
	}
	r.lock = lock
	if err := r.openOutputs(); err != nil {
		r.close()
		return nil, err
	}
	if err := r.joinJob(ctx); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// joinJob meets the job's other ranks (none in a job of one rank) and
// gives every rank rank 0's parameters, fresh or resumed.
func (r *run) joinJob(ctx context.Context) error {
	if r.o.Parallel.Env.Multi() && r.o.HostOptimizer {
		return errors.New("a data-parallel job keeps its training state on the device: drop --host-optimizer")
	}
	var err error
	if r.job, err = joinJob(ctx, r.o.Parallel, r.backend); err != nil || r.job == nil {
		return err
	}
	if err := r.job.checkSame(r.jobFields()); err != nil {
		return err
	}
	if err := r.state.toHost(); err != nil {
		return err
	}
	if err := r.job.broadcast(r.store); err != nil {
		return err
	}
	return r.state.toDevice()
}

// openPrevious opens the run to resume, or checks that --out holds none.
func openPrevious(o Options) (*Run, error) {
	_, _, err := locateCheckpoint(o.Out)
	has := err == nil
	switch {
	case o.Resume && !has:
		return nil, fmt.Errorf("--resume: no checkpoint in %s (%v)", o.Out, err)
	case !o.Resume && has:
		return nil, fmt.Errorf("%s already holds a run; pass --resume to continue it or choose another --out", o.Out)
	case !o.Resume:
		return nil, nil
	}
	prev, err := openRun(o.Out, true)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	return prev, nil
}

// limitMemory tells the Go runtime the run's budget, so that garbage is
// collected before the heap outgrows it (unless GOMEMLIMIT is set).
func (r *run) limitMemory() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(r.plan.Memory.Budget)
	}
	m := r.plan.Memory
	ev := MemoryEvent{Planned: m.Total, Budget: m.Budget, Static: m.Static, Eval: m.Eval}
	for i, l := range r.plan.Lengths {
		ev.Lengths = append(ev.Lengths, LengthMemory{Context: l.T, Batch: l.Batch, MicroBatch: l.Micro, StepBytes: m.Steps[i]})
	}
	logging.Info(r.o.Log, ev)
}

// initState builds the store, the optimizer, the run state, the
// controllers and the data streams, fresh or from the resumed run.
func (r *run) initState(prev *Run) error {
	p, o := r.plan, r.o
	r.store = kernels.NewStore(ir.FP32)
	mg0, err := model.Build(&p.Config, model.Opts{T: p.Lengths[0].T, B: 1, Mode: model.Train})
	if err != nil {
		return err
	}
	acfg := optim.DefaultAdamW()
	acfg.Decay = mg0.Decayed()
	r.opt = optim.NewAdamW(acfg)
	r.st = &RunState{Format: stateFormat, Config: p.Config, Preset: p.Preset, Context: p.EvalT, Batch: p.EvalBatchOf(),
		TotalSteps: p.Steps, RunningOK: map[string]bool{}, Dataset: r.ds.Name, Protocol: r.ds.Protocol, TrainSplit: r.ds.TrainSplit,
		DataDir: r.ds.Dir, LastValCE: control.F(math.NaN()), Lengths: p.Lengths, PeakLR: p.Schedule.Peak}
	if p.Game() {
		r.st.Contexts = append([]int(nil), p.Contexts...)
	}
	r.st.Options = marshalOptions(o)
	if err := r.newBatchers(); err != nil {
		return err
	}
	if prev != nil {
		if err := r.restore(prev); err != nil {
			return err
		}
	}
	mg, err := r.initStore()
	if err != nil {
		return err
	}
	cs := r.st.Control
	if cs == nil {
		if cs, err = newControlState(o.Control, p, o.Seed); err != nil {
			return err
		}
		r.st.Control = cs
	} else if err := checkControllers(cs, o.Control, p.Game()); err != nil {
		return err
	}
	cs.EvalEvery, cs.GameEvery = p.EvalEvery, p.GameEvery
	r.ctl = newControllers(cs, o.Control, p, mg, r.store)
	if r.w, err = newWeightSets(r.store, mg.Params(), cs); err != nil {
		return err
	}
	if r.state, err = newOptState(o, r.backend, r.store, r.opt, r.w); err != nil {
		return err
	}
	r.res = &Result{Params: model.CountParams(mg.Specs), Out: o.Out, InitialLoss: math.NaN(), FinalLoss: math.NaN(),
		FinalValCE: float64(r.st.LastValCE), FinalEMACE: math.NaN(),
		FinalSWACE: math.NaN(), FinalRecall: math.NaN(), Plan: p}
	return nil
}

// EvalBatchOf is the batch recorded as the run's batch at its evaluation
// length (the training batch there when it is a training length).
func (p *Plan) EvalBatchOf() int {
	if l := p.Length(p.EvalT); l.T != 0 {
		return l.Batch
	}
	return max(1, p.TokensPerStep/p.EvalT)
}

func (r *run) newBatchers() error {
	r.batchers = make([]*data.TrainBatcher, len(r.plan.Lengths))
	for i, l := range r.plan.Lengths {
		seed := r.o.Seed
		if i > 0 {
			seed = r.o.Seed ^ (0x9e3779b97f4a7c15 * uint64(i))
		}
		var err error
		if r.batchers[i], err = data.NewTrainBatcher(r.ds.Train, l.T, l.Batch*l.T, seed); err != nil {
			return err
		}
		if err := r.batchers[i].SetAlign(r.ds.Align); err != nil {
			return err
		}
		if err := r.maskTargets(r.batchers[i]); err != nil {
			return err
		}
	}
	return nil
}

// maskTargets makes tb leave out the targets the loss does not count.
func (r *run) maskTargets(tb *data.TrainBatcher) error {
	if !r.o.Loss.counted() {
		return nil
	}
	keep := r.ds.trainAnswers()
	if keep == nil {
		return fmt.Errorf("--loss %s needs a corpus with answer positions (synthetic or mqar), not %s", r.o.Loss, r.ds.Name)
	}
	return tb.SetTargetMask(keep)
}

// initStore creates every tensor of the training and eval graphs of every
// length that the checkpoint did not provide, and returns the training
// graph of the first length (its handles serve the controllers).
func (r *run) initStore() (*model.Graph, error) {
	var first *model.Graph
	for _, l := range r.plan.Lengths {
		for _, opts := range []model.Opts{{T: l.T, B: 1, Mode: model.Train}, {T: l.T, B: 1, Mode: model.Eval}} {
			mg, err := model.Build(&r.plan.Config, opts)
			if err != nil {
				return nil, err
			}
			if err := model.InitStore(mg.Specs, r.store, r.o.Seed); err != nil {
				return nil, err
			}
			if first == nil {
				first = mg
			}
		}
	}
	return first, nil
}

// openOutputs compiles the evaluator and opens metrics and progress.
func (r *run) openOutputs() error {
	p := r.plan
	var err error
	r.eval, err = compileEvaluator(&p.Config, r.store, r.backend, p.EvalT, p.EvalBatch, p.EvalMicro, p.EvalStats == "batch")
	if err != nil {
		return err
	}
	if r.metrics, err = r.openMetrics(); err != nil {
		return err
	}
	r.logStart()
	r.progress = metrics.NewProgress(r.o.Log, p.Steps, "step")
	r.progress.Event = "train.progress"
	r.progress.TokensPerStep = p.TokensPerStep
	r.started, r.tokens0, r.step0 = time.Now(), r.st.Tokens, r.st.Step
	return nil
}

// openMetrics opens metrics.jsonl (rank 0 of a data-parallel job writes
// the records; the other ranks discard theirs).
func (r *run) openMetrics() (*metrics.Writer, error) {
	if !r.o.Parallel.primary() {
		return metrics.Discard(), nil
	}
	path := filepath.Join(r.o.Out, "metrics.jsonl")
	if err := r.prepareMetrics(path); err != nil {
		return nil, err
	}
	return metrics.Open(path)
}

// prepareMetrics readies metrics.jsonl at path for this invocation's
// records. Records after the checkpoint are written again from it. A new
// run in a directory without a checkpoint starts the file afresh: what is
// there was written by an attempt killed before its first checkpoint, and
// appending to it would repeat its steps.
func (r *run) prepareMetrics(path string) error {
	switch st, err := os.Stat(path); {
	case r.o.Resume:
		if err := metrics.TruncateAfter(path, r.st.Step); err != nil {
			return fmt.Errorf("metrics.jsonl: %w", err)
		}
	case err == nil && st.Size() > 0:
		r.o.Log.Warn("metrics.jsonl: discarding the records of an earlier attempt that saved no checkpoint", "file", path, "bytes", st.Size())
		if err := os.Truncate(path, 0); err != nil {
			return fmt.Errorf("metrics.jsonl: %w", err)
		}
	}
	return nil
}

func (r *run) logStart() {
	p, o, ctl := r.plan, r.o, r.o.Control
	cfg := &p.Config
	ev := StartEvent{Model: cfg.Model, Config: cfg.Summary(), Align: cfg.UseRPA, Preset: p.Preset, Params: r.res.Params,
		Context: p.EvalT, TokensPerStep: p.TokensPerStep, Steps: p.Steps, From: r.st.Step, Dataset: r.ds.Name,
		Protocol: r.ds.Protocol, Backend: r.backend.Name(), Optimizer: r.optimizerPlace(), Controller: ctl.controller(), EMA: ctl.EMA, SWA: ctl.SWA,
		Chaos: ctl.Chaos, Glide: ctl.DropoutGlide}
	if p.Game() {
		ev.Games = p.Contexts
	}
	logging.Info(o.Log, ev)
	if r.st.Step == 0 {
		_ = r.metrics.Write(&metrics.Record{Event: metrics.EventStart, Start: r.startRecord()})
	}
}

// startRecord is the start record of metrics.jsonl.
func (r *run) startRecord() *metrics.Start {
	p, ctl := r.plan, r.o.Control
	cfg := &p.Config
	config, _ := json.Marshal(cfg)
	lengths, _ := json.Marshal(p.Lengths)
	return &metrics.Start{Model: cfg.Model.String(), Align: cfg.UseRPA, Preset: p.Preset, Params: r.res.Params,
		Config: config, Context: p.EvalT, Contexts: p.Contexts, Batch: r.st.Batch, Lengths: lengths,
		TokensPerStep: p.TokensPerStep, Steps: p.Steps, Dataset: r.ds.Name, Protocol: r.ds.Protocol,
		LR: p.Schedule.Peak, Controller: ctl.controller(), EMA: ctl.EMA, SWA: ctl.SWA,
		Chaos: ctl.Chaos, DropoutGlide: ctl.DropoutGlide, EvalEvery: p.EvalEvery, GameEvery: p.GameEvery,
		Layers: cfg.Layers, R: cfg.R, Experts: cfg.Experts, MemBudget: p.Memory.Budget, MemPlanned: p.Memory.Total,
		Seed: r.o.Seed}
}

// optimizerPlace is where the training state is updated: host or device.
func (r *run) optimizerPlace() string {
	if r.state.onDevice() {
		return "device"
	}
	return "host"
}

func (r *run) close() {
	for _, s := range r.steps {
		s.Close()
	}
	if r.state != nil {
		r.state.close()
	}
	if r.eval != nil {
		r.eval.Close()
	}
	if r.metrics != nil {
		r.metrics.Close()
	}
	r.job.close()
	r.lock.unlock()
}

// runStep compiles (on first use) and runs the step of the chosen context
// and dropout on the next batch of that context's stream.
func (r *run) runStep(set stepSettings) (*StepResult, error) {
	s, err := r.step(set.Context, set.Dropout)
	if err != nil {
		return nil, err
	}
	bt := r.batchers[set.Context].Next()
	if err := r.job.begin(s); err != nil {
		return nil, err
	}
	out, err := s.Run(bt.X, bt.Y, r.o.Seed*1_000_003+uint64(r.st.Step))
	if err != nil {
		return nil, err
	}
	return out, r.job.reduce(s, out)
}

// step returns the compiled step of context index ci at dropout; a new
// dropout rate retires the programs of the old one.
func (r *run) step(ci int, dropout float64) (*Step, error) {
	l := r.plan.Lengths[ci]
	key := stepKey{T: l.T, dropout: int64(math.Round(dropout * 1e6))}
	if s := r.steps[key]; s != nil {
		return s, nil
	}
	for k, s := range r.steps {
		if k.dropout != key.dropout {
			s.Close()
			delete(r.steps, k)
		}
	}
	cfg := r.plan.Config
	s, err := CompileStepLoss(&cfg, r.store, r.backend, l.T, l.Batch, l.Micro, dropout, r.o.Loss, r.dumpContext())
	if err != nil {
		return nil, err
	}
	if err := r.state.prepare(s); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.Shard(r.o.Parallel.Env.Rank, r.o.Parallel.Ranks()); err != nil {
		s.Close()
		return nil, err
	}
	r.steps[key] = s
	return s, nil
}

// updateRunning moves the running statistics of the step's length toward
// this batch's statistics (the first batch initialises them).
func (r *run) updateRunning(out *StepResult) {
	for i, name := range out.Buffers {
		stat, buf := out.Running[i], r.store.Get(name)
		if stat == nil || buf == nil {
			continue
		}
		if !r.st.RunningOK[name] {
			copy(buf.F32, stat)
			r.st.RunningOK[name] = true
			continue
		}
		for j, v := range stat {
			buf.F32[j] += runningMomentum * (v - buf.F32[j])
		}
	}
}

func (r *run) logStep(set stepSettings, out *StepResult, gnorm, lr float64) error {
	l := r.plan.Lengths[set.Context]
	if math.IsNaN(r.res.InitialLoss) {
		r.res.InitialLoss = out.CE
	}
	r.res.FinalLoss = out.CE
	r.st.Step++
	r.st.Tokens += int64(l.Batch * l.T)
	tokps := float64(r.st.Tokens-r.tokens0) / math.Max(time.Since(r.started).Seconds(), 1e-9)
	r.res.TokensPerS = tokps
	rec := metrics.Record{Step: r.st.Step, Loss: metrics.N(out.Loss), TrainCE: metrics.N(out.CE), LR: metrics.N(lr), GradNorm: metrics.N(gnorm),
		BiasScale: metrics.N(set.Scale), Tokens: r.st.Tokens, TokPerS: metrics.N(tokps), Context: l.T, Batch: l.Batch}
	if l.Micro < l.Batch {
		rec.MicroBatch = l.Micro
	}
	if n := len(out.Layers); n > 0 {
		var h, sat float64
		for _, st := range out.Layers {
			h += st.H / float64(n)
			sat += st.Sat / float64(n)
		}
		rec.MuEntropy, rec.SatFrac = metrics.N(h), metrics.N(sat)
	}
	if r.ctl.cs.Chaos != nil {
		rec.Chaos = metrics.N(set.Chaos)
	}
	if r.o.Control.DropoutGlide {
		rec.Dropout = metrics.N(set.Dropout)
	}
	if err := r.metrics.Write(&rec); err != nil {
		return err
	}
	r.progress.Update(r.st.Step, metrics.Fields{metrics.F("loss", out.CE), metrics.F("lr", lr)})
	return nil
}

func (r *run) intervalEnds() bool {
	e := r.plan.EvalEvery
	return (e > 0 && r.st.Step%e == 0) || r.st.Step == r.plan.Steps
}

// save writes the checkpoint (weights, optimizer, state, data streams).
func (r *run) save() error {
	if err := r.state.toHost(); err != nil {
		return err
	}
	r.ctl.plainScale(r.st.Step)
	r.st.DataRNGs = r.st.DataRNGs[:0]
	for _, b := range r.batchers {
		s, err := b.State()
		if err != nil {
			return err
		}
		r.st.DataRNGs = append(r.st.DataRNGs, s)
	}
	r.st.DataRNG = r.st.DataRNGs[0]
	if name := nonFinite(r.store); name != "" {
		return fmt.Errorf("refusing to write a checkpoint at step %d: %s holds a non-finite value (the last good checkpoint in %s is kept); lower --lr", r.st.Step, name, r.ckDir)
	}
	mom, steps, err := r.state.moments()
	if err != nil || !r.o.Parallel.primary() {
		return err
	}
	return saveCheckpoint(r.ckDir, r.store, mom, steps, r.st)
}

func (r *run) interrupted() error {
	if err := r.save(); err != nil {
		return fmt.Errorf("interrupted at step %d and the checkpoint failed: %v", r.st.Step, err)
	}
	return fmt.Errorf("interrupted at step %d; checkpoint saved, continue with --resume", r.st.Step)
}

func (r *run) finish(err error) (*Result, error) {
	if err != nil {
		return nil, err
	}
	if r.job != nil {
		logging.Info(r.o.Log, r.job.event())
	}
	r.res.Steps, r.res.Tokens, r.res.Ran = r.st.Step, r.st.Tokens, r.st.Step-r.step0
	return r.res, nil
}

func mean(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	var s float64
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}

func zeroNaN(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return x
}

// dumpContext asks the first compiled step to print its graph after the
// pass named by --dump-ir.
func (r *run) dumpContext() *passes.Context {
	pc := &passes.Context{Experts: r.o.Experts}
	if r.o.DumpIR != "" && !r.dumped {
		pc.DumpAfter, pc.Dump = r.o.DumpIR, r.o.Progress
		r.dumped = true
	}
	return pc
}

// jobFields are the figures of the run every rank of a job must share.
func (r *run) jobFields() []jobField {
	var elems int
	for _, t := range r.store.Tensors {
		elems += len(t.F32)
	}
	p := r.plan
	return []jobField{{"number of tensors", float64(len(r.store.Tensors))}, {"number of parameters and buffers", float64(elems)},
		{"number of steps", float64(p.Steps)}, {"tokens per step", float64(p.TokensPerStep)}, {"first micro-batch", float64(p.Lengths[0].Micro)},
		{"starting step", float64(r.st.Step)}, {"seed", float64(r.o.Seed % (1 << 52))}}
}

// nonFinite names a tensor of st holding NaN or ±Inf ("" when none).
func nonFinite(st *kernels.Store) string {
	for _, name := range st.Order {
		if t := st.Tensors[name]; t != nil && !allFinite(t.F32) {
			return name
		}
	}
	return ""
}

// allFinite reports whether x holds no NaN or ±Inf.
func allFinite(x []float32) bool {
	for _, v := range x {
		if v != v || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return true
}
