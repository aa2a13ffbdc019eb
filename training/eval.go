package training

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/logging"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/data"
	"github.com/rpac-dev/rpac/training/metrics"
)

// evaluator scores the evaluation split at one length: sequential,
// non-overlapping chunks (drop_last) in batches of Batch sequences, each
// batch run as Batch/Micro micro-batches. With running statistics (the
// default) every sequence is scored on its own, so the result does not
// depend on Micro; with batch statistics the statistics are those of each
// micro-batch.
type evaluator struct {
	T, Batch, Micro int
	graph           *model.Graph
	plan            *kernels.Plan
	prog            kernels.Program
}

// EvalResult is one evaluation.
type EvalResult struct {
	CE     float64 // mean pure CE per token
	Tokens int
	// Recall counts correct argmax predictions at the synthetic corpus's
	// answer positions (nil for other data).
	Recall *data.Recall
	// Breakdown splits Recall by query distance and pair slot (MQAR only).
	Breakdown *data.RecallBreakdown
	// Bias holds each fuzzy block's attention bias [T,T] (before the warm-in
	// scale) as the first batch saw it, when asked for.
	Bias [][]float32
}

// evalGraph builds and plans the eval graph at T with micro sequences
// (attention fused for backends that ask for it).
func evalGraph(cfg *model.Config, T, micro int, batchStats bool, caps kernels.Capabilities) (*model.Graph, *kernels.Plan, error) {
	mg, err := model.Build(cfg, model.Opts{T: T, B: micro, Mode: model.Eval, BatchStats: batchStats, Align: caps.Align})
	if err != nil {
		return nil, nil, err
	}
	for _, l := range mg.Layers {
		mg.SetOutput(probeBias(l.Index), l.Bias)
	}
	if err := passes.Run(mg.Graph, passes.EvalPipeline, (&passes.Context{Model: mg.Info()}).ForBackend(caps)); err != nil {
		return nil, nil, err
	}
	return mg, passes.Plan(mg.Graph), nil
}

func compileEvaluator(cfg *model.Config, store *kernels.Store, be kernels.Backend, T, batch, micro int, batchStats bool) (*evaluator, error) {
	if micro < 1 || batch%micro != 0 {
		return nil, fmt.Errorf("evaluation micro-batch %d does not divide the batch of %d", micro, batch)
	}
	mg, plan, err := evalGraph(cfg, T, micro, batchStats, be.Capabilities())
	if err != nil {
		return nil, err
	}
	if err := model.InitStore(mg.Specs, store, 0); err != nil {
		return nil, err
	}
	prog, err := be.Compile(mg.Graph, plan, store)
	if err != nil {
		return nil, err
	}
	return &evaluator{T: T, Batch: batch, Micro: micro, graph: mg, plan: plan, prog: prog}, nil
}

func (e *evaluator) Close() { e.prog.Close() }

// run scores at most maxBatches batches of ds's evaluation split (0: all).
func (e *evaluator) run(ds *Dataset, maxBatches int, wantBias bool) (EvalResult, error) {
	var res EvalResult
	eb, err := data.NewEvalBatcher(ds.Eval, e.T, e.Batch)
	if err != nil {
		return res, err
	}
	var sum float64
	for bi, bt := range eb.All() {
		if maxBatches > 0 && bi >= maxBatches {
			break
		}
		var mask []bool
		if ds.Answers != nil {
			mask = ds.Answers.BatchAnswerMask(eb, bi)
			if res.Recall == nil {
				res.Recall = &data.Recall{}
			}
		}
		if ds.MQAR != nil && res.Breakdown == nil {
			res.Breakdown = ds.MQAR.Eval.Config.NewRecallBreakdown()
		}
		for k := 0; k < e.Batch/e.Micro; k++ {
			lo, hi := k*e.Micro*e.T, (k+1)*e.Micro*e.T
			ce, err := e.runMicro(bt.X[lo:hi], bt.Y[lo:hi])
			if err != nil {
				return res, err
			}
			sum += ce
			if wantBias && bi == 0 && k == 0 {
				res.Bias = e.biases()
			}
			if mask != nil {
				r, err := e.recall(bt.Y[lo:hi], mask[lo:hi])
				if err != nil {
					return res, err
				}
				*res.Recall = res.Recall.Add(r)
			}
			if res.Breakdown != nil {
				if err := e.breakdown(res.Breakdown, ds.MQAR.Eval, eb, bi*e.Batch+k*e.Micro); err != nil {
					return res, err
				}
			}
		}
		res.Tokens += e.Batch * e.T
	}
	if res.Tokens == 0 {
		return res, fmt.Errorf("evaluation split too short for one batch of %d×%d", e.Batch, e.T)
	}
	res.CE = sum / float64(res.Tokens)
	return res, nil
}

