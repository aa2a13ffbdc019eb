package serve

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzRequests: whatever body a client sends to a POST route, the answer
// is a 2xx or 4xx with a JSON body (an event stream for a streamed
// completion), never a 5xx and never a panic.
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
	} {
		f.Add(uint8(i%len(paths)), body)
	}
	m := &countModel{maxLen: 32}
	s, err := New(m, Config{Tokenizer: letters{}, MaxTokens: 40, MaxBodyBytes: 4096})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		path := paths[int(route)%len(paths)]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
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
