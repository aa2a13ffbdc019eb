package training

import (
	"io"
	"log/slog"
	"slices"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/data"
)

// Options are the knobs of `rpac train`.
type Options struct {
	Preset  string
	Model   model.Kind // model.KindUnset: the preset's
	Dataset string     // wikitext2 | synthetic | mqar
	DataDir string
	// Synthetic shapes the synthetic corpus (zero fields: defaults).
	Synthetic data.SyntheticConfig
	// MQAR shapes the MQAR corpus (zero fields: defaults).
	MQAR          data.MQARConfig
	TrainSplit    string
	EvalSplit     string
	Context       int // 0 = the preset's first context (with the context game: the longest game context); the evaluation length
	TokensPerStep int // 0 = preset
	Steps         int // 0 = from Epochs or the preset (see InitOnly)
	Epochs        float64
	// InitOnly writes the initialised checkpoint (step 0) and stops:
	// `rpac train --steps 0`.
	InitOnly    bool
	EvalEvery   int // 0 = only at the end (with per-epoch controllers: steps/10)
	EvalBatches int // 0 = every full eval batch of the split
	// FinalEvalBatches limits the last evaluation (0 = EvalBatches, < 0 =
	// the whole split).
	FinalEvalBatches int
	Seed             uint64
	Out              string
	Resume           bool
	Device           Device
	// Backend, when set, replaces the backend Device would open (tests
	// drive a run through the CUDA backend's dry-run device with it).
	Backend   kernels.Backend
	Precision ir.Precision // GEMM arithmetic (CUDA: bf16 by default)
	// CUDA chooses the CUDA backend's paths (nil: cuda.DefaultOptions();
	// the command line passes cuda.OptionsFromEnv's).
	CUDA *cuda.Options
	// HostOptimizer keeps the optimizer, the clipping and the EMA on the
	// host on CUDA (--host-optimizer); by default a CUDA run keeps its
	// training state on the device (optstate.go).
	HostOptimizer bool
	// Experts is the dispatch of the fuzzy blocks' experts in the
	// training steps (--expert-dispatch; passes.DispatchAuto: the backend's
	// choice, kernels.Capabilities.RoutedExperts).
	Experts   passes.Dispatch
	LR        float64 // 0 = preset
	Dropout   float64 // <0 = preset
	WarmIn    int     // <0 = preset
	GradClip  float64
	EvalStats string // running | batch
	DumpIR    string
	// NoAlign trains the fuzzy model without the RPA alignment (the
	// listing's legacy bias from fuzz_sim = mean_b μμᵀ): the ablation's
	// baseline.
	NoAlign bool
	Control Controls
	// Log receives the run's events (see events.go): nil means one
	// human-readable line each on Progress.
	Log *slog.Logger
	// Progress is where --dump-ir prints, and the events go when Log is
	// nil (nil: stderr).
	Progress io.Writer
	// Config, when set, replaces the preset's model configuration (tests,
	// experiments); Model and Dropout still apply on top.
	Config *model.Config
	// ConfigFile is a JSON file with fields of model.Config applied over
	// the preset; Sizes override both (flags beat the file).
	ConfigFile string
	Sizes      model.Overrides
	// MicroBatch is the number of sequences per forward/backward pass; the
	// gradients of a step's micro-batches are accumulated before one
	// optimizer step. 0: the largest that fits MemBudget.
	MicroBatch int
	// MemBudget bounds the memory the run plans for, in bytes (0: 80% of
	// the memory available to the process, cgroup limits included).
	MemBudget int64
	// StopAfter ends the run (with a checkpoint) after this many steps of
	// this invocation (`rpac train --stop-after`). 0 = no limit.
	StopAfter int
	// SaveFinalOnly writes the checkpoint only at the end (and on an
	// interrupt), not at every evaluation.
	SaveFinalOnly bool
	// Loss chooses the tokens the training loss averages over ("" = all);
	// evaluations score every token whatever it is.
	Loss LossTargets
	// Parallel places the run in a data-parallel job (the launch
	// environment); not part of the run's record: a run resumes on any
	// number of ranks.
	Parallel Parallel `json:"-"`
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
	Contexts []int
	// GameDefault plays the game on DefaultGameContexts when Contexts is
	// empty (rpac train --all).
	GameDefault bool
	Game        control.GameConfig // zero: DefaultGameConfig
	GameEvery   int                // steps per game update (0 = the eval interval)

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

// DataSpec is the run's data.
func (o Options) DataSpec() DataSpec {
	return DataSpec{Name: o.Dataset, Dir: o.DataDir, TrainSplit: o.TrainSplit, EvalSplit: o.EvalSplit, Seed: o.Seed, Synthetic: o.Synthetic, MQAR: o.MQAR}
}
