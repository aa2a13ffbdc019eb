// Package lengtheval scores a trained run at context lengths, including
// lengths it never trained at, the way a service runs the model: the run's
// checkpoint goes through the folded export (one constant RPA bias per
// length; the running statistics of untrained lengths calibrated on the
// run's training split, as rpac export does) and onnxruntime scores the
// run's evaluation split cut into chunks of each length. A run on the MQAR
// corpus is scored at length T on MQAR sequences of T tokens instead (its
// pairs, the eval stream's seed; distances up to T unless the run bounded
// them), for CE and recall. rpac ablate --eval-lengths calls it for every
// run (training.LengthEval).
package lengtheval

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/rpac-dev/rpac/app/exportjob"
	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
	"github.com/rpac-dev/rpac/training/data"
)

// Options configure Score.
type Options struct {
	Lengths []int
	// Tokens bounds the text scored at each length to its first Tokens
	// tokens, in ⌊Tokens/T⌋ chunks of T (0: the whole split), so every
	// length scores the same text.
	Tokens int
	// Threads are onnxruntime's intra-op threads (0: one per core).
	Threads int
	Log     *slog.Logger
}

// exportDir is where Score writes the export inside the run directory; it
// is removed once scored.
const exportDir = "export-lengths"

// Score exports the run in dir (its weights: which; WeightsAuto for EMA
// when the checkpoint has it) at o.Lengths and returns its CE at each.
func Score(ctx context.Context, dir string, which training.WeightSet, o Options) ([]training.LengthCE, error) {
	if len(o.Lengths) == 0 {
		return nil, fmt.Errorf("lengtheval: no lengths")
	}
	if err := runtime.Available(); err != nil {
		return nil, fmt.Errorf("scoring at other lengths runs the export in onnxruntime: %w", err)
	}
	run, err := training.OpenRun(dir)
	if err != nil {
		return nil, err
	}
	if err := run.SelectWeights(which); err != nil {
		return nil, err
	}
	if err := export.CheckLengths(o.Lengths, run.Config.MaxLen); err != nil {
		return nil, err
	}
	ds, err := training.LoadDataset(ctx, run.DataSpec("", "", ""), o.Log)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(dir, exportDir)
	defer os.RemoveAll(out)
	if _, err := exportjob.Run(ctx, job(run, ds, out, o)); err != nil {
		return nil, err
	}
	m, err := runtime.OpenContext(ctx, out, runtime.Options{Threads: o.Threads})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var res []training.LengthCE
	for _, T := range o.Lengths {
		if ds.MQAR != nil {
			l, err := mqarAt(ctx, m, ds.MQAR.Eval, T, len(ds.Eval), o.Tokens)
			if err != nil {
				return nil, fmt.Errorf("T = %d: %w", T, err)
			}
			res = append(res, l)
			continue
		}
		chunks := (len(ds.Eval) - 1) / T
		if o.Tokens > 0 {
			chunks = min(chunks, o.Tokens/T)
		}
		if chunks < 1 {
			return nil, fmt.Errorf("the %s split has %d tokens, fewer than one chunk of %d+1", ds.EvalName, len(ds.Eval), T)
		}
		ev, err := runtime.Evaluate(ctx, m, ds.Eval, T, chunks, 1)
		if err != nil {
			return nil, fmt.Errorf("T = %d: %w", T, err)
		}
		res = append(res, training.LengthCE{T: T, CE: ev.MeanCE, Tokens: ev.Tokens})
	}
	return res, nil
}

// job is the fp32 folded export of run at o.Lengths into out. Under EMA or
// SWA weights every length is calibrated again (the running statistics
// kept in training come from the live weights).
func job(run *training.Run, ds *training.Dataset, out string, o Options) exportjob.Job {
	tok, eos := run.Tokenizer()
	calibrate := exportjob.CalibrateAuto
	if run.Weights != training.WeightsLast {
		calibrate = exportjob.CalibrateAlways
	}
	return exportjob.Job{
		Options: export.Options{DType: ir.FP32, Config: run.Config, Store: run.Store, Trained: run.Trained, Lengths: o.Lengths,
			CalibBatches: export.DefaultCalibBatches, CalibBatch: export.DefaultCalibBatch,
			Out: out, Tokenizer: tok, EOS: eos, Provenance: run.Provenance(), Log: o.Log},
		Format:    exportjob.FormatONNX,
		Calibrate: calibrate,
		LoadData:  func(context.Context) (*exportjob.Data, error) { return exportjob.FromDataset(ds), nil },
	}
}

// mqarBatch is the number of sequences per onnxruntime call in mqarAt.
const mqarBatch = 8

// mqarAt scores the model on MQAR sequences of T tokens generated like
// eval (its pairs, seed and least distance; its greatest distance when it
// was below its own sequence length, else T), as many as fit in evalTokens
// tokens (in maxTokens, when that is positive and fewer), one sequence per
// chunk. It returns the mean CE over every token and the recall at the
// answers.
func mqarAt(ctx context.Context, m *runtime.Model, eval *data.MQARStream, T, evalTokens, maxTokens int) (training.LengthCE, error) {
	cfg := eval.Config
	if cfg.MaxDist >= cfg.SeqLen {
		cfg.MaxDist = 0 // no bound: T
	}
	cfg.SeqLen = T
	n := evalTokens / T
	if maxTokens > 0 {
		n = min(n, maxTokens/T)
	}
	if n < 1 {
		return training.LengthCE{}, fmt.Errorf("fewer than one MQAR sequence of %d tokens in %d", T, max(evalTokens, maxTokens))
	}
	s, err := data.MQAR(eval.Seed, n*T+1, cfg)
	if err != nil {
		return training.LengthCE{}, err
	}
	b := s.Config.NewRecallBreakdown()
	var nll float64
	for c := 0; c < n; c += mqarBatch {
		var seqs [][]int32
		for i := c; i < min(c+mqarBatch, n); i++ {
			seqs = append(seqs, s.IDs[i*T:(i+1)*T])
		}
		out, err := m.Logits(ctx, seqs)
		if err != nil {
			return training.LengthCE{}, err
		}
		for r, l := range out {
			start := (c + r) * T
			nll += l.NLL(s.IDs[start+1 : start+T+1])
			if err := b.Add(s, start, argmaxRows(l)); err != nil {
				return training.LengthCE{}, err
			}
		}
	}
	l := training.LengthCE{T: T, CE: nll / float64(n*T), Tokens: n * T, RecallN: b.Total()}
	if l.RecallN > 0 {
		r := float64(b.Correct()) / float64(l.RecallN)
		l.Recall = &r
	}
	return l, nil
}

// argmaxRows is the argmax of each position's logits (the first of ties).
func argmaxRows(l runtime.Logits) []int32 {
	pred := make([]int32, l.Len)
	for t := range pred {
		row := l.Row(t)
		best := 0
		for v, x := range row {
			if x > row[best] {
				best = v
			}
		}
		pred[t] = int32(best)
	}
	return pred
}
