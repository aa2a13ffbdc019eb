package serve

import (
	"math"
	"net/http"
	"slices"
	"strings"
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

// greedyReference decodes greedily from the countModel's logits with
// OpenAI's logit_bias and penalties applied directly: the reference for
// the server's adjusted decoding.
func greedyReference(m *countModel, prompt int32, n int, bias map[int32]float32, presence, frequency float32) []int32 {
	var out []int32
	counts := map[int32]int{}
	last := prompt
	for range n {
		row := m.row(last)
		best := int32(0)
		for j := range row {
			row[j] += bias[int32(j)]
			if c := counts[int32(j)]; c > 0 {
				row[j] -= float32(c)*frequency + presence
			}
			if row[j] > row[best] {
				best = int32(j)
			}
		}
		if best == fakeEOS {
			break
		}
		out = append(out, best)
		counts[best]++
		last = best
	}
	return out
}

func idsOf(t *testing.T, v map[string]any) []int32 {
	t.Helper()
	ch, _ := v["choices"].([]any)
	if len(ch) != 1 {
		t.Fatalf("choices: %v", v)
	}
	raw, _ := ch[0].(map[string]any)["token_ids"].([]any)
	out := []int32{}
	for _, x := range raw {
		out = append(out, int32(x.(float64)))
	}
	return out
}

// TestLogitAdjust: logit_bias, presence_penalty and frequency_penalty give
// the tokens of greedy decoding over the model's logits with OpenAI's
// adjustments applied; values out of range are 400s naming the field.
func TestLogitAdjust(t *testing.T) {
	m := &countModel{}
	_, ts := newTest(t, m, Config{})
	for _, c := range []struct {
		body                string
		bias                map[int32]float32
		presence, frequency float32
	}{
		{`"logit_bias": {"2": -5}`, map[int32]float32{2: -5}, 0, 0},
		{`"logit_bias": {"15": -100}`, map[int32]float32{15: -100}, 0, 0},
		{`"logit_bias": {"15": -100, "1": -4.5}, "presence_penalty": 1.5`, map[int32]float32{15: -100, 1: -4.5}, 1.5, 0},
		{`"logit_bias": {"15": -100, "1": -4.5}, "frequency_penalty": 1`, map[int32]float32{15: -100, 1: -4.5}, 0, 1},
		{`"logit_bias": {"15": -100, "3": 4.5}, "frequency_penalty": 1, "presence_penalty": -0.5`, map[int32]float32{15: -100, 3: 4.5}, -0.5, 1},
	} {
		status, v := post(t, ts.URL+"/v1/completions", `{"prompt": [0], "max_tokens": 40, "temperature": 0, `+c.body+`}`)
		if status != 200 {
			t.Fatalf("%s: %d %v", c.body, status, v)
		}
		got, want := idsOf(t, v), greedyReference(m, 0, 40, c.bias, c.presence, c.frequency)
		if !slices.Equal(got, want) {
			t.Errorf("%s: tokens %v, want %v", c.body, got, want)
		}
	}
	// each penalty changes the tokens here (else the test shows nothing)
	bias := map[int32]float32{15: -100, 1: -4.5}
	plain := greedyReference(m, 0, 40, bias, 0, 0)
	if slices.Equal(plain, greedyReference(m, 0, 40, bias, 1.5, 0)) || slices.Equal(plain, greedyReference(m, 0, 40, bias, 0, 1)) {
		t.Fatal("a penalty does not change the reference")
	}
	for _, c := range []struct{ body, param string }{
		{`"logit_bias": {"2": 101}`, "logit_bias"},
		{`"logit_bias": {"16": 1}`, "logit_bias"},
		{`"logit_bias": {"x": 1}`, "logit_bias"},
		{`"presence_penalty": 2.5`, "presence_penalty"},
		{`"frequency_penalty": -3`, "frequency_penalty"},
		{`"logprobs": 6`, "logprobs"},
	} {
		status, v := post(t, ts.URL+"/v1/completions", `{"prompt": [0], `+c.body+`}`)
		if param, _ := openAIErrorOf(t, c.body, v); status != 400 || param != c.param {
			t.Errorf("%s: %d %v, want 400 naming %s", c.body, status, v, c.param)
		}
	}
}

// logSoftmaxRef is log softmax(row) in float64.
func logSoftmaxRef(row []float32) []float64 {
	mx := math.Inf(-1)
	for _, x := range row {
		mx = max(mx, float64(x))
	}
	s := 0.0
	for _, x := range row {
		s += math.Exp(float64(x) - mx)
	}
	out := make([]float64, len(row))
	for j, x := range row {
		out[j] = float64(x) - mx - math.Log(s)
	}
	return out
}

// TestLogprobsEcho: logprobs gives each token's log-probability and its
// most likely alternatives from the model's logits (before the bias),
// with echo the prompt's too (null for its first token), and text
// offsets into the choice's text; a stream gives the same per chunk.
func TestLogprobsEcho(t *testing.T) {
	m := &countModel{}
	_, ts := newTest(t, m, Config{})
	status, v := post(t, ts.URL+"/v1/completions", `{"prompt": "ab", "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": true, "logit_bias": {"3": -10}}`)
	if status != 200 {
		t.Fatalf("%d %v", status, v)
	}
	ch := v["choices"].([]any)[0].(map[string]any)
	// the prompt a b, then greedy decoding with c biased down
	gen := greedyReference(m, 1, 3, map[int32]float32{3: -10}, 0, 0)
	all := append([]int32{0, 1}, gen...)
	text := letters{}.Decode(all)
	if ch["text"] != text {
		t.Fatalf("text %q, want %q", ch["text"], text)
	}
	lp := ch["logprobs"].(map[string]any)
	tokens, tlp, top, off := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any), lp["text_offset"].([]any)
	if len(tokens) != len(all) || len(tlp) != len(all) || len(top) != len(all) || len(off) != len(all) {
		t.Fatalf("logprobs of %d tokens: %v", len(all), lp)
	}
	if tlp[0] != nil || top[0] != nil {
		t.Errorf("first echoed token: logprob %v, top %v, want null", tlp[0], top[0])
	}
	var tok letters
	for i, id := range all {
		if tokens[i] != tok.Decode([]int32{id}) || off[i] != float64(i) {
			t.Errorf("token %d: %v at %v, want %q at %d", i, tokens[i], off[i], tok.Decode([]int32{id}), i)
		}
		if i == 0 {
			continue
		}
		ref := logSoftmaxRef(m.row(all[i-1]))
		if got := tlp[i].(float64); math.Abs(got-ref[id]) > 1e-5 {
			t.Errorf("token %d: logprob %v, want %v", i, got, ref[id])
		}
		alt := top[i].(map[string]any)
		if len(alt) != 2 {
			t.Fatalf("token %d: top %v, want 2", i, alt)
		}
		for k, x := range []int32{(all[i-1] + 1) % fakeV, (all[i-1] + 2) % fakeV} {
			if got, ok := alt[tok.Decode([]int32{x})].(float64); !ok || math.Abs(got-ref[x]) > 1e-5 {
				t.Errorf("token %d: alternative %d (%d) %v, want %v", i, k, x, alt, ref[x])
			}
		}
	}
	// without logprobs the field is null
	_, v = post(t, ts.URL+"/v1/completions", `{"prompt": "ab", "max_tokens": 2}`)
	if lp, present := v["choices"].([]any)[0].(map[string]any)["logprobs"]; !present || lp != nil {
		t.Errorf("logprobs without asking: %v", lp)
	}
	// a stream carries each token's logprobs in its chunk
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "a", "max_tokens": 3, "temperature": 0, "logprobs": 1, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs, done := readEvents(t, resp.Body)
	n := 0
	for _, ev := range evs {
		c := ev["choices"].([]any)[0].(map[string]any)
		l := c["logprobs"].(map[string]any)
		for _, x := range l["token_logprobs"].([]any) {
			prev := int32(n) // prompt a (0) then b, c: each after the one before
			if want := logSoftmaxRef(m.row(prev))[prev+1]; math.Abs(x.(float64)-want) > 1e-5 {
				t.Errorf("stream token %d: logprob %v, want %v", n, x, want)
			}
			n++
		}
	}
	if !done || n != 3 {
		t.Fatalf("stream: %d logprobs, done %v: %v", n, done, evs)
	}
}

