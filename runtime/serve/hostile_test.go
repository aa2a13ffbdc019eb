package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/training/data"
)

// TestScoreTakesTurns: a one-window score sent while a 40-window score is
// being scored is answered after a few model calls, long before the large
// one ends (the requests take turns in the batches instead of queueing
// behind each other).
func TestScoreTakesTurns(t *testing.T) {
	m := &countModel{maxLen: 8, delay: 100 * time.Millisecond} // 2 s in all: far more than an HTTP round trip
	_, ts := newTest(t, m, Config{MaxBatch: 2, MaxWait: time.Millisecond})
	ids := make([]string, 7*40+1) // 40 windows of 8 overlapping by one
	for i := range ids {
		ids[i] = fmt.Sprint(i % fakeV)
	}
	var bigDone atomic.Bool
	big := make(chan int, 1)
	go func() {
		code := postCode(ts.URL+"/v1/score", `{"ids": [`+strings.Join(ids, ",")+`]}`)
		bigDone.Store(true)
		big <- code
	}()
	waitFor(t, "the large score to be under way", func() bool { return m.calls.Load() >= 2 })
	before := m.calls.Load()
	code, v := post(t, ts.URL+"/v1/score", `{"ids": [1, 2, 3]}`)
	calls := m.calls.Load() - before
	if code != http.StatusOK {
		t.Fatalf("small score: %d %v", code, v)
	}
	if bigDone.Load() || calls > 3 {
		t.Errorf("the small score waited %d model calls (the large one finished first: %v); want at most 3", calls, bigDone.Load())
	}
	if code := <-big; code != http.StatusOK {
		t.Errorf("large score: %d", code)
	}
}

// inferOutputs posts an inference and returns its status, its outputs by
// name and the error message.
func inferOutputs(t *testing.T, url, body string) (int, map[string]map[string]any, string) {
	t.Helper()
	code, v := post(t, url, body)
	outs := map[string]map[string]any{}
	if list, ok := v["outputs"].([]any); ok {
		for _, o := range list {
			om := o.(map[string]any)
			outs[om["name"].(string)] = om
		}
	}
	return code, outs, errorMessage(v)
}

func floatsOf(t *testing.T, o map[string]any) []float64 {
	t.Helper()
	var xs []float64
	for _, x := range o["data"].([]any) {
		xs = append(xs, x.(float64))
	}
	return xs
}

