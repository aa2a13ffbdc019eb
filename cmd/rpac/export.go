package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/urfave/cli/v2"
)

func exportCommand() *cli.Command {
	return &cli.Command{
		Name:  "export",
		Usage: "compile a checkpoint into ONNX graphs (one per length) and a manifest for runtime/onnxruntime",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "run", Usage: "run directory (holds checkpoint/)"},
			&cli.StringFlag{Name: "checkpoint", Usage: "checkpoint directory or its model.safetensors (instead of --run)"},
			&cli.StringFlag{Name: "lengths", Usage: "context lengths to export, e.g. 384,768 (default: the trained contexts)"},
			&cli.StringFlag{Name: "out", Usage: "export folder", Required: true},
			&cli.StringFlag{Name: "fold", Value: "rpa", Usage: "rpa (constant bias per length) | none (RPA computed in the graph)"},
			&cli.StringFlag{Name: "weights", Usage: "ema|swa|last (default: ema if the checkpoint has it, else last)"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention, Usage: "attention lowering: op (ONNX Attention; spelled out below opset 23) | plain (MatMul, Add of one constant mask, Softmax)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "static batch size of the exported graphs"},
			&cli.IntFlag{Name: "opset", Value: 23, Usage: "ONNX opset (18..26)"},
			&cli.IntFlag{Name: "calib-batches", Value: export.DefaultCalibBatches, Usage: "batches to calibrate running statistics on, for lengths the checkpoint has none for"},
			&cli.IntFlag{Name: "calib-batch", Value: export.DefaultCalibBatch, Usage: "sequences per calibration batch"},
			&cli.StringFlag{Name: "calib-split", Usage: "split to calibrate on (default: the run's training split)"},
			&cli.StringFlag{Name: "calibrate", Value: "auto", Usage: "auto: calibrate the lengths the checkpoint has no running statistics for | always: every length (advisable with ema/swa weights, whose memberships differ from the live weights') | never"},
			&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (else $RPAC_DATA, the user cache, then a download)"},
			&cli.BoolFlag{Name: "verify", Usage: "run every exported graph in onnxruntime on held-out batches and compare with the Go executor"},
			&cli.StringFlag{Name: "eval-split", Value: "valid", Usage: "held-out split for --verify"},
			&cli.IntFlag{Name: "verify-batches", Value: 4, Usage: "batches per length for --verify (0: the whole split)"},
			&cli.IntFlag{Name: "verify-batch", Value: 4, Usage: "sequences per --verify batch (also the batch of the batch-statistics CE)"},
			&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "onnxruntime provider for --verify: cpu|cuda"},
			&cli.StringFlag{Name: "dump-ir", Usage: "print the graph after the named pass (" + strings.Join(passes.Names(passes.ExportPipeline), ", ") + ", or all)"},
		},
		Action: exportAction,
	}
}

