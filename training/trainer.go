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

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/control"
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
	Context       int // 0 = the preset's first context (with the context game: the longest game context); the evaluation length
	TokensPerStep int // 0 = preset
	Steps         int // 0 = from Epochs or the preset
	Epochs        float64
	EvalEvery     int // 0 = only at the end (with per-epoch controllers: steps/10)
	EvalBatches   int // 0 = every full eval batch of the split
	// FinalEvalBatches limits the last evaluation (0 = EvalBatches).
	FinalEvalBatches int
	Seed             uint64
	Out              string
	Resume           bool
	Device           string
	LR               float64 // 0 = preset
	Dropout          float64 // <0 = preset
	WarmIn           int     // <0 = preset
	GradClip         float64
	EvalStats        string // running | batch
	DumpIR           string
	// NoAlign trains the fuzzy model without the RPA alignment (the
	// listing's legacy bias from fuzz_sim = mean_b μμᵀ): the ablation's
	// baseline.
	NoAlign  bool
	Control  Controls
	Log      *slog.Logger
	Progress io.Writer // nil = stderr
	// Config, when set, replaces the preset's model configuration (tests,
	// experiments); Model and Dropout still apply on top.
	Config *model.Config
	// StopAfter ends the run (with a checkpoint) after this many steps of
	// this invocation; for tests of resume. 0 = no limit.
	StopAfter int
	// SaveFinalOnly writes the checkpoint only at the end (and on an
	// interrupt), not at every evaluation.
	SaveFinalOnly bool
}

// Controls switch and tune the paper's training-time machinery. The zero
// value is a plain run: no controller, no context game, no EMA/SWA, no
// chaos, no glide, the default LR floor schedule.
type Controls struct {
	// Controller moves τ_att between steps: "none" (or ""), "guardian" or
	// "scripted" (Algorithm 1).
	Controller string
	Guardian   control.GuardianConfig // zero fields: defaults
	// Scripted schedule bounds (0 = 0.6 and the model's τ_max).
	ScriptedTauMin, ScriptedTauMax float64

	// Contexts of the context game; fewer than two: no game.
	Contexts  []int
	Game      control.GameConfig // zero: DefaultGameConfig
	GameEvery int                // steps per game update (0 = the eval interval)

	EMA      bool
	EMADecay float64 // 0 = 1 − 10/steps, within [0.9, 0.9999]

	SWA        bool
	SWAZoneLo  float64  // helpful zone: absolute CE bounds
	SWAZoneHi  float64  // 0 = +Inf
	SWABand    *float64 // relative band above the best CE (nil = 0.03; 0 = off)
	SWAMinGain *float64 // minimum relative gain over the entry snapshot (nil = 0.001)
	SWAStart   *int     // first epoch that may join (nil = half of the run's epochs)

	Chaos      bool
	ChaosAmp   float64 // 0 = 0.25 (listing)
	ChaosDecay float64 // 0 = 4/steps (the listing's 5e-4 at the paper's 8,030 steps)

	DropoutGlide bool

	// LR schedule: flat prelude then cosine to a floor (nil = 0.3 and 0.1;
	// the ablation's baseline uses 0 and 0: warmup + cosine to zero).
	LRFlat  *float64
	LRFloor *float64
}

func (c Controls) controller() string {
	if c.Controller == "" {
		return "none"
	}
	return c.Controller
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
	Context    int             `json:"context"` // evaluation length (the only length without the context game)
	Batch      int             `json:"batch"`   // batch at Context
	Contexts   []int           `json:"contexts,omitempty"`
	DataRNG    data.RNGState   `json:"data_rng"`
	DataRNGs   []data.RNGState `json:"data_rngs,omitempty"` // one per context of Contexts
	OptimStep  int             `json:"optim_step"`
	RunningOK  map[string]bool `json:"running_initialised"`
	LastValCE  control.F       `json:"last_val_ce"`
	Dataset    string          `json:"dataset"`
	Protocol   string          `json:"protocol"`
	Control    *ControlState   `json:"control,omitempty"`
}

// ControlState is the controllers' state in state.json. Guardian's policy
// and its Adam moments live here, never among the model's tensors.
type ControlState struct {
	Epoch     int                  `json:"epoch"`
	EvalEvery int                  `json:"eval_every"`
	GameEvery int                  `json:"game_every"`
	Dropout   float64              `json:"dropout"` // current (glided) dropout rate
	Guardian  *control.Guardian    `json:"guardian,omitempty"`
	Scripted  *control.Scripted    `json:"scripted,omitempty"`
	Game      *control.ContextGame `json:"context_game,omitempty"`
	GameU     []float64            `json:"game_utility,omitempty"`
	Chaos     *control.Chaos       `json:"chaos,omitempty"`
	EMA       *control.EMA         `json:"ema,omitempty"`
	SWA       *control.SWASelect   `json:"swa,omitempty"`
	Acc       EpochStats           `json:"epoch_stats"`
	PrevUsage [][]float64          `json:"prev_usage,omitempty"`
}

