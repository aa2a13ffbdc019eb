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