// TestKServeOutputs: the request's outputs are answered, in their order,
// with the selected values only.
func TestKServeOutputs(t *testing.T) {
	m := &countModel{maxLen: 8}
	_, ts := newTest(t, m, Config{Name: "tiny"})
	url := ts.URL + "/v2/models/tiny/infer"
	input := `{"name": "input_ids", "shape": [2, 3], "datatype": "INT64", "data": [[1, 2, 3], [4, 5, 14]]}`
	target := `{"name": "target_ids", "shape": [2, 3], "datatype": "INT32", "data": [2, 3, 9, 5, 0, 0]}`
	body := `{"inputs": [` + input + `, ` + target + `], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 3}}, {"name": "last_logits"}, {"name": "top_k_logits"}, {"name": "target_logprobs"}]}`
	code, v := post(t, url, body)
	if code != http.StatusOK {
		t.Fatalf("%d %v", code, v)
	}
	var names []string
	for _, o := range v["outputs"].([]any) {
		names = append(names, o.(map[string]any)["name"].(string))
	}
	if fmt.Sprint(names) != "[top_k_ids last_logits top_k_logits target_logprobs]" {
		t.Fatalf("outputs %v, want the request's order", names)
	}
	_, outs, _ := inferOutputs(t, url, body)
	rows := []int32{1, 2, 3, 4, 5, 14}
	// top_k: the count model's row after x peaks at x+1 (6), then x+2 (2),
	// then the lowest other id (0).
	var wantIDs, wantTop []string
	for _, x := range rows {
		third := int32(0)
		for third == (x+1)%fakeV || third == (x+2)%fakeV {
			third++
		}
		wantIDs = append(wantIDs, fmt.Sprint((x+1)%fakeV, " ", (x+2)%fakeV, " ", third))
		wantTop = append(wantTop, "6 2 0")
	}
	if o := outs["top_k_ids"]; o["datatype"] != "INT64" || fmt.Sprint(o["shape"]) != "[2 3 3]" || fmt.Sprint(o["data"]) != "["+strings.Join(wantIDs, " ")+"]" {
		t.Errorf("top_k_ids %v, want data %v", o, wantIDs)
	}
	if o := outs["top_k_logits"]; o["datatype"] != "FP32" || fmt.Sprint(o["shape"]) != "[2 3 3]" || fmt.Sprint(o["data"]) != "["+strings.Join(wantTop, " ")+"]" {
		t.Errorf("top_k_logits %v", o)
	}
	last := outs["last_logits"]
	if fmt.Sprint(last["shape"]) != "[2 16]" || fmt.Sprint(floatsOf(t, last)) != fmt.Sprint(append(toF64(m.row(3)), toF64(m.row(14))...)) {
		t.Errorf("last_logits %v", last)
	}
	lp := floatsOf(t, outs["target_logprobs"])
	targets := []int{2, 3, 9, 5, 0, 0}
	for i, x := range rows {
		row := m.row(x)
		var z float64
		for _, r := range row {
			z += math.Exp(float64(r))
		}
		if want := float64(row[targets[i]]) - math.Log(z); math.Abs(lp[i]-want) > 1e-6 {
			t.Errorf("target_logprobs[%d] = %v, want %v", i, lp[i], want)
		}
	}
	if fmt.Sprint(outs["target_logprobs"]["shape"]) != "[2 3]" {
		t.Errorf("target_logprobs shape %v", outs["target_logprobs"]["shape"])
	}
	// Without outputs: logits alone; top_k defaults to 10.
	if code, outs, msg := inferOutputs(t, url, `{"inputs": [`+input+`]}`); code != 200 || len(outs) != 1 || fmt.Sprint(outs["logits"]["shape"]) != "[2 3 16]" {
		t.Errorf("no outputs: %d %v %s", code, outs, msg)
	}
	if code, outs, msg := inferOutputs(t, url, `{"inputs": [`+input+`], "outputs": [{"name": "top_k_logits"}]}`); code != 200 || fmt.Sprint(outs["top_k_logits"]["shape"]) != "[2 3 10]" {
		t.Errorf("default top_k: %d %v %s", code, outs, msg)
	}
	for _, c := range []struct{ body, want string }{
		{`{"inputs": [` + input + `], "outputs": [{"name": "probs"}]}`, `unknown output "probs"`},
		{`{"inputs": [` + input + `], "outputs": [{"name": "logits"}, {"name": "logits"}]}`, "asked for twice"},
		{`{"inputs": [` + input + `], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 0}}]}`, "want an integer in 1..16"},
		{`{"inputs": [` + input + `], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 17}}]}`, "want an integer in 1..16"},
		{`{"inputs": [` + input + `], "outputs": [{"name": "last_logits", "parameters": {"top_k": 2}}]}`, "belongs to the outputs top_k_ids"},
		{`{"inputs": [` + input + `], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 2}}, {"name": "top_k_logits", "parameters": {"top_k": 3}}]}`, "different top_k"},
		{`{"inputs": [` + input + `], "outputs": [{"name": "target_logprobs"}]}`, "give both or neither"},
		{`{"inputs": [` + input + `, ` + target + `]}`, "give both or neither"},
		{`{"inputs": [` + input + `, {"name": "target_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}], "outputs": [{"name": "target_logprobs"}]}`, "want input_ids' shape [2 3]"},
		{`{"inputs": [` + input + `, ` + input + `]}`, "given twice"},
		{`{"inputs": [` + input + `, {"name": "mask", "shape": [1], "datatype": "INT64", "data": [1]}]}`, `unknown input "mask"`},
		{`{"inputs": [` + input + `], "outputs": [{"name": "logits", "parameters": {"binary_data": 1}}]}`, "binary_data 1: want true or false"},
		{`{"inputs": [` + input + `], "parameters": {"binary_data_output": "yes"}}`, "want true or false"},
		{`{"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "parameters": {"binary_data_size": 8}}]}`, "no header Inference-Header-Content-Length"},
	} {
		if code, _, msg := inferOutputs(t, url, c.body); code != 400 || !strings.Contains(msg, c.want) {
			t.Errorf("%.120s: %d %q, want 400 with %q", c.body, code, msg, c.want)
		}
	}
}

