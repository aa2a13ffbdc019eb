package serve

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"

	"github.com/ardanlabs/jinja"
)

// DefaultChatTemplate renders a conversation for a base model (one not
// tuned on a chat format): a system message as a paragraph of its own,
// every other message as "Role: content" on its line, and, for the
// answer, "Assistant:" to be continued. A base model may well go on with
// the next "User:" line: a client stops it with stop ["\nUser:"].
const DefaultChatTemplate = `{% for message in messages %}` +
	`{% if message['role'] == 'system' %}{{ message['content'] }}{{ '\n\n' }}` +
	`{% else %}{{ message['role'] | capitalize }}: {{ message['content'] }}{{ '\n' }}{% endif %}` +
	`{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}`

// chatTemplate is a compiled chat template in the Jinja syntax of Hugging
// Face's tokenizer_config.json chat_template.
type chatTemplate struct {
	t   *jinja.Template
	eos string // eos_token in the template
}

func newChatTemplate(source, eos string) (*chatTemplate, error) {
	t, err := jinja.Compile(cmp.Or(source, DefaultChatTemplate))
	if err != nil {
		return nil, fmt.Errorf("serve: the chat template does not compile: %w", err)
	}
	return &chatTemplate{t, eos}, nil
}

// render renders the conversation with add_generation_prompt true (as
// Hugging Face's apply_chat_template does for an answer), bos_token ""
// and eos_token the model's EOS text.
func (c *chatTemplate) render(msgs []chatMessage) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.text}
	}
	return c.t.Render(map[string]any{"messages": list, "add_generation_prompt": true, "bos_token": "", "eos_token": c.eos})
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	samplingParams
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"` // max_tokens' newer name
}

// chatMessage is a message: a role and its content, a string or an array
// of text parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	text    string
}

// contentText is a message's content as one text: a string, or the
// concatenated text of an array of {"type": "text", "text": ...} parts.
func contentText(i int, raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badParam("messages", "messages[%d].content: want a string or an array of text parts", i)
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return "", badParam("messages", "messages[%d].content[%d]: a part of type %q; this server takes text parts only", i, j, p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// chatPrompt checks the messages and renders them with the template.
func (s *Server) chatPrompt(req *chatRequest) (string, error) {
	if len(req.Messages) == 0 {
		return "", badParam("messages", "messages: want at least one message")
	}
	if s.cfg.Tokenizer == nil {
		return "", badRequest("chat needs a tokenizer, and this model's tokenizer cannot encode text here; use /v1/completions with token ids")
	}
	for i := range req.Messages {
		m := &req.Messages[i]
		switch m.Role {
		case "system", "developer", "user", "assistant":
		default:
			return "", badParam("messages", "messages[%d].role %q: want system, developer, user or assistant", i, m.Role)
		}
		var err error
		if m.text, err = contentText(i, m.Content); err != nil {
			return "", err
		}
	}
	text, err := s.chat.render(req.Messages)
	if err != nil {
		return "", badParam("messages", "the chat template cannot render these messages: %v", err)
	}
	return text, nil
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := s.decodeParams(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.MaxCompletionTokens != nil {
		if req.MaxTokens != nil {
			s.fail(w, r, badParam("max_completion_tokens", "give max_tokens or max_completion_tokens, not both"))
			return
		}
		req.MaxTokens = req.MaxCompletionTokens
	}
	text, err := s.chatPrompt(&req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	prompt, _ := json.Marshal(text)
	s.complete(w, r, &completionRequest{samplingParams: req.samplingParams, Prompt: prompt}, func(h responseHead) answerShape {
		h.ID = fmt.Sprintf("chatcmpl-%016x", rand.Uint64())
		return &chatShape{head: h}
	})
}

// chatShape is the form of /v1/chat/completions.
type chatShape struct {
	head     responseHead // without its object
	roleSent bool         // a stream gives the role in its first delta
}

type chatContent struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatContent `json:"message,omitempty"`
	Delta        *chatContent `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"` // always null
	FinishReason *string      `json:"finish_reason"`
}

type chatResponse struct {
	responseHead
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

func (c *chatShape) chunk(g *generation, text string, ids []int32, finish *string, u *usage) any {
	d := &chatContent{Content: &text}
	if !c.roleSent {
		d.Role, c.roleSent = "assistant", true
	}
	h := c.head
	h.Object = "chat.completion.chunk"
	return chatResponse{responseHead: h, Choices: []chatChoice{{Delta: d, FinishReason: finish}}, Usage: u}
}

func (c *chatShape) whole(g *generation, text, finish string, u *usage) any {
	h := c.head
	h.Object = "chat.completion"
	return chatResponse{responseHead: h, Choices: []chatChoice{{Message: &chatContent{Role: "assistant", Content: &text}, FinishReason: &finish}}, Usage: u}
}
