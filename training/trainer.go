// Package training drives rpac's training runs: data → compiled step →
// AdamW → running statistics → evaluation → checkpoints and metrics.
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
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/rpac-dev/rpac/training/metrics"
	"github.com/rpac-dev/rpac/training/optim"
)

// Options are the knobs of `rpac train`.
type Options struct {
	Preset        string
	Model         string // fuzzy | baseline ("" = preset)
	Dataset       string // wikitext2 | synthetic
	DataDir       string
	TrainSplit    string
	EvalSplit     string
	Context       int // 0 = the preset's first context
	TokensPerStep int // 0 = preset
	Steps         int // 0 = from Epochs or the preset
	Epochs        float64
	EvalEvery     int // 0 = only at the end
	EvalBatches   int // 0 = every full eval batch of the split
	Seed          uint64
	Out           string
	Resume        bool
	Device        string
	LR            float64 // 0 = preset
	Dropout       float64 // <0 = preset
	WarmIn        int     // <0 = preset
	GradClip      float64
	EvalStats     string // running | batch
	DumpIR        string
	Log           *slog.Logger
	Progress      io.Writer // nil = stderr
	// Config, when set, replaces the preset's model configuration (tests,
	// experiments); Model and Dropout still apply on top.
	Config *model.Config
	// StopAfter ends the run (with a checkpoint) after this many steps of
	// this invocation; for tests of resume. 0 = no limit.
	StopAfter int
}

// RunState is what state.json holds besides weights and optimizer moments.
type RunState struct {
	Format     int             `json:"format"`
	Step       int             `json:"step"`
	Tokens     int64           `json:"tokens"`
	TotalSteps int             `json:"total_steps"`
	Config     model.Config    `json:"config"`
	Options    json.RawMessage `json:"options"`
	Preset     string          `json:"preset"`
	Context    int             `json:"context"`
	Batch      int             `json:"batch"`
	DataRNG    data.RNGState   `json:"data_rng"`
	OptimStep  int             `json:"optim_step"`
	RunningOK  map[string]bool `json:"running_initialised"`
	LastValCE  float64         `json:"last_val_ce"`
	Dataset    string          `json:"dataset"`
	Protocol   string          `json:"protocol"`
}

// Result summarises a finished run.
type Result struct {
	Steps       int
	FinalValCE  float64
	InitialLoss float64
	FinalLoss   float64
	TokensPerS  float64
	Params      int
	Out         string
}

const runningMomentum = 0.05

