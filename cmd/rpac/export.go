package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rpac-dev/rpac/app/exportjob"
	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
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
			&cli.StringFlag{Name: "format", Value: "onnx", Usage: "onnx (model_L{T}.onnx and manifest.json for rpac/runtime) | triton (a Triton Inference Server model repository: NAME_L{T}/config.pbtxt and 1/model.onnx with a variable batch; --batch sets max_batch_size, default 8) | hf (the Hugging Face / Optimum layout at one length L for transformers.js and onnxruntime-genai: onnx/model.onnx with past_key_values, config.json, generation_config.json, genai_config.json, tokenizer.json; GPT-2 tokens only)"},
			&cli.StringFlag{Name: "name", Value: export.DefaultTritonName, Usage: "--format triton: model name prefix (models NAME_L{T})"},
			&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "fp32 | fp16 | bf16: type of weights and activations (LayerNorm, softmax, reductions stay fp32; logits fp32)"},
			&cli.StringFlag{Name: "fold", Value: "rpa", Usage: "rpa (constant bias per length) | rank (the prior as extra query/key components, exact where the bias clip is inactive) | rank-approx (rank, clip dropped) | none (RPA computed in the graph)"},
			&cli.StringFlag{Name: "weights", Usage: "ema|swa|last (default: ema if the checkpoint has it, else last)"},
			&cli.StringFlag{Name: "attention", Value: passes.DefaultAttention.String(), Usage: "attention lowering: op (ONNX Attention; spelled out below opset 23) | op8 (op with q, k and v padded to one head size, a multiple of 8: what onnxruntime's CUDA flash attention needs) | plain (MatMul, Add of one constant mask, Softmax)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: "static batch size of the exported graphs"},
			&cli.StringFlag{Name: "quantize", Value: "none", Usage: "none | int8 (int8 weights per output column and activations per token in every Linear layer, int32 accumulation: for onnxruntime's CPU provider; --verify reports the CE cost)"},
			&cli.IntFlag{Name: "opset", Value: 23, Usage: "ONNX opset (18..26)"},
			&cli.BoolFlag{Name: "kv-cache", Usage: "also write, per length, the prefill and decode graphs of KV-cached decoding (rpac's fixed-slot cache: cache.{i}.key|value in, cache_out.{i}.key|value out); rpac generate uses them"},
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
	if err := checkExportFlags(c); err != nil {
		return err
	}
	weights, err := training.ParseWeightSet(c.String("weights"))
	if err != nil {
		return err
	}
	run, err := openRun(c.String("run"), c.String("checkpoint"), weights)
	if err != nil {
		return err
	}
	j, err := exportJob(c, run)
	if err != nil {
		return err
	}
	res, err := exportjob.Run(c.Context, j)
	if res == nil {
		return err
	}
	switch j.Format {
	case exportjob.FormatTriton:
		reportTriton(c, j, res)
		return err
	case exportjob.FormatHF:
		reportHF(c, j, res)
		return err
	}
	reportExport(c, run, j, res)
	if j.Verify {
		reportVerify(c, res, err)
	}
	return err
}

// checkExportFlags checks the flags that need no run.
func checkExportFlags(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments: %v", c.Args().Slice())
	}
	if err := checkCounts(c, []string{"batch", "calib-batches", "calib-batch", "verify-batches", "verify-batch"}, []string{"batch", "calib-batch", "verify-batch"}); err != nil {
		return err
	}
	for _, n := range []string{"verify-max-kl", "verify-max-ce-cost", "verify-max-diff"} {
		if v := c.Float64(n); c.IsSet(n) && !(v > 0 && !math.IsInf(v, 1)) {
			return fmt.Errorf("--%s must be a positive number (got %g)", n, v)
		}
	}
	if _, err := exportModes(c); err != nil {
		return err
	}
	if d := c.String("dump-ir"); d != "" && d != "all" && !slices.Contains(passes.Names(passes.ExportPipeline), d) {
		return fmt.Errorf("--dump-ir %q: not a pass of the export pipeline (%s, or all)", d, strings.Join(passes.Names(passes.ExportPipeline), ", "))
	}
	if f, err := exportjob.ParseFormat(c.String("format")); err != nil || f != exportjob.FormatONNX && c.Bool("verify") {
		return cmp.Or(err, errors.New("--verify checks a runtime export; use it with --format onnx"))
	}
	if c.Bool("verify") {
		if err := runtime.Available(); err != nil {
			return fmt.Errorf("--verify needs onnxruntime: %w", err)
		}
	}
	_, err := exportjob.ParseCalibrate(c.String("calibrate"))
	return err
}

