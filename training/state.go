package training

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/data"
)

// stateFormat is the RunState format this build writes (1 and 2 are read).
const stateFormat = 2

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
	// TrainSplit is the WikiText-2 split the run trained on (absent for
	// the synthetic corpus).
	TrainSplit string `json:"train_split,omitempty"`
	// DataDir is the WikiText-2 directory the run read (absolute); export,
	// eval and verify use it when no --data-dir is given.
	DataDir string `json:"data_dir,omitempty"`
	// Lengths records each training length's batch and micro-batch.
	Lengths []LengthPlan `json:"lengths,omitempty"`
	// SkippedSteps counts the steps skipped for a non-finite loss or
	// gradient norm.
	SkippedSteps int `json:"skipped_steps,omitempty"`
	// PeakLR is the schedule's peak learning rate.
	PeakLR  float64       `json:"peak_lr,omitempty"`
	Control *ControlState `json:"control,omitempty"`
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

// saveCheckpoint writes the store, the optimizer and the run state atomically.
func saveCheckpoint(dir string, store *kernels.Store, mom []checkpoint.Named, steps int, st *RunState) error {
	st.OptimStep = steps
	js, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := checkpoint.Save(dir, &checkpoint.Checkpoint{Weights: checkpoint.FromStore(store), Optim: mom, State: js}); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// restore continues prev: its weights, optimizer moments, data streams,
// controllers and counters. The flags must describe the same run.
func (r *run) restore(prev *Run) error {
	p := r.plan
	saved := prev.State
	if saved.Context != p.EvalT || saved.Batch != p.EvalBatchOf() {
		return fmt.Errorf("--resume: the run was trained at context %d batch %d, these flags give %d and %d", saved.Context, saved.Batch, p.EvalT, p.EvalBatchOf())
	}
	var want []int
	if p.Game() {
		want = p.Contexts
	}
	if !slices.Equal(saved.Contexts, want) {
		return fmt.Errorf("--resume: the run's context game lengths are %v, these flags give %v", saved.Contexts, want)
	}
	if err := r.sameData(prev); err != nil {
		return err
	}
	params, err := prev.ParamNames()
	if err != nil {
		return err
	}
	var missing []string
	for _, n := range params {
		if prev.Store.Get(n) == nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("--resume: the checkpoint lacks %d parameter(s) (%s); it cannot continue this run", len(missing), strings.Join(head(missing, 5), ", "))
	}
	r.store = prev.Store
	if err := r.opt.Import(prev.Optim, saved.OptimStep); err != nil {
		return fmt.Errorf("--resume: optimizer state: %w", err)
	}
	rngs := saved.DataRNGs
	if len(rngs) == 0 { // format 1: one context, one generator
		rngs = []data.RNGState{saved.DataRNG}
	}
	if len(rngs) != len(r.batchers) {
		return fmt.Errorf("--resume: the checkpoint holds %d data generators, the flags ask for %d context lengths", len(rngs), len(r.batchers))
	}
	for i, b := range r.batchers {
		if err := b.SetState(rngs[i]); err != nil {
			return fmt.Errorf("--resume: %w", err)
		}
	}
	opts := r.st.Options
	*r.st = saved
	r.st.Options, r.st.Format = opts, stateFormat
	r.st.TotalSteps, r.st.Lengths, r.st.PeakLR = p.Steps, p.Lengths, p.Schedule.Peak
	if r.st.DataDir == "" {
		r.st.DataDir = r.ds.Dir
	}
	if r.st.RunningOK == nil {
		r.st.RunningOK = map[string]bool{}
	}
	return nil
}

// marshalOptions records the run's options in state.json.
// JSON has no infinities: the CLI's default SWA zone "0,inf" is recorded
// as its documented equivalent 0 (without this the whole record was null,
// and export and eval lost the run's seed and corpus shape).
func marshalOptions(o Options) json.RawMessage {
	o.Log, o.Progress = nil, nil
	if math.IsInf(o.Control.SWAZoneHi, 1) {
		o.Control.SWAZoneHi = 0
	}
	b, err := json.Marshal(o)
	if err != nil {
		return nil
	}
	return b
}

// sameData refuses a resume whose flags would read other data than the
// run did (seed, dataset, training split) and warns when the peak LR
// changes (a deliberate lower LR after a divergence is allowed).
func (r *run) sameData(prev *Run) error {
	po, o := prev.options, r.o
	var diffs []string
	if po.Seed != 0 && po.Seed != o.Seed {
		diffs = append(diffs, fmt.Sprintf("--seed %d (the run: %d)", o.Seed, po.Seed))
	}
	if po.TrainSplit != "" && o.TrainSplit != "" && po.TrainSplit != o.TrainSplit {
		diffs = append(diffs, fmt.Sprintf("--train-split %s (the run: %s)", o.TrainSplit, po.TrainSplit))
	}
	if po.Dataset != "" && o.Dataset != "" && po.Dataset != o.Dataset {
		diffs = append(diffs, fmt.Sprintf("--dataset %s (the run: %s)", o.Dataset, po.Dataset))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("--resume: these flags differ from the run's: %s; a resumed run must read the same data", strings.Join(diffs, ", "))
	}
	if was := prev.State.PeakLR; was != 0 && was != r.plan.Schedule.Peak {
		logging.Warn(r.o.Log, ResumeLREvent{LR: r.plan.Schedule.Peak, Was: was})
	}
	return nil
}