// TestCORS: with AllowOrigins, an allowed origin's requests carry
// Access-Control-Allow-Origin and its preflight OPTIONS is answered 204
// with the methods and headers; another origin gets neither (403 for its
// preflight); without AllowOrigins there are no CORS headers and OPTIONS
// stays a 405.
func TestCORS(t *testing.T) {
	if got := ParseOrigins([]string{"http://a.example, http://b.example", "http://c.example"}); !slices.Equal(got, []string{"http://a.example", "http://b.example", "http://c.example"}) {
		t.Fatalf("ParseOrigins: %q", got)
	}
	send := func(url, method, origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url+"/v1/completions", strings.NewReader(`{"prompt": "a", "max_tokens": 1}`))
		req.Header.Set("Origin", origin)
		if method == http.MethodOptions {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	_, on := newTest(t, &countModel{}, Config{AllowOrigins: []string{"http://a.example", "http://b.example"}})
	resp := send(on.URL, http.MethodPost, "http://b.example")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "http://b.example" {
		t.Errorf("allowed POST: %d %v", resp.StatusCode, resp.Header)
	}
	resp = send(on.URL, http.MethodOptions, "http://a.example")
	if h := resp.Header; resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "http://a.example" ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || h.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Errorf("allowed preflight: %d %v", resp.StatusCode, resp.Header)
	}
	resp = send(on.URL, http.MethodPost, "http://evil.example")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("POST from another origin: %d %v", resp.StatusCode, resp.Header)
	}
	if resp = send(on.URL, http.MethodOptions, "http://evil.example"); resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin: %d %v", resp.StatusCode, resp.Header)
	}
	_, star := newTest(t, &countModel{}, Config{AllowOrigins: []string{"*"}})
	if resp = send(star.URL, http.MethodOptions, "http://x.example"); resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "http://x.example" {
		t.Errorf("* preflight: %d %v", resp.StatusCode, resp.Header)
	}
	_, off := newTest(t, &countModel{}, Config{})
	for _, m := range []string{http.MethodPost, http.MethodOptions} {
		resp = send(off.URL, m, "http://a.example")
		want := map[string]int{http.MethodPost: 200, http.MethodOptions: http.StatusMethodNotAllowed}[m]
		if resp.StatusCode != want || resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.Header.Get("Access-Control-Allow-Methods") != "" {
			t.Errorf("%s without AllowOrigins: %d %v", m, resp.StatusCode, resp.Header)
		}
	}
}
