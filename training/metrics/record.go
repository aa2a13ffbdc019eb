package metrics

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"

	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/data"
)

// Record is one line of metrics.jsonl: the run's start, a training step, a
// skipped step or an evaluation (Kind tells which). A field that does not
// apply to a record is absent from its line: the zero Num, a nil pointer,
// slice or map, an empty string (an empty list that applies is written).
type Record struct {
	Step int   `json:"step,omitempty"` // steps done, this one included; absent from the start record
	Time Stamp `json:"time"`           // unix seconds; the Writer stamps a record that has none

	// Event names a record that is neither a step nor an evaluation
	// ("start"); Start holds the start record's fields.
	Event string `json:"event,omitempty"`
	Start *Start `json:"-"`

	// A training step (train_ce present) or a skipped one (Skipped).
	Loss         Num   `json:"loss,omitzero"`
	TrainCE      Num   `json:"train_ce,omitzero"`
	GradNorm     Num   `json:"grad_norm,omitzero"`
	TokPerS      Num   `json:"tok_per_s,omitzero"`
	Context      int   `json:"context,omitempty"`
	Batch        int   `json:"batch,omitempty"`
	MicroBatch   int   `json:"micro_batch,omitempty"` // when micro-batches split the batch
	Chaos        Num   `json:"chaos,omitzero"`
	Dropout      Num   `json:"dropout,omitzero"`
	Skipped      bool  `json:"skipped,omitempty"`
	SkippedTotal int   `json:"skipped_total,omitempty"`
	Tokens       int64 `json:"tokens,omitempty"`

	// Steps and evaluations: the schedule's state.
	LR        Num `json:"lr,omitzero"`
	BiasScale Num `json:"bias_scale,omitzero"`

	// An evaluation (val_ce present).
	Split     string `json:"split,omitempty"`
	Epoch     *int   `json:"epoch,omitempty"`
	ValCE     Num    `json:"val_ce,omitzero"`
	ValPPL    Num    `json:"val_ppl,omitzero"`
	ValTokens int    `json:"val_tokens,omitempty"`
	ValCEEMA  Num    `json:"val_ce_ema,omitzero"`
	ValPPLEMA Num    `json:"val_ppl_ema,omitzero"`
	ValCESWA  Num    `json:"val_ce_swa,omitzero"`
	ValPPLSWA Num    `json:"val_ppl_swa,omitzero"`
	RecallAcc Num    `json:"recall_acc,omitzero"`
	RecallN   *int   `json:"recall_n,omitempty"`
	*data.RecallBreakdown

	// Diagnostics: per step the means over layers, per evaluation the
	// interval's means (and per layer).
	MuEntropy       Num         `json:"mu_entropy,omitzero"`
	MuEntropyLayers []float64   `json:"mu_entropy_layers,omitzero"`
	SatFrac         Num         `json:"sat_frac,omitzero"`
	SatFracLayers   []float64   `json:"sat_frac_layers,omitzero"`
	ExpertUsage     [][]float64 `json:"expert_usage,omitzero"`
	GateDelta       Num         `json:"gate_delta,omitzero"`
	TauAtt          []float64   `json:"tau_att,omitzero"`

	// The context game.
	Contexts         []int              `json:"contexts,omitzero"`
	QContext         []float64          `json:"q_context,omitzero"`
	GameUtility      []float64          `json:"game_utility,omitzero"`
	TrainCEByContext map[string]float64 `json:"train_ce_by_context,omitzero"`

	// SWA-select.
	SWAJoin    *bool `json:"swa_join,omitempty"`
	SWAInZone  *bool `json:"swa_in_zone,omitempty"`
	SWAGain    Num   `json:"swa_gain,omitzero"`
	SWAMembers []int `json:"swa_members,omitzero"`
	SWACount   *int  `json:"swa_count,omitempty"`

	// The τ controllers.
	ScriptedNudge     *bool     `json:"scripted_nudge,omitempty"`
	GuardianReward    Num       `json:"guardian_reward,omitzero"`
	GuardianAdvantage Num       `json:"guardian_advantage,omitzero"`
	GuardianAction    []float64 `json:"guardian_action,omitzero"`
	GuardianState     []float64 `json:"guardian_state,omitzero"`
	TauAttAfter       []float64 `json:"tau_att_after,omitzero"`
	GuardianBeta      Num       `json:"guardian_beta,omitzero"`
	LambdaDelta       Num       `json:"lambda_delta,omitzero"`
	LambdaSat         Num       `json:"lambda_sat,omitzero"`
}

