// Package exportjob is the whole rpac export flow as a Job: the data when
// calibration or verification needs it, the calibration policy
// (Calibrate), the export itself in ONNX or as a Triton repository
// (Format), and the verification against the Go executor within limits
// (export.VerifyLimits). rpac export and rpac ablate --eval-lengths
// (app/lengtheval) run it.
package exportjob

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
)

// Format is what a Job writes.
type Format string

const (
	FormatONNX   Format = "onnx"   // model_L{T}.onnx and manifest.json for runtime.Open
	FormatTriton Format = "triton" // a Triton Inference Server model repository
	// FormatHF is the Hugging Face / Optimum layout at one length
	// (export.HF and the tokenizer files), which transformers.js and
	// onnxruntime-genai load; GPT-2's tokenizer only.
	FormatHF Format = "hf"
)

// ParseFormat reads a Format.
func ParseFormat(s string) (Format, error) {
	if f := Format(s); f == FormatONNX || f == FormatTriton || f == FormatHF {
		return f, nil
	}
	return "", fmt.Errorf("--format %q: want onnx, triton or hf", s)
}

// Calibrate says which lengths' running statistics a Job computes on data.
type Calibrate string

const (
	CalibrateAuto   Calibrate = "auto"   // the lengths the checkpoint has none for
	CalibrateAlways Calibrate = "always" // every length (averaged weights differ from the live ones)
	CalibrateNever  Calibrate = "never"  // none: a length without them is an error
)

// ParseCalibrate reads a Calibrate.
func ParseCalibrate(s string) (Calibrate, error) {
	if c := Calibrate(s); c == CalibrateAuto || c == CalibrateAlways || c == CalibrateNever {
		return c, nil
	}
	return "", fmt.Errorf("--calibrate %q: want auto, always or never", s)
}

// Data is what a Job calibrates and verifies on.
type Data struct {
	Train  []int32 // calibration stream
	Source string  // what Train is, for the manifest ("wikitext2 train")
	Eval   []int32 // held-out stream for verification
	// EvalName and Protocol describe Eval (reported with the verification).
	EvalName, Protocol string
	Vocab              int
}

// FromDataset is the export's view of a run's dataset: the training split
// to calibrate on and the evaluation split to verify on.
func FromDataset(ds *training.Dataset) *Data {
	src := fmt.Sprintf("%s %s", ds.Name, ds.Protocol)
	if ds.Name == "wikitext2" {
		src = "wikitext2 " + ds.TrainSplit
	}
	return &Data{Train: ds.Train, Source: src, Eval: ds.Eval, EvalName: ds.EvalName, Protocol: ds.Protocol, Vocab: ds.Vocab}
}

// Job is one export as rpac export runs it: Options (Lengths set), the
// format, the calibration policy and, for FormatONNX, the verification.
type Job struct {
	export.Options
	Format Format
	// TritonName and TritonMaxBatch describe a FormatTriton repository
	// (TritonOptions.Name and MaxBatch; 0: its default).
	TritonName     string
	TritonMaxBatch int
	Calibrate      Calibrate
	// Verify compares every exported graph in onnxruntime with the Go
	// executor on VerifyBatches batches of VerifyBatch sequences of the
	// held-out stream; Limits overrides the nonzero limits of
	// DefaultVerifyLimits.
	Verify        bool
	VerifyBatches int
	VerifyBatch   int
	VerifyRuntime runtime.Options
	Limits        export.VerifyLimits
	// LoadData reads the data, called only when calibration or
	// verification needs it.
	LoadData func(context.Context) (*Data, error)
}

// Result is what a Job did. Verified and Limits are set when it
// verified; a verification over its limits returns the result and an
// error.
type Result struct {
	Result *export.Result // FormatONNX
	// HFFiles are the Hugging Face tokenizer files written beside a
	// FormatONNX export (tokenizer.json, tokenizer_config.json; none for
	// a tokenizer without them).
	HFFiles  []string
	HF       *export.HFResult      // FormatHF (its HFFiles: the tokenizer's)
	Triton   []export.TritonModel  // FormatTriton
	Data     *Data                 // nil when none was needed
	Elapsed  time.Duration         // the export, without loading data or verifying
	Verified []export.VerifyResult // one per length
	Limits   export.VerifyLimits
}

