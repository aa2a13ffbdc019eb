package serve

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCompletions(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{})
	url := ts.URL + "/v1/completions"
	for _, c := range []struct {
		body, text, finish string
		ids                string
	}{
		{`{"prompt": "k", "max_tokens": 3, "temperature": 0}`, "lmn", "length", "[11 12 13]"},
		{`{"prompt": "k", "max_tokens": 10, "temperature": 0}`, "lmno", "stop", "[11 12 13 14]"}, // EOS
		{`{"prompt": "a", "max_tokens": 10, "temperature": 0, "stop": "de"}`, "bc", "stop", "[1 2 3 4]"},
		{`{"prompt": "a", "max_tokens": 10, "temperature": 0, "stop": ["x", "cd"]}`, "b", "stop", "[1 2 3]"},
		{`{"prompt": [3, 4], "max_tokens": 2, "temperature": 0}`, "fg", "length", "[5 6]"},
		{`{"prompt": "", "max_tokens": 2, "temperature": 0}`, "ab", "length", "[0 1]"}, // starts from EOS
		{`{"prompt": "k", "max_tokens": 0}`, "", "length", "[]"},
		{`{"prompt": [` + strings.Repeat("1,", 58) + `0], "temperature": 0}`, "bcdef", "length", "[1 2 3 4 5]"}, // the default max_tokens fits the context of 64
	} {
		code, v := post(t, url, c.body)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %v", c.body, code, v)
		}
		ch := choiceOf(t, v)
		if ch["text"] != c.text || ch["finish_reason"] != c.finish || fmt.Sprint(ch["token_ids"]) != c.ids {
			t.Errorf("%s: text %q finish %v ids %v; want %q %s %s", c.body, ch["text"], ch["finish_reason"], ch["token_ids"], c.text, c.finish, c.ids)
		}
		if v["object"] != "text_completion" || v["model"] != "rpac" {
			t.Errorf("%s: object %v model %v", c.body, v["object"], v["model"])
		}
	}
	// Seeded sampling repeats; usage counts tokens.
	body := `{"prompt": "abc", "max_tokens": 8, "temperature": 1.5, "top_k": 3, "top_p": 0.95, "seed": 42}`
	_, a := post(t, url, body)
	_, b := post(t, url, body)
	if fmt.Sprint(choiceOf(t, a)["token_ids"]) != fmt.Sprint(choiceOf(t, b)["token_ids"]) {
		t.Errorf("seed 42 drew %v then %v", choiceOf(t, a)["token_ids"], choiceOf(t, b)["token_ids"])
	}
	u := a["usage"].(map[string]any)
	if n := len(choiceOf(t, a)["token_ids"].([]any)); u["prompt_tokens"] != 3.0 || u["completion_tokens"] != float64(n) || u["total_tokens"] != float64(3+n) {
		t.Errorf("usage %v for %d tokens", u, n)
	}
}

func TestCompletionStream(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{})
	for _, c := range []struct {
		body, text, finish string
		events             int
	}{
		{`{"prompt": "a", "max_tokens": 5, "temperature": 0, "stream": true}`, "bcdef", "length", 5},
		{`{"prompt": "k", "max_tokens": 9, "temperature": 0, "stream": true}`, "lmno", "stop", 5},
		{`{"prompt": "a", "max_tokens": 9, "temperature": 0, "stream": true, "stop": "def"}`, "bc", "stop", 5},
	} {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("Content-Type %q", ct)
		}
		evs, done := readEvents(t, resp.Body)
		resp.Body.Close()
		if !done || len(evs) != c.events {
			t.Fatalf("%s: %d events, [DONE] %v; want %d events", c.body, len(evs), done, c.events)
		}
		var text strings.Builder
		for i, ev := range evs {
			ch := choiceOf(t, ev)
			text.WriteString(ch["text"].(string))
			last := i == len(evs)-1
			if (ch["finish_reason"] != nil) != last {
				t.Errorf("%s: event %d finish_reason %v", c.body, i, ch["finish_reason"])
			}
			if last && ch["finish_reason"] != c.finish {
				t.Errorf("%s: finish %v, want %s", c.body, ch["finish_reason"], c.finish)
			}
			if !strings.HasPrefix(c.text+strings.Repeat("?", 9), text.String()) {
				t.Errorf("%s: streamed %q, beyond the text %q", c.body, text.String(), c.text)
			}
		}
		if text.String() != c.text {
			t.Errorf("%s: streamed text %q, want %q", c.body, text.String(), c.text)
		}
	}
}

