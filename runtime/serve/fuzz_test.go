package serve

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/training/data"
)

// FuzzRequests: whatever body a client sends to a POST route, the answer
// is a 2xx or 4xx with a JSON body (an event stream for a streamed
// completion), never a 5xx and never a panic, and it comes within a time
// limit. Text goes through the real GPT-2 tokenizer.
func FuzzRequests(f *testing.F) {
	paths := []string{"/v1/completions", "/v1/score", "/v2/models/rpac/infer"}
	for i, body := range []string{
		`{"prompt": "abc", "max_tokens": 3, "temperature": 0.5, "top_k": 2, "top_p": 0.9, "seed": 1, "stop": ["c"]}`,
		`{"prompt": [1, 2, 3], "max_tokens": 2, "stream": true}`,
		`{"text": "abcdef"}`,
		`{"ids": [1, 2, 3, 4]}`,
		`{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [[1, 2]]}]}`,
		`{"inputs": [{"name": "input_ids", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}]}`,
		`{"prompt": null, "max_tokens": 1e9}`,
		`[]`,
		`{"prompt": "\u007faaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "max_tokens": 2, "stop": "\n"}`,
		`{"text": "The history of the city begins in 1850.\n\u00ff\ud83d\ude42"}`,
		`{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}, {"name": "target_ids", "shape": [1, 2], "datatype": "INT64", "data": [3, 4]}], "outputs": [{"name": "top_k_ids", "parameters": {"top_k": 3}}, {"name": "target_logprobs"}, {"name": "last_logits"}]}`,
	} {
		f.Add(uint8(i%len(paths)), body)
	}
	m := &countModel{maxLen: 32}
	s, err := New(m, Config{Tokenizer: modTokenizer{data.NewTokenizer()}, MaxTokens: 40, MaxBodyBytes: 4096, Timeout: 2 * time.Second, MaxResponseBytes: 8192})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		path := paths[int(route)%len(paths)]
		rec := httptest.NewRecorder()
		t0 := time.Now()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		if d := time.Since(t0); d > 2*time.Second {
			t.Fatalf("POST %s %q took %v", path, body, d)
		}
		if rec.Code >= 500 {
			t.Fatalf("POST %s %q: %d %s", path, body, rec.Code, rec.Body)
		}
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
			if !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
				t.Fatalf("POST %s %q: the stream did not end with [DONE]: %q", path, body, rec.Body)
			}
			return
		}
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("POST %s %q: %d, body %q is not a JSON object", path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 && errorMessage(v) == "" {
			t.Fatalf("POST %s %q: %d without an error message: %s", path, body, rec.Code, rec.Body)
		}
	})
}
