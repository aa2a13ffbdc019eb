package manifest

import (
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strconv"
)

// Provenance is where an export came from: the training run and weight set,
// the data and its options, the tokenizer, the splits, the commit and how
// the export was compiled. `rpac export` writes it into the manifest
// (Manifest.Provenance) and into every ONNX file's metadata ("provenance");
// rpac eval, serve and inspect read it through Manifest.Origin.
//
// It is a record for people and for tools that pick defaults (the data an
// evaluation reads); the runtime never needs it to run a model.
type Provenance struct {
	// Run is the run directory ("" when a checkpoint was exported on its
	// own); Checkpoint the checkpoint directory the weights were read from.
	Run        string `json:"run,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	// Weights is the weight set exported: last, ema or swa; Step the
	// training step of the checkpoint.
	Weights string `json:"weights,omitempty"`
	Step    int    `json:"step"`

	// Dataset names the data the run trained on (wikitext2, synthetic).
	Dataset string `json:"dataset,omitempty"`
	// DataDir is the data directory the run read (absolute; "" unknown).
	DataDir string `json:"data_dir,omitempty"`
	// Seed is the run's seed (the synthetic corpus depends on it; 0 when
	// it does not matter).
	Seed uint64 `json:"seed,omitempty"`
	// Synthetic holds the synthetic corpus's options
	// (training/data.SyntheticConfig, opaque here); absent for real data.
	Synthetic json.RawMessage `json:"synthetic,omitempty"`
	// MQAR holds the MQAR corpus's shape (training/data.MQARConfig, opaque
	// here); absent for other data.
	MQAR json.RawMessage `json:"mqar,omitempty"`
	// TrainSplit and EvalSplit are the splits the run trained and
	// evaluated on; Protocol describes the protocol for people.
	TrainSplit string `json:"train_split,omitempty"`
	EvalSplit  string `json:"eval_split,omitempty"`
	Protocol   string `json:"protocol,omitempty"`

	// Tokenizer names the tokenizer of the ids; EOS is its end-of-sequence
	// id (the manifest's Tokenizer and EOS).
	Tokenizer string `json:"tokenizer,omitempty"`
	EOS       int    `json:"eos"`

	// Commit is the source revision of the rpac that wrote the export
	// (with "-dirty" for a modified tree); "" when the build records none.
	Commit string `json:"commit,omitempty"`

	// Fold, Attention, Precision and Quantize say how the graphs were
	// compiled: the fold mode (rpa, rank, rank-approx, none), the
	// attention lowering, the type of weights and activations (fp32,
	// fp16, bf16) and the quantization (int8, or "" for none).
	Fold      string `json:"fold,omitempty"`
	Attention string `json:"attention,omitempty"`
	Precision string `json:"precision,omitempty"`
	Quantize  string `json:"quantize,omitempty"`
}

// Origin returns the export's provenance: the manifest's record, or, for a
// manifest written before it had one, what its fold record's "meta" says
// (weights, source, step, data_dir, synthetic, seed). Its tokenizer and EOS
// are always the manifest's own, the ones the runtime feeds the model
// with. It never returns nil.
func (m *Manifest) Origin() *Provenance {
	if m.Provenance != nil {
		p := *m.Provenance
		p.Tokenizer, p.EOS = m.Tokenizer, m.EOS
		return &p
	}
	var fold struct {
		Meta map[string]string `json:"meta"`
	}
	if len(m.Fold) > 0 {
		_ = json.Unmarshal(m.Fold, &fold) // a fold record without meta: nothing to add
	}
	p := ProvenanceFromMeta(fold.Meta)
	p.Tokenizer, p.EOS = m.Tokenizer, m.EOS
	return p
}

// The keys of the string metadata exports wrote before Provenance existed
// (the manifest's fold "meta" and the ONNX metadata_props). LegacyMeta and
// ProvenanceFromMeta are the only code that spells them.
const (
	metaWeights   = "weights"
	metaSource    = "source"
	metaStep      = "step"
	metaDataDir   = "data_dir"
	metaSynthetic = "synthetic"
	metaMQAR      = "mqar"
	metaSeed      = "seed"
)

// LegacyMeta renders p as the string map earlier exports wrote, so that
// readers of those keys keep working: weights, source (the checkpoint),
// step, data_dir, and for the synthetic corpus its options and seed.
func (p *Provenance) LegacyMeta() map[string]string {
	out := map[string]string{metaWeights: p.Weights, metaSource: p.Checkpoint, metaStep: strconv.Itoa(p.Step)}
	if p.DataDir != "" {
		out[metaDataDir] = p.DataDir
	}
	if len(p.Synthetic) > 0 {
		out[metaSynthetic], out[metaSeed] = string(p.Synthetic), strconv.FormatUint(p.Seed, 10)
	}
	if len(p.MQAR) > 0 {
		out[metaMQAR], out[metaSeed] = string(p.MQAR), strconv.FormatUint(p.Seed, 10)
	}
	return out
}

// ProvenanceFromMeta reads the string map of an export written before
// Provenance existed (see LegacyMeta); unknown or malformed entries are
// left out. A nil map gives an empty Provenance.
func ProvenanceFromMeta(meta map[string]string) *Provenance {
	p := &Provenance{Weights: meta[metaWeights], Checkpoint: meta[metaSource], DataDir: meta[metaDataDir]}
	if s, err := strconv.Atoi(meta[metaStep]); err == nil {
		p.Step = s
	}
	if js := meta[metaSynthetic]; js != "" && json.Valid([]byte(js)) {
		p.Synthetic, p.Dataset = json.RawMessage(js), "synthetic"
	}
	if js := meta[metaMQAR]; js != "" && json.Valid([]byte(js)) {
		p.MQAR, p.Dataset = json.RawMessage(js), "mqar"
	}
	if s, err := strconv.ParseUint(meta[metaSeed], 10, 64); err == nil {
		p.Seed = s
	}
	return p
}

// validate checks what a reader relies on: the synthetic options are a JSON
// object and the EOS is not negative.
func (p *Provenance) validate() error {
	if len(p.Synthetic) > 0 {
		var v map[string]any
		if err := json.Unmarshal(p.Synthetic, &v); err != nil {
			return fmt.Errorf("manifest provenance: synthetic options are not a JSON object: %v", err)
		}
	}
	if p.EOS < 0 || p.Step < 0 {
		return fmt.Errorf("manifest provenance: eos %d and step %d must not be negative", p.EOS, p.Step)
	}
	return nil
}

// BuildCommit is the source revision this binary was built from, as the Go
// toolchain recorded it ("<rev>-dirty" for a modified tree), or "".
func BuildCommit() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" && modified == "true" {
		rev += "-dirty"
	}
	return rev
}
