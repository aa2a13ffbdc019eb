package export

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cpu"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
)

// VerifyOptions configure Verify.
type VerifyOptions struct {
	// Dir is the export folder; Config and Store are the model it was
	// exported from (with the running statistics the export used).
	Dir    string
	Config model.Config
	Store  *kernels.Store
	// IDs is the held-out token stream; Batches batches of Batch
	// sequential chunks per length are compared (0 batches: every full
	// batch of the stream).
	IDs     []int32
	Batches int
	Batch   int
	// Runtime opens the export (provider, threads, library).
	Runtime runtime.Options
}

// VerifyResult compares one exported length with the Go executor.
type VerifyResult struct {
	T, Batch, Batches, Tokens int
	// MaxAbsDiff is max |logit(onnxruntime) - logit(Go, eval mode)|.
	MaxAbsDiff float64
	// MeanKL is the mean over positions of KL(p_Go ‖ p_onnxruntime), the
	// divergence of the next-token distributions (nats). Unlike the CE
	// cost it cannot cancel across positions, and unlike MaxAbsDiff it is
	// not set by one outlying logit.
	MeanKL float64
	// Mean next-token cross-entropy (nats) of the exported graph in
	// onnxruntime, of the Go executor in eval mode (running statistics),
	// and of the Go executor evaluating the paper's way (statistics of the
	// evaluated batch: not causal, not servable).
	CEExport, CEEval, CEBatchStats float64
	// KVSteps decode steps of the KV-cache graphs (none without them) on
	// the first batch, each sequence at its own position, differ from the
	// Go executor's logits by at most KVMaxAbsDiff.
	KVSteps      int
	KVMaxAbsDiff float64
}

// VerifyLimits bound what Verify accepts of one export: the mean KL
// divergence of its next-token distributions from the Go executor's
// (VerifyResult.MeanKL), its CE cost against the Go executor in eval mode
// (nats), and the largest |logit(onnxruntime) − logit(Go)| at any position.
//
// The KL is the check that tells a wrong graph from a rounded one. On the
// tiny preset (trained 40 and 200 steps, L=128 and 256), int8 graphs whose
// integer sums saturated on an AVX2 CPU had a mean KL of 7.1e-3 to 1.2e-2,
// correct int8 graphs 1.4e-5 to 5.0e-5. The CE cost can cancel across
// positions (+0.0065 nats for a saturated graph), and the largest logit
// difference is one extreme of billions (0.57 for a correct int8 graph,
// 0.63 for a saturated one), so alone neither separates them.
type VerifyLimits struct {
	MaxKL      float64
	MaxCECost  float64
	MaxAbsDiff float64
}

// DefaultVerifyLimits are the limits for an export's precision: float32
// computes what the Go executor computes up to summation order; reduced
// precisions and int8 round weights and activations, and their limits sit
// well above what correct graphs of trained models measure and well below
// what a wrong kernel gives (docs/EXPORT.md).
func DefaultVerifyLimits(dt ir.Precision, quantize onnx.Quantize) VerifyLimits {
	switch {
	case quantize == onnx.QuantizeInt8:
		return VerifyLimits{MaxKL: 1e-3, MaxCECost: 0.01, MaxAbsDiff: 2}
	case dt == ir.FP16:
		return VerifyLimits{MaxKL: 1e-4, MaxCECost: 0.01, MaxAbsDiff: 1}
	case dt == ir.BF16:
		return VerifyLimits{MaxKL: 1e-2, MaxCECost: 0.01, MaxAbsDiff: 2}
	default:
		return VerifyLimits{MaxKL: 1e-6, MaxCECost: 1e-3, MaxAbsDiff: 1e-2}
	}
}

// Check returns an error naming the first limit r exceeds (a NaN exceeds
// every limit).
func (r VerifyResult) Check(l VerifyLimits) error {
	if !(r.MeanKL <= l.MaxKL) {
		return fmt.Errorf("verify length %d: mean KL %.3g nats exceeds the limit %g", r.T, r.MeanKL, l.MaxKL)
	}
	if cost := r.CEExport - r.CEEval; !(cost <= l.MaxCECost) {
		return fmt.Errorf("verify length %d: CE cost %+.5f nats exceeds the limit %g", r.T, cost, l.MaxCECost)
	}
	if !(r.MaxAbsDiff <= l.MaxAbsDiff) {
		return fmt.Errorf("verify length %d: max |Δlogit| %.3g exceeds the limit %g", r.T, r.MaxAbsDiff, l.MaxAbsDiff)
	}
	if !(r.KVMaxAbsDiff <= l.MaxAbsDiff) {
		return fmt.Errorf("verify length %d: KV cache max |Δlogit| %.3g exceeds the limit %g", r.T, r.KVMaxAbsDiff, l.MaxAbsDiff)
	}
	return nil
}

