package runtime

import (
	"math"
	"math/rand/v2"
	"testing"
)

// nll64 is the float64 log-softmax the scorer replaced (a math.Exp per
// logit): the reference for its accuracy and its benchmark baseline.
func nll64(row []float32, target int) float64 {
	mx := math.Inf(-1)
	for _, x := range row {
		mx = math.Max(mx, float64(x))
	}
	var s float64
	for _, x := range row {
		s += math.Exp(float64(x) - mx)
	}
	return math.Log(s) + mx - float64(row[target])
}

const gpt2Vocab = 50257

// lmRows returns rows of logits shaped like a language model's over the
// GPT-2 vocabulary: a spread of ~3 nats, a few hundred plausible tokens
// well above the rest, and per row either a confident or an uncertain
// prediction; targets mix likely and unlikely tokens.
func lmRows(rows int, seed uint64) ([]float32, []int32) {
	r := rand.New(rand.NewPCG(seed, 1))
	l := make([]float32, rows*gpt2Vocab)
	y := make([]int32, rows)
	for t := range rows {
		row := l[t*gpt2Vocab : (t+1)*gpt2Vocab]
		for i := range row {
			row[i] = float32(r.NormFloat64()*3 - 2)
		}
		for range 300 {
			row[r.IntN(gpt2Vocab)] += float32(4 + 4*r.Float64())
		}
		y[t] = int32(r.IntN(gpt2Vocab))
		if t%3 == 0 { // a confident, correct prediction
			row[y[t]] += 25
		}
	}
	return l, y
}

// TestNLLClosedForm: logits [0, log 3] give p = (1/4, 3/4).
func TestNLLClosedForm(t *testing.T) {
	q := []float32{0, float32(math.Log(3))}
	if got, want := NLL(q, 1), math.Log(4.0/3); math.Abs(got-want) > 1e-7 {
		t.Errorf("NLL = %g, want %g", got, want)
	}
	if got := LogProb(q, 0); math.Abs(got-math.Log(0.25)) > 1e-7 {
		t.Errorf("LogProb = %g, want log 1/4", got)
	}
	if got := NLL([]float32{1, float32(math.NaN()), 2}, 0); !math.IsNaN(got) {
		t.Errorf("NLL of a row with a NaN = %g, want NaN", got)
	}
	// Logits far apart: exp underflows for all but the maximum.
	if got := NLL([]float32{-1e4, 0, 50}, 2); got != 0 {
		t.Errorf("NLL of a certain prediction = %g, want 0", got)
	}
}

// TestNLLMatchesFloat64: the reported mean NLL and perplexity stay within
// 1e-4 relative of the float64 scorer's (in fact within 1e-6), and every
// row within 1e-5 nats.
func TestNLLMatchesFloat64(t *testing.T) {
	const rows = 96
	l, y := lmRows(rows, 7)
	var fast, ref float64
	for i := range rows {
		row := l[i*gpt2Vocab : (i+1)*gpt2Vocab]
		a, b := NLL(row, int(y[i])), nll64(row, int(y[i]))
		if math.Abs(a-b) > 1e-5 {
			t.Errorf("row %d: NLL %.9f, float64 %.9f", i, a, b)
		}
		fast += a
		ref += b
	}
	fast /= rows
	ref /= rows
	if rel := math.Abs(fast-ref) / ref; rel > 1e-6 {
		t.Errorf("mean NLL %.9f, float64 %.9f: relative %.3g", fast, ref, rel)
	}
	if rel := math.Abs(math.Exp(fast)-math.Exp(ref)) / math.Exp(ref); rel > 1e-4 {
		t.Errorf("perplexity relative difference %.3g", rel)
	}
	sum := SumNLL(l, gpt2Vocab, y)
	if math.Abs(sum/rows-fast) > 1e-9*fast {
		t.Errorf("SumNLL/rows = %.12f, per-row mean %.12f", sum/rows, fast)
	}
	lg := Logits{Len: rows, Vocab: gpt2Vocab, Data: l}
	if got := lg.NLL(y); got != sum {
		t.Errorf("Logits.NLL = %g, SumNLL %g", got, sum)
	}
}

// BenchmarkScorer measures the scorer's cost per token (one row of GPT-2
// logits): fast is NLL, float64 the math.Exp log-softmax it replaced; both
// on one goroutine.
//
//	go test ./runtime -run '^$' -bench Scorer -count 6 | benchstat -col /scorer -
func BenchmarkScorer(b *testing.B) {
	const rows = 64
	l, y := lmRows(rows, 3)
	for _, c := range []struct {
		name string
		nll  func([]float32, int) float64
	}{{"fast", NLL}, {"float64", nll64}} {
		b.Run("scorer="+c.name, func(b *testing.B) {
			var s float64
			b.SetBytes(4 * gpt2Vocab)
			for i := 0; b.Loop(); i++ {
				t := i % rows
				s += c.nll(l[t*gpt2Vocab:(t+1)*gpt2Vocab], int(y[t]))
			}
			if math.IsNaN(s) {
				b.Fatal("NaN")
			}
		})
	}
}

// TestEvaluationErr: an evaluation whose mean cross-entropy is NaN or
// infinite is an error (rpac eval exits non-zero after printing it); a
// finite one is not.
func TestEvaluationErr(t *testing.T) {
	for _, c := range []struct {
		ce  float64
		bad bool
	}{{math.NaN(), true}, {math.Inf(1), true}, {math.Inf(-1), true}, {3.2, false}, {0, false}} {
		if err := (Evaluation{Tokens: 10, MeanCE: c.ce}).Err(); (err != nil) != c.bad {
			t.Errorf("CE %v: %v", c.ce, err)
		}
	}
}