// exportModes are --fold, --attention and --quantize.
func exportModes(c *cli.Context) (m export.Options, err error) {
	if m.Fold, err = passes.ParseFold(c.String("fold")); err != nil {
		return m, err
	}
	if m.Attention, err = passes.ParseAttention(c.String("attention")); err != nil || m.Attention == passes.AttentionNone {
		return m, cmp.Or(err, errors.New("--attention none: an export writes op, op8 or plain"))
	}
	m.Quantize, err = onnx.ParseQuantize(c.String("quantize"))
	return m, err
}

// checkCounts checks that the flags nonNeg are not negative and the flags
// positive are above zero.
func checkCounts(c *cli.Context, nonNeg, positive []string) error {
	for _, n := range nonNeg {
		if c.Int(n) < 0 {
			return fmt.Errorf("--%s must not be negative (got %d)", n, c.Int(n))
		}
	}
	for _, n := range positive {
		if c.Int(n) == 0 {
			return fmt.Errorf("--%s must be positive", n)
		}
	}
	return nil
}

// exportJob is the job the flags describe for run.
func exportJob(c *cli.Context, run *training.Run) (exportjob.Job, error) {
	format, _ := exportjob.ParseFormat(c.String("format"))
	modes, err := exportModes(c)
	if err != nil {
		return exportjob.Job{}, err
	}
	calibrate, err := exportjob.ParseCalibrate(c.String("calibrate"))
	if err != nil {
		return exportjob.Job{}, err
	}
	lengths, err := exportLengths(c.String("lengths"), run)
	if err != nil {
		return exportjob.Job{}, err
	}
	dtype, err := ir.ParsePrecision(c.String("dtype"))
	if err != nil {
		return exportjob.Job{}, fmt.Errorf("--dtype: %w", err)
	}
	tok, eos := run.Tokenizer()
	j := exportjob.Job{Options: export.Options{
		DType:  dtype.Or(ir.FP32),
		Config: run.Config, Store: run.Store, Trained: run.Trained, Lengths: lengths, Batch: c.Int("batch"),
		Fold: modes.Fold, Attention: modes.Attention, Opset: int64(c.Int("opset")), Quantize: modes.Quantize, KVCache: c.Bool("kv-cache"),
		CalibBatches: c.Int("calib-batches"), CalibBatch: c.Int("calib-batch"),
		Out: c.String("out"), Tokenizer: tok, EOS: eos, Provenance: run.Provenance(),
		DumpIR: c.String("dump-ir"), Dump: c.App.Writer, Log: logger(c),
	},
		Format: format, TritonName: c.String("name"), Calibrate: calibrate,
		Verify: c.Bool("verify"), VerifyBatches: c.Int("verify-batches"), VerifyBatch: c.Int("verify-batch"),
		VerifyRuntime: runtime.Options{Provider: c.String("provider")},
		Limits:        export.VerifyLimits{MaxKL: c.Float64("verify-max-kl"), MaxCECost: c.Float64("verify-max-ce-cost"), MaxAbsDiff: c.Float64("verify-max-diff")},
		LoadData:      func(ctx context.Context) (*exportjob.Data, error) { return exportData(c, run) },
	}
	if c.IsSet("batch") {
		j.TritonMaxBatch = c.Int("batch")
	}
	return j, nil
}

// exportLengths parses --lengths, by default the run's trained contexts.
func exportLengths(s string, run *training.Run) ([]int, error) {
	lengths := run.Lengths()
	var err error
	if s != "" {
		if lengths, err = export.ParseLengths(s); err != nil {
			return nil, fmt.Errorf("--lengths: %w", err)
		}
	} else if len(lengths) == 0 {
		return nil, errors.New("--lengths is required: the checkpoint does not record its training context")
	}
	if err := export.CheckLengths(lengths, run.Config.MaxLen); err != nil {
		return nil, fmt.Errorf("--lengths: %w", err)
	}
	return lengths, nil
}

