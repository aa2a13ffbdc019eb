package serve

import (
	"context"
	"net/http"
	"testing"
	"time"
)

func TestLoad(t *testing.T) {
	_, ts := newTest(t, &countModel{delay: time.Millisecond}, Config{MaxBatch: 4})
	o := LoadOptions{URL: ts.URL, Clients: 4, Requests: 40, Duration: time.Minute, ScoreEvery: 4,
		PromptLen: 3, MaxTokens: 5, ScoreLen: 6, Vocab: fakeV - 1, Seed: 1}
	r, err := Load(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 40 || r.Completions != 30 || r.Score != 10 || r.Unexpected() != 0 || r.Codes[http.StatusOK] != 40 {
		t.Fatalf("result %+v", r)
	}
	if r.Tokens < 30 || r.Tokens > 150 || r.CompletionP50 <= 0 || r.CompletionP99 < r.CompletionP50 || r.ScoreP99 < r.ScoreP50 || r.RequestsPerSecond() <= 0 {
		t.Fatalf("result %+v", r)
	}
	// The time bound stops a test whose request bound is far away.
	_, slow := newTest(t, &countModel{delay: 20 * time.Millisecond}, Config{MaxBatch: 2, Queue: 1})
	o.URL, o.Requests, o.Duration, o.Clients = slow.URL, 1<<30, 300*time.Millisecond, 6
	t0 := time.Now()
	r, err = Load(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("the load test ran %v past its 300ms bound", d)
	}
	// Six clients against two slots and a queue of one: some 429s, no
	// other failure.
	if r.Codes[http.StatusTooManyRequests] == 0 || r.Unexpected() != 0 || r.Completions == 0 {
		t.Fatalf("result %+v", r)
	}
	if _, err := Load(context.Background(), LoadOptions{URL: ts.URL}); err == nil {
		t.Fatal("zero clients: no error")
	}
	if n, err := RSS(); err != nil || n <= 0 {
		t.Fatalf("RSS %d, %v", n, err)
	}
}

// TestMixLoad: a second of mixed load (completions, streams, scores,
// KServe inferences, malformed and slow requests) against the stand-in
// model behind Serve: no 5xx, every malformed request a 4xx, every slow one
// cut off with a 408 within the read timeout, every request answered in
// time, and the goroutines back to their count before the load.
func TestMixLoad(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	_, addr := serveTest(t, &countModel{delay: time.Millisecond}, Config{Name: "fake", MaxBatch: 4, Timeout: 5 * time.Second, ReadTimeout: readTimeout})
	o := MixOptions{URL: "http://" + addr, Model: "fake", Clients: 12, Duration: time.Second, Malformed: 0.15, Slow: 0.1,
		PromptLen: 3, MaxTokens: 5, ScoreLen: 6, InferLen: 4, TopK: 3, Vocab: fakeV - 1, Seed: 1,
		Timeout: 5 * time.Second, ReadTimeout: readTimeout, Grace: 500 * time.Millisecond, Settle: 500 * time.Millisecond}
	t0 := time.Now()
	r, err := MixLoad(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("a 1 s mixed load took %v", d)
	}
	for k, kr := range r.Kinds {
		t.Logf("%-10s sent %4d codes %v no answer %d late %d p50 %v p99 %v max %v", Kind(k), kr.Sent, kr.Codes, kr.NoAnswer, kr.Late, kr.P50, kr.P99, kr.Max)
		if kr.Sent == 0 {
			t.Errorf("%v: none sent", Kind(k))
		}
		if kr.Expected != kr.Sent {
			t.Errorf("%v: %d of %d answered as expected: %v, %d no answer", Kind(k), kr.Expected, kr.Sent, kr.Codes, kr.NoAnswer)
		}
	}
	if tot := r.Total(); tot.Server != 0 || tot.NoAnswer != 0 || !r.InTime() {
		t.Errorf("classes %+v, in time %v", tot, r.InTime())
	}
	if n := r.Kinds[KindMalformed].Sent; n < NumMalformed {
		t.Errorf("only %d malformed requests: not every kind of mistake was sent", n)
	}
	slow := r.Kinds[KindSlow]
	if slow.Codes[http.StatusRequestTimeout] != slow.Sent || slow.P50 < readTimeout*9/10 || slow.Max > readTimeout+500*time.Millisecond {
		t.Errorf("slow requests: %v, p50 %v, max %v; want 408 within the read timeout of %v", slow.Codes, slow.P50, slow.Max, readTimeout)
	}
	if st := r.Kinds[KindStream]; st.FirstP50 <= 0 || st.FirstP50 > st.P50 || st.Tokens < st.Expected {
		t.Errorf("streams: first event p50 %v, p50 %v, %d tokens", st.FirstP50, st.P50, st.Tokens)
	}
	if r.Leaked() != 0 {
		t.Errorf("goroutines: %d before the load, %d after %v", r.GoroutinesBefore, r.GoroutinesAfter, r.SettledIn)
	}
	if r.IdleRSS <= 0 || r.PeakRSS < r.IdleRSS || r.SettledRSS <= 0 {
		t.Errorf("RSS idle %d, peak %d, settled %d", r.IdleRSS, r.PeakRSS, r.SettledRSS)
	}
	if _, err := MixLoad(context.Background(), MixOptions{URL: o.URL}); err == nil {
		t.Error("zero clients: no error")
	}
}