// EpochStats accumulate per-layer diagnostics over an epoch's steps.
type EpochStats struct {
	Steps int         `json:"steps"`
	H     []float64   `json:"h"`
	Sat   []float64   `json:"sat"`
	Usage [][]float64 `json:"usage"`
	// CE sums the training CE per context (for the record).
	CE []float64 `json:"ce"`
	N  []int     `json:"n"`
}

// Result summarises a finished run.
type Result struct {
	Steps       int
	FinalValCE  float64 // raw weights
	FinalEMACE  float64 // NaN without EMA
	FinalSWACE  float64 // NaN without SWA members
	SWAMembers  []int
	InitialLoss float64
	FinalLoss   float64
	TokensPerS  float64
	Params      int
	Tokens      int64
	Out         string
}

const runningMomentum = 0.05

// Probe outputs the trainer adds to the model's graphs.
func probeMu(layer int) string   { return fmt.Sprintf("probe:blocks.%d.mu", layer) }
func probeBias(layer int) string { return fmt.Sprintf("probe:blocks.%d.bias", layer) }
func statH(layer int) string     { return fmt.Sprintf("stat:blocks.%d.mu_entropy", layer) }
func statUsage(layer int) string { return fmt.Sprintf("stat:blocks.%d.expert_usage", layer) }

// addProbes makes values of a built graph extra outputs, without changing
// what the graph computes: each layer's memberships μ [B,T,R] (the output of
// its GaussianMembership) and each layer's attention bias before the warm-in
// scale (the second input of the Mul with clamp(bias_scale)). A value the
// graph does not have (the baseline model, a changed builder) is skipped.
func addProbes(g *ir.Graph, layers int, mu, bias bool) {
	uses := g.Uses()
	for i := 0; i < layers; i++ {
		if c := g.Lookup(fmt.Sprintf("blocks.%d.mem.centers", i)); mu && c != nil {
			for _, n := range uses[c] {
				if n.Op == "GaussianMembership" {
					g.SetOutput(probeMu(i), n.Outputs[0])
				}
			}
		}
		if bs := g.Lookup(fmt.Sprintf("blocks.%d.attn.bias_scale", i)); bias && bs != nil {
			for _, n := range uses[bs] {
				if n.Op != "Clamp" {
					continue
				}
				for _, m := range uses[n.Outputs[0]] {
					if m.Op == "Mul" && len(m.Inputs) == 2 {
						other := m.Inputs[0]
						if other == n.Outputs[0] {
							other = m.Inputs[1]
						}
						g.SetOutput(probeBias(i), other)
					}
				}
			}
		}
	}
}

