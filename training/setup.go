package training

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/training/optim"
)

// Plan is a training run decided before its first step: Options, the
// preset, a config file and the data resolved into one set of numbers.
type Plan struct {
	Preset string
	Config model.Config
	// Contexts are the training lengths; more than one plays the context game.
	Contexts []int
	// EvalT is the evaluation length; EvalBatch sequences per evaluation
	// batch, run EvalMicro at a time.
	EvalT, EvalBatch, EvalMicro int
	TokensPerStep               int
	// Lengths holds each training length's batch and micro-batch.
	Lengths   []LengthPlan
	Steps     int
	Schedule  optim.Schedule
	WarmIn    int
	GradClip  float64
	EvalEvery int // steps per evaluation and controller epoch (0: at the end only)
	GameEvery int // steps per context-game update
	EvalStats string
	Memory    MemoryPlan
	// Ranks is the data-parallel job's number of ranks (1: one process):
	// every batch is shared among them, micro-batch by micro-batch.
	Ranks int
}

// LengthPlan is one training length's batch, run as Batch/Micro
// micro-batches of Micro sequences.
type LengthPlan struct {
	T     int `json:"T"`
	Batch int `json:"batch"`
	Micro int `json:"micro_batch"`
}

// checkRanks refuses a batch the ranks cannot share equally.
func (p *Plan) checkRanks() error {
	for _, l := range p.Lengths {
		if l.Batch%p.Ranks != 0 {
			return fmt.Errorf("the batch of %d sequences at context %d (tokens per step ÷ context) cannot be shared equally by %d ranks: choose --tokens-per-step so that the ranks divide the batch", l.Batch, l.T, p.Ranks)
		}
	}
	return nil
}

// Game reports whether the run plays the context game.
func (p *Plan) Game() bool { return len(p.Contexts) > 1 }

// Length returns the plan of training length T.
func (p *Plan) Length(T int) LengthPlan {
	for _, l := range p.Lengths {
		if l.T == T {
			return l
		}
	}
	return LengthPlan{}
}

// Setup resolves o into a Plan. ds supplies the vocabulary and the split
// sizes (nil: the preset's vocabulary, no data checks: benchmarks). prev is
// the run being resumed, or nil. The memory plan is sized for the graphs
// o.Backend runs (its Capabilities); without one, o.Device must be the CPU.
// Nothing is written.
func Setup(o Options, ds *Dataset, prev *Run) (*Plan, error) {
	preset, err := model.LookupPreset(o.Preset)
	if err != nil {
		return nil, err
	}
	p := &Plan{Preset: preset.Name}
	caps, err := planCapabilities(o)
	if err != nil {
		return nil, err
	}
	if o.MemBudget == 0 {
		if o.MemBudget, err = memBudget(caps); err != nil {
			return nil, err
		}
	}
	if err := p.resolveControls(o); err != nil {
		return nil, err
	}
	if err := p.resolveConfig(o, preset, ds, prev); err != nil {
		return nil, err
	}
	if err := p.resolveLengths(o, preset, ds); err != nil {
		return nil, err
	}
	if err := p.resolveSchedule(o, preset, ds, prev); err != nil {
		return nil, err
	}
	p.Ranks = o.Parallel.Ranks()
	if err := p.checkRanks(); err != nil {
		return nil, err
	}
	if err := p.planMemory(o, caps, prev); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Plan) resolveControls(o Options) error {
	switch o.Control.controller() {
	case "none", "guardian", "scripted":
	default:
		return fmt.Errorf("--controller %q: want none, guardian or scripted", o.Control.Controller)
	}
	p.EvalStats = o.EvalStats
	if p.EvalStats == "" {
		p.EvalStats = "running"
	}
	if p.EvalStats != "running" && p.EvalStats != "batch" {
		return fmt.Errorf("--eval-stats %q: want running or batch", p.EvalStats)
	}
	if o.MicroBatch < 0 {
		return fmt.Errorf("--micro-batch %d: want a positive number of sequences, or auto", o.MicroBatch)
	}
	return nil
}

// resolveConfig: preset ← Options.Config ← config file ← size flags ←
// model, dropout and alignment flags; the vocabulary comes from the data.
// A resumed run keeps its own config.
func (p *Plan) resolveConfig(o Options, preset model.Preset, ds *Dataset, prev *Run) error {
	base := preset.Config
	if o.Config != nil {
		base = *o.Config
	}
	if o.Model != model.KindUnset {
		base.Model = o.Model
	}
	if ds != nil {
		base.Vocab = ds.Vocab
	}
	cfg, err := model.Resolve(base, o.ConfigFile, o.Sizes)
	if err != nil {
		return err
	}
	if o.Dropout >= 0 {
		cfg.Dropout = o.Dropout
	}
	if o.NoAlign {
		cfg.UseRPA = false
	}
	if prev != nil {
		if err := sameArchitecture(prev.Config, cfg); err != nil {
			return err
		}
		cfg = prev.Config
	}
	p.Config = cfg
	return p.Config.Validate()
}