// runMicro runs one micro-batch and returns its summed pure CE.
func (e *evaluator) runMicro(x, y []int32) (float64, error) {
	feeds := map[string]*kernels.Tensor{
		"input_ids": kernels.IntTensor(ir.Shape{e.Micro, e.T}, x),
		"targets":   kernels.IntTensor(ir.Shape{e.Micro * e.T}, y),
	}
	if err := e.prog.Run(feeds, 0); err != nil {
		return 0, err
	}
	return e.prog.Output("ce_sum").At(0), nil
}

// recall scores the last micro-batch's argmax predictions.
func (e *evaluator) recall(y []int32, mask []bool) (data.Recall, error) {
	p := e.prog.Output("pred")
	if p == nil || p.I32 == nil {
		return data.Recall{}, fmt.Errorf("the evaluation graph has no argmax output %q", "pred")
	}
	return data.RecallAccuracy(p.I32, y, mask)
}

// breakdown adds the last micro-batch's argmax predictions, whose first
// row is chunk first of eb, to b.
func (e *evaluator) breakdown(b *data.RecallBreakdown, s *data.MQARStream, eb *data.EvalBatcher, first int) error {
	p := e.prog.Output("pred")
	if p == nil || p.I32 == nil {
		return fmt.Errorf("the evaluation graph has no argmax output %q", "pred")
	}
	for r := range e.Micro {
		if err := b.Add(s, eb.Chunks().Start(first+r), p.I32[r*e.T:(r+1)*e.T]); err != nil {
			return err
		}
	}
	return nil
}

// biases copies each block's attention bias from the last run.
func (e *evaluator) biases() [][]float32 {
	var out [][]float32
	for _, l := range e.graph.Layers {
		if b := e.prog.Output(probeBias(l.Index)); b != nil && b.Len() == e.T*e.T {
			out = append(out, b.Float32s())
		}
	}
	return out
}

// evaluate runs an interval's evaluation: the raw weights (with the bias
// snapshot), the EMA and SWA weights, SWA-select's decision and the τ
// controllers' end-of-interval hooks; one metrics record.
func (r *run) evaluate(lr float64) error {
	if err := r.state.toHost(); err != nil {
		return err
	}
	if err := r.evaluateOnHost(lr); err != nil {
		return err
	}
	return r.state.toDevice() // the controllers may have set τ
}