// exportData loads the run's data for calibration (--calib-split) and
// verification (--eval-split).
func exportData(c *cli.Context, run *training.Run) (*exportjob.Data, error) {
	evalSplit := ""
	if c.IsSet("eval-split") {
		evalSplit = c.String("eval-split")
	}
	ds, err := training.LoadDataset(c.Context, run.DataSpec(c.String("data-dir"), c.String("calib-split"), evalSplit), logger(c))
	if err != nil {
		return nil, err
	}
	return exportjob.FromDataset(ds), nil
}

// reportExport prints what an ONNX export wrote.
func reportExport(c *cli.Context, run *training.Run, j exportjob.Job, jr *exportjob.Result) {
	res, o := jr.Result, j.Options
	report(c, exportedEvent{Model: run.Config.Model, Weights: run.Weights, Step: run.State.Step, Dir: res.Dir,
		Manifest: filepath.Join(res.Dir, runtime.ManifestName), Seconds: jr.Elapsed.Seconds(), Fold: o.Fold, Attention: o.Attention,
		Batch: o.Batch, DType: o.DType, Quantize: o.Quantize, KVCache: o.KVCache, Lengths: o.Lengths})
	for _, lr := range res.Lengths {
		ev := exportedLengthEvent{CompiledEvent: lr.Compiled(), KVFiles: lr.KVFiles, KVBytes: lr.KVBytes}
		if lr.Calibrated {
			ev.Calibrated, ev.CalibBatches, ev.CalibBatch, ev.CalibSource = true, o.CalibBatches, o.CalibBatch, jr.Data.Source
		}
		report(c, ev)
		for _, f := range lr.Fold {
			report(c, foldLayerEvent{FoldLayer: f})
		}
	}
	if len(jr.HFFiles) > 0 {
		report(c, exportNoteEvent{Note: fmt.Sprintf("wrote the Hugging Face tokenizer of the ids: %s (docs/EXPORT.md, \"Hugging Face files\")", strings.Join(jr.HFFiles, ", "))})
	}
	if run.Weights != training.WeightsLast && j.Calibrate == exportjob.CalibrateAuto && run.Config.Model == model.Fuzzy {
		report(c, exportNoteEvent{Note: fmt.Sprintf("the running statistics of trained lengths come from the live weights; --calibrate always recomputes them under the %s weights", run.Weights)})
	}
}

// reportVerify prints the verification, and its limits when it passed.
func reportVerify(c *cli.Context, jr *exportjob.Result, err error) {
	report(c, verifyEvent{Split: jr.Data.EvalName, Protocol: jr.Data.Protocol})
	for _, r := range jr.Verified {
		report(c, verifiedEvent{VerifyResult: r})
	}
	if err == nil {
		report(c, verifyLimitsEvent{VerifyLimits: jr.Limits})
	}
}

// openRun opens the run named by --run or --checkpoint and selects its
// weight set.
func openRun(run, ckpt string, weights training.WeightSet) (*training.Run, error) {
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

// reportHF prints what a Hugging Face export wrote.
func reportHF(c *cli.Context, j exportjob.Job, res *exportjob.Result) {
	h := res.HF
	report(c, hfEvent{Out: h.Dir, T: h.Length, Files: strings.Join(append(h.Files, res.HFFiles...), ", "), Bytes: h.Bytes, Nodes: h.Nodes,
		Seconds: res.Elapsed.Seconds(), Fold: j.Fold, Attention: j.Attention})
}

// reportTriton prints what a Triton export wrote and how to serve it.
func reportTriton(c *cli.Context, j exportjob.Job, res *exportjob.Result) {
	report(c, tritonEvent{Out: j.Out, Seconds: res.Elapsed.Seconds(), Fold: j.Fold, Attention: j.Attention})
	for _, m := range res.Triton {
		report(c, tritonModelEvent{TritonModel: m})
	}
	abs, err := filepath.Abs(j.Out)
	if err != nil {
		abs = j.Out
	}
	report(c, tritonServeEvent{Command: fmt.Sprintf("docker run --rm --gpus=all -p8000:8000 -p8001:8001 -p8002:8002 -v %s:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models", abs)})
}
