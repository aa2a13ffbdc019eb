package training

import (
	"fmt"
	"log/slog"
	"math"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/training/data"
)

// The events of a training run, logged through Options.Log (see
// internal/logging): each has the fields that apply to it and a line for
// people. metrics.jsonl keeps the full per-step record; these are what a
// person (or a log collector) watches.

// LengthMemory is the memory plan of one training length.
type LengthMemory struct {
	Context    int   `json:"context"`
	Batch      int   `json:"batch"`
	MicroBatch int   `json:"micro_batch"`
	StepBytes  int64 `json:"step_bytes"`
}

// MemoryEvent is the run's memory plan ("train.memory").
type MemoryEvent struct {
	_       logging.Name   `log:"train.memory"`
	Planned int64          `log:"planned_bytes"`
	Budget  int64          `log:"budget_bytes"`
	Static  int64          `log:"static_bytes"`
	Eval    int64          `log:"eval_bytes"`
	Lengths []LengthMemory `log:"lengths"`
}

func (e MemoryEvent) Text() string {
	var steps, micro []string
	for _, l := range e.Lengths {
		steps = append(steps, FormatBytes(l.StepBytes))
		micro = append(micro, fmt.Sprintf("%d of %d sequences at T=%d", l.MicroBatch, l.Batch, l.Context))
	}
	return fmt.Sprintf("memory: %s planned of a %s budget (static %s, step %s, eval %s); micro-batch %s",
		FormatBytes(e.Planned), FormatBytes(e.Budget), FormatBytes(e.Static), strings.Join(steps, ", "), FormatBytes(e.Eval),
		strings.Join(micro, ", "))
}

// ParallelEvent is a data-parallel rank's collectives when the run ends
// ("train.parallel"): the time per step of the gradients' all-reduce and
// the statistics' (the wait for the slowest rank included).
type ParallelEvent struct {
	_         logging.Name `log:"train.parallel"`
	Rank      int
	Ranks     int
	Steps     int
	PerStep   float64 `log:"allreduce_s_per_step"`
	GradBytes int64   `log:"grad_bytes"`
	// Overlapped: the gradients' buckets were all-reduced on a second
	// stream during the backward (Parallel.Overlap).
	Overlapped bool
}

func (e ParallelEvent) Text() string {
	how := "after the backward"
	if e.Overlapped {
		how = "overlapped with the backward"
	}
	return fmt.Sprintf("data-parallel: rank %d of %d, %d steps, all-reduce %.2f ms per step (%s of gradients, %s)", e.Rank, e.Ranks, e.Steps,
		1e3*e.PerStep, FormatBytes(e.GradBytes), how)
}

// StartEvent describes the run as it starts or resumes ("train.start").
// Controls that are off are left out.
type StartEvent struct {
	_       logging.Name `log:"train.start"`
	Model   model.Kind
	Config  string // the model's size, model.Config.Summary
	Align   bool   // RPA alignment (fuzzy only)
	Preset  string
	Params  int
	Context int   // evaluation length
	Games   []int // the context game's lengths (nil: no game)
	// TokensPerStep and Steps: the whole run's; From is the step it
	// resumes after (0: a fresh run).
	TokensPerStep, Steps, From int
	Dataset, Protocol          string
	Backend                    string
	// Optimizer says where the weights, moments, clipping and EMA are
	// updated: "host" or "device".
	Optimizer              string
	Controller             string // "" or none: no controller
	EMA, SWA, Chaos, Glide bool
}

func (e StartEvent) controls() []string {
	var on []string
	if e.Controller != "" && e.Controller != "none" {
		on = append(on, "controller "+e.Controller)
	}
	if len(e.Games) > 0 {
		on = append(on, fmt.Sprintf("context game %v", e.Games))
	}
	for _, c := range []struct {
		on   bool
		name string
	}{{e.EMA, "EMA"}, {e.SWA, "SWA-select"}, {e.Chaos, "chaos"}, {e.Glide, "dropout glide"}} {
		if c.on {
			on = append(on, c.name)
		}
	}
	return on
}

func (e StartEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.String("model", e.Model.String()), slog.String("config", e.Config)}
	if e.Model == model.Fuzzy {
		a = append(a, slog.Bool("align", e.Align))
	}
	if e.Preset != "" {
		a = append(a, slog.String("preset", e.Preset))
	}
	a = append(a, slog.Int("params", e.Params), slog.Int("context", e.Context))
	if len(e.Games) > 0 {
		a = append(a, slog.Any("contexts", e.Games))
	}
	a = append(a, slog.Int("tokens_per_step", e.TokensPerStep), slog.Int("steps", e.Steps))
	if e.From > 0 {
		a = append(a, slog.Int("resume_from", e.From))
	}
	a = append(a, slog.String("dataset", e.Dataset), slog.String("protocol", e.Protocol), slog.String("backend", e.Backend),
		slog.String("optimizer", e.Optimizer))
	if e.Controller != "" && e.Controller != "none" {
		a = append(a, slog.String("controller", e.Controller))
	}
	for _, c := range []struct {
		on  bool
		key string
	}{{e.EMA, "ema"}, {e.SWA, "swa"}, {e.Chaos, "chaos"}, {e.Glide, "dropout_glide"}} {
		if c.on {
			a = append(a, slog.Bool(c.key, true))
		}
	}
	return a
}

