package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// admitAnswer is one request's outcome in a burst.
type admitAnswer struct {
	path       string
	code       int
	d          time.Duration
	retryAfter string
	msg        string
}

// burst sends the requests at once and returns their answers.
func burst(t *testing.T, base string, reqs []struct{ path, body string }) []admitAnswer {
	t.Helper()
	out := make([]admitAnswer, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := http.Post(base+r.path, "application/json", strings.NewReader(r.body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			v := decodeBody(t, resp)
			out[i] = admitAnswer{r.path, resp.StatusCode, time.Since(t0), resp.Header.Get("Retry-After"), errorMessage(v)}
		}()
	}
	wg.Wait()
	return out
}

// codes counts the answers by status.
func codes(as []admitAnswer) map[int]int {
	n := map[int]int{}
	for _, a := range as {
		n[a.code]++
	}
	return n
}

// metricsText returns the server's /metrics.
func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

const (
	admitScore = `{"ids": [1, 2, 3]}`
	admitInfer = `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}], "outputs": [{"name": "last_logits"}]}`
)

// checkRefusals: the burst is answered 200 and 429, some of each, with at
// most a quarter 504 (with every request admitted, 7 of 12 were; the
// estimate is an average, so on a stalled machine a request admitted near
// its limit can still miss it); every 429 came at once (well within the
// timeout) with a Retry-After of whole seconds and a message that says
// why. Times are the client's, so they carry a grace for a busy machine.
func checkRefusals(t *testing.T, as []admitAnswer, timeout time.Duration) {
	t.Helper()
	const grace = 250 * time.Millisecond
	n := codes(as)
	for _, a := range as {
		t.Logf("%s: %d after %v (Retry-After %q) %s", a.path, a.code, a.d.Round(time.Millisecond), a.retryAfter, a.msg)
	}
	ok, busy, late := n[http.StatusOK], n[http.StatusTooManyRequests], n[http.StatusGatewayTimeout]
	if ok == 0 || busy == 0 || ok+busy+late != len(as) || 4*late > len(as) {
		t.Errorf("burst of %d: %v; want some 200, the rest 429, and at most a quarter 504", len(as), n)
	}
	for _, a := range as {
		switch a.code {
		case http.StatusOK:
			if a.d > timeout+grace {
				t.Errorf("%s: 200 after %v, past the %v timeout", a.path, a.d, timeout)
			}
		case http.StatusTooManyRequests:
			if s, err := strconv.Atoi(a.retryAfter); err != nil || s < 1 {
				t.Errorf("%s: 429 with Retry-After %q, want whole seconds >= 1", a.path, a.retryAfter)
			}
			if a.d > timeout/2 {
				t.Errorf("%s: 429 after %v; want it at once, well before the %v timeout", a.path, a.d, timeout)
			}
			if !strings.Contains(a.msg, "too busy to answer this request within its timeout") {
				t.Errorf("%s: 429 %q", a.path, a.msg)
			}
		}
	}
}

// TestAdmitByDeadline: against a slow model, a burst that the model cannot
// finish within the timeout is answered 200 for what it can finish and
// 429 at once for the rest, where every request used to be queued and the
// excess answered 504 at its timeout: scores and KServe inferences (one
// sequence each, one model call per sequence) and completions (one
// decoding slot).
func TestAdmitByDeadline(t *testing.T) {
	t.Run("score", func(t *testing.T) {
		const timeout = 550 * time.Millisecond // the model finishes 5 sequences in it, admission plans for 4 (90%)
		m := &countModel{maxLen: 8, delay: 100 * time.Millisecond}
		_, ts := newTest(t, m, Config{Name: "tiny", MaxBatch: 1, Timeout: timeout})
		if code := postCode(ts.URL+"/v1/score", admitScore); code != http.StatusOK { // times a model call
			t.Fatalf("warm-up score: %d", code)
		}
		var reqs []struct{ path, body string }
		for i := range 12 {
			if i%2 == 0 {
				reqs = append(reqs, struct{ path, body string }{"/v1/score", admitScore})
			} else {
				reqs = append(reqs, struct{ path, body string }{"/v2/models/tiny/infer", admitInfer})
			}
		}
		as := burst(t, ts.URL, reqs)
		checkRefusals(t, as, timeout)
		var n429 int
		for _, a := range as {
			if a.code == http.StatusTooManyRequests {
				n429++
			}
		}
		if want := fmt.Sprintf(`rpac_refused_total{kind="score",reason="deadline"} %d`, n429); !strings.Contains(metricsText(t, ts.URL), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	})
	t.Run("completion", func(t *testing.T) {
		const timeout = 600 * time.Millisecond // 10 tokens take 200ms: two completions fit, three do not
		m := &countModel{delay: 20 * time.Millisecond}
		_, ts := newTest(t, m, Config{MaxBatch: 1, Timeout: timeout})
		if code := postCode(ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 3}`); code != http.StatusOK { // times the steps
			t.Fatalf("warm-up completion: %d", code)
		}
		var reqs []struct{ path, body string }
		for range 6 {
			reqs = append(reqs, struct{ path, body string }{"/v1/completions", `{"prompt": "a", "max_tokens": 10, "temperature": 0}`})
		}
		as := burst(t, ts.URL, reqs)
		checkRefusals(t, as, timeout)
		if !strings.Contains(metricsText(t, ts.URL), `rpac_refused_total{kind="decode",reason="deadline"}`) {
			t.Error("/metrics does not count the refused completions")
		}
	})
}

// TestAdmitBeforeEstimate: before the first model call has been timed,
// requests are admitted as before, work ahead of them or not: the second
// score, queued behind a call that ends after its timeout, is admitted
// (and answered 504 at its timeout) rather than refused.
func TestAdmitBeforeEstimate(t *testing.T) {
	const timeout = 300 * time.Millisecond
	m := &countModel{maxLen: 8, delay: 200 * time.Millisecond}
	s, ts := newTest(t, m, Config{MaxBatch: 1, Timeout: timeout})
	first := make(chan int, 1)
	go func() { first <- postCode(ts.URL+"/v1/score", admitScore) }()
	waitFor(t, "the first score's model call", func() bool { return m.calls.Load() >= 1 })
	if _, ok := s.sc.cost.get(); ok {
		t.Fatal("an estimate before any call ended")
	}
	code, v := post(t, ts.URL+"/v1/score", admitScore)
	if code != http.StatusGatewayTimeout {
		t.Errorf("second score, queued with no estimate: %d %v; want it admitted (and 504 at its timeout)", code, v)
	}
	if code := <-first; code != http.StatusOK {
		t.Errorf("first score: %d", code)
	}
	text := metricsText(t, ts.URL)
	if strings.Contains(text, `reason="deadline"`) {
		t.Errorf("refusals with no estimate:\n%s", grepLines(text, "rpac_refused_total"))
	}
	if !strings.Contains(text, `rpac_cost_estimate_seconds{kind="score"} 0.2`) {
		t.Errorf("after one 200ms call: %s", grepLines(text, "rpac_cost_estimate_seconds"))
	}
}

// TestAdmitAdapts: the estimate follows the model's speed: a burst that a
// slow model had refused in part is admitted whole once the model is fast.
func TestAdmitAdapts(t *testing.T) {
	const timeout = 600 * time.Millisecond
	m := &countModel{maxLen: 8}
	m.speed.Store(int64(150 * time.Millisecond))
	s, ts := newTest(t, m, Config{MaxBatch: 1, Timeout: timeout})
	reqs := make([]struct{ path, body string }, 8)
	for i := range reqs {
		reqs[i].path, reqs[i].body = "/v1/score", admitScore
	}
	if code := postCode(ts.URL+"/v1/score", admitScore); code != http.StatusOK {
		t.Fatalf("warm-up score: %d", code)
	}
	slow := codes(burst(t, ts.URL, reqs))
	if slow[http.StatusTooManyRequests] == 0 || slow[http.StatusGatewayTimeout] != 0 {
		t.Fatalf("8 scores of 150ms with a 600ms timeout: %v; want some 429 and no 504", slow)
	}
	slowCost, _ := s.sc.cost.get()
	m.speed.Store(int64(5 * time.Millisecond))
	for range 15 { // one at a time: nothing ahead, always admitted
		if code := postCode(ts.URL+"/v1/score", admitScore); code != http.StatusOK {
			t.Fatalf("score: %d", code)
		}
	}
	fastCost, _ := s.sc.cost.get()
	if fastCost > slowCost/4 {
		t.Errorf("estimate %v after 15 calls of 5ms (it was %v at 150ms)", fastCost, slowCost)
	}
	if fast := codes(burst(t, ts.URL, reqs)); fast[http.StatusOK] != len(reqs) {
		t.Errorf("the same burst against the fast model: %v; want every score admitted", fast)
	}
}

// TestCostEstimate: the moving average starts at the first observation
// and moves a quarter of the way to each new one.
func TestCostEstimate(t *testing.T) {
	var c costEstimate
	if _, ok := c.get(); ok {
		t.Fatal("an estimate before any observation")
	}
	c.observe(0, 1) // ignored
	c.observe(time.Second, 0)
	if _, ok := c.get(); ok {
		t.Fatal("an estimate from empty observations")
	}
	c.observe(800*time.Millisecond, 4)
	if d, ok := c.get(); !ok || d != 200*time.Millisecond {
		t.Fatalf("after 800ms for 4: %v %v", d, ok)
	}
	c.observe(600*time.Millisecond, 1)
	if d, _ := c.get(); d != 300*time.Millisecond {
		t.Fatalf("then 600ms for 1: %v, want 300ms", d)
	}
	e := deadlineRefusal(context.Background(), time.Second, time.Hour, time.Hour, "x")
	if e != nil {
		t.Fatal("a refusal without a deadline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if e := deadlineRefusal(ctx, time.Second, 0, time.Hour, "x"); e != nil {
		t.Error("a refusal with nothing ahead")
	}
	if e := deadlineRefusal(ctx, time.Second, 300*time.Millisecond, 300*time.Millisecond, "x"); e != nil {
		t.Error("a refusal of 600ms of work within a second")
	}
	e = deadlineRefusal(ctx, time.Second, 1500*time.Millisecond, 300*time.Millisecond, "x")
	if e == nil || e.retryAfterSeconds() != "2" {
		t.Errorf("1.8s of work within a second: %v", e)
	}
}
