package serve

import (
	"net/http"
	"strings"
	"testing"
)

// TestChatTemplate: the default template's text for a conversation, and
// a template that fails to render is a 400 that says why and names
// messages; one that does not compile fails New.
func TestChatTemplate(t *testing.T) {
	c, err := newChatTemplate("", "<eos>")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.render([]chatMessage{{Role: "system", text: "Be brief."}, {Role: "user", text: "Hi"}, {Role: "assistant", text: "Hello"}, {Role: "user", text: "Bye"}})
	if want := "Be brief.\n\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:"; err != nil || got != want {
		t.Fatalf("default template: %q, %v; want %q", got, err, want)
	}
	_, ts := newTest(t, &countModel{}, Config{ChatTemplate: `{% if messages[0]['role'] != 'system' %}{{ raise_exception('the first message must be the system message') }}{% endif %}{{ messages[0]['content'] }}`})
	status, v := post(t, ts.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "abc"}]}`)
	if param, _ := openAIErrorOf(t, "render", v); status != 400 || param != "messages" || !strings.Contains(errorMessage(v), "the first message must be the system message") {
		t.Fatalf("a failing template: %d %v", status, v)
	}
	if _, err := New(&countModel{maxLen: 8}, Config{ChatTemplate: `{% for %}`}); err == nil || !strings.Contains(err.Error(), "chat template") {
		t.Fatalf("a template that does not compile: %v", err)
	}
}

// TestChat: a chat completion is the completion of the rendered
// conversation (same tokens, same text), whole or streamed as deltas
// with the role first; bad messages and unsupported fields are 400s.
func TestChat(t *testing.T) {
	m := &countModel{}
	_, ts := newTest(t, m, Config{ChatTemplate: `{% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}`})
	body := `{"messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": [{"type": "text", "text": "cd"}]}], "max_tokens": 5, "temperature": 0`
	status, v := post(t, ts.URL+"/v1/chat/completions", body+`}`)
	if status != 200 || v["object"] != "chat.completion" {
		t.Fatalf("chat: %d %v", status, v)
	}
	// the rendered prompt is "abcd" and EOS's text ("p", id 15)
	_, ref := post(t, ts.URL+"/v1/completions", `{"prompt": "abcdp", "max_tokens": 5, "temperature": 0}`)
	refText := ref["choices"].([]any)[0].(map[string]any)["text"].(string)
	msg := v["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if msg["role"] != "assistant" || msg["content"] != refText || refText == "" {
		t.Fatalf("chat message %v, want the completion %q", msg, refText)
	}
	if u := v["usage"].(map[string]any); u["prompt_tokens"] != float64(5) {
		t.Errorf("usage %v, want 5 prompt tokens", u)
	}
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body+`, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs, done := readEvents(t, resp.Body)
	var text strings.Builder
	for i, ev := range evs {
		if ev["object"] != "chat.completion.chunk" {
			t.Fatalf("chunk %d: %v", i, ev)
		}
		d := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
		if (i == 0) != (d["role"] == "assistant") {
			t.Errorf("chunk %d: delta %v (the role goes in the first only)", i, d)
		}
		s, _ := d["content"].(string)
		text.WriteString(s)
	}
	if !done || text.String() != refText {
		t.Fatalf("stream: %q (done %v), want %q", text.String(), done, refText)
	}
	for _, c := range []struct{ body, param string }{
		{`{"messages": []}`, "messages"},
		{`{"messages": [{"role": "robot", "content": "a"}]}`, "messages"},
		{`{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, "messages"},
		{`{"messages": [{"role": "user", "content": "a"}], "logprobs": true}`, "logprobs"},
		{`{"messages": [{"role": "user", "content": "a"}], "tools": []}`, "tools"},
		{`{"messages": [{"role": "user", "content": "a"}], "model": "x"}`, "model"},
	} {
		status, v := post(t, ts.URL+"/v1/chat/completions", c.body)
		if param, _ := openAIErrorOf(t, c.body, v); status/100 != 4 || param != c.param {
			t.Errorf("%s: %d %v, want a 4xx naming %s", c.body, status, v, c.param)
		}
	}
}