// TestStreamClientCancel: a client that leaves mid-stream stops its
// generation and frees its slot.
func TestStreamClientCancel(t *testing.T) {
	m := &countModel{maxLen: 512, delay: 5 * time.Millisecond}
	s, ts := newTest(t, m, Config{MaxTokens: 400})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions",
		strings.NewReader(`{"prompt": [1], "max_tokens": 400, "temperature": 1, "stream": true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(resp.Body, buf, 10); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the slot to be released", func() bool { return s.dec.open.Load() == 0 })
	calls := m.calls.Load()
	time.Sleep(30 * time.Millisecond)
	if m.calls.Load() != calls || calls >= 400 {
		t.Fatalf("generation went on after the client left: %d model calls, then %d", calls, m.calls.Load())
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestBatching: concurrent completions share model calls and get the
// tokens they get alone.
func TestBatching(t *testing.T) {
	m := &countModel{delay: 2 * time.Millisecond}
	s, ts := newTest(t, m, Config{MaxBatch: 8, MaxWait: 20 * time.Millisecond})
	const clients, tokens = 8, 12
	alone := make([]string, clients)
	for i := range alone {
		_, v := post(t, ts.URL+"/v1/completions", fmt.Sprintf(`{"prompt": [%d], "max_tokens": %d, "temperature": 0.7, "seed": %d}`, i, tokens, i))
		alone[i] = fmt.Sprint(choiceOf(t, v)["token_ids"])
	}
	before := m.calls.Load()
	var wg sync.WaitGroup
	got := make([]string, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"prompt": [%d], "max_tokens": %d, "temperature": 0.7, "seed": %d}`, i, tokens, i)))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			v := decodeBody(t, resp)
			got[i] = fmt.Sprint(choiceOf(t, v)["token_ids"])
		}()
	}
	wg.Wait()
	for i := range got {
		if got[i] != alone[i] {
			t.Errorf("client %d: batched %s, alone %s", i, got[i], alone[i])
		}
	}
	steps := 0
	for _, g := range alone {
		steps += len(strings.Fields(g))
	}
	if calls := m.calls.Load() - before; calls > int64(steps)/3 {
		t.Errorf("%d concurrent completions of %d steps took %d model calls; batching should need far fewer", clients, steps, calls)
	}
	// A slot is freed just after its sequence's last token is sent.
	waitFor(t, "every slot to be released", func() bool { return s.dec.open.Load() == 0 })
}