// evaluateOnHost is evaluate with the store current.
func (r *run) evaluateOnHost(lr float64) error {
	scale := r.ctl.plainScale(r.st.Step)
	final := r.st.Step == r.plan.Steps
	nb := r.o.EvalBatches
	if final && r.o.FinalEvalBatches != 0 {
		nb = max(0, r.o.FinalEvalBatches) // < 0: the whole split
	}
	cs := r.ctl.cs
	rec := &metrics.Record{Step: r.st.Step, Split: r.ds.EvalName, Epoch: new(cs.Epoch), LR: metrics.N(lr),
		BiasScale: metrics.N(scale), Tokens: r.st.Tokens}
	res, err := r.eval.run(r.ds, nb, true)
	if err != nil {
		return err
	}
	ce := res.CE
	if err := r.job.fromRank0(&ce); err != nil {
		return err
	}
	r.st.LastValCE, r.res.FinalValCE = control.F(ce), ce
	rec.ValCE, rec.ValPPL, rec.ValTokens = metrics.N(ce), metrics.N(math.Exp(ce)), res.Tokens
	if res.Recall != nil {
		r.res.FinalRecall, r.res.FinalRecallN = res.Recall.Accuracy(), res.Recall.Total
		rec.RecallAcc, rec.RecallN = metrics.N(res.Recall.Accuracy()), new(res.Recall.Total)
	}
	if res.Breakdown != nil {
		rec.RecallBreakdown = res.Breakdown
		r.res.FinalRecallByDist = res.Breakdown.ByDist
	}
	if len(res.Bias) > 0 && r.o.Parallel.primary() {
		if err := saveBias(filepath.Join(r.o.Out, "bias"), res.Bias, r.st.Step, r.plan.EvalT, cs.Epoch == 0); err != nil {
			return err
		}
	}
	if r.w.ema != nil {
		ece, err := r.evalWith(r.w.ema, nb)
		if err != nil {
			return err
		}
		r.res.FinalEMACE = ece
		rec.ValCEEMA, rec.ValPPLEMA = metrics.N(ece), metrics.N(math.Exp(ece))
	}
	diag := r.ctl.intervalDiagnostics(rec)
	if cs.SWA != nil {
		if err := r.swaSelect(ce, nb, rec); err != nil {
			return err
		}
	}
	r.ctl.endOfInterval(r.st.Step, ce, final, diag, rec)
	ev := EvalEvent{Step: r.st.Step, Steps: r.plan.Steps, Split: r.ds.EvalName, CE: ce, Tokens: res.Tokens,
		EMACE: math.NaN(), SWACE: math.NaN()}
	if res.Recall != nil && res.Recall.Total > 0 { // no answers in the evaluated chunks: no recall
		acc := res.Recall.Accuracy()
		ev.Recall, ev.RecallN = &acc, res.Recall.Total
		ev.Breakdown = res.Breakdown
	}
	if r.w.ema != nil {
		ev.EMACE = r.res.FinalEMACE
	}
	if r.w.swa != nil {
		ev.SWACE, ev.SWACount = r.res.FinalSWACE, cs.SWA.Count()
	}
	logging.Info(r.o.Log, ev)
	return r.metrics.WriteEval(rec)
}

// evalWith evaluates the weight set w.
func (r *run) evalWith(w [][]float32, nb int) (float64, error) {
	var ce float64
	err := r.w.with(w, func() error {
		res, err := r.eval.run(r.ds, nb, false)
		if err != nil {
			return err
		}
		ce = res.CE
		return r.job.fromRank0(&ce)
	})
	return ce, err
}

// swaSelect lets SWA-select decide on the interval with the raw weights'
// CE, and evaluates the SWA average.
func (r *run) swaSelect(ce float64, nb int, rec *metrics.Record) error {
	swa := r.ctl.cs.SWA
	d := swa.Consider(r.ctl.cs.Epoch, ce)
	if d.Join {
		if err := r.w.joinSWA(swa.Count()); err != nil {
			return err
		}
	}
	rec.SWAJoin, rec.SWAInZone, rec.SWAGain = new(d.Join), new(d.InZone), metrics.N(d.RelGain)
	rec.SWAMembers, rec.SWACount = append([]int{}, swa.Members...), new(swa.Count())
	if r.w.swa != nil {
		sce, err := r.evalWith(r.w.swa, nb)
		if err != nil {
			return err
		}
		r.res.FinalSWACE = sce
		rec.ValCESWA, rec.ValPPLSWA = metrics.N(sce), metrics.N(math.Exp(sce))
	}
	r.res.SWAMembers = slices.Clone(swa.Members)
	return nil
}

// saveBias writes a layer-by-layer snapshot of the attention bias B(T)
// (before the warm-in scale) to bias/late.safetensors, and on the first
// evaluation also to bias/early.safetensors.
func saveBias(dir string, bias [][]float32, step, T int, first bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	snap := make([]checkpoint.Named, len(bias))
	for i, b := range bias {
		snap[i] = checkpoint.Named{Name: fmt.Sprintf("blocks.%d", i), Shape: []int{T, T}, Data: b}
	}
	meta := map[string]string{"step": fmt.Sprint(step), "T": fmt.Sprint(T)}
	names := []string{"late"}
	if first {
		names = append(names, "early")
	}
	for _, n := range names {
		p := filepath.Join(dir, n+".safetensors")
		if err := checkpoint.SaveWeightsFile(p+".tmp", snap, meta); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	return nil
}
