package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
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
			&cli.StringFlag{Name: "out", Usage: "export folder (--format triton: the model repository)", Required: true},
			&cli.StringFlag{Name: "format", Value: "onnx", Usage: "onnx (model_L{T}.onnx and manifest.json for rpac/runtime) | triton (a Triton Inference Server model repository: NAME_L{T}/config.pbtxt and 1/model.onnx with a variable batch; --batch sets max_batch_size, default 8)"},
			&cli.StringFlag{Name: "name", Value: export.DefaultTritonName, Usage: "--format triton: model name prefix (models NAME_L{T})"},
			&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "fp32 | fp16 | bf16: type of weights and activations (LayerNorm, softmax, reductions stay fp32; logits fp32)"},
			&cli.StringFlag{Name: "fold", Value: "rpa", Usage: "rpa (constant bias per length) | rank (the prior as extra query/key components, exact where the bias clip is inactive) | rank-approx (rank, clip dropped) | none (RPA computed in the graph)"},
			&cli.StringFlag{Name: "weights", Usage: "ema|swa|last (default: ema if the checkpoint has it, else last)"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention, Usage: "attention lowering: op (ONNX Attention; spelled out below opset 23) | op8 (op with q, k and v padded to one head size, a multiple of 8: what onnxruntime's CUDA flash attention needs) | plain (MatMul, Add of one constant mask, Softmax)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "static batch size of the exported graphs"},
			&cli.StringFlag{Name: "quantize", Value: "none", Usage: "none | int8 (int8 weights per output column and activations per token in every Linear layer, int32 accumulation: for onnxruntime's CPU provider; --verify reports the CE cost)"},
			&cli.IntFlag{Name: "opset", Value: 23, Usage: "ONNX opset (18..26)"},
			&cli.BoolFlag{Name: "kv-cache", Usage: "also write, per length, the prefill and decode graphs of KV-cached decoding (past_key_values.{i}.key|value in, present.{i}.key|value out); rpac generate uses them"},
			&cli.IntFlag{Name: "calib-batches", Value: export.DefaultCalibBatches, Usage: "batches to calibrate running statistics on, for lengths the checkpoint has none for"},
			&cli.IntFlag{Name: "calib-batch", Value: export.DefaultCalibBatch, Usage: "sequences per calibration batch"},
			&cli.StringFlag{Name: "calib-split", Usage: "split to calibrate on (default: the run's training split)"},
			&cli.StringFlag{Name: "calibrate", Value: "auto", Usage: "auto: calibrate the lengths the checkpoint has no running statistics for | always: every length (advisable with ema/swa weights, whose memberships differ from the live weights') | never"},
			&cli.StringFlag{Name: "data-dir", Usage: "WikiText-2 raw directory (default: the run's own, else $RPAC_DATA, the user cache, then a download)"},
			&cli.BoolFlag{Name: "verify", Usage: "run every exported graph in onnxruntime on held-out batches and compare with the Go executor"},
			&cli.StringFlag{Name: "eval-split", Value: "valid", Usage: "held-out split for --verify (default: the run's evaluation split)"},
			&cli.IntFlag{Name: "verify-batches", Value: 4, Usage: "batches per length for --verify (0: the whole split)"},
			&cli.IntFlag{Name: "verify-batch", Value: 4, Usage: "sequences per --verify batch (also the batch of the batch-statistics CE)"},
			&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "onnxruntime provider for --verify: cpu|cuda"},
			&cli.Float64Flag{Name: "verify-max-kl", Usage: "--verify fails above this mean KL of the next-token distributions, nats (default by precision: fp32 1e-6, fp16 1e-4, int8 1e-3, bf16 1e-2)"},
			&cli.Float64Flag{Name: "verify-max-ce-cost", Usage: "--verify fails above this CE cost in nats (default by precision: fp32 1e-3, others 0.01)"},
			&cli.Float64Flag{Name: "verify-max-diff", Usage: "--verify fails above this max |Δlogit| (default by precision: fp32 1e-2, fp16 1, bf16 and int8 2)"},
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
	for _, n := range []string{"batch", "calib-batch", "verify-batch"} {
		if c.Int(n) == 0 {
			return fmt.Errorf("--%s must be positive", n)
		}
	}
	for _, n := range []string{"verify-max-kl", "verify-max-ce-cost", "verify-max-diff"} {
		if v := c.Float64(n); c.IsSet(n) && !(v > 0 && !math.IsInf(v, 1)) {
			return fmt.Errorf("--%s must be a positive number (got %g)", n, v)
		}
	}
	if f := c.String("fold"); f != passes.FoldRPAMode && f != passes.FoldNoneMode && f != passes.FoldRankMode && f != passes.FoldRankApproxMode {
		return fmt.Errorf("--fold %q: want rpa, rank, rank-approx or none", f)
	}
	if a := c.String("attention"); a != passes.AttentionOp && a != passes.AttentionPlain && a != passes.AttentionOpPadded {
		return fmt.Errorf("--attention %q: want op, op8 or plain", a)
	}
	if d := c.String("dump-ir"); d != "" && d != "all" && !contains(passes.Names(passes.ExportPipeline), d) {
		return fmt.Errorf("--dump-ir %q: not a pass of the export pipeline (%s, or all)", d, strings.Join(passes.Names(passes.ExportPipeline), ", "))
	}
	format := c.String("format")
	if format != "onnx" && format != "triton" {
		return fmt.Errorf("--format %q: want onnx or triton", format)
	}
	if format == "triton" && c.Bool("verify") {
		return errors.New("--verify checks a runtime export; use it with --format onnx")
	}
	if c.Bool("verify") {
		if err := runtime.Available(); err != nil {
			return fmt.Errorf("--verify needs onnxruntime: %w", err)
		}
	}
	quantize := c.String("quantize")
	switch quantize {
	case "none":
		quantize = onnx.QuantizeNone
	case onnx.QuantizeInt8:
	default:
		return fmt.Errorf("--quantize %q: want none or int8", quantize)
	}
	calibrate := c.String("calibrate")
	if calibrate != "auto" && calibrate != "always" && calibrate != "never" {
		return fmt.Errorf("--calibrate %q: want auto, always or never", calibrate)
	}
	log := logger(c)
	run, err := openRun(c.String("run"), c.String("checkpoint"), c.String("weights"))
	if err != nil {
		return err
	}
	trained := run.Trained
	if calibrate == "always" {
		trained = func(string) bool { return false }
	}
	lengths := run.Lengths()
	if s := c.String("lengths"); s != "" {
		if lengths, err = export.ParseLengths(s); err != nil {
			return fmt.Errorf("--lengths: %w", err)
		}
	} else if len(lengths) == 0 {
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
		evalSplit := ""
		if c.IsSet("eval-split") {
			evalSplit = c.String("eval-split")
		}
		ds, err = training.LoadDataset(c.Context, run.DataSpec(c.String("data-dir"), c.String("calib-split"), evalSplit), log)
		if err != nil {
			return fmt.Errorf("loading data for calibration/verification: %w", err)
		}
		if ds.Vocab > run.Config.Vocab {
			return fmt.Errorf("the data's vocabulary (%d) is larger than the model's (%d)", ds.Vocab, run.Config.Vocab)
		}
	}
	tok, eos := tokenizerOf(run.Dataset())
	meta := map[string]string{"weights": run.Weights, "source": run.Checkpoint, "step": fmt.Sprint(run.State.Step)}
	if d := run.DataDir(); d != "" {
		meta["data_dir"] = d // rpac eval's default data
	}
	if run.Dataset() == "synthetic" {
		spec := run.DataSpec("", "", "")
		js, _ := json.Marshal(spec.Synthetic)
		meta["synthetic"], meta["seed"] = string(js), fmt.Sprint(spec.Seed) // rpac eval's corpus
	}
	if run.Dataset() == "mqar" {
		spec := run.DataSpec("", "", "")
		js, _ := json.Marshal(spec.MQAR.WithDefaults())
		meta["mqar"], meta["seed"] = string(js), fmt.Sprint(spec.Seed) // rpac eval's corpus
	}
	dtype, err := ir.ParsePrecision(c.String("dtype"))
	if err != nil {
		return fmt.Errorf("--dtype: %w", err)
	}
	dtype = dtype.Or(ir.FP32)
	o := export.Options{
		DType:  dtype,
		Config: run.Config, Store: run.Store, Trained: trained, Lengths: lengths, Batch: c.Int("batch"),
		Fold: c.String("fold"), Attention: c.String("attention"), Opset: int64(c.Int("opset")), Quantize: quantize, KVCache: c.Bool("kv-cache"),
		CalibBatches: c.Int("calib-batches"), CalibBatch: c.Int("calib-batch"),
		Out: c.String("out"), Tokenizer: tok, EOS: eos, Meta: meta,
		DumpIR: c.String("dump-ir"), Dump: c.App.Writer, Log: log,
	}
	if ds != nil {
		o.CalibIDs = ds.Train
		o.CalibSource = fmt.Sprintf("%s %s", ds.Name, ds.Protocol)
		if ds.Name == "wikitext2" {
			o.CalibSource = "wikitext2 " + ds.TrainSplit
		}
	}
	t0 := time.Now()
	if format == "triton" {
		return exportTriton(c, o, t0)
	}
	res, err := export.Export(c.Context, o)
	if err != nil {
		return err
	}
	report(c, exportedEvent{Model: run.Config.Model, Weights: run.Weights, Step: run.State.Step, Dir: res.Dir,
		Manifest: filepath.Join(res.Dir, runtime.ManifestName), Seconds: time.Since(t0).Seconds(), Fold: o.Fold, Attention: o.Attention,
		Batch: o.Batch, DType: o.DType, Quantize: o.Quantize, KVCache: o.KVCache, Lengths: lengths})
	for _, lr := range res.Lengths {
		ev := exportedLengthEvent{T: lr.T, File: lr.File, Bytes: lr.Bytes, Nodes: lr.Nodes, Seconds: lr.Seconds, KVFiles: lr.KVFiles, KVBytes: lr.KVBytes}
		if lr.Calibrated {
			ev.Calibrated, ev.CalibBatches, ev.CalibBatch, ev.CalibSource = true, o.CalibBatches, o.CalibBatch, o.CalibSource
		}
		report(c, ev)
		for _, f := range lr.Fold {
			report(c, foldLayerEvent{f})
		}
	}
	if run.Weights != "last" && calibrate == "auto" && run.Config.Model == "fuzzy" {
		report(c, exportNoteEvent{fmt.Sprintf("the running statistics of trained lengths come from the live weights; --calibrate always recomputes them under the %s weights", run.Weights)})
	}
	if !c.Bool("verify") {
		return nil
	}
	report(c, verifyEvent{Split: ds.EvalName, Protocol: ds.Protocol})
	vr, err := export.Verify(c.Context, export.VerifyOptions{Dir: res.Dir, Config: run.Config, Store: run.Store,
		IDs: ds.Eval, Batches: c.Int("verify-batches"), Batch: c.Int("verify-batch"),
		Runtime: runtime.Options{Provider: c.String("provider")}})
	if err != nil {
		return err
	}
	limits := export.DefaultVerifyLimits(dtype, quantize)
	if c.IsSet("verify-max-diff") {
		limits.MaxAbsDiff = c.Float64("verify-max-diff")
	}
	if c.IsSet("verify-max-ce-cost") {
		limits.MaxCECost = c.Float64("verify-max-ce-cost")
	}
	if c.IsSet("verify-max-kl") {
		limits.MaxKL = c.Float64("verify-max-kl")
	}
	var failed error
	for _, r := range vr {
		if err := r.Check(limits); err != nil && failed == nil {
			failed = err
		}
		report(c, verifiedEvent{T: r.T, Tokens: r.Tokens, Batches: r.Batches, Batch: r.Batch, MaxAbsDiff: r.MaxAbsDiff, MeanKL: r.MeanKL,
			CEExport: r.CEExport, CEEval: r.CEEval, CEBatch: r.CEBatchStats, KVSteps: r.KVSteps, KVMaxAbsDiff: r.KVMaxAbsDiff})
	}
	if failed != nil {
		return fmt.Errorf("%w (limits: mean KL %g, CE cost %g nats, max |Δlogit| %g; --verify-max-kl, --verify-max-ce-cost and --verify-max-diff set them)", failed, limits.MaxKL, limits.MaxCECost, limits.MaxAbsDiff)
	}
	report(c, verifyLimitsEvent{limits})
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

