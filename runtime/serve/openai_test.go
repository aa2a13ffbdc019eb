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

// TestModels: GET /v1/models lists the served names in OpenAI's shapes,
// GET /v1/models/{id} answers one (404 in the error shape for another),
// and a completion may name any served model (echoed in its answer).
func TestModels(t *testing.T) {
	_, ts := newTest(t, &countModel{}, Config{Name: "m", ServedModelNames: []string{"first", "org/second"}})
	status, v := get(t, ts.URL+"/v1/models")
	if status != 200 || v["object"] != "list" {
		t.Fatalf("list: %d %v", status, v)
	}
	data, _ := v["data"].([]any)
	if len(data) != 2 {
		t.Fatalf("list: %v, want 2 models", v)
	}
	for i, id := range []string{"first", "org/second"} {
		m, _ := data[i].(map[string]any)
		created, _ := m["created"].(float64)
		if m["id"] != id || m["object"] != "model" || m["owned_by"] != "rpac" || created <= 0 {
			t.Errorf("model %d: %v", i, m)
		}
		status, one := get(t, ts.URL+"/v1/models/"+id)
		if status != 200 || one["id"] != id || one["object"] != "model" {
			t.Errorf("GET /v1/models/%s: %d %v", id, status, one)
		}
		status, c := post(t, ts.URL+"/v1/completions", `{"model": "`+id+`", "prompt": "a", "max_tokens": 1}`)
		if status != 200 || c["model"] != id {
			t.Errorf("completion of %s: %d %v", id, status, c)
		}
	}
	status, v = get(t, ts.URL+"/v1/models/m")
	if param, code := openAIErrorOf(t, "unknown model", v); status != 404 || param != "model" || code != "model_not_found" {
		t.Fatalf("GET /v1/models/m: %d %v", status, v)
	}
	if status, c := post(t, ts.URL+"/v1/completions", `{"prompt": "a", "max_tokens": 1}`); status != 200 || c["model"] != "first" {
		t.Errorf("completion without a model: %d %v, want model first", status, c)
	}
	if _, err := New(&countModel{maxLen: 8}, Config{ServedModelNames: []string{"a", "a"}}); err == nil {
		t.Error("repeated served names: no error")
	}
}
