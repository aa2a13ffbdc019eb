package serve

import (
	"net/http"
	"testing"
)

// openAIErrorOf checks that v is an error in OpenAI's form (message and
// type strings, param and code each a string or null) and returns its
// param and code ("" for null).
func openAIErrorOf(t *testing.T, what string, v map[string]any) (param, code string) {
	t.Helper()
	e, ok := v["error"].(map[string]any)
	if !ok {
		t.Fatalf("%s: error %v is not an object", what, v["error"])
	}
	for _, k := range []string{"message", "type"} {
		if s, ok := e[k].(string); !ok || s == "" {
			t.Fatalf("%s: error.%s %v is not a non-empty string", what, k, e[k])
		}
	}
	for _, k := range []string{"param", "code"} {
		x, present := e[k]
		if !present {
			t.Fatalf("%s: error has no %s: %v", what, k, e)
		}
		if x != nil {
			if _, ok := x.(string); !ok {
				t.Fatalf("%s: error.%s %v is neither a string nor null", what, k, x)
			}
		}
	}
	param, _ = e["param"].(string)
	code, _ = e["code"].(string)
	return param, code
}

// TestOpenAIErrors: every /v1 error has OpenAI's shape; a parameter the
// server does not implement is a 400 that names it (never ignored), and a
// bad value names its field.
func TestOpenAIErrors(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{Name: "m"})
	for _, c := range []struct {
		path, body  string
		status      int
		param, code string
	}{
		{"/v1/completions", `{"prompt": "a", "best_of": 2}`, 400, "best_of", "unsupported_parameter"},
		{"/v1/completions", `{"prompt": "a", "suffix": "x"}`, 400, "suffix", "unsupported_parameter"},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 1000}`, 400, "max_tokens", "invalid_value"},
		{"/v1/completions", `{"prompt": "a", "temperature": -1}`, 400, "temperature", "invalid_value"},
		{"/v1/completions", `{"prompt": "a", "top_p": 2}`, 400, "top_p", "invalid_value"},
		{"/v1/completions", `{"prompt": "a", "stop": 3}`, 400, "stop", "invalid_value"},
		{"/v1/completions", `{"prompt": [99]}`, 400, "prompt", "invalid_value"},
		{"/v1/completions", `{"prompt": "a", "max_tokens": "x"}`, 400, "max_tokens", "invalid_value"},
		{"/v1/completions", `{"prompt": "a", "model": "other"}`, 404, "model", "model_not_found"},
		{"/v1/completions", `{"prompt": "a"`, 400, "", ""},
		{"/v1/score", `{"text": "ab", "echo": true}`, 400, "echo", "unsupported_parameter"},
		{"/v1/nothing", `{}`, 404, "", "not_found"},
	} {
		status, v := post(t, ts.URL+c.path, c.body)
		if status != c.status {
			t.Fatalf("%s %s: status %d, want %d: %v", c.path, c.body, status, c.status, v)
		}
		param, code := openAIErrorOf(t, c.body, v)
		if param != c.param || code != c.code {
			t.Errorf("%s %s: param %q code %q, want %q %q", c.path, c.body, param, code, c.param, c.code)
		}
	}
	// null is absent, not an unknown value
	if status, v := post(t, ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 2, "suffix": null}`); status != http.StatusOK {
		t.Fatalf("a null field: %d %v", status, v)
	}
}
