package training

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/runtime/manifest"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/data"
)

// Run is a training run's checkpoint, opened for export, inspection,
// evaluation or resuming. Every reader of a run directory goes through
// OpenRun, so all of them find the checkpoint the same way (including the
// previous one left by an interrupted save) and read the same facts from it.
type Run struct {
	// Dir is the run directory ("" when a checkpoint was opened on its own).
	Dir string
	// Checkpoint is the checkpoint directory read.
	Checkpoint string
	State      RunState
	Config     model.Config
	// Store holds the weights and buffers: the trained ("last") parameters,
	// and the averaged sets "ema.<p>" / "swa.<p>" until SelectWeights.
	Store *kernels.Store
	// Optim is the optimizer state (only from openRunForResume).
	Optim []checkpoint.Named
	// Tensors lists what model.safetensors holds (names and shapes).
	Tensors []checkpoint.Named
	// Weights is the weight set the store's parameters hold: last, ema or swa.
	Weights WeightSet

	options recordedOptions
}

// recordedOptions are the fields of the run's Options that readers use.
type recordedOptions struct {
	TrainSplit string `json:"TrainSplit"`
	EvalSplit  string `json:"EvalSplit"`
	DataDir    string `json:"DataDir"`
	Seed       uint64 `json:"Seed"`
	Dataset    string `json:"Dataset"`
	Synthetic  data.SyntheticConfig
	MQAR       data.MQARConfig
}

// OpenRun opens path: a run directory (holding checkpoint/ or, after an
// interrupted save, checkpoint.prev/), a checkpoint directory, or a
// checkpoint's model.safetensors. The weights are checked against the
// checkpoint's manifest; the optimizer state is not read.
func OpenRun(path string) (*Run, error) { return openRun(path, false) }

func openRun(path string, withOptim bool) (*Run, error) {
	if path == "" {
		return nil, errors.New("no run given: pass a run directory (rpac train --out) or a checkpoint")
	}
	runDir, ckDir, err := locateCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if ckDir, err = checkpoint.Resolve(ckDir); err != nil {
		return nil, err
	}
	r := &Run{Dir: runDir, Checkpoint: ckDir, Weights: WeightsLast}
	statePath := filepath.Join(ckDir, checkpoint.StateFile)
	// state.json is read and checked first; its config and lengths say
	// what the tensor files may hold, which is checked against their
	// headers before their data is read.
	ck, err := checkpoint.LoadWith(ckDir, checkpoint.LoadOptions{Optim: withOptim, Finite: true,
		Expect: func(state []byte) (checkpoint.Schema, checkpoint.Schema, error) {
			if err := json.Unmarshal(state, &r.State); err != nil {
				return nil, nil, fmt.Errorf("%s: %v", statePath, err)
			}
			if err := r.State.Validate(); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", statePath, err)
			}
			w, m, err := checkpointSchemas(&r.State)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", statePath, err)
			}
			return w, m, nil
		}})
	if err != nil {
		return nil, err
	}
	r.Optim = ck.Optim
	r.Config = r.State.Config
	if len(r.State.Options) > 0 {
		_ = json.Unmarshal(r.State.Options, &r.options) // optional facts; older runs lack some
	}
	for _, t := range ck.Weights {
		r.Tensors = append(r.Tensors, checkpoint.Named{Name: t.Name, Shape: t.Shape})
	}
	r.Store = kernels.NewStore(ir.FP32)
	if _, err := checkpoint.IntoStore(r.Store, ck.Weights); err != nil {
		return nil, err
	}
	if err := r.checkParams(); err != nil {
		return nil, err
	}
	return r, nil
}

// locateCheckpoint finds the checkpoint directory of path (see OpenRun).
func locateCheckpoint(path string) (runDir, ckDir string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", path, errors.Unwrap(err))
	}
	if !st.IsDir() {
		if filepath.Base(path) != checkpoint.ModelFile {
			return "", "", fmt.Errorf("%s: want a run directory, a checkpoint directory or its %s", path, checkpoint.ModelFile)
		}
		return "", filepath.Dir(path), nil
	}
	if exists(filepath.Join(path, checkpoint.ManifestFile)) {
		return "", path, nil // a checkpoint directory
	}
	ck := filepath.Join(path, "checkpoint")
	if exists(filepath.Join(ck, checkpoint.ManifestFile)) || exists(filepath.Join(ck+".prev", checkpoint.ManifestFile)) {
		return path, ck, nil
	}
	return "", "", fmt.Errorf("%s holds no checkpoint (%s is missing): train into it with `rpac train --out %s` first", path, filepath.Join(ck, checkpoint.ManifestFile), path)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ParamNames lists the model's trainable parameters.
func (r *Run) ParamNames() ([]string, error) { return model.Params(&r.Config) }