func TestLimits(t *testing.T) {
	slow := &countModel{delay: 40 * time.Millisecond}
	_, ts := newTest(t, slow, Config{MaxBodyBytes: 200, MaxTokens: 20, Timeout: 150 * time.Millisecond})
	url := ts.URL + "/v1/completions"
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"prompt": "` + strings.Repeat("a", 300) + `"}`, 413, "the request body is 314 bytes, more than the 200 bytes this server accepts (rpac serve --max-body)"},
		{`{"prompt": "a", "max_tokens": 21}`, 400, "max_tokens 21: want 0..20"},
		{`{"prompt": "a", "max_tokens": -1}`, 400, "max_tokens -1"},
		{`{"prompt": [` + strings.Repeat("1,", 50) + `1], "max_tokens": 20}`, 400, "more than the model's context of 64"},
		{`{"prompt": "a", "temperature": -1}`, 400, "temperature -1"},
		{`{"prompt": "a", "top_p": 0}`, 400, "top_p 0"},
		{`{"prompt": "a", "top_k": -2}`, 400, "top_k -2"},
		{`{"prompt": "a", "n": 2}`, 400, "one choice"},
		{`{"prompt": [99]}`, 400, "outside the vocabulary"},
		{`{"prompt": {"x": 1}}`, 400, "prompt: want a string"},
		{`{"prompt": "a", "stop": ["", "x"]}`, 400, "empty strings"},
		{`{"prompt": "a", "stop": 5}`, 400, "stop: want"},
		{`{"prompt": "a", "model": "other"}`, 404, `no model "other"`},
		{`{"prompt": `, 400, "not valid JSON"},
		{``, 400, "empty"},
		{`{"prompt": "a"} {}`, 400, "more than one JSON value"},
		{`{"prompt": "a", "max_tokens": 20, "temperature": 0}`, 504, "longer than the server's limit"},
	} {
		code, v := post(t, url, c.body)
		if code != c.code || !strings.Contains(errorMessage(v), c.want) {
			t.Errorf("%.40s: %d %q, want %d with %q", c.body, code, errorMessage(v), c.code, c.want)
		}
	}
	for _, c := range []struct {
		method, path string
		code         int
		allow        string // the Allow header of a 405: every method the path takes
	}{
		{http.MethodGet, "/v1/completions", 405, "POST"},
		{http.MethodDelete, "/v1/score", 405, "POST"},
		{http.MethodPost, "/v2/health/live", 405, "GET, HEAD"},
		{http.MethodPut, "/v2/models/rpac", 405, "GET, HEAD"},
		{http.MethodGet, "/v2/models/rpac/infer", 405, "POST"},
		{http.MethodPost, "/metrics", 405, "GET, HEAD"},
		{http.MethodGet, "/v1/nothing", 404, ""},
		{http.MethodPost, "/v2/models/rpac/infer/more", 404, ""},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		v := decodeBody(t, resp)
		resp.Body.Close()
		if resp.StatusCode != c.code || errorMessage(v) == "" {
			t.Errorf("%s %s: %d %v, want %d with a JSON error", c.method, c.path, resp.StatusCode, v, c.code)
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q, want application/json", c.method, c.path, ct)
		}
	}
}

// TestRouteMethods: a route registered for several methods on one path
// answers each, and any other method with 405 and an Allow header naming
// them all (the standard mux's behaviour, which the server keeps).
func TestRouteMethods(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{})
	req, _ := http.NewRequest(http.MethodHead, ts.URL+"/v2/health/live", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD /v2/health/live: %d, want 200 (GET routes take HEAD)", resp.StatusCode)
	}
	s, ts2 := newTest(t, &countModel{}, Config{})
	ok := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }
	s.mux.HandleFunc("PUT /x", ok)
	s.mux.HandleFunc("DELETE /x", ok)
	for _, m := range []string{http.MethodPut, http.MethodDelete} {
		if code := do(t, m, ts2.URL+"/x"); code != http.StatusNoContent {
			t.Errorf("%s /x: %d, want 204", m, code)
		}
	}
	req, _ = http.NewRequest(http.MethodPost, ts2.URL+"/x", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "DELETE, PUT" {
		t.Errorf("POST /x: %d Allow %q, want 405 with Allow \"DELETE, PUT\"", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func do(t *testing.T, method, url string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestQueueFull: with one slot and a queue of one, a third concurrent
// completion gets 429 while the first two are served.
func TestQueueFull(t *testing.T) {
	m := &countModel{gate: make(chan struct{})} // the first request holds the slot until the gate opens
	s, ts := newTest(t, m, Config{MaxBatch: 1, Queue: 1})
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			codes <- postCode(ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 5}`)
		}()
	}
	waitFor(t, "one request holding the slot and one queued", func() bool { return s.dec.open.Load() == 1 && s.dec.waiting.Load() == 1 })
	code, v := post(t, ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 5}`)
	if code != http.StatusTooManyRequests || !strings.Contains(errorMessage(v), "queue is full") {
		t.Fatalf("third request: %d %v, want 429", code, v)
	}
	close(m.gate)
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("queued request: %d", c)
		}
	}
	// The score queue: more windows than it holds at once.
	s2, ts2 := newTest(t, &countModel{maxLen: 4, delay: 50 * time.Millisecond}, Config{Queue: 2})
	go postCode(ts2.URL+"/v1/score", `{"ids": [1, 2, 3]}`) // occupies the scorer
	waitFor(t, "the scorer to be busy", func() bool { return s2.metrics != nil && s2.sc.pending() == 0 })
	time.Sleep(5 * time.Millisecond)
	var wg sync.WaitGroup
	var n429 sync.Map
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n429.Store(i, postCode(ts2.URL+"/v1/score", `{"ids": [1, 2, 3]}`))
		}()
	}
	wg.Wait()
	got := map[int]int{}
	n429.Range(func(_, v any) bool { got[v.(int)]++; return true })
	if got[http.StatusTooManyRequests] == 0 || got[http.StatusOK] == 0 || got[http.StatusOK]+got[http.StatusTooManyRequests] != 4 {
		t.Errorf("score requests against a queue of 2: %v, want some 200 and some 429", got)
	}
}

func TestScore(t *testing.T) {
	m := &countModel{maxLen: 8}
	_, ts := newTest(t, m, Config{})
	// Every prediction of the count model is log softmax of its row.
	lp := func(prev, next int32) float64 {
		row := m.row(prev)
		var s float64
		for _, x := range row {
			s += math.Exp(float64(x))
		}
		return float64(row[next]) - math.Log(s)
	}
	ids := []int32{1, 2, 3, 9, 0, 5, 6, 7, 8, 2, 3, 4, 11, 12, 1, 14, 15, 0, 2, 2} // 20 tokens: three windows of 8
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprint(id))
	}
	for _, body := range []string{`{"ids": [` + strings.Join(parts, ",") + `]}`, `{"text": "` + letters{}.Decode(ids) + `"}`} {
		code, v := post(t, ts.URL+"/v1/score", body)
		if code != http.StatusOK {
			t.Fatalf("%d %v", code, v)
		}
		got := v["token_logprobs"].([]any)
		if len(got) != len(ids)-1 || v["tokens"] != float64(len(ids)-1) {
			t.Fatalf("%d log-probabilities, tokens %v; want %d", len(got), v["tokens"], len(ids)-1)
		}
		var nll float64
		for i, g := range got {
			want := lp(ids[i], ids[i+1])
			nll -= want
			if math.Abs(g.(float64)-want) > 1e-6 {
				t.Errorf("token %d: log-probability %v, want %v", i+1, g, want)
			}
		}
		// The server scores with runtime.NLL (float32 exponentials): within
		// 1e-6 relative of the float64 log-softmax.
		if ce := v["ce"].(float64); math.Abs(ce-nll/float64(len(got))) > 1e-6*ce || math.Abs(v["perplexity"].(float64)-math.Exp(ce)) > 1e-9 {
			t.Errorf("ce %v perplexity %v, want %v", ce, v["perplexity"], nll/float64(len(got)))
		}
	}
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"ids": [1]}`, 400, "at least two"},
		{`{"ids": [1, 16]}`, 400, "outside the vocabulary"},
		{`{"ids": [1, 2], "text": "ab"}`, 400, "not both"},
		{`{}`, 400, "give text"},
		{`{"ids": "ab"}`, 400, "ids: want a JSON array"},
	} {
		code, v := post(t, ts.URL+"/v1/score", c.body)
		if code != c.code || !strings.Contains(errorMessage(v), c.want) {
			t.Errorf("%s: %d %q, want %d with %q", c.body, code, errorMessage(v), c.code, c.want)
		}
	}
}