// Verify runs every exported graph in onnxruntime on held-out batches and
// compares it with the Go executor.
func Verify(ctx context.Context, o VerifyOptions) ([]VerifyResult, error) {
	if o.Batch <= 0 {
		o.Batch = 1
	}
	if o.Store == nil {
		return nil, errors.New("verify: no weights")
	}
	m, err := runtime.Open(o.Dir, o.Runtime)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var out []VerifyResult
	for _, T := range m.Lengths() {
		r, err := verifyLength(ctx, m, o, T)
		if err != nil {
			return nil, fmt.Errorf("verify length %d: %w", T, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func verifyLength(ctx context.Context, m *runtime.Model, o VerifyOptions, T int) (VerifyResult, error) {
	res := VerifyResult{T: T}
	chunks := (len(o.IDs) - 1) / T
	if chunks < 1 {
		return res, fmt.Errorf("the held-out data has %d tokens, fewer than one chunk of %d+1", len(o.IDs), T)
	}
	B := min(o.Batch, chunks)
	nb := chunks / B
	if o.Batches > 0 {
		nb = min(nb, o.Batches)
	}
	res.Batch, res.Batches = B, nb
	V := o.Config.Vocab
	build := func(bs bool) (kernels.Program, error) {
		mg, err := model.Build(&o.Config, model.Opts{T: T, B: B, Mode: model.Eval, BatchStats: bs, Logits: !bs})
		if err != nil {
			return nil, err
		}
		g := mg.Graph
		if err := passes.Run(g, passes.EvalPipeline, &passes.Context{}); err != nil {
			return nil, err
		}
		return cpu.New(ir.FP32).Compile(g, passes.Plan(g), o.Store)
	}
	ev, err := build(false)
	if err != nil {
		return res, err
	}
	defer ev.Close()
	bsp, err := build(true)
	if err != nil {
		return res, err
	}
	defer bsp.Close()
	var nllExport, sumEval, sumBS, klSum float64
	for k := 0; k < nb; k++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		x := make([]int32, B*T)
		y := make([]int32, B*T)
		seqs := make([][]int32, B)
		for r := 0; r < B; r++ {
			s := (k*B + r) * T
			copy(x[r*T:], o.IDs[s:s+T])
			copy(y[r*T:], o.IDs[s+1:s+T+1])
			seqs[r] = x[r*T : (r+1)*T]
		}
		feeds := map[string]*kernels.Tensor{
			"input_ids": kernels.IntTensor(ir.Shape{B, T}, x),
			"targets":   kernels.IntTensor(ir.Shape{B * T}, y),
		}
		if err := ev.Run(feeds, 0); err != nil {
			return res, err
		}
		sumEval += ev.Output("ce_sum").At(0)
		goLogits := ev.Output("logits").F32
		if k == 0 && slices.Contains(m.KVCacheLengths(), T) {
			if err := verifyKV(ctx, m, T, seqs, goLogits, V, &res); err != nil {
				return res, fmt.Errorf("KV cache: %w", err)
			}
		}
		got, err := m.Logits(ctx, seqs)
		if err != nil {
			return res, err
		}
		for r := 0; r < B; r++ {
			for t := 0; t < T; t++ {
				row := got[r].Row(t)
				ref := goLogits[(r*T+t)*V : (r*T+t+1)*V]
				for j, g := range row {
					d := math.Abs(float64(g) - float64(ref[j]))
					if d > res.MaxAbsDiff || d != d {
						res.MaxAbsDiff = d
					}
				}
				nllExport += runtime.NLL(row, int(y[r*T+t]))
				klSum += KL(ref, row)
			}
		}
		if err := bsp.Run(feeds, 0); err != nil {
			return res, err
		}
		sumBS += bsp.Output("ce_sum").At(0)
		res.Tokens += B * T
	}
	n := float64(res.Tokens)
	res.CEExport, res.CEEval, res.CEBatchStats = nllExport/n, sumEval/n, sumBS/n
	res.MeanKL = klSum / n
	return res, nil
}

// KL is KL(softmax(p) ‖ softmax(q)) in float64 (nats).
func KL(p, q []float32) float64 {
	lp, lq := logSumExp(p), logSumExp(q)
	var kl float64
	for i := range p {
		a := float64(p[i]) - lp
		kl += math.Exp(a) * (a - (float64(q[i]) - lq))
	}
	return max(kl, 0)
}

// logSumExp is log Σ exp(x) in float64.
func logSumExp(x []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	return math.Log(s) + mx
}

// kvVerifySteps is how many of the last positions of each sequence
// verifyKV decodes one by one.
const kvVerifySteps = 16

// verifyKV decodes the last positions of seqs on the KV cache of length T
// (sequence r prefilled with all but its last kvVerifySteps+r tokens, so
// one Step holds sequences at different positions) and compares every
// step's logits with ref, the Go executor's [B,T,V] logits.
func verifyKV(ctx context.Context, m *runtime.Model, T int, seqs [][]int32, ref []float32, V int, res *VerifyResult) error {
	d, err := m.NewDecoder(T, len(seqs))
	if err != nil {
		return err
	}
	slots := make([]int, len(seqs))
	n := make([]int, len(seqs))
	for r, seq := range seqs {
		n[r] = max(1, T-kvVerifySteps-r)
		if slots[r], _, err = d.Prefill(ctx, seq[:n[r]]); err != nil {
			return err
		}
	}
	for {
		var ss, rows []int
		var toks []int32
		for r := range seqs {
			if n[r] < T {
				ss, rows, toks = append(ss, slots[r]), append(rows, r), append(toks, seqs[r][n[r]])
			}
		}
		if len(ss) == 0 {
			return nil
		}
		got, err := d.Step(ctx, ss, toks)
		if err != nil {
			return err
		}
		for i, r := range rows {
			want := ref[(r*T+n[r])*V : (r*T+n[r]+1)*V]
			for j, g := range got[i] {
				if dd := math.Abs(float64(g) - float64(want[j])); dd > res.KVMaxAbsDiff || dd != dd {
					res.KVMaxAbsDiff = dd
				}
			}
			n[r]++
			res.KVSteps++
		}
	}
}