func toF64(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// TestKServeResponseLimits: an answer that could exceed MaxResponseBytes
// is refused with a 413 that says what to ask for instead, and answers in
// flight reserve their size from ResponseMemory (429 when it is taken).
func TestKServeResponseLimits(t *testing.T) {
	m := &countModel{maxLen: 8, delay: 150 * time.Millisecond}
	s, ts := newTest(t, m, Config{Name: "tiny", MaxResponseBytes: 3000, ResponseMemory: 4000, MaxBatch: 1})
	url := ts.URL + "/v2/models/tiny/infer"
	row := func(b int) string {
		return fmt.Sprintf(`{"inputs": [{"name": "input_ids", "shape": [%d, 8], "datatype": "INT64", "data": [%s]}]`, b, strings.TrimSuffix(strings.Repeat("1,", 8*b), ","))
	}
	// [2,8,16] logits: 256 values, up to 15 bytes each.
	code, _, msg := inferOutputs(t, url, row(2)+`}`)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "logits [2 8 16]: 256 values") || !strings.Contains(msg, "limit of 3000 bytes") || !strings.Contains(msg, "last_logits") {
		t.Fatalf("large answer: %d %q", code, msg)
	}
	if m.calls.Load() != 0 {
		t.Fatal("the model ran for a refused answer")
	}
	if code, outs, msg := inferOutputs(t, url, row(2)+`, "outputs": [{"name": "last_logits"}]}`); code != 200 || fmt.Sprint(outs["last_logits"]["shape"]) != "[2 16]" {
		t.Fatalf("last_logits of the same input: %d %s", code, msg)
	}
	// One [1,8] answer (2,560 bytes counted) holds the memory: a second
	// at the same time gets 429, a third after it 200.
	first := make(chan int, 1)
	go func() { first <- postCode(url, row(1)+`}`) }()
	waitFor(t, "the first answer to reserve its memory", func() bool {
		s.respMu.Lock()
		defer s.respMu.Unlock()
		return s.respMem > 0
	})
	if code, _, msg := inferOutputs(t, url, row(1)+`}`); code != http.StatusTooManyRequests || !strings.Contains(msg, "memory for answers") {
		t.Errorf("second answer while the first holds the memory: %d %q", code, msg)
	}
	if code := <-first; code != 200 {
		t.Errorf("first: %d", code)
	}
	if code := postCode(url, row(1)+`}`); code != 200 {
		t.Errorf("third: %d", code)
	}
	s.respMu.Lock()
	defer s.respMu.Unlock()
	if s.respMem != 0 {
		t.Errorf("%d bytes of response memory still reserved", s.respMem)
	}
}

// modTokenizer is the GPT-2 tokenizer with its ids folded into the stand-in
// model's vocabulary: the real BPE sees every fuzzed text.
type modTokenizer struct{ *data.Tokenizer }

func (m modTokenizer) Encode(s string) []int32 {
	ids, _ := m.EncodeContext(context.Background(), s, 0)
	return ids
}

func (m modTokenizer) EncodeContext(ctx context.Context, s string, max int) ([]int32, error) {
	ids, err := m.Tokenizer.EncodeContext(ctx, s, max)
	for i := range ids {
		ids[i] %= fakeV
	}
	return ids, err
}

// TestRealTokenizerPrompts: with the GPT-2 tokenizer, a prompt whose one
// DEL once made tokenization quadratic (300 KB: minutes) is answered at
// once, and a text too long to score is refused before all of it is
// tokenized.
func TestRealTokenizerPrompts(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{Tokenizer: modTokenizer{data.NewTokenizer()}, Timeout: 20 * time.Second})
	long := "\x7f" + strings.Repeat("a", 300<<10)
	t0 := time.Now()
	code, v := post(t, ts.URL+"/v1/completions", `{"prompt": "`+strings.ReplaceAll(long, "\x7f", `\u007f`)+`", "max_tokens": 1}`)
	if code != 400 || !strings.Contains(errorMessage(v), "more than 64 tokens") {
		t.Errorf("long prompt: %d %v", code, v)
	}
	code, v = post(t, ts.URL+"/v1/score", `{"text": "`+strings.Repeat("The history of the city. ", 40<<10)+`"}`)
	if code != 413 || !strings.Contains(errorMessage(v), "more than 4033 tokens") {
		t.Errorf("long score: %d %v", code, v)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("two long texts took %v", d)
	}
	if code, v := post(t, ts.URL+"/v1/completions", `{"prompt": "Hello world", "max_tokens": 2, "temperature": 0}`); code != 200 {
		t.Errorf("short prompt: %d %v", code, v)
	}
}