func TestKServe(t *testing.T) {
	m := &countModel{maxLen: 8}
	s, ts := newTest(t, m, Config{Name: "tiny", MaxInferValues: 1000})
	for _, path := range []string{"/v2/health/live", "/v2/health/ready", "/v2/models/tiny/ready"} {
		if code, v := get(t, ts.URL+path); code != http.StatusOK {
			t.Errorf("%s: %d %v", path, code, v)
		}
	}
	code, meta := get(t, ts.URL+"/v2/models/tiny")
	if code != http.StatusOK || meta["name"] != "tiny" || !strings.HasPrefix(fmt.Sprint(meta["outputs"]), "[map[datatype:FP32 name:logits shape:[-1 -1 16]] map[datatype:FP32 name:last_logits shape:[-1 16]]") {
		t.Errorf("metadata: %d %v", code, meta)
	}
	for _, data := range []string{`[1, 2, 3, 4, 5, 6]`, `[[1, 2, 3], [4, 5, 6]]`} {
		code, v := post(t, ts.URL+"/v2/models/tiny/infer", `{"id": "r1", "inputs": [{"name": "input_ids", "shape": [2, 3], "datatype": "INT64", "data": `+data+`}]}`)
		if code != http.StatusOK {
			t.Fatalf("infer: %d %v", code, v)
		}
		out := v["outputs"].([]any)[0].(map[string]any)
		if v["id"] != "r1" || out["name"] != "logits" || out["datatype"] != "FP32" || fmt.Sprint(out["shape"]) != "[2 3 16]" {
			t.Fatalf("infer answer %v", v)
		}
		vals := out["data"].([]any)
		for p, id := range []int32{1, 2, 3, 4, 5, 6} {
			for k, x := range m.row(id) {
				if vals[p*fakeV+k].(float64) != float64(x) {
					t.Fatalf("logits[%d,%d] = %v, want %v", p, k, vals[p*fakeV+k], x)
				}
			}
		}
	}
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v2/models/other/infer", `{}`, 404, `no model "other"`},
		{"/v2/models/tiny/infer", `{"inputs": []}`, 400, "want the input input_ids"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}`, 400, "datatype"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}`, 400, "shape"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2]}]}`, 400, "holds 2 values"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2, 3]}]}`, 400, "more values"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 16]}]}`, 400, "outside the vocabulary"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 1.5]}]}`, 400, "not an integer"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 9], "datatype": "INT64", "data": [1]}]}`, 400, "longest exported length is 8"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [8, 8], "datatype": "INT64", "data": [1]}]}`, 413, "makes the model compute 1024 logits, more than the server's limit of 1000"},
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}], "outputs": [{"name": "probs"}]}`, 400, "unknown output"},
	} {
		code, v := post(t, ts.URL+c.path, c.body)
		if code != c.code || !strings.Contains(errorMessage(v), c.want) {
			t.Errorf("%s %.60s: %d %q, want %d with %q", c.path, c.body, code, errorMessage(v), c.code, c.want)
		}
		if _, isString := v["error"].(string); !isString {
			t.Errorf("%s: KServe errors are {\"error\": string}, got %v", c.path, v)
		}
	}
	if code, _ := get(t, ts.URL+"/v2/models/other"); code != http.StatusNotFound {
		t.Errorf("metadata of an unknown model: %d", code)
	}
	close(s.draining)
	if code, _ := get(t, ts.URL+"/v2/health/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("ready while draining: %d, want 503", code)
	}
}

func TestMetrics(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{})
	post(t, ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 3, "temperature": 0}`)
	post(t, ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 300}`)
	post(t, ts.URL+"/v1/score", `{"ids": [1, 2, 3]}`)
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	for _, want := range []string{
		`rpac_http_requests_total{code="200",route="/v1/completions"} 1`,
		`rpac_http_requests_total{code="400",route="/v1/completions"} 1`,
		`rpac_http_requests_total{code="200",route="/v1/score"} 1`,
		`rpac_http_request_duration_seconds_count{route="/v1/completions"} 2`,
		`rpac_generated_tokens_total 3`,
		`rpac_batch_size_count{kind="decode"} 3`,
		`rpac_batch_size_count{kind="score"} 1`,
		`rpac_queue_depth 0`,
		`rpac_active_sequences 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("/metrics Content-Type %q", ct)
	}
}

