package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/runtime"
)

// countModel is a Go stand-in for an exported model: vocabulary 16, EOS
// 15, and the logits after token x peak (by 6 nats) at x+1 mod 16, so
// greedy decoding counts up to EOS. Every call can be slowed down.
type countModel struct {
	maxLen int
	delay  time.Duration
	speed  atomic.Int64 // when set, the delay in nanoseconds (for tests that change it)
	// gate, when set, holds every call until it is closed (or the call's
	// context ends): a test sets up its state without racing the model.
	gate  chan struct{}
	calls atomic.Int64 // model calls
	mu    sync.Mutex
	sizes []int // sequences per call
}

const (
	fakeV   = 16
	fakeEOS = 15
)

func (m *countModel) row(x int32) []float32 {
	r := make([]float32, fakeV)
	r[(x+1)%fakeV] = 6
	r[(x+2)%fakeV] = 2
	return r
}

func (m *countModel) call(ctx context.Context, batch [][]int32) error {
	m.calls.Add(1)
	m.mu.Lock()
	m.sizes = append(m.sizes, len(batch))
	m.mu.Unlock()
	for _, s := range batch {
		if len(s) == 0 || len(s) > m.maxLen {
			return io.ErrShortBuffer
		}
	}
	if m.gate != nil {
		select {
		case <-m.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	delay := m.delay
	if d := m.speed.Load(); d != 0 {
		delay = time.Duration(d)
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (m *countModel) Each(ctx context.Context, batch [][]int32, fn func(int, runtime.Logits) error) error {
	if err := m.call(ctx, batch); err != nil {
		return err
	}
	for i, s := range batch {
		l := runtime.Logits{Len: len(s), Vocab: fakeV}
		for _, x := range s {
			l.Data = append(l.Data, m.row(x)...)
		}
		if err := fn(i, l); err != nil {
			return err
		}
	}
	return nil
}

func (m *countModel) LengthFor(n int) (int, error) {
	if n > m.maxLen {
		return 0, io.ErrShortBuffer
	}
	return m.maxLen, nil
}

func (m *countModel) MaxLength() int { return m.maxLen }
func (m *countModel) VocabSize() int { return fakeV }
func (m *countModel) EOS() int32     { return fakeEOS }

// letters encodes "a".."p" as ids 0..15 (other characters are dropped).
type letters struct{}

func (letters) Encode(s string) []int32 {
	var ids []int32
	for _, r := range s {
		if r >= 'a' && r < 'a'+fakeV {
			ids = append(ids, r-'a')
		}
	}
	return ids
}

func (letters) Decode(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteRune('a' + id)
	}
	return b.String()
}

// newTest starts a server over a countModel behind httptest.
func newTest(t *testing.T, m *countModel, cfg Config) (*Server, *httptest.Server) {
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
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return s, ts
}

// post sends a JSON body and returns the status and decoded JSON answer.
func post(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, decodeBody(t, resp)
}

func get(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, decodeBody(t, resp)
}

func decodeBody(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: Content-Type %q, body %q", resp.Request.URL.Path, ct, b)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: body %q is not a JSON object: %v", resp.Request.URL.Path, b, err)
	}
	return v
}

// errorMessage is the message of either error form, "" when there is none.
func errorMessage(v map[string]any) string {
	switch e := v["error"].(type) {
	case string:
		return e
	case map[string]any:
		s, _ := e["message"].(string)
		return s
	}
	return ""
}

// readEvents reads server-sent events until [DONE] or the end of the
// stream; it returns the decoded events and whether [DONE] came.
func readEvents(t *testing.T, r io.Reader) ([]map[string]any, bool) {
	t.Helper()
	var evs []map[string]any
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("stream line %q is not a data line", line)
		}
		if data == "[DONE]" {
			return evs, true
		}
		var v map[string]any
		if err := json.NewDecoder(bytes.NewReader([]byte(data))).Decode(&v); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		evs = append(evs, v)
	}
	return evs, false
}

// choiceOf returns the first choice of a completion (or chunk).
func choiceOf(t *testing.T, v map[string]any) map[string]any {
	t.Helper()
	cs, ok := v["choices"].([]any)
	if !ok || len(cs) != 1 {
		t.Fatalf("choices: %v", v)
	}
	return cs[0].(map[string]any)
}

// postCode sends a JSON body and returns the status (0 when the request
// failed); safe to call from any goroutine.
func postCode(url, body string) int {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