// TestTokenizerOutsideVocabulary: a tokenizer whose ids do not fit the
// model's vocabulary gets an error answer, not a crash of the server.
func TestTokenizerOutsideVocabulary(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{Tokenizer: data.NewTokenizer()})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt": "Hello world", "max_tokens": 2}`},
		{"/v1/score", `{"text": "Hello world"}`},
	} {
		if code, v := post(t, ts.URL+c.path, c.body); code != 500 || !strings.Contains(errorMessage(v), "outside the model's vocabulary [0,16)") {
			t.Errorf("%s: %d %v", c.path, code, v)
		}
	}
}

// blockingEncoder never finishes encoding before its context ends.
type blockingEncoder struct {
	letters
	started chan struct{}
}

func (e blockingEncoder) EncodeContext(ctx context.Context, text string, max int) ([]int32, error) {
	e.started <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestTokenizeUnderDeadline: tokenization ends with the request's timeout
// (504) and with Close (503).
func TestTokenizeUnderDeadline(t *testing.T) {
	enc := blockingEncoder{started: make(chan struct{}, 4)}
	_, ts := newTest(t, &countModel{}, Config{Tokenizer: enc, Timeout: 100 * time.Millisecond})
	t0 := time.Now()
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt": "abc"}`},
		{"/v1/score", `{"text": "abc"}`},
	} {
		if code, v := post(t, ts.URL+c.path, c.body); code != http.StatusGatewayTimeout {
			t.Errorf("%s: %d %v, want 504", c.path, code, v)
		}
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("took %v", d)
	}
	s2, ts2 := newTest(t, &countModel{}, Config{Tokenizer: enc, Timeout: time.Minute})
	code := make(chan int, 1)
	go func() { code <- postCode(ts2.URL+"/v1/completions", `{"prompt": "abc"}`) }()
	<-enc.started
	s2.Close()
	select {
	case c := <-code:
		if c != http.StatusServiceUnavailable {
			t.Errorf("tokenizing when the server closed: %d, want 503", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a tokenization in flight")
	}
}

// serveTest runs s.Serve on a loopback port until the test ends.
func serveTest(t *testing.T, m *countModel, cfg Config) (*Server, string) {
	t.Helper()
	if m.maxLen == 0 {
		m.maxLen = 64
	}
	if cfg.Tokenizer == nil {
		cfg.Tokenizer = letters{}
	}
	s, err := New(m, cfg)
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
	t.Cleanup(func() {
		stop()
		<-served
	})
	return s, ln.Addr().String()
}

// TestConnectionTimeouts: a body that never arrives gets 408 after the read
// timeout, an idle connection is closed after the idle timeout, and
// requests that compute or stream for longer than the read and write
// timeouts still get their whole answer.
func TestConnectionTimeouts(t *testing.T) {
	m := &countModel{delay: 100 * time.Millisecond}
	_, addr := serveTest(t, m, Config{ReadTimeout: 300 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
		IdleTimeout: 300 * time.Millisecond, ReadHeaderTimeout: 300 * time.Millisecond})
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		return c, bufio.NewReader(c)
	}
	// A slow body.
	c, br := dial()
	fmt.Fprint(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	t0 := time.Now()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("slow body: no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "read timeout") || time.Since(t0) > 3*time.Second {
		t.Errorf("slow body: %d %s after %v", resp.StatusCode, b, time.Since(t0))
	}
	// An idle keep-alive connection.
	c, br = dial()
	fmt.Fprint(c, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("live: %v", err)
	} else {
		io.Copy(io.Discard, resp.Body)
	}
	t0 = time.Now()
	if _, err := br.ReadByte(); err != io.EOF || time.Since(t0) > 3*time.Second {
		t.Errorf("idle connection: read %v after %v, want EOF after the idle timeout", err, time.Since(t0))
	}
	// Six steps of 100 ms: longer than every timeout.
	code, v := post(t, "http://"+addr+"/v1/completions", `{"prompt": "a", "max_tokens": 6, "temperature": 0}`)
	if code != 200 || choiceOf(t, v)["text"] != "bcdefg" {
		t.Errorf("long completion: %d %v", code, v)
	}
	resp, err = http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "a", "max_tokens": 6, "temperature": 0, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	evs, done := readEvents(t, resp.Body)
	resp.Body.Close()
	if !done || len(evs) != 6 {
		t.Errorf("long stream: %d events, [DONE] %v", len(evs), done)
	}
}

// TestMaxConns: with MaxConns 2 and two connections open (for less than
// the second they may go without headers), a third waits until one of them
// closes.
func TestMaxConns(t *testing.T) {
	_, addr := serveTest(t, &countModel{}, Config{MaxConns: 2})
	open := dialN(t, addr, 2)
	time.Sleep(50 * time.Millisecond) // let the server accept both
	client := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := client.Get("http://" + addr + "/v2/health/live"); err == nil {
		resp.Body.Close()
		t.Fatalf("a third connection was served while two were open: %d", resp.StatusCode)
	}
	open[0].Close()
	client.Timeout = 5 * time.Second
	resp, err := client.Get("http://" + addr + "/v2/health/live")
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	resp.Body.Close()
}

// TestMaxConnsClosesIdle: with MaxConns 3 held by idle keep-alive
// connections, a new client is served at once: the longest idle one is
// closed for it (not after the idle timeout).
func TestMaxConnsClosesIdle(t *testing.T) {
	_, addr := serveTest(t, &countModel{}, Config{MaxConns: 3, IdleTimeout: time.Minute})
	for _, c := range dialN(t, addr, 3) {
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close() // the connection stays open, idle
	}
	checkServedWithin(t, addr, 3*time.Second)
}

// TestMaxConnsClosesHeaderless: with MaxConns 3 held by connections that
// never finish their headers, a new client is served about a second later
// (not after the read header timeout).
func TestMaxConnsClosesHeaderless(t *testing.T) {
	_, addr := serveTest(t, &countModel{}, Config{MaxConns: 3, ReadHeaderTimeout: time.Minute})
	for _, c := range dialN(t, addr, 3) {
		fmt.Fprintf(c, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
	}
	checkServedWithin(t, addr, 5*time.Second)
}

// TestMaxConnsPerClient: a remote IP holding MaxConnsPerClient connections
// has one more closed at once; once one of its connections closes, it is
// served again.
func TestMaxConnsPerClient(t *testing.T) {
	_, addr := serveTest(t, &countModel{}, Config{MaxConnsPerClient: 2})
	open := dialN(t, addr, 2)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection from one IP: read %d bytes, %v; want it closed at once", n, err)
	}
	open[0].Close()
	// The server sees the close when it next reads the connection: until
	// then the IP still holds its two places.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for t0 := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		resp, err := client.Get("http://" + addr + "/v2/health/live")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Since(t0) > 5*time.Second {
			t.Fatalf("after one of its connections closed, the IP is still refused: %v", err)
		}
	}
}