// TestGracefulShutdown: once Serve's context ends, a stream in flight
// runs to [DONE], new connections are refused and Serve returns nil.
func TestGracefulShutdown(t *testing.T) {
	m := &countModel{delay: 10 * time.Millisecond}
	m.maxLen = 64
	s, err := New(m, Config{Tokenizer: letters{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": [1], "max_tokens": 12, "temperature": 1, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 8)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	stop()
	rest, _ := io.ReadAll(resp.Body)
	evs, done := readEvents(t, strings.NewReader(string(buf)+string(rest)))
	if !done || len(evs) == 0 || choiceOf(t, evs[len(evs)-1])["finish_reason"] == nil {
		t.Fatalf("the stream in flight did not finish: %d events, [DONE] %v", len(evs), done)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, err := c.Get(url + "/v2/health/live"); err == nil {
		t.Fatal("a new connection was accepted after shutdown")
	}
}

// TestAfterClose: once the batchers are closed, completions and scores get
// 503 at once.
func TestAfterClose(t *testing.T) {
	s, ts := newTest(t, &countModel{}, Config{Timeout: 10 * time.Second})
	s.Close()
	t0 := time.Now()
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt": "a", "max_tokens": 3}`},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 3, "stream": true}`},
		{"/v1/score", `{"ids": [1, 2]}`},
	} {
		if code := postCode(ts.URL+c.path, c.body); code != http.StatusServiceUnavailable {
			t.Errorf("%s %s after Close: %d, want 503", c.path, c.body, code)
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("requests after Close took %v", d)
	}
}