// Start is the start record's content: the run's settings as it began.
type Start struct {
	Model         string          `json:"model"`
	Align         bool            `json:"align"`
	Preset        string          `json:"preset"`
	Params        int             `json:"params"`
	Config        json.RawMessage `json:"config,omitempty"` // the model's configuration, as in config.json
	Context       int             `json:"context"`
	Contexts      []int           `json:"contexts"`
	Batch         int             `json:"batch"`
	Lengths       json.RawMessage `json:"lengths,omitempty"` // each length's batch and micro-batch, as in state.json
	TokensPerStep int             `json:"tokens_per_step"`
	Steps         int             `json:"steps"`
	Dataset       string          `json:"dataset"`
	Protocol      string          `json:"protocol"`
	LR            float64         `json:"lr"` // the schedule's peak
	Controller    string          `json:"controller"`
	EMA           bool            `json:"ema"`
	SWA           bool            `json:"swa"`
	Chaos         bool            `json:"chaos"`
	DropoutGlide  bool            `json:"dropout_glide"`
	EvalEvery     int             `json:"eval_every"`
	GameEvery     int             `json:"game_every"`
	Layers        int             `json:"layers"`
	R             int             `json:"R"`
	Experts       int             `json:"experts"`
	MemBudget     int64           `json:"mem_budget"`
	MemPlanned    int64           `json:"mem_planned"`
	Seed          uint64          `json:"seed"`
}

// EventStart is the Event of the start record.
const EventStart = "start"

// Kind is what a record records.
type Kind uint8

const (
	KindOther   Kind = iota // an event other than the start, or a record of none of the kinds below
	KindStart               // the run's start (Start)
	KindStep                // a training step (TrainCE)
	KindSkipped             // a step skipped for a non-finite loss or gradient norm
	KindEval                // an evaluation (ValCE)
)

// Kind tells the record's kind from the fields it holds, for records of
// any rpac version.
func (r *Record) Kind() Kind {
	switch {
	case r.Event == EventStart:
		return KindStart
	case r.Event != "":
		return KindOther
	case r.ValCE.Present():
		return KindEval
	case r.TrainCE.Present():
		return KindStep
	case r.Skipped:
		return KindSkipped
	}
	return KindOther
}

// record is Record without its methods, for encoding/json.
type record Record

// startLine is the start record's line.
type startLine struct {
	Time  Stamp  `json:"time"`
	Event string `json:"event"`
	*Start
}

// MarshalJSON writes the record's fields; the start record's come from
// Start.
func (r Record) MarshalJSON() ([]byte, error) {
	if r.Start != nil {
		return json.Marshal(startLine{Time: r.Time, Event: r.Event, Start: r.Start})
	}
	return json.Marshal(record(r))
}

// UnmarshalJSON reads a line: a start record into Start, any other into
// the record's fields.
func (r *Record) UnmarshalJSON(b []byte) error {
	var head struct {
		Event string `json:"event"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return err
	}
	if head.Event != EventStart {
		return json.Unmarshal(b, (*record)(r))
	}
	l := startLine{Start: new(Start)}
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	*r = Record{Time: l.Time, Event: l.Event, Start: l.Start}
	return nil
}

// Num is a number of a record that may be absent. The zero Num is absent
// (its field is left out of the line); N makes a present one, NaN and ±Inf
// included, which are written as the strings "NaN", "Inf" and "-Inf" (JSON
// has no such numbers; control.F's form). A null read back (earlier
// versions wrote some NaNs so) is a present NaN.
type Num struct {
	v   control.F
	set bool
}

// N is the present number x.
func N(x float64) Num { return Num{v: control.F(x), set: true} }

// Value is the number, NaN when absent.
func (n Num) Value() float64 {
	if !n.set {
		return math.NaN()
	}
	return float64(n.v)
}

// Present reports whether the record holds the number.
func (n Num) Present() bool { return n.set }

// IsZero reports an absent number (omitzero).
func (n Num) IsZero() bool { return !n.set }

// MarshalJSON writes the number, or its non-finite spelling.
func (n Num) MarshalJSON() ([]byte, error) { return control.F(n.Value()).MarshalJSON() }

// UnmarshalJSON reads a number, "NaN", "Inf", "-Inf" or null.
func (n *Num) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		*n = N(math.NaN())
		return nil
	}
	var f control.F
	if err := f.UnmarshalJSON(b); err != nil {
		return err
	}
	*n = Num{v: f, set: true}
	return nil
}

// Stamp is a time in unix seconds, written to the millisecond.
type Stamp float64

// MarshalJSON writes the seconds with three decimals.
func (s Stamp) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(s), 'f', 3, 64), nil
}