// tokenizerOf names the tokenizer and EOS of a dataset's ids.
func tokenizerOf(dataset string) (string, int) {
	if dataset == "synthetic" {
		return "synthetic", int(data.SynBOS)
	}
	if dataset == "mqar" {
		return "mqar", int(data.MQARBOS)
	}
	return data.GPT2TokenizerName, int(data.GPT2EOS)
}

// openRun opens the run named by --run or --checkpoint and selects its
// weight set.
func openRun(run, ckpt, weights string) (*training.Run, error) {
	var path string
	switch {
	case run != "" && ckpt != "":
		return nil, errors.New("give --run or --checkpoint, not both")
	case run != "":
		path = run
	case ckpt != "":
		path = ckpt
	default:
		return nil, errors.New("--run DIR or --checkpoint PATH is required")
	}
	r, err := training.OpenRun(path)
	if err != nil {
		return nil, err
	}
	if err := r.SelectWeights(weights); err != nil {
		return nil, fmt.Errorf("--weights: %w", err)
	}
	return r, nil
}

// exportTriton writes a Triton model repository and prints how to serve it.
func exportTriton(c *cli.Context, o export.Options, t0 time.Time) error {
	to := export.TritonOptions{Options: o, Name: c.String("name")}
	if c.IsSet("batch") {
		to.MaxBatch = c.Int("batch")
	}
	models, err := export.Triton(c.Context, to)
	if err != nil {
		return err
	}
	report(c, tritonEvent{Out: o.Out, Seconds: time.Since(t0).Seconds(), Fold: o.Fold, Attention: o.Attention})
	for _, m := range models {
		report(c, tritonModelEvent{Model: m.Name, T: m.T, Bytes: m.Bytes, Nodes: m.Nodes, Config: m.Config})
	}
	abs, err := filepath.Abs(o.Out)
	if err != nil {
		abs = o.Out
	}
	report(c, tritonServeEvent{Command: fmt.Sprintf("docker run --rm --gpus=all -p8000:8000 -p8001:8001 -p8002:8002 -v %s:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models", abs)})
	return nil
}