// dialN opens n connections to addr, closed when t ends.
func dialN(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var open []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		open = append(open, c)
	}
	return open
}

// checkServedWithin fails t unless a new connection to addr gets an answer
// within d.
func checkServedWithin(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: d, Transport: &http.Transport{DisableKeepAlives: true}}
	t0 := time.Now()
	resp, err := client.Get("http://" + addr + "/v2/health/live")
	if err != nil {
		t.Fatalf("a new client, after %v: %v", time.Since(t0), err)
	}
	resp.Body.Close()
}

// TestStreamFailureMetrics: a stream cut by the timeout after its 200
// header is counted as 504, not 200; a large chunked body gets a 413 that
// names the limit.
func TestStreamFailureMetrics(t *testing.T) {
	_, ts := newTest(t, &countModel{delay: 40 * time.Millisecond}, Config{Timeout: 150 * time.Millisecond, MaxBodyBytes: 200})
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "a", "max_tokens": 30, "temperature": 0, "stream": true}`)) // EOS only after 14 steps
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"code":"timeout","status":504`) {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"prompt": "` + strings.Repeat("a", 400) + `"}`))
		pw.Close()
	}()
	code, v := func() (int, map[string]any) {
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", pr) // chunked: no length
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, decodeBody(t, resp)
	}()
	if code != 413 || !strings.Contains(errorMessage(v), "larger than 200 bytes, the most this server accepts (rpac serve --max-body)") {
		t.Errorf("chunked large body: %d %v", code, v)
	}
	resp, err = http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(mb), `rpac_http_requests_total{code="504",route="/v1/completions"} 1`) || strings.Contains(string(mb), `code="200",route="/v1/completions"`) {
		t.Errorf("metrics after a timed-out stream:\n%s", grepLines(string(mb), "rpac_http_requests_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// deadlineRecorder is a ResponseWriter that records the write deadlines
// set on it and what was written after each.
type deadlineRecorder struct {
	h      http.Header
	code   int
	events []string // "deadline D" and "write", in order
}

func (d *deadlineRecorder) Header() http.Header { return d.h }
func (d *deadlineRecorder) WriteHeader(code int) {
	if d.code == 0 {
		d.code = code
	}
}
func (d *deadlineRecorder) Write(b []byte) (int, error) {
	d.WriteHeader(200)
	d.events = append(d.events, "write")
	return len(b), nil
}
func (d *deadlineRecorder) Flush() {}
func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.events = append(d.events, fmt.Sprintf("deadline %v", time.Until(t).Round(time.Second)))
	return nil
}
func (d *deadlineRecorder) SetReadDeadline(time.Time) error { return nil }

// TestWriteDeadlines: an answer's write deadline is set when it is ready
// (WriteTimeout ahead), and each event of a stream gets its own
// (StreamIdleTimeout ahead) before it is written.
func TestWriteDeadlines(t *testing.T) {
	s, _ := newTest(t, &countModel{}, Config{WriteTimeout: 7 * time.Second, StreamIdleTimeout: 3 * time.Second})
	do := func(body string) *deadlineRecorder {
		rec := &deadlineRecorder{h: http.Header{}}
		s.Handler().ServeHTTP(rec, httptestRequest("/v1/completions", body))
		return rec
	}
	if got := strings.Join(do(`{"prompt": "a", "max_tokens": 2}`).events, ", "); got != "deadline 7s, write" {
		t.Errorf("completion: %s", got)
	}
	got := strings.Join(do(`{"prompt": "a", "max_tokens": 3, "temperature": 0, "stream": true}`).events, ", ")
	if want := "deadline 7s, deadline 3s, write, deadline 3s, write, deadline 3s, write, write"; got != want { // 3 events, then [DONE]
		t.Errorf("stream: %s\nwant %s", got, want)
	}
}

func httptestRequest(path, body string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, path, strings.NewReader(body))
	return r
}

// TestScoreDeadlineInFlight: a score or inference whose timeout passes
// while its sequences wait behind a long model call, or are in it, is
// answered 504 at its timeout, not when the call ends.
func TestScoreDeadlineInFlight(t *testing.T) {
	m := &countModel{maxLen: 8, delay: 3 * time.Second}
	_, ts := newTest(t, m, Config{Name: "tiny", MaxBatch: 1, Timeout: 300 * time.Millisecond})
	bodies := []struct{ path, body string }{
		{"/v1/score", `{"ids": [1, 2, 3]}`}, // in the model call
		{"/v1/score", `{"ids": [4, 5, 6]}`}, // queued behind it
		{"/v2/models/tiny/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}], "outputs": [{"name": "last_logits"}]}`},
	}
	type result struct {
		code int
		d    time.Duration
	}
	results := make(chan result, len(bodies))
	t0 := time.Now()
	for i, b := range bodies {
		if i == 1 {
			waitFor(t, "the first score's model call", func() bool { return m.calls.Load() >= 1 })
		}
		go func() {
			code := postCode(ts.URL+b.path, b.body)
			results <- result{code, time.Since(t0)}
		}()
	}
	for range bodies {
		r := <-results
		if r.code != http.StatusGatewayTimeout || r.d > 2*time.Second {
			t.Errorf("answered %d after %v; want 504 at the 300ms timeout, long before the 3s model call ends", r.code, r.d)
		}
	}
}