// checkParams refuses a checkpoint that lacks a parameter of its model
// (in every weight set), naming the parameters.
func (r *Run) checkParams() error {
	params, err := r.ParamNames()
	if err != nil {
		return err
	}
	var missing []string
	for _, p := range params {
		if r.Store.Get(p) == nil && r.Store.Get("ema."+p) == nil && r.Store.Get("swa."+p) == nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s lacks %d parameter(s) of the %s model (%s); the checkpoint does not match its config",
			filepath.Join(r.Checkpoint, checkpoint.ModelFile), len(missing), r.Config.Model, strings.Join(head(missing, 5), ", "))
	}
	return nil
}

func head(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("and %d more", len(s)-n))
	}
	return s
}

// SelectWeights makes the store's parameters the chosen weight set
// (WeightsAuto: ema when the checkpoint has it) and drops the others.
func (r *Run) SelectWeights(which WeightSet) error {
	params, err := r.ParamNames()
	if err != nil {
		return err
	}
	if r.Weights, err = SelectWeights(r.Store, params, which); err != nil {
		return err
	}
	for _, p := range params {
		if t := r.Store.Get(p); t != nil && !allFinite(t.F32) {
			return fmt.Errorf("the checkpoint's %s weights hold a non-finite value in %s; a diverged run cannot be exported (resume it from an earlier checkpoint with a lower --lr)", r.Weights, p)
		}
	}
	return nil
}

// Trained reports whether the store's running statistic name was
// estimated during training (rather than left at its initial value).
func (r *Run) Trained(name string) bool {
	return r.Store.Get(name) != nil && r.State.RunningOK[name]
}

// Dataset is the run's dataset name.
func (r *Run) Dataset() string {
	if r.State.Dataset == "" {
		return "wikitext2"
	}
	return r.State.Dataset
}

// TrainSplit is the split the run trained on.
func (r *Run) TrainSplit() string {
	if r.options.TrainSplit != "" {
		return r.options.TrainSplit
	}
	if r.State.TrainSplit != "" {
		return r.State.TrainSplit
	}
	return "train"
}

// EvalSplit is the split the run evaluated on.
func (r *Run) EvalSplit() string {
	if r.options.EvalSplit != "" {
		return r.options.EvalSplit
	}
	return "valid"
}

// DataDir is the data directory the run read ("" when unknown or missing
// now: the usual lookup applies).
func (r *Run) DataDir() string {
	d := r.State.DataDir
	if d == "" {
		d = r.options.DataDir
	}
	if d == "" || !exists(d) {
		return ""
	}
	return d
}

// Seed is the run's seed (the synthetic corpus depends on it).
func (r *Run) Seed() uint64 {
	if r.options.Seed != 0 {
		return r.options.Seed
	}
	return 1
}

// DataSpec is the data the run trained on, with the splits given ("": the
// run's own) and the data directory dir ("": the run's own).
func (r *Run) DataSpec(dir, trainSplit, evalSplit string) DataSpec {
	if dir == "" {
		dir = r.DataDir()
	}
	if trainSplit == "" {
		trainSplit = r.TrainSplit()
	}
	if evalSplit == "" {
		evalSplit = r.EvalSplit()
	}
	return DataSpec{Name: r.Dataset(), Dir: dir, TrainSplit: trainSplit, EvalSplit: evalSplit, Seed: r.Seed(), Synthetic: r.options.Synthetic, MQAR: r.options.MQAR}
}

// Lengths are the run's trained context lengths.
func (r *Run) Lengths() []int {
	if len(r.State.Contexts) > 0 {
		return append([]int(nil), r.State.Contexts...)
	}
	if r.State.Context > 0 {
		return []int{r.State.Context}
	}
	return nil
}

// Tokenizer names the tokenizer of the run's ids and its end-of-sequence
// id.
func (r *Run) Tokenizer() (string, int) {
	switch r.Dataset() {
	case "synthetic":
		return "synthetic", int(data.SynBOS)
	case "mqar":
		return "mqar", int(data.MQARBOS)
	}
	return data.GPT2TokenizerName, int(data.GPT2EOS)
}

// Provenance is the run's part of an export's record: where the weights
// come from (run, checkpoint, weight set, step), the data and its options,
// the splits and the tokenizer. The exporter adds how it compiled them.
func (r *Run) Provenance() *manifest.Provenance {
	tok, eos := r.Tokenizer()
	p := &manifest.Provenance{Run: r.Dir, Checkpoint: r.Checkpoint, Weights: r.Weights.String(), Step: r.State.Step,
		Dataset: r.Dataset(), DataDir: r.DataDir(), TrainSplit: r.TrainSplit(), EvalSplit: r.EvalSplit(),
		Protocol: r.State.Protocol, Tokenizer: tok, EOS: eos}
	switch p.Dataset {
	case "synthetic":
		p.Synthetic, _ = json.Marshal(r.options.Synthetic)
		p.Seed = r.Seed()
	case "mqar":
		p.MQAR, _ = json.Marshal(r.options.MQAR.WithDefaults())
		p.Seed = r.Seed()
	}
	return p
}
