package runtime

import (
	"context"
	"fmt"
	"math"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/rpac-dev/rpac/internal/logsumexp"
)

// The scorer: the next-token negative log-likelihood of rows of logits,
// used by Score, LogProb, rpac eval, the server's logprobs and the
// exporter's --verify. A row's log-sum-exp is internal/logsumexp's: the
// maximum, then Σ exp(x - max) with a polynomial exp (within 2 ulp) in
// float32 lanes, vectorized C with cgo (AVX-512, AVX2 or SSE2 chosen at
// start, NEON on arm64) and unrolled Go without, flushed to float64 every
// 1,024 logits, and the logarithm in float64: within 2e-6 nats of a
// float64 log-softmax per row. CE needs only that and the target's logit.

// LogSumExp is log Σ exp(row): a token j's log-probability is row[j] less
// it. A NaN or +Inf logit, or a row of -Inf only, gives NaN.
func LogSumExp(row []float32) float64 { return logsumexp.LogSumExp(row) }

// NLL is -log softmax(row)[target].
func NLL(row []float32, target int) float64 {
	return LogSumExp(row) - float64(row[target])
}

// LogProb is log softmax(row)[target] (the negative of NLL, which Score
// sums).
func LogProb(row []float32, target int) float64 { return -NLL(row, target) }

// scoreGrain is the fewest logits a goroutine of SumNLL scores: below it,
// starting goroutines costs more than it saves.
const scoreGrain = 1 << 18

// SumNLL is Σ_t NLL(logits[t·V:(t+1)·V], targets[t]) over the rows of a
// [len(targets), V] block of logits, on the machine's cores. The sum is
// taken per contiguous range of rows and the ranges added in order, so a
// given GOMAXPROCS always gives the same result.
func SumNLL(logits []float32, V int, targets []int32) float64 {
	rows := len(targets)
	logits = logits[:rows*V]
	w := max(1, min(goruntime.GOMAXPROCS(0), rows*V/scoreGrain, rows))
	if w == 1 {
		return sumNLL(logits, V, targets)
	}
	sums := make([]float64, w)
	var wg sync.WaitGroup
	for k := range w {
		lo, hi := k*rows/w, (k+1)*rows/w
		wg.Go(func() { sums[k] = sumNLL(logits[lo*V:hi*V], V, targets[lo:hi]) })
	}
	wg.Wait()
	var s float64
	for _, x := range sums {
		s += x
	}
	return s
}

func sumNLL(logits []float32, V int, targets []int32) float64 {
	var s float64
	for t, y := range targets {
		s += NLL(logits[t*V:(t+1)*V], int(y))
	}
	return s
}

// NLL is the summed next-token NLL of the sequence's rows against targets
// (targets[t] is the token that follows position t; at most Len of them).
func (l Logits) NLL(targets []int32) float64 {
	return SumNLL(l.Data, l.Vocab, targets[:min(len(targets), l.Len)])
}

// Evaluation is the score of a token stream in chunks of T tokens.
type Evaluation struct {
	Tokens  int
	NLL     float64       // summed, nats
	MeanCE  float64       // NLL / Tokens
	InModel time.Duration // in onnxruntime
	Elapsed time.Duration // in all, scoring included
}

// Err reports a cross-entropy that is not a finite number: the model's
// outputs were not finite, and the evaluation measured nothing.
func (e Evaluation) Err() error {
	if math.IsNaN(e.MeanCE) || math.IsInf(e.MeanCE, 0) {
		return fmt.Errorf("runtime: the mean cross-entropy over %d tokens is %v: the model's outputs are not finite", e.Tokens, e.MeanCE)
	}
	return nil
}

// Evaluate scores the first chunks chunks of T+1 tokens of ids (chunk k
// predicts ids[kT+1 : (k+1)T+1] from ids[kT : (k+1)T]), batch sequences
// per call: what rpac eval reports.
func Evaluate(ctx context.Context, m *Model, ids []int32, T, chunks, batch int) (Evaluation, error) {
	var ev Evaluation
	t0 := time.Now()
	for start := 0; start < chunks; start += batch {
		var seqs [][]int32
		for i := start; i < min(start+batch, chunks); i++ {
			seqs = append(seqs, ids[i*T:(i+1)*T])
		}
		t1 := time.Now()
		out, err := m.Logits(ctx, seqs)
		if err != nil {
			return ev, err
		}
		ev.InModel += time.Since(t1)
		for r, l := range out {
			ev.NLL += l.NLL(ids[(start+r)*T+1 : (start+r+1)*T+1])
			ev.Tokens += T
		}
	}
	ev.Elapsed = time.Since(t0)
	ev.MeanCE = ev.NLL / float64(ev.Tokens)
	return ev, nil
}