type trainProg struct {
	prog    kernels.Program
	T, B    int
	dropout float64
}

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
	ctl := o.Control
	switch ctl.controller() {
	case "none", "guardian", "scripted":
	default:
		return nil, fmt.Errorf("--controller %q: want none, guardian or scripted", ctl.Controller)
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
	if o.NoAlign {
		cfg.UseRPA = false
	}

	// Context lengths: the evaluation length T and the training lengths.
	contexts := slices.Clone(ctl.Contexts)
	if len(contexts) < 2 {
		contexts = nil
	}
	for _, c := range contexts {
		if c < 2 {
			return nil, fmt.Errorf("--contexts: context %d is too short (at least 2)", c)
		}
	}
	T := o.Context
	if T == 0 {
		if contexts != nil {
			T = slices.Max(contexts)
		} else {
			T = preset.Contexts[0]
		}
	}
	if T < 2 {
		return nil, fmt.Errorf("--context %d is too short (at least 2)", T)
	}
	if contexts == nil {
		contexts = []int{T}
	}
	game := len(contexts) > 1
	longest := max(T, slices.Max(contexts))
	if longest > cfg.MaxLen {
		cfg.MaxLen = longest
	}
	if game && cfg.Model != "fuzzy" {
		o.Log.Info("context game on a baseline model: the utility uses the training CE only")
	}
	tps := o.TokensPerStep
	if tps == 0 {
		tps = preset.TokensPerStep
	}
	tps = max(tps, longest)
	batchOf := func(c int) int { return max(1, tps/c) }
	B := batchOf(T)
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
	batchers := make([]*data.TrainBatcher, len(contexts))
	for i, c := range contexts {
		seed := o.Seed
		if i > 0 {
			seed = o.Seed ^ (0x9e3779b97f4a7c15 * uint64(i))
		}
		if batchers[i], err = data.NewTrainBatcher(ds.Train, c, batchOf(c)*c, seed); err != nil {
			return nil, err
		}
	}
	evalChunks := ds.EvalChunks(T)
	if evalChunks < 1 {
		return nil, fmt.Errorf("the %s split has %d tokens, fewer than one evaluation chunk of context %d + 1", ds.EvalName, ds.EvalLen(), T)
	}
	evalB := min(B, evalChunks)

	steps := o.Steps
	if steps == 0 && o.Epochs > 0 {
		steps = int(math.Ceil(o.Epochs * float64(ds.TrainLen()) / float64(tps)))
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
	evalEvery := o.EvalEvery
	perEpoch := ctl.controller() != "none" || ctl.SWA || game
	if evalEvery == 0 && perEpoch {
		evalEvery = max(1, steps/10)
	}
	gameEvery := ctl.GameEvery
	if gameEvery <= 0 {
		gameEvery = max(1, evalEvery)
		if evalEvery == 0 {
			gameEvery = max(1, steps/10)
		}
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

	store := kernels.NewStore(kernels.F32)
	opt := optim.NewAdamW(optim.DefaultAdamW())
	st := &RunState{Format: 2, Config: cfg, Preset: preset.Name, Context: T, Batch: B, TotalSteps: steps,
		RunningOK: map[string]bool{}, Dataset: ds.Name, Protocol: ds.Protocol, LastValCE: control.F(math.NaN())}
	if game {
		st.Contexts = slices.Clone(contexts)
	}
	st.Options, _ = json.Marshal(o)
	if o.Resume {
		if err := resume(ckDir, store, opt, st, &cfg, batchers); err != nil {
			return nil, err
		}
		if st.Context != T || st.Batch != B {
			return nil, fmt.Errorf("--resume: the run was trained at context %d batch %d, these flags give %d and %d", st.Context, st.Batch, T, B)
		}
		var want []int
		if game {
			want = contexts
		}
		if !slices.Equal(st.Contexts, want) {
			return nil, fmt.Errorf("--resume: the run's context game lengths are %v, these flags give %v", st.Contexts, want)
		}
		if steps <= st.Step {
			steps = st.TotalSteps
		}
		st.TotalSteps = steps
	}

	// Graphs. Training programs are compiled per (context, dropout) on
	// first use and share the store.
	var dump io.Writer
	if o.DumpIR != "" {
		dump = o.Progress
	}
	var specs []model.Spec
	runningByT := map[int][]model.Spec{}
	for _, c := range contexts {
		_, sp, err := model.Build(&cfg, model.Opts{T: c, B: batchOf(c), Mode: model.Train})
		if err != nil {
			return nil, err
		}
		if specs == nil {
			specs = sp
		}
		if err := model.InitStore(sp, store, o.Seed); err != nil {
			return nil, err
		}
		_, esp, err := model.Build(&cfg, model.Opts{T: c, B: 1, Mode: model.Eval})
		if err != nil {
			return nil, err
		}
		if err := model.InitStore(esp, store, o.Seed); err != nil {
			return nil, err
		}
		for _, s := range esp {
			if s.Running != "" {
				runningByT[c] = append(runningByT[c], s)
			}
		}
	}
	eg, especs, err := model.Build(&cfg, model.Opts{T: T, B: evalB, Mode: model.Eval, BatchStats: evalStats == "batch"})
	if err != nil {
		return nil, err
	}
	addProbes(eg, cfg.Layers, false, true)
	if err := passes.Run(eg, passes.EvalPipeline, &passes.Context{}); err != nil {
		return nil, err
	}
	if err := model.InitStore(especs, store, o.Seed); err != nil {
		return nil, err
	}
	backend := cpu.New(kernels.F32)
	eprog, err := backend.Compile(eg, passes.Plan(eg), store)
	if err != nil {
		return nil, err
	}
	defer eprog.Close()
	progs := map[[2]int]*trainProg{}
	defer func() {
		for _, p := range progs {
			p.prog.Close()
		}
	}()
	dumped := false
	trainProgram := func(c int, dropout float64) (*trainProg, error) {
		key := [2]int{c, int(math.Round(dropout * 1e6))}
		if p := progs[key]; p != nil {
			return p, nil
		}
		for k, p := range progs { // a new dropout rate retires the old programs
			if k[1] != key[1] {
				p.prog.Close()
				delete(progs, k)
			}
		}
		c2 := cfg
		c2.Dropout = dropout
		b := batchOf(c)
		g, _, err := model.Build(&c2, model.Opts{T: c, B: b, Mode: model.Train})
		if err != nil {
			return nil, err
		}
		addProbes(g, cfg.Layers, true, false)
		pc := &passes.Context{Loss: "loss"}
		if !dumped {
			pc.DumpAfter, pc.Dump = o.DumpIR, dump
			dumped = true
		}
		if err := passes.Run(g, passes.TrainPipeline, pc); err != nil {
			return nil, err
		}
		prog, err := backend.Compile(g, passes.Plan(g), store)
		if err != nil {
			return nil, err
		}
		p := &trainProg{prog: prog, T: c, B: b, dropout: dropout}
		progs[key] = p
		return p, nil
	}

	paramNames := []string{}
	pdata := map[string][]float32{}
	for _, s := range specs {
		if s.Param {
			paramNames = append(paramNames, s.Name)
			pdata[s.Name] = store.Get(s.Name).F32
		}
	}
	var biasScales, taus []*kernels.Tensor
	for _, s := range specs {
		if strings.HasSuffix(s.Name, ".bias_scale") {
			biasScales = append(biasScales, store.Get(s.Name))
		}
		if strings.HasSuffix(s.Name, ".attn.tau_att") {
			taus = append(taus, store.Get(s.Name))
		}
	}
	lambdaSat := store.Get(model.LambdaSat)

	// Controllers: fresh, or as the checkpoint left them.
	cs := st.Control
	if cs == nil {
		cs = &ControlState{Dropout: cfg.Dropout}
		if err := newControllers(cs, ctl, &cfg, contexts, steps, warm, evalEvery, o.Seed); err != nil {
			return nil, err
		}
		st.Control = cs
	} else if err := checkControllers(cs, ctl, contexts); err != nil {
		return nil, err
	}
	cs.EvalEvery, cs.GameEvery = evalEvery, gameEvery
	// Averaged weights beside the parameters: "ema.<p>" and "swa.<p>".
	shadow := func(prefix string) ([][]float32, error) {
		out := make([][]float32, len(paramNames))
		for i, n := range paramNames {
			t, err := store.Ensure(prefix+n, store.Get(n).Shape)
			if err != nil {
				return nil, err
			}
			out[i] = t.F32
		}
		return out, nil
	}
	raw := make([][]float32, len(paramNames))
	for i, n := range paramNames {
		raw[i] = pdata[n]
	}
	var emaW, swaW [][]float32
	if cs.EMA != nil {
		fresh := store.Get(control.EMAPrefix+paramNames[0]) == nil
		if emaW, err = shadow(control.EMAPrefix); err != nil {
			return nil, err
		}
		if fresh {
			for i := range emaW {
				copy(emaW[i], raw[i])
			}
		}
	}
	if cs.SWA != nil && cs.SWA.Count() > 0 {
		if swaW, err = shadow(control.SWAPrefix); err != nil {
			return nil, err
		}
	}

	mw, err := metrics.Open(filepath.Join(o.Out, "metrics.jsonl"))
	if err != nil {
		return nil, err
	}
	defer mw.Close()
	params := model.CountParams(specs)
	o.Log.Info("run", "model", cfg.Model, "align", cfg.UseRPA, "preset", preset.Name, "params", params, "context", T,
		"contexts", contexts, "batch", B, "tokens_per_step", tps, "steps", steps, "dataset", ds.Name, "protocol", ds.Protocol,
		"controller", ctl.controller(), "ema", ctl.EMA, "swa", ctl.SWA, "chaos", ctl.Chaos, "glide", ctl.DropoutGlide, "gemm", backend.Name())
	if st.Step == 0 {
		_ = mw.Write(map[string]any{"event": "start", "model": cfg.Model, "align": cfg.UseRPA, "preset": preset.Name, "params": params,
			"context": T, "contexts": contexts, "batch": B, "tokens_per_step": tps, "steps": steps, "dataset": ds.Name,
			"protocol": ds.Protocol, "lr": lr, "controller": ctl.controller(), "ema": ctl.EMA, "swa": ctl.SWA,
			"chaos": ctl.Chaos, "dropout_glide": ctl.DropoutGlide, "eval_every": evalEvery, "game_every": gameEvery,
			"layers": cfg.Layers, "R": cfg.R, "experts": cfg.Experts})
	}

	flat, floor := 0.3, 0.1
	if ctl.LRFlat != nil {
		flat = *ctl.LRFlat
	}
	if ctl.LRFloor != nil {
		floor = *ctl.LRFloor
	}
	sched := optim.Schedule{Peak: lr, FloorFrac: floor, FlatFrac: flat, WarmupSteps: min(100, steps/10), Total: steps}
	if err := sched.Validate(); err != nil {
		return nil, err
	}

	res := &Result{Params: params, Out: o.Out, InitialLoss: math.NaN(), FinalEMACE: math.NaN(), FinalSWACE: math.NaN()}
	prog := metrics.NewProgress(o.Progress, steps, "step")
	prog.TokensPerStep = tps
	start := time.Now()
	startStep := st.Step
	var startTokens = st.Tokens
	layers := cfg.Layers
	if cfg.Model != "fuzzy" {
		layers = 0
	}
	ensureAcc := func() {
		a := &cs.Acc
		if len(a.H) != layers {
			a.H, a.Sat, a.Usage = make([]float64, layers), make([]float64, layers), make([][]float64, layers)
		}
		if len(a.CE) != len(contexts) {
			a.CE, a.N = make([]float64, len(contexts)), make([]int, len(contexts))
		}
	}
	ensureAcc()
	biasDir := filepath.Join(o.Out, "bias")
	var curLR, curChaos, curScale float64 = sched.LR(st.Step), 1, 1

	// withWeights runs f with the store's parameters replaced by w.
	backup := make([][]float32, len(paramNames))
	withWeights := func(w [][]float32, f func() error) error {
		if w == nil {
			return f()
		}
		for i := range raw {
			if backup[i] == nil {
				backup[i] = make([]float32, len(raw[i]))
			}
			copy(backup[i], raw[i])
			copy(raw[i], w[i])
		}
		err := f()
		for i := range raw {
			copy(raw[i], backup[i])
		}
		return err
	}

	// Chaos perturbs training only: evaluations and checkpoints see the
	// plain warm-in scale.
	plainScale := func() {
		curScale = control.WarmIn(st.Step, warm)
		for _, t := range biasScales {
			t.Set(0, curScale)
		}
	}
	evalNow := func() error {
		plainScale()
		final := st.Step == steps
		nb := o.EvalBatches
		if final && o.FinalEvalBatches > 0 {
			nb = o.FinalEvalBatches
		}
		rec := map[string]any{"step": st.Step, "split": ds.EvalName, "epoch": cs.Epoch, "lr": curLR,
			"bias_scale": curScale, "tokens": st.Tokens}
		var snap []checkpoint.Named
		ce, err := evaluate(eprog, ds, T, evalB, nb, func(p kernels.Program) {
			for i := 0; i < cfg.Layers; i++ {
				if b := p.Output(probeBias(i)); b != nil && b.Len() == T*T {
					snap = append(snap, checkpoint.Named{Name: fmt.Sprintf("blocks.%d", i), Shape: []int{T, T},
						Data: b.Float32s()})
				}
			}
		})
		if err != nil {
			return err
		}
		st.LastValCE, res.FinalValCE = control.F(ce), ce
		rec["val_ce"], rec["val_ppl"] = ce, math.Exp(ce)
		if len(snap) > 0 {
			if err := saveBias(biasDir, snap, st.Step, T, cs.Epoch == 0); err != nil {
				return err
			}
		}
		if emaW != nil {
			var ece float64
			if err := withWeights(emaW, func() error {
				ece, err = evaluate(eprog, ds, T, evalB, nb, nil)
				return err
			}); err != nil {
				return err
			}
			res.FinalEMACE = ece
			rec["val_ce_ema"], rec["val_ppl_ema"] = ece, math.Exp(ece)
		}

		// Diagnostics of the epoch that just ended.
		a := &cs.Acc
		var usage [][]float64
		if layers > 0 && a.Steps > 0 {
			hs, sats := make([]float64, layers), make([]float64, layers)
			usage = make([][]float64, layers)
			for l := 0; l < layers; l++ {
				hs[l], sats[l] = a.H[l]/float64(a.Steps), a.Sat[l]/float64(a.Steps)
				for _, u := range a.Usage[l] {
					usage[l] = append(usage[l], u/float64(a.Steps))
				}
			}
			rec["mu_entropy_layers"], rec["mu_entropy"] = hs, mean(hs)
			rec["sat_frac_layers"], rec["sat_frac"] = sats, mean(sats)
			rec["expert_usage"] = usage
			rec["gate_delta"] = control.GateDelta(cs.PrevUsage, usage)
		}
		tauNow := make([]float64, len(taus))
		for i, t := range taus {
			tauNow[i] = t.At(0)
		}
		rec["tau_att"] = slices.Clone(tauNow)
		if cs.Game != nil {
			rec["contexts"], rec["q_context"] = contexts, cs.Game.Probs()
			rec["game_utility"] = cs.GameU
		}
		ceByCtx := map[string]float64{}
		for i, c := range contexts {
			if a.N[i] > 0 {
				ceByCtx[fmt.Sprint(c)] = a.CE[i] / float64(a.N[i])
			}
		}
		rec["train_ce_by_context"] = ceByCtx

		// SWA-select decides on this epoch with the raw weights' CE.
		if cs.SWA != nil {
			d := cs.SWA.Consider(cs.Epoch, ce)
			if d.Join {
				if swaW == nil {
					if swaW, err = shadow(control.SWAPrefix); err != nil {
						return err
					}
				}
				control.Accumulate(swaW, raw, cs.SWA.Count())
			}
			rec["swa_join"], rec["swa_in_zone"], rec["swa_gain"] = d.Join, d.InZone, nanNull(d.RelGain)
			rec["swa_members"], rec["swa_count"] = slices.Clone(cs.SWA.Members), cs.SWA.Count()
			if swaW != nil {
				var sce float64
				if err := withWeights(swaW, func() error {
					sce, err = evaluate(eprog, ds, T, evalB, nb, nil)
					return err
				}); err != nil {
					return err
				}
				res.FinalSWACE = sce
				rec["val_ce_swa"], rec["val_ppl_swa"] = sce, math.Exp(sce)
			}
			res.SWAMembers = slices.Clone(cs.SWA.Members)
		}

		// Controllers.
		switch {
		case cs.Guardian != nil:
			g := cs.Guardian
			r, adv := g.Learn(ce)
			rec["guardian_reward"], rec["guardian_advantage"] = r, nanNull(adv)
			if !final {
				g.Beta = g.Cfg.BetaAt(st.Step)
				obs := control.Observation{ValCE: ce}
				if v, ok := rec["gate_delta"].(float64); ok {
					obs.GateDelta = v
				}
				if v, ok := rec["sat_frac"].(float64); ok {
					obs.SatFrac = v
				}
				if v, ok := rec["mu_entropy"].(float64); ok {
					obs.MuEntropy = v
				}
				act := g.Act(obs, tauNow)
				for i, t := range taus {
					t.Set(0, tauNow[i])
				}
				rec["guardian_action"] = act.Raw
				rec["guardian_state"] = obs.Vector()
				rec["tau_att_after"] = slices.Clone(tauNow)
			}
			rec["guardian_beta"], rec["lambda_delta"], rec["lambda_sat"] = g.Beta, g.LambdaDelta, g.LambdaSat
		case cs.Scripted != nil:
			cs.Scripted.Observe(ce)
			rec["scripted_nudge"] = cs.Scripted.Nudging
		}

		cs.PrevUsage = usage
		cs.Epoch++
		cs.Acc = EpochStats{}
		ensureAcc()
		o.Log.Info("eval", "step", st.Step, "split", ds.EvalName, "val_ce", ce, "val_ppl", math.Exp(ce),
			"ema", rec["val_ce_ema"], "swa", rec["val_ce_swa"])
		return mw.WriteEval(rec)
	}
	save := func() error {
		plainScale()
		st.DataRNGs = st.DataRNGs[:0]
		for _, b := range batchers {
			s, err := b.State()
			if err != nil {
				return err
			}
			st.DataRNGs = append(st.DataRNGs, s)
		}
		st.DataRNG = st.DataRNGs[0]
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
		// Between steps: context, dropout glide, warm-in × chaos, τ schedule, λ_sat.
		ci := 0
		if cs.Game != nil {
			ci = cs.Game.Sample()
		}
		if ctl.DropoutGlide {
			cs.Dropout = control.QuantizeDropout(control.DropoutGlide(cfg.Dropout, float64(st.Step)/float64(steps)), 0.005)
		}
		tp, err := trainProgram(contexts[ci], cs.Dropout)
		if err != nil {
			return nil, err
		}
		curChaos = 1
		if cs.Chaos != nil {
			curChaos = cs.Chaos.Step()
		}
		curScale = control.WarmIn(st.Step, warm) * curChaos
		for _, t := range biasScales {
			t.Set(0, curScale)
		}
		if cs.Scripted != nil {
			tau := cs.Scripted.Tau(st.Step + 1)
			for _, t := range taus {
				t.Set(0, tau)
			}
		}
		if lambdaSat != nil && cs.Guardian != nil {
			lambdaSat.Set(0, cs.Guardian.LambdaSat)
		}

		Tc, Bc := tp.T, tp.B
		bt := batchers[ci].Next()
		feeds := map[string]*kernels.Tensor{
			"input_ids": kernels.IntTensor(ir.Shape{Bc, Tc}, bt.X),
			"targets":   kernels.IntTensor(ir.Shape{Bc * Tc}, bt.Y),
		}
		if err := tp.prog.Run(feeds, o.Seed*1_000_003+uint64(st.Step)); err != nil {
			return nil, err
		}
		p := tp.prog
		loss := p.Output("loss").At(0)
		ce := p.Output("ce_sum").At(0) / float64(Bc*Tc)
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			return nil, fmt.Errorf("step %d: loss is %v; lower --lr or check the data", st.Step, loss)
		}
		grads := map[string][]float32{}
		for _, n := range paramNames {
			if gt := p.Output(passes.GradName(n)); gt != nil {
				grads[n] = gt.F32
			}
		}
		gnorm := optim.ClipGlobalNorm(grads, clip)
		curLR = sched.LR(st.Step) * curChaos
		if err := opt.Step(pdata, grads, curLR); err != nil {
			return nil, err
		}
		for _, s := range runningByT[Tc] {
			stat := p.Output(s.Running)
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
		if emaW != nil {
			cs.EMA.Update(emaW, raw)
		}

		// Per-step diagnostics: membership entropy, saturation, expert usage.
		a := &cs.Acc
		var hMean, satMean float64
		for l := 0; l < layers; l++ {
			h, sat := math.NaN(), math.NaN()
			if t := p.Output(statH(l)); t != nil {
				h = t.At(0)
			}
			if t := p.Output(probeMu(l)); t != nil {
				sat = control.SatFraction(t.F32, cfg.R, control.SatThreshold)
			}
			if !math.IsNaN(h) {
				a.H[l] += h
			}
			if !math.IsNaN(sat) {
				a.Sat[l] += sat
			}
			hMean += h / float64(layers)
			satMean += sat / float64(layers)
			if t := p.Output(statUsage(l)); t != nil {
				if len(a.Usage[l]) != t.Len() {
					a.Usage[l] = make([]float64, t.Len())
				}
				for e := range a.Usage[l] {
					a.Usage[l][e] += t.At(e)
				}
			}
		}
		a.Steps++
		a.CE[ci] += ce
		a.N[ci]++
		if cs.Game != nil {
			cs.Game.Observe(ci, ce, zeroNaN(satMean), zeroNaN(hMean))
		}

		if math.IsNaN(res.InitialLoss) {
			res.InitialLoss = ce
		}
		res.FinalLoss = ce
		st.Step++
		st.Tokens += int64(Bc * Tc)
		el := time.Since(start).Seconds()
		tokps := float64(st.Tokens-startTokens) / math.Max(el, 1e-9)
		res.TokensPerS = tokps
		rec := map[string]any{"step": st.Step, "loss": loss, "train_ce": ce, "lr": curLR, "grad_norm": gnorm,
			"bias_scale": curScale, "tokens": st.Tokens, "tok_per_s": tokps, "context": Tc, "batch": Bc}
		if layers > 0 {
			rec["mu_entropy"], rec["sat_frac"] = nanNull(hMean), nanNull(satMean)
		}
		if cs.Chaos != nil {
			rec["chaos"] = curChaos
		}
		if ctl.DropoutGlide {
			rec["dropout"] = cs.Dropout
		}
		if err := mw.Write(rec); err != nil {
			return nil, err
		}
		prog.Update(st.Step, metrics.Fields{metrics.F("loss", ce), metrics.F("lr", curLR)})
		if cs.Game != nil && st.Step%gameEvery == 0 {
			cs.GameU = cs.Game.Update()
		}
		if (evalEvery > 0 && st.Step%evalEvery == 0) || st.Step == steps {
			if err := evalNow(); err != nil {
				return nil, err
			}
			if !o.SaveFinalOnly || st.Step == steps {
				if err := save(); err != nil {
					return nil, err
				}
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
	res.Tokens = st.Tokens
	return res, nil
}

// newControllers builds the switched-on controllers of a fresh run.
func newControllers(cs *ControlState, ctl Controls, cfg *model.Config, contexts []int, steps, warm, evalEvery int, seed uint64) error {
	var err error
	switch ctl.controller() {
	case "guardian":
		gc := ctl.Guardian
		if gc.TauMax == 0 {
			gc.TauMax = cfg.TauMax
		}
		if gc.BetaStart == 0 && gc.BetaRamp == 0 {
			gc.BetaStart, gc.BetaRamp = warm, max(1, steps/5)
		}
		if cs.Guardian, err = control.NewGuardian(gc, seed); err != nil {
			return err
		}
	case "scripted":
		lo, hi := ctl.ScriptedTauMin, ctl.ScriptedTauMax
		if lo == 0 {
			lo = 0.6 // the model clamps τ_att to [0.6, τ_max] inside the bias
		}
		if hi == 0 {
			hi = cfg.TauMax
		}
		if cs.Scripted, err = control.NewScripted(lo, hi, warm, steps); err != nil {
			return err
		}
	}
	if len(contexts) > 1 {
		gc := ctl.Game
		if gc == (control.GameConfig{}) {
			gc = control.DefaultGameConfig()
		}
		if cs.Game, err = control.NewContextGame(contexts, gc, math.Log(math.Max(2, float64(cfg.R))), seed); err != nil {
			return err
		}
	}
	if ctl.EMA {
		d := ctl.EMADecay
		if d == 0 {
			d = math.Min(0.9999, math.Max(0.9, 1-10/float64(steps)))
		}
		if cs.EMA, err = control.NewEMA(d); err != nil {
			return err
		}
	}
	if ctl.SWA {
		hi := ctl.SWAZoneHi
		if hi == 0 {
			hi = math.Inf(1)
		}
		band, gain := 0.03, 0.001
		if ctl.SWABand != nil {
			band = *ctl.SWABand
		}
		if ctl.SWAMinGain != nil {
			gain = *ctl.SWAMinGain
		}
		start := 0
		if ctl.SWAStart != nil {
			start = *ctl.SWAStart
		} else if evalEvery > 0 {
			start = steps / evalEvery / 2 // the paper collects from epoch 60 of 110
		}
		if cs.SWA, err = control.NewSWASelect(ctl.SWAZoneLo, hi, band, gain, start); err != nil {
			return err
		}
	}
	if ctl.Chaos {
		amp, decay := ctl.ChaosAmp, ctl.ChaosDecay
		if amp == 0 {
			amp = 0.25
		}
		if decay == 0 {
			decay = 4 / float64(max(1, steps))
		}
		if cs.Chaos, err = control.NewChaos(3.9, amp, decay); err != nil {
			return err
		}
	}
	return nil
}

// checkControllers reports flags that disagree with a resumed run's
// controllers (switching a controller on or off mid-run is not a resume).
func checkControllers(cs *ControlState, ctl Controls, contexts []int) error {
	var diffs []string
	on := func(name string, have, want bool) {
		if have != want {
			diffs = append(diffs, fmt.Sprintf("%s is %v in the run, %v in the flags", name, onOff(have), onOff(want)))
		}
	}
	on("guardian", cs.Guardian != nil, ctl.controller() == "guardian")
	on("scripted controller", cs.Scripted != nil, ctl.controller() == "scripted")
	on("context game", cs.Game != nil, len(contexts) > 1)
	on("EMA", cs.EMA != nil, ctl.EMA)
	on("SWA-select", cs.SWA != nil, ctl.SWA)
	on("chaos", cs.Chaos != nil, ctl.Chaos)
	if len(diffs) > 0 {
		return fmt.Errorf("--resume: the flags do not match the run: %s", strings.Join(diffs, "; "))
	}
	if cs.Guardian != nil {
		if err := cs.Guardian.Policy.Validate(); err != nil {
			return fmt.Errorf("--resume: %w", err)
		}
	}
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// saveBias writes a layer-by-layer snapshot of the attention bias B(T)
// (before the warm-in scale) to bias/late.safetensors, and on the first
// evaluation also to bias/early.safetensors.
func saveBias(dir string, snap []checkpoint.Named, step, T int, first bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	meta := map[string]string{"step": fmt.Sprint(step), "T": fmt.Sprint(T)}
	names := []string{"late"}
	if first {
		names = append(names, "early")
	}
	for _, n := range names {
		p := filepath.Join(dir, n+".safetensors")
		if err := checkpoint.SaveWeightsFile(p+".tmp", snap, meta); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	return nil
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

// nanNull turns NaN into a JSON null.
func nanNull(x float64) any {
	if math.IsNaN(x) {
		return nil
	}
	return x
}

// evaluate returns the mean pure CE over the eval split's sequential,
// non-overlapping chunks (drop_last), at most maxBatches batches (0 = all).
// first, when set, sees the program after the first batch.
func evaluate(p kernels.Program, ds *Dataset, T, B, maxBatches int, first func(kernels.Program)) (float64, error) {
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
		if bi == 0 && first != nil {
			first(p)
		}
		sum += p.Output("ce_sum").At(0)
		n += B * T
	}
	if n == 0 {
		return 0, fmt.Errorf("evaluation split too short for one batch of %d×%d", B, T)
	}
	return sum / float64(n), nil
}

// DefaultGameContexts are the context game's lengths when none are given:
// the preset's own training lengths when it has several (the paper preset:
// 384 and 768), else {T/2, T} for the evaluation length T (0 = the preset's).
func DefaultGameContexts(presetName string, T int) []int {
	p, err := model.LookupPreset(presetName)
	if err != nil {
		return nil
	}
	if T == 0 && len(p.Contexts) > 1 {
		return slices.Clone(p.Contexts)
	}
	if T == 0 {
		T = p.Contexts[0]
	}
	return []int{T / 2, T}
}