// Train runs (or resumes) a training run.
func Train(ctx context.Context, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	if o.Out == "" {
		return nil, errors.New("--out is required: the run directory for checkpoints and metrics")
	}
	if o.Device != "" && o.Device != "cpu" {
		return nil, fmt.Errorf("device %q is not available in this build (use --device cpu)", o.Device)
	}
	preset, err := model.LookupPreset(o.Preset)
	if err != nil {
		return nil, err
	}
	cfg := preset.Config
	if o.Config != nil {
		cfg = *o.Config
	}
	if o.Model != "" {
		cfg.Model = o.Model
	}
	if o.Dropout >= 0 {
		cfg.Dropout = o.Dropout
	}
	T := o.Context
	if T == 0 {
		T = preset.Contexts[0]
	}
	if T < 2 {
		return nil, fmt.Errorf("--context %d is too short (at least 2)", T)
	}
	if T > cfg.MaxLen {
		cfg.MaxLen = T
	}
	tps := o.TokensPerStep
	if tps == 0 {
		tps = preset.TokensPerStep
	}
	if tps < T {
		tps = T
	}
	B := max(1, tps/T)
	evalStats := o.EvalStats
	if evalStats == "" {
		evalStats = "running"
	}
	if evalStats != "running" && evalStats != "batch" {
		return nil, fmt.Errorf("--eval-stats %q: want running or batch", evalStats)
	}

	// Data.
	ds, err := LoadDataset(ctx, o.Dataset, o.DataDir, o.TrainSplit, o.EvalSplit, o.Seed, o.Progress)
	if err != nil {
		return nil, err
	}
	cfg.Vocab = ds.Vocab
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	train, err := data.NewTrainBatcher(ds.Train, T, B*T, o.Seed)
	if err != nil {
		return nil, err
	}
	evalB := B
	evalChunks := ds.EvalChunks(T)
	if evalChunks < 1 {
		return nil, fmt.Errorf("the %s split has %d tokens, fewer than one evaluation chunk of context %d + 1", ds.EvalName, ds.EvalLen(), T)
	}
	evalB = min(evalB, evalChunks)

	steps := o.Steps
	if steps == 0 && o.Epochs > 0 {
		steps = int(math.Ceil(o.Epochs * float64(ds.TrainLen()) / float64(B*T)))
	}
	if steps == 0 {
		steps = preset.Steps
	}
	lr := o.LR
	if lr == 0 {
		lr = preset.PeakLR
	}
	warm := o.WarmIn
	if warm < 0 {
		warm = preset.WarmIn
	}
	clip := o.GradClip
	if clip == 0 {
		clip = 1.0
	}

	// Run directory.
	ckDir := filepath.Join(o.Out, "checkpoint")
	if o.Resume {
		if _, err := os.Stat(ckDir); err != nil {
			return nil, fmt.Errorf("--resume: no checkpoint in %s (%v)", o.Out, err)
		}
	} else if _, err := os.Stat(ckDir); err == nil {
		return nil, fmt.Errorf("%s already holds a run; pass --resume to continue it or choose another --out", o.Out)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}

	// Graphs.
	var dump io.Writer
	if o.DumpIR != "" {
		dump = o.Progress
	}
	tg, specs, err := model.Build(&cfg, model.Opts{T: T, B: B, Mode: model.Train})
	if err != nil {
		return nil, err
	}
	if err := passes.Run(tg, passes.TrainPipeline, &passes.Context{Loss: "loss", DumpAfter: o.DumpIR, Dump: dump}); err != nil {
		return nil, err
	}
	eg, especs, err := model.Build(&cfg, model.Opts{T: T, B: evalB, Mode: model.Eval, BatchStats: evalStats == "batch"})
	if err != nil {
		return nil, err
	}
	if err := passes.Run(eg, passes.EvalPipeline, &passes.Context{}); err != nil {
		return nil, err
	}
	store := kernels.NewStore(kernels.F32)
	opt := optim.NewAdamW(optim.DefaultAdamW())
	st := &RunState{Format: 1, Config: cfg, Preset: preset.Name, Context: T, Batch: B, TotalSteps: steps,
		RunningOK: map[string]bool{}, Dataset: ds.Name, Protocol: ds.Protocol, LastValCE: math.NaN()}
	st.Options, _ = json.Marshal(o)
	if o.Resume {
		if err := resume(ckDir, store, opt, st, &cfg, train); err != nil {
			return nil, err
		}
		if st.Context != T || st.Batch != B {
			return nil, fmt.Errorf("--resume: the run was trained at context %d batch %d, these flags give %d and %d", st.Context, st.Batch, T, B)
		}
		if steps <= st.Step {
			steps = st.TotalSteps
		}
		st.TotalSteps = steps
	}
	if err := model.InitStore(specs, store, o.Seed); err != nil {
		return nil, err
	}
	if err := model.InitStore(especs, store, o.Seed); err != nil {
		return nil, err
	}
	backend := cpu.New(kernels.F32)
	tprog, err := backend.Compile(tg, passes.Plan(tg), store)
	if err != nil {
		return nil, err
	}
	defer tprog.Close()
	eprog, err := backend.Compile(eg, passes.Plan(eg), store)
	if err != nil {
		return nil, err
	}
	defer eprog.Close()

	mw, err := metrics.Open(filepath.Join(o.Out, "metrics.jsonl"))
	if err != nil {
		return nil, err
	}
	defer mw.Close()
	params := model.CountParams(specs)
	o.Log.Info("run", "model", cfg.Model, "preset", preset.Name, "params", params, "context", T, "batch", B,
		"tokens_per_step", B*T, "steps", steps, "dataset", ds.Name, "protocol", ds.Protocol, "gemm", backend.Name())
	if st.Step == 0 {
		_ = mw.Write(map[string]any{"event": "start", "model": cfg.Model, "preset": preset.Name, "params": params,
			"context": T, "batch": B, "steps": steps, "dataset": ds.Name, "protocol": ds.Protocol, "lr": lr})
	}

	sched := optim.Schedule{Peak: lr, FloorFrac: 0.1, FlatFrac: 0.3, WarmupSteps: min(100, steps/10), Total: steps}
	var biasScales []*kernels.Tensor
	for _, s := range specs {
		if strings.HasSuffix(s.Name, ".bias_scale") {
			biasScales = append(biasScales, store.Get(s.Name))
		}
	}
	var running []model.Spec
	for _, s := range especs {
		if s.Running != "" {
			running = append(running, s)
		}
	}
	paramNames := []string{}
	pdata := map[string][]float32{}
	for _, s := range specs {
		if s.Param {
			paramNames = append(paramNames, s.Name)
			pdata[s.Name] = store.Get(s.Name).F32
		}
	}

	res := &Result{Params: params, Out: o.Out, InitialLoss: math.NaN()}
	prog := metrics.NewProgress(o.Progress, steps, "step")
	prog.TokensPerStep = B * T
	stepTokens := int64(B * T)
	start := time.Now()
	startStep := st.Step
	evalNow := func() error {
		ce, err := evaluate(eprog, ds, T, evalB, o.EvalBatches)
		if err != nil {
			return err
		}
		st.LastValCE = ce
		res.FinalValCE = ce
		o.Log.Info("eval", "step", st.Step, "split", ds.EvalName, "val_ce", ce, "val_ppl", math.Exp(ce))
		return mw.WriteEval(map[string]any{"step": st.Step, "val_ce": ce, "val_ppl": math.Exp(ce), "split": ds.EvalName})
	}
	save := func() error {
		st.DataRNG, err = train.State()
		if err != nil {
			return err
		}
		return saveCheckpoint(ckDir, store, opt, st)
	}
	for st.Step < steps {
		if err := ctx.Err(); err != nil {
			if serr := save(); serr != nil {
				return nil, fmt.Errorf("interrupted at step %d and the checkpoint failed: %v", st.Step, serr)
			}
			return nil, fmt.Errorf("interrupted at step %d; checkpoint saved, continue with --resume", st.Step)
		}
		if o.StopAfter > 0 && st.Step-startStep >= o.StopAfter {
			break
		}
		// Bias warm-in (apply_warm_in): scale = min(1, step / warm_steps).
		ws := 1.0
		if warm > 0 {
			ws = math.Min(1, float64(st.Step)/float64(warm))
		}
		for _, t := range biasScales {
			t.F32[0] = float32(ws)
		}
		bt := train.Next()
		x, y := bt.X, bt.Y
		feeds := map[string]*kernels.Tensor{
			"input_ids": kernels.IntTensor(ir.Shape{B, T}, x),
			"targets":   kernels.IntTensor(ir.Shape{B * T}, y),
		}
		if err := tprog.Run(feeds, o.Seed*1_000_003+uint64(st.Step)); err != nil {
			return nil, err
		}
		loss := tprog.Output("loss").At(0)
		ce := tprog.Output("ce_sum").At(0) / float64(B*T)
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			return nil, fmt.Errorf("step %d: loss is %v; lower --lr or check the data", st.Step, loss)
		}
		grads := map[string][]float32{}
		for _, n := range paramNames {
			if gt := tprog.Output(passes.GradName(n)); gt != nil {
				grads[n] = gt.F32
			}
		}
		gnorm := optim.ClipGlobalNorm(grads, clip)
		curLR := sched.LR(st.Step)
		if err := opt.Step(pdata, grads, curLR); err != nil {
			return nil, err
		}
		for _, s := range running {
			stat := tprog.Output(s.Running)
			if stat == nil {
				continue
			}
			buf := store.Get(s.Name).F32
			if !st.RunningOK[s.Name] {
				copy(buf, stat.F32)
				st.RunningOK[s.Name] = true
				continue
			}
			for i, v := range stat.F32 {
				buf[i] += runningMomentum * (v - buf[i])
			}
		}
		if math.IsNaN(res.InitialLoss) {
			res.InitialLoss = ce
		}
		res.FinalLoss = ce
		st.Step++
		st.Tokens += stepTokens
		el := time.Since(start).Seconds()
		tokps := float64(int64(st.Step-startStep)*stepTokens) / math.Max(el, 1e-9)
		res.TokensPerS = tokps
		rec := map[string]any{"step": st.Step, "loss": loss, "train_ce": ce, "lr": curLR, "grad_norm": gnorm,
			"bias_scale": ws, "tokens": st.Tokens, "tok_per_s": tokps}
		if h := tprog.Output("stat:mu_entropy"); h != nil {
			rec["mu_entropy"] = h.At(0)
		}
		if err := mw.Write(rec); err != nil {
			return nil, err
		}
		prog.Update(st.Step, metrics.Fields{metrics.F("loss", ce), metrics.F("lr", curLR)})
		if (o.EvalEvery > 0 && st.Step%o.EvalEvery == 0) || st.Step == steps {
			if err := evalNow(); err != nil {
				return nil, err
			}
			if err := save(); err != nil {
				return nil, err
			}
		}
	}
	prog.Finish()
	if st.Step < steps { // stopped early by StopAfter
		if err := save(); err != nil {
			return nil, err
		}
	}
	res.Steps = st.Step
	return res, nil
}

// evaluate returns the mean pure CE over the eval split's sequential,
// non-overlapping chunks (drop_last), at most maxBatches batches (0 = all).
func evaluate(p kernels.Program, ds *Dataset, T, B, maxBatches int) (float64, error) {
	var sum float64
	var n int
	eb, err := data.NewEvalBatcher(ds.Eval, T, B)
	if err != nil {
		return 0, err
	}
	for bi, bt := range eb.All() {
		if maxBatches > 0 && bi >= maxBatches {
			break
		}
		x, y := bt.X, bt.Y
		feeds := map[string]*kernels.Tensor{
			"input_ids": kernels.IntTensor(ir.Shape{B, T}, x),
			"targets":   kernels.IntTensor(ir.Shape{B * T}, y),
		}
		if err := p.Run(feeds, 0); err != nil {
			return 0, err
		}
		sum += p.Output("ce_sum").At(0)
		n += B * T
	}
	if n == 0 {
		return 0, fmt.Errorf("evaluation split too short for one batch of %d×%d", B, T)
	}
	return sum / float64(n), nil
}