// sameArchitecture refuses to resume a run with flags that describe
// another model.
func sameArchitecture(have, want model.Config) error {
	var diffs []string
	cmp := func(name string, a, b any) {
		if a != b {
			diffs = append(diffs, fmt.Sprintf("%s %v (flags: %v)", name, a, b))
		}
	}
	cmp("model", have.Model, want.Model)
	cmp("d_model", have.DModel, want.DModel)
	cmp("layers", have.Layers, want.Layers)
	cmp("heads", have.Heads, want.Heads)
	cmp("vocab", have.Vocab, want.Vocab)
	if len(diffs) > 0 {
		return fmt.Errorf("--resume: the checkpoint holds another model: %s", strings.Join(diffs, ", "))
	}
	return nil
}

// resolveLengths decides the evaluation length, the training lengths and
// their batches.
func (p *Plan) resolveLengths(o Options, preset model.Preset, ds *Dataset) error {
	contexts := slices.Clone(o.Control.Contexts)
	if len(contexts) == 0 && o.Control.GameDefault {
		contexts = DefaultGameContexts(preset.Name, o.Context)
	}
	if len(contexts) < 2 {
		contexts = nil
	}
	for _, c := range contexts {
		if c < 2 {
			return fmt.Errorf("--contexts: context %d is too short (at least 2)", c)
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
		return fmt.Errorf("--context %d is too short (at least 2)", T)
	}
	if contexts == nil {
		contexts = []int{T}
	}
	p.Contexts, p.EvalT = contexts, T
	longest := max(T, slices.Max(contexts))
	if err := checkLengthFits(longest, o.MemBudget); err != nil {
		return err
	}
	p.Config.MaxLen = max(p.Config.MaxLen, longest)
	tps := o.TokensPerStep
	if tps == 0 {
		tps = preset.TokensPerStep
	}
	p.TokensPerStep = max(tps, longest)
	p.Lengths = nil
	for _, c := range contexts {
		b := max(1, p.TokensPerStep/c)
		p.Lengths = append(p.Lengths, LengthPlan{T: c, Batch: b, Micro: b})
	}
	p.EvalBatch = max(1, p.TokensPerStep/T)
	if ds != nil {
		chunks := ds.EvalChunks(T)
		if chunks < 1 {
			return fmt.Errorf("the %s split has %d tokens, fewer than one evaluation chunk of context %d + 1", ds.EvalName, ds.EvalLen(), T)
		}
		p.EvalBatch = min(p.EvalBatch, chunks)
	}
	p.EvalMicro = p.EvalBatch
	return nil
}

// resolveSchedule decides steps, LR schedule, warm-in, clipping and the
// evaluation and game intervals.
func (p *Plan) resolveSchedule(o Options, preset model.Preset, ds *Dataset, prev *Run) error {
	steps := o.Steps
	if steps == 0 && o.Epochs > 0 && ds != nil {
		steps = int(math.Ceil(o.Epochs * float64(ds.TrainLen()) / float64(p.TokensPerStep)))
	}
	if steps == 0 {
		steps = preset.Steps
	}
	if steps < 0 {
		return fmt.Errorf("--steps %d must not be negative", steps)
	}
	if prev != nil && steps <= prev.State.Step {
		steps = prev.State.TotalSteps // resuming without new --steps: the run's own length
	}
	p.Steps = steps
	lr := o.LR
	if lr == 0 {
		lr = preset.PeakLR
	}
	p.WarmIn = o.WarmIn
	if p.WarmIn < 0 {
		p.WarmIn = preset.WarmIn
	}
	p.GradClip = o.GradClip
	if p.GradClip == 0 {
		p.GradClip = 1.0
	}
	ctl := o.Control
	p.EvalEvery = o.EvalEvery
	perEpoch := ctl.controller() != "none" || ctl.SWA || p.Game()
	if p.EvalEvery == 0 && perEpoch {
		p.EvalEvery = max(1, steps/10)
	}
	p.GameEvery = ctl.GameEvery
	if p.GameEvery <= 0 {
		p.GameEvery = max(1, p.EvalEvery)
		if p.EvalEvery == 0 {
			p.GameEvery = max(1, steps/10)
		}
	}
	flat, floor := 0.3, 0.1
	if ctl.LRFlat != nil {
		flat = *ctl.LRFlat
	}
	if ctl.LRFloor != nil {
		floor = *ctl.LRFloor
	}
	p.Schedule = optim.Schedule{Peak: lr, FloorFrac: floor, FlatFrac: flat, WarmupSteps: min(100, steps/10), Total: max(1, steps)}
	if err := p.Schedule.Validate(); err != nil {
		return err
	}
	return nil
}

// errNoFit is wrapped by planMemory's error when even one sequence per
// micro-batch does not fit the budget.
var errNoFit = errors.New("does not fit the memory budget")

// checkLengthFits refuses a context whose graphs alone (the fuzzy model's
// [T,T] position constants, held in float64 by the IR, and a [T,T] score
// matrix per head) could not fit the budget, before any graph is built.
func checkLengthFits(T int, budget int64) error {
	if budget == 0 {
		var err error
		if budget, err = DefaultMemBudget(); err != nil {
			return err
		}
	}
	need := int64(T) * int64(T) * 16 // posdist and its z-scored bias, float64
	if need > budget/2 {
		return fmt.Errorf("context %d: its [T,T] attention constants alone need %s, more than half of the %s memory budget; use a shorter --context (or raise --mem-budget)",
			T, FormatBytes(need), FormatBytes(budget))
	}
	return nil
}