func exportAction(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	for _, n := range []string{"batch", "calib-batches", "calib-batch", "verify-batches", "verify-batch"} {
		if c.Int(n) < 0 {
			return fmt.Errorf("--%s must not be negative (got %d)", n, c.Int(n))
		}
	}
	if c.Int("batch") == 0 {
		return errors.New("--batch must be positive")
	}
	if f := c.String("fold"); f != passes.FoldRPAMode && f != passes.FoldNoneMode {
		return fmt.Errorf("--fold %q: want rpa or none", f)
	}
	if a := c.String("attention"); a != passes.AttentionOp && a != passes.AttentionPlain {
		return fmt.Errorf("--attention %q: want plain or op", a)
	}
	if d := c.String("dump-ir"); d != "" && d != "all" && !contains(passes.Names(passes.ExportPipeline), d) {
		return fmt.Errorf("--dump-ir %q: not a pass of the export pipeline (%s, or all)", d, strings.Join(passes.Names(passes.ExportPipeline), ", "))
	}
	if c.Bool("verify") {
		if err := runtime.Available(); err != nil {
			return fmt.Errorf("--verify needs onnxruntime: %w", err)
		}
	}
	calibrate := c.String("calibrate")
	if calibrate != "auto" && calibrate != "always" && calibrate != "never" {
		return fmt.Errorf("--calibrate %q: want auto, always or never", calibrate)
	}
	log := logger(c)
	run, err := loadRun(c.String("run"), c.String("checkpoint"), c.String("weights"))
	if err != nil {
		return err
	}
	trained := run.trained
	if calibrate == "always" {
		trained = func(string) bool { return false }
	}
	lengths := []int{run.State.Context}
	if len(run.State.Contexts) > 0 {
		lengths = append([]int(nil), run.State.Contexts...)
	}
	if s := c.String("lengths"); s != "" {
		if lengths, err = export.ParseLengths(s); err != nil {
			return fmt.Errorf("--lengths: %w", err)
		}
	} else if run.State.Context == 0 {
		return errors.New("--lengths is required: the checkpoint does not record its training context")
	}
	if err := export.CheckLengths(lengths, run.Config.MaxLen); err != nil {
		return fmt.Errorf("--lengths: %w", err)
	}

	// Data: only when calibration or verification needs it.
	needCalib := false
	for _, T := range lengths {
		bufs, err := export.RunningBuffers(&run.Config, T)
		if err != nil {
			return err
		}
		for name := range bufs {
			if !trained(name) {
				needCalib = true
			}
		}
	}
	if needCalib && calibrate == "never" {
		return fmt.Errorf("the checkpoint has no running statistics for some of the lengths %v and --calibrate is never; export the trained length or allow calibration", lengths)
	}
	var ds *training.Dataset
	if needCalib || c.Bool("verify") {
		if needCalib && c.Int("calib-batches") == 0 {
			return fmt.Errorf("the checkpoint has no running statistics for some of the lengths %v and --calib-batches is 0; calibrate on data (--calib-batches N --data-dir D)", lengths)
		}
		split := c.String("calib-split")
		if split == "" {
			split = run.trainSplit()
		}
		ds, err = training.LoadDataset(c.Context, run.dataset(), c.String("data-dir"), split, c.String("eval-split"), run.seed(), c.App.ErrWriter)
		if err != nil {
			return fmt.Errorf("loading data for calibration/verification: %w", err)
		}
		if ds.Vocab > run.Config.Vocab {
			return fmt.Errorf("the data's vocabulary (%d) is larger than the model's (%d)", ds.Vocab, run.Config.Vocab)
		}
	}
	tok, eos := tokenizerOf(run.dataset())
	meta := map[string]string{"weights": run.Weights, "source": run.Dir, "step": fmt.Sprint(run.State.Step)}
	o := export.Options{
		Config: run.Config, Store: run.Store, Trained: trained, Lengths: lengths, Batch: c.Int("batch"),
		Fold: c.String("fold"), Attention: c.String("attention"), Opset: int64(c.Int("opset")),
		CalibBatches: c.Int("calib-batches"), CalibBatch: c.Int("calib-batch"),
		Out: c.String("out"), Tokenizer: tok, EOS: eos, Meta: meta,
		DumpIR: c.String("dump-ir"), Dump: c.App.Writer, Log: log,
	}
	if ds != nil {
		o.CalibIDs = ds.Train
		o.CalibSource = fmt.Sprintf("%s %s", ds.Name, ds.Protocol)
		if ds.Name == "wikitext2" {
			o.CalibSource = "wikitext2 " + strings.TrimSuffix(strings.TrimPrefix(ds.Protocol, "train on "), ", evaluate on "+ds.EvalName)
		}
	}
	t0 := time.Now()
	res, err := export.Export(c.Context, o)
	if err != nil {
		return err
	}
	w := c.App.Writer
	fmt.Fprintf(w, "exported %s model (%s weights, step %d) to %s in %.1fs: fold %s, attention %s, batch %d\n",
		run.Config.Model, run.Weights, run.State.Step, res.Dir, time.Since(t0).Seconds(), o.Fold, o.Attention, o.Batch)
	for _, lr := range res.Lengths {
		cal := ""
		if lr.Calibrated {
			cal = fmt.Sprintf(", running statistics calibrated on %d×%d chunks (%s)", o.CalibBatches, o.CalibBatch, o.CalibSource)
		}
		fmt.Fprintf(w, "  L=%d  %s  %.1f MiB  %d nodes  %.1fs%s\n", lr.T, lr.File, float64(lr.Bytes)/(1<<20), lr.Nodes, lr.Seconds, cal)
		for _, f := range lr.Fold {
			fmt.Fprintf(w, "    layer %2d  bias [%+.3f, %+.3f] mean %+.3f  clipped %.2f%% (|x| > %g)\n", f.Layer, f.Min, f.Max, f.Mean, 100*f.ClipFrac, f.Clip)
		}
	}
	fmt.Fprintf(w, "  %s\n", filepath.Join(res.Dir, runtime.ManifestName))
	if run.Weights != "last" && calibrate == "auto" && run.Config.Model == "fuzzy" {
		fmt.Fprintf(w, "  note: the running statistics of trained lengths come from the live weights; --calibrate always recomputes them under the %s weights\n", run.Weights)
	}
	if !c.Bool("verify") {
		return nil
	}
	vr, err := export.Verify(c.Context, export.VerifyOptions{Dir: res.Dir, Config: run.Config, Store: run.Store,
		IDs: ds.Eval, Batches: c.Int("verify-batches"), Batch: c.Int("verify-batch"),
		Runtime: runtime.Options{Provider: c.String("provider")}})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "verify on %s (%s):\n", ds.EvalName, ds.Protocol)
	for _, r := range vr {
		fmt.Fprintf(w, "  L=%d  %d tokens (%d×%d)  max|Δlogit| %.2e  CE onnxruntime %.5f  CE Go eval %.5f  CE batch-stats (paper's way) %.5f\n",
			r.T, r.Tokens, r.Batches, r.Batch, r.MaxAbsDiff, r.CEExport, r.CEEval, r.CEBatchStats)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runState is the part of the trainer's state.json that export reads.
type runState struct {
	Step      int             `json:"step"`
	Config    *model.Config   `json:"config"`
	Context   int             `json:"context"`
	Contexts  []int           `json:"contexts"` // lengths of the context game, when it ran
	Batch     int             `json:"batch"`
	Preset    string          `json:"preset"`
	Dataset   string          `json:"dataset"`
	Protocol  string          `json:"protocol"`
	RunningOK map[string]bool `json:"running_initialised"`
	Options   struct {
		TrainSplit string `json:"TrainSplit"`
		Seed       uint64 `json:"Seed"`
	} `json:"options"`
}

// loadedRun is a checkpoint loaded for export.
type loadedRun struct {
	Dir     string // checkpoint directory
	Config  model.Config
	Store   *kernels.Store
	State   runState
	Weights string // weight set used: ema, swa or last
	// Tensors lists what model.safetensors holds (names and sizes).
	Tensors []checkpoint.Named
}

func (r *loadedRun) trained(name string) bool {
	if r.Store.Get(name) == nil {
		return false
	}
	return r.State.RunningOK[name]
}

func (r *loadedRun) dataset() string {
	if r.State.Dataset == "" {
		return "wikitext2"
	}
	return r.State.Dataset
}

func (r *loadedRun) trainSplit() string {
	if r.State.Options.TrainSplit != "" {
		return r.State.Options.TrainSplit
	}
	// "train on test, evaluate on valid"
	if rest, ok := strings.CutPrefix(r.State.Protocol, "train on "); ok {
		if split, _, ok := strings.Cut(rest, ","); ok && split != "" {
			return split
		}
	}
	return "train"
}

func (r *loadedRun) seed() uint64 {
	if r.State.Options.Seed != 0 {
		return r.State.Options.Seed
	}
	return 1
}

// tokenizerOf names the tokenizer and EOS of a dataset's ids.
func tokenizerOf(dataset string) (string, int) {
	if dataset == "synthetic" {
		return "synthetic", int(data.SynBOS)
	}
	return data.GPT2TokenizerName, int(data.GPT2EOS)
}

// loadRun reads a checkpoint's weights and state: from run/checkpoint, or
// from ckpt (a checkpoint directory or its model.safetensors). The model
// file is checked against checkpoint.json; the optimizer state is not read.
func loadRun(run, ckpt, weights string) (*loadedRun, error) {
	var dir string
	switch {
	case run != "" && ckpt != "":
		return nil, errors.New("give --run or --checkpoint, not both")
	case run != "":
		st, err := os.Stat(run)
		if err != nil {
			return nil, fmt.Errorf("--run %s: %w", run, errors.Unwrap(err))
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("--run %s is not a directory (pass a checkpoint file with --checkpoint)", run)
		}
		dir = filepath.Join(run, "checkpoint")
		if _, err := os.Stat(filepath.Join(dir, checkpoint.ManifestFile)); err != nil {
			if _, err2 := os.Stat(filepath.Join(run, checkpoint.ManifestFile)); err2 == nil {
				dir = run // the run flag names the checkpoint directory itself
			} else {
				return nil, fmt.Errorf("--run %s holds no checkpoint (%s is missing): train into it with `rpac train --out %s` first, or pass --checkpoint", run, filepath.Join(dir, checkpoint.ManifestFile), run)
			}
		}
	case ckpt != "":
		st, err := os.Stat(ckpt)
		if err != nil {
			return nil, fmt.Errorf("--checkpoint %s: %w", ckpt, errors.Unwrap(err))
		}
		dir = ckpt
		if !st.IsDir() {
			dir = filepath.Dir(ckpt)
			if filepath.Base(ckpt) != checkpoint.ModelFile {
				return nil, fmt.Errorf("--checkpoint %s: want a checkpoint directory or its %s", ckpt, checkpoint.ModelFile)
			}
		}
	default:
		return nil, errors.New("--run DIR or --checkpoint PATH is required")
	}
	manBuf, err := os.ReadFile(filepath.Join(dir, checkpoint.ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("%s is not a checkpoint directory (%s is missing or unreadable): %v", dir, checkpoint.ManifestFile, errors.Unwrap(err))
	}
	var man checkpoint.Manifest
	if err := json.Unmarshal(manBuf, &man); err != nil {
		return nil, fmt.Errorf("%s: bad JSON: %v", filepath.Join(dir, checkpoint.ManifestFile), err)
	}
	read := func(name string) ([]byte, error) {
		path := filepath.Join(dir, name)
		want, ok := man.Files[name]
		if !ok {
			return nil, fmt.Errorf("%s does not list %s", filepath.Join(dir, checkpoint.ManifestFile), name)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint file %s: %v", path, errors.Unwrap(err))
		}
		sum := sha256.Sum256(b)
		if int64(len(b)) != want.Size || !strings.EqualFold(hex.EncodeToString(sum[:]), want.SHA256) {
			return nil, fmt.Errorf("checkpoint file %s does not match %s (size or sha256 differ): it is corrupt or was changed", path, checkpoint.ManifestFile)
		}
		return b, nil
	}
	stateBuf, err := read(checkpoint.StateFile)
	if err != nil {
		return nil, err
	}
	lr := &loadedRun{Dir: dir}
	if err := json.NewDecoder(bytes.NewReader(stateBuf)).Decode(&lr.State); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %v", filepath.Join(dir, checkpoint.StateFile), err)
	}
	if lr.State.Config == nil {
		return nil, fmt.Errorf("%s has no model config; it was not written by rpac train", filepath.Join(dir, checkpoint.StateFile))
	}
	lr.Config = *lr.State.Config
	if err := lr.Config.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, checkpoint.StateFile), err)
	}
	modelBuf, err := read(checkpoint.ModelFile)
	if err != nil {
		return nil, err
	}
	ts, _, err := checkpoint.ReadSafetensors(modelBuf)
	modelBuf = nil
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, checkpoint.ModelFile), err)
	}
	for _, t := range ts {
		lr.Tensors = append(lr.Tensors, checkpoint.Named{Name: t.Name, Shape: t.Shape})
	}
	lr.Store = kernels.NewStore(kernels.F32)
	if _, err := checkpoint.IntoStore(lr.Store, ts); err != nil {
		return nil, err
	}
	ts = nil
	params, err := export.Params(&lr.Config)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range params {
		if lr.Store.Get(p) == nil && lr.Store.Get("ema."+p) == nil && lr.Store.Get("swa."+p) == nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s lacks %d parameter(s) of the %s model (first: %s); the checkpoint does not match its config",
			filepath.Join(dir, checkpoint.ModelFile), len(missing), lr.Config.Model, missing[0])
	}
	if lr.Weights, err = export.SelectWeights(lr.Store, params, weights); err != nil {
		return nil, fmt.Errorf("--weights: %w", err)
	}
	return lr, nil
}