func (e StartEvent) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "model: %s, %d parameters", e.Config, e.Params)
	if e.Model == model.Fuzzy && !e.Align {
		b.WriteString(" (legacy bias, no RPA alignment)")
	}
	verb := "training"
	if e.From > 0 {
		verb = fmt.Sprintf("resuming after step %d of", e.From)
	}
	data := e.Dataset + " (" + e.Protocol + ")"
	if strings.HasPrefix(e.Protocol, e.Dataset) {
		data = e.Protocol
	}
	fmt.Fprintf(&b, "; %s %d steps × %d tokens on %s, eval at T=%d", verb, e.Steps, e.TokensPerStep, data, e.Context)
	if on := e.controls(); len(on) > 0 {
		b.WriteString("; " + strings.Join(on, ", "))
	}
	fmt.Fprintf(&b, "; backend %s", e.Backend)
	if e.Optimizer == "device" {
		b.WriteString(", training state on the device")
	}
	return b.String()
}

// EvalEvent is one evaluation during training ("train.eval"). NaN fields
// (EMA, SWA) and a nil Recall are left out.
type EvalEvent struct {
	_           logging.Name `log:"train.eval"`
	Step, Steps int
	Split       string
	CE          float64
	Tokens      int
	Recall      *float64 // accuracy on the synthetic corpus's answers (nil: none were scored)
	RecallN     int
	Breakdown   *data.RecallBreakdown // MQAR: recall by query distance, pair slot and query order (nil: none)
	EMACE       float64               // NaN: no EMA
	SWACE       float64               // NaN: no SWA average yet
	SWACount    int
}

func (e EvalEvent) Attrs() []slog.Attr {
	a := []slog.Attr{slog.Int("step", e.Step), slog.Int("steps", e.Steps), slog.String("split", e.Split),
		slog.Float64("val_ce", e.CE), slog.Float64("val_ppl", math.Exp(e.CE)), slog.Int("val_tokens", e.Tokens)}
	if e.Recall != nil {
		a = append(a, slog.Float64("recall_acc", *e.Recall), slog.Int("recall_n", e.RecallN))
	}
	if e.Breakdown != nil {
		a = append(a, slog.Any("recall_by_dist", e.Breakdown.ByDist), slog.Any("recall_by_slot", e.Breakdown.BySlot),
			slog.Any("recall_by_order", e.Breakdown.ByOrder))
	}
	if !math.IsNaN(e.EMACE) {
		a = append(a, slog.Float64("val_ce_ema", e.EMACE), slog.Float64("val_ppl_ema", math.Exp(e.EMACE)))
	}
	if !math.IsNaN(e.SWACE) {
		a = append(a, slog.Float64("val_ce_swa", e.SWACE), slog.Float64("val_ppl_swa", math.Exp(e.SWACE)), slog.Int("swa_count", e.SWACount))
	}
	return a
}

func (e EvalEvent) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "eval step %d/%d on %s: CE %.4f (ppl %.1f) over %d tokens", e.Step, e.Steps, e.Split, e.CE, math.Exp(e.CE), e.Tokens)
	if e.Recall != nil {
		fmt.Fprintf(&b, ", recall %.4f (%d answers)", *e.Recall, e.RecallN)
	}
	if e.Breakdown != nil {
		b.WriteString(e.Breakdown.Text())
	}
	if !math.IsNaN(e.EMACE) {
		fmt.Fprintf(&b, ", EMA CE %.4f", e.EMACE)
	}
	if !math.IsNaN(e.SWACE) {
		fmt.Fprintf(&b, ", SWA CE %.4f (%d epochs)", e.SWACE, e.SWACount)
	}
	return b.String()
}

// SkippedStepEvent is a step whose loss or gradient norm was not finite
// ("train.skipped_step", a warning).
type SkippedStepEvent struct {
	_        logging.Name `log:"train.skipped_step"`
	Step     int          `log:"step"`
	Loss     float64      `log:"loss"`
	GradNorm float64      `log:"grad_norm"`
	Skipped  int          `log:"skipped_total"` // steps skipped so far
}

func (e SkippedStepEvent) Text() string {
	return fmt.Sprintf("step %d skipped: loss %v, gradient norm %v (the weights are unchanged; %d skipped so far)",
		e.Step, e.Loss, e.GradNorm, e.Skipped)
}

// ResumeLREvent is a resume with another peak learning rate
// ("train.resume_lr", a warning).
type ResumeLREvent struct {
	_   logging.Name `log:"train.resume_lr"`
	LR  float64      `log:"lr"`
	Was float64      `log:"run_lr"`
}

func (e ResumeLREvent) Text() string {
	return fmt.Sprintf("--resume with another peak LR: %g (the run: %g); the schedule continues at the new peak", e.LR, e.Was)
}

// AblationRunEvent starts one run of an ablation ("ablate.run").
type AblationRunEvent struct {
	_     logging.Name `log:"ablate.run"`
	Stage string       `log:"stage"`
	Label string       `log:"label"`
	Seed  uint64       `log:"seed"`
	Dir   string       `log:"dir"`
}

func (e AblationRunEvent) Text() string {
	return fmt.Sprintf("ablation: %s, seed %d → %s", e.Label, e.Seed, e.Dir)
}

// AblationReuseEvent is an ablation run found finished ("ablate.reuse").
type AblationReuseEvent struct {
	_     logging.Name `log:"ablate.reuse"`
	Stage string       `log:"stage"`
	Seed  uint64       `log:"seed"`
	CE    float64      `log:"val_ce"`
}

func (e AblationReuseEvent) Text() string {
	return fmt.Sprintf("ablation: %s, seed %d already finished (val CE %.4f); reusing it", e.Stage, e.Seed, e.CE)
}