// Run loads the data the job needs, exports and verifies.
func Run(ctx context.Context, j Job) (*Result, error) {
	if err := j.checkFormat(); err != nil {
		return nil, err
	}
	if j.Calibrate == CalibrateAlways {
		j.Trained = func(string) bool { return false }
	}
	res := &Result{}
	var err error
	if res.Data, err = j.data(ctx); err != nil {
		return nil, err
	}
	if res.Data != nil {
		j.CalibIDs, j.CalibSource = res.Data.Train, res.Data.Source
	}
	t0 := time.Now()
	switch j.Format {
	case FormatTriton:
		res.Triton, err = export.Triton(ctx, export.TritonOptions{Options: j.Options, Name: j.TritonName, MaxBatch: j.TritonMaxBatch})
		res.Elapsed = time.Since(t0)
		return res, err
	case FormatHF:
		if res.HF, err = export.HF(ctx, j.Options); err != nil {
			return nil, err
		}
		res.HFFiles, err = writeHFTokenizer(j.Out, j.Tokenizer)
		res.Elapsed = time.Since(t0)
		return res, err
	}
	if res.Result, err = export.Export(ctx, j.Options); err != nil {
		return nil, err
	}
	if res.HFFiles, err = writeHFTokenizer(j.Out, j.Tokenizer); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(t0)
	if !j.Verify {
		return res, nil
	}
	return res, j.verify(ctx, res)
}

// checkFormat refuses what the job's format cannot do.
func (j *Job) checkFormat() error {
	if j.Format != FormatONNX && j.Verify {
		return errors.New("--verify checks a runtime export; use it with --format onnx")
	}
	if j.Format != FormatHF {
		return nil
	}
	tok, ok := HFTokenizer(j.Tokenizer)
	if !ok {
		return fmt.Errorf("--format hf writes GPT-2's tokenizer files; this run's tokens are %q, which have none (export it with --format onnx)", j.Tokenizer)
	}
	if len(tok.Pieces) != j.Config.Vocab {
		return fmt.Errorf("--format hf: the model's vocabulary has %d ids, the tokenizer %d", j.Config.Vocab, len(tok.Pieces))
	}
	if len(j.Lengths) != 1 {
		return fmt.Errorf("--format hf exports one frame length L (max_position_embeddings; the prior is exact at L); have --lengths %v, want one of them", j.Lengths)
	}
	return nil
}

// needsCalibration reports whether a length has a running-statistics
// buffer without trained values.
func (j *Job) needsCalibration() (bool, error) {
	for _, T := range j.Lengths {
		bufs, err := model.RunningBuffers(&j.Config, T)
		if err != nil {
			return false, err
		}
		for name := range bufs {
			if j.Trained != nil && !j.Trained(name) || j.Trained == nil && j.Store.Get(name) == nil {
				return true, nil
			}
		}
	}
	return false, nil
}

// data loads the job's data when calibration or verification needs it.
func (j *Job) data(ctx context.Context) (*Data, error) {
	need, err := j.needsCalibration()
	if err != nil {
		return nil, err
	}
	if need && j.Calibrate == CalibrateNever {
		return nil, fmt.Errorf("the checkpoint has no running statistics for some of the lengths %v and --calibrate is never; export the trained length or allow calibration", j.Lengths)
	}
	if !need && !j.Verify {
		return nil, nil
	}
	if need && j.CalibBatches == 0 {
		return nil, fmt.Errorf("the checkpoint has no running statistics for some of the lengths %v and --calib-batches is 0; calibrate on data (--calib-batches N --data-dir D)", j.Lengths)
	}
	if j.LoadData == nil {
		return nil, errors.New("exportjob: the job needs data and has no LoadData")
	}
	d, err := j.LoadData(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading data for calibration/verification: %w", err)
	}
	if d.Vocab > j.Config.Vocab {
		return nil, fmt.Errorf("the data's vocabulary (%d) is larger than the model's (%d)", d.Vocab, j.Config.Vocab)
	}
	return d, nil
}

// verify runs Verify on the export and checks every length's figures.
func (j *Job) verify(ctx context.Context, res *Result) error {
	vr, err := export.Verify(ctx, export.VerifyOptions{Dir: res.Result.Dir, Config: j.Config, Store: j.Store,
		IDs: res.Data.Eval, Batches: j.VerifyBatches, Batch: j.VerifyBatch, Runtime: j.VerifyRuntime})
	if err != nil {
		return err
	}
	l := export.DefaultVerifyLimits(j.DType, j.Quantize)
	for _, o := range []struct{ dst, src *float64 }{{&l.MaxKL, &j.Limits.MaxKL}, {&l.MaxCECost, &j.Limits.MaxCECost}, {&l.MaxAbsDiff, &j.Limits.MaxAbsDiff}} {
		if *o.src != 0 {
			*o.dst = *o.src
		}
	}
	res.Verified, res.Limits = vr, l
	for _, r := range vr {
		if err := r.Check(l); err != nil {
			return fmt.Errorf("%w (limits: mean KL %g, CE cost %g nats, max |Δlogit| %g; --verify-max-kl, --verify-max-ce-cost and --verify-max-diff set them)", err, l.MaxKL, l.MaxCECost, l.MaxAbsDiff)
		}
	}
	return nil
}
