package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rpac-dev/rpac/runtime"
)

// completionRequest is the body of POST /v1/completions (OpenAI's
// fields; any other is refused with a 400 that names it).
type completionRequest struct {
	samplingParams
	Prompt   json.RawMessage `json:"prompt"`   // a string, or an array of token ids
	Logprobs *int            `json:"logprobs"` // alternatives per token, 0..5
	Echo     bool            `json:"echo"`
}

// samplingParams are the fields completions and chat completions share.
type samplingParams struct {
	Model       string          `json:"model"`
	MaxTokens   *int            `json:"max_tokens"`
	Temperature *float64        `json:"temperature"`
	TopK        int             `json:"top_k"`
	TopP        *float64        `json:"top_p"`
	Seed        *uint64         `json:"seed"`
	Stop        json.RawMessage `json:"stop"` // a string or an array of strings
	Stream      bool            `json:"stream"`
	N           *int            `json:"n"`

	LogitBias        map[string]float64 `json:"logit_bias"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
}

// maxStops bounds the stop strings of a request.
const maxStops = 4

// defaultMaxTokens is max_tokens when a request leaves it out (OpenAI's
// default), cut to the server's limit and to the room the prompt leaves.
const defaultMaxTokens = 16

// completion is a validated request.
type completion struct {
	prompt    []int32
	maxTokens int
	sample    runtime.SampleOptions
	seed      uint64
	stop      []string
	stream    bool
	adjust    *logitAdjust
	logprobs  int    // alternatives per token; -1: no logprobs
	echo      bool   // the answer begins with the prompt
	text      string // the prompt's text (for echo)
}

type choice struct {
	Index        int            `json:"index"`
	Text         string         `json:"text"`
	TokenIDs     []int32        `json:"token_ids"`
	Logprobs     *logprobsBlock `json:"logprobs"`
	FinishReason *string        `json:"finish_reason"`
}

// logprobsBlock is OpenAI's logprobs of a completion choice: per token
// its text, log-probability, most likely alternatives and offset in the
// choice's text (null for the first token of an echoed prompt).
type logprobsBlock struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// responseHead is what every completion and chat answer (and chunk)
// begins with.
type responseHead struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
}

type completionResponse struct {
	responseHead
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

// parse validates a request against the model and the server's limits; a
// text prompt is tokenized under ctx.
func (s *Server) parse(ctx context.Context, req *completionRequest) (*completion, error) {
	c := &completion{maxTokens: defaultMaxTokens, sample: runtime.SampleOptions{Temperature: 1, TopK: req.TopK}, stream: req.Stream, logprobs: -1, echo: req.Echo}
	if err := s.checkModel(req.Model); err != nil {
		return nil, err
	}
	if req.N != nil && *req.N != 1 {
		return nil, badParam("n", "n %d: this server returns one choice per request (n 1)", *req.N)
	}
	if req.MaxTokens != nil {
		c.maxTokens = *req.MaxTokens
	} else {
		c.maxTokens = min(c.maxTokens, s.cfg.MaxTokens)
	}
	if c.maxTokens < 0 || c.maxTokens > s.cfg.MaxTokens {
		return nil, badParam("max_tokens", "max_tokens %d: want 0..%d (the server's limit)", c.maxTokens, s.cfg.MaxTokens)
	}
	if req.Temperature != nil {
		c.sample.Temperature = *req.Temperature
	}
	if t := c.sample.Temperature; t < 0 || t > 100 || math.IsNaN(t) {
		return nil, badParam("temperature", "temperature %v: want a number in [0,100] (0: greedy)", t)
	}
	if req.TopP != nil {
		if p := *req.TopP; !(p > 0 && p <= 1) {
			return nil, badParam("top_p", "top_p %v: want a number in (0,1]", p)
		}
		c.sample.TopP = *req.TopP
	}
	if err := c.sample.Validate(); err != nil {
		return nil, badRequest("%v", err)
	}
	if req.Seed != nil {
		c.seed = *req.Seed
	} else {
		c.seed = rand.Uint64()
	}
	if req.Logprobs != nil {
		if c.logprobs = *req.Logprobs; c.logprobs < 0 || c.logprobs > maxLogprobs {
			return nil, badParam("logprobs", "logprobs %d: want 0..%d (the most likely tokens to give with each)", c.logprobs, maxLogprobs)
		}
	}
	var err error
	if c.adjust, err = parseAdjust(req.LogitBias, req.PresencePenalty, req.FrequencyPenalty, s.m.VocabSize()); err != nil {
		return nil, err
	}
	if c.stop, err = parseStop(req.Stop); err != nil {
		return nil, err
	}
	if len(c.stop) > 0 && s.cfg.Tokenizer == nil {
		return nil, badParam("stop", "stop strings need a tokenizer, and this model's tokenizer cannot decode text here; leave stop out")
	}
	if c.prompt, err = s.parsePrompt(ctx, req.Prompt); err != nil {
		return nil, err
	}
	if c.echo && s.cfg.Tokenizer != nil {
		c.text = s.cfg.Tokenizer.Decode(c.prompt)
	}
	if req.MaxTokens == nil { // the default never overflows the context
		c.maxTokens = max(0, min(c.maxTokens, s.cfg.Engine.Context()-len(c.prompt)))
	}
	if n, ctx := len(c.prompt)+c.maxTokens, s.cfg.Engine.Context(); n > ctx {
		return nil, badParam("max_tokens", "the prompt (%d tokens) plus max_tokens (%d) is %d tokens, more than the model's context of %d; shorten the prompt or lower max_tokens", len(c.prompt), c.maxTokens, n, ctx)
	}
	return c, nil
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		raw, _ = json.Marshal([]string{one})
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badParam("stop", "stop: want a string or an array of strings")
	}
	if len(list) > maxStops {
		return nil, badParam("stop", "stop: %d strings, at most %d", len(list), maxStops)
	}
	for _, s := range list {
		if s == "" {
			return nil, badParam("stop", "stop: empty strings are not allowed")
		}
	}
	return list, nil
}

// parsePrompt accepts a string (encoded with the tokenizer, under ctx) or
// an array of token ids; an empty prompt starts from EOS.
func (s *Server) parsePrompt(ctx context.Context, raw json.RawMessage) ([]int32, error) {
	var ids []int32
	var text string
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case json.Unmarshal(raw, &text) == nil:
		if text != "" {
			if s.cfg.Tokenizer == nil {
				return nil, badParam("prompt", "this model's tokenizer cannot encode text here; send the prompt as an array of token ids")
			}
			n := s.cfg.Engine.Context()
			var err error
			if ids, err = s.encode(ctx, text, n); err != nil {
				return nil, err
			}
			if len(ids) > n {
				return nil, badParam("prompt", "the prompt has more than %d tokens, the model's context; shorten it", n)
			}
		}
	default:
		var nums []int64
		if err := json.Unmarshal(raw, &nums); err != nil {
			return nil, badParam("prompt", "prompt: want a string or an array of token ids")
		}
		V := int64(s.m.VocabSize())
		for i, id := range nums {
			if id < 0 || id >= V {
				return nil, badParam("prompt", "prompt token %d: id %d is outside the vocabulary [0,%d)", i, id, V)
			}
			ids = append(ids, int32(id))
		}
	}
	if len(ids) == 0 {
		ids = []int32{s.m.EOS()}
	}
	return ids, nil
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := s.decodeParams(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	s.complete(w, r, &req, func(h responseHead) answerShape {
		h.ID, h.Object = fmt.Sprintf("cmpl-%016x", rand.Uint64()), "text_completion"
		return &completionShape{completionResponse{responseHead: h}}
	})
}

// complete validates req, generates it and answers in the shape that
// shape makes from the answer's head.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, req *completionRequest, shape func(responseHead) answerShape) {
	ctx, cancel := s.requestContext(r)
	defer cancel()
	c, err := s.parse(ctx, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.answer(ctx, w, r, c, shape(responseHead{Created: time.Now().Unix(), Model: cmp.Or(req.Model, s.cfg.ServedModelNames[0])}))
}

// answer generates c and answers it in shape's form, streamed or whole.
func (s *Server) answer(ctx context.Context, w http.ResponseWriter, r *http.Request, c *completion, shape answerShape) {
	g := &generation{s: s, c: c, ids: []int32{}, finish: "length", shape: shape}
	if c.maxTokens > 0 {
		sampler, err := runtime.NewSampler(c.sample, c.seed)
		if err != nil {
			s.fail(w, r, badRequest("%v", err))
			return
		}
		g.req = &genRequest{prompt: c.prompt, maxTokens: c.maxTokens, sampler: sampler, adjust: c.adjust, logprobs: c.logprobs,
			events: make(chan genEvent, c.maxTokens+1)}
		if err := s.dec.start(ctx, g.req); err != nil {
			s.fail(w, r, err)
			return
		}
		defer g.req.cancel() // ends the sequence if this handler returns early
	}
	if err := g.echoPrompt(ctx); err != nil {
		s.fail(w, r, err)
		return
	}
	if c.stream {
		g.streamTo(ctx, w, r)
		return
	}
	if err := g.run(ctx, nil); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, shape.whole(g, g.text(true), g.finish, g.usage()))
}

// usage counts the prompt's and the generated tokens.
func (g *generation) usage() *usage {
	return &usage{len(g.c.prompt), len(g.ids), len(g.c.prompt) + len(g.ids)}
}

// answerShape renders a generation in a route's form.
type answerShape interface {
	// chunk is a stream event: the text and ids new since the last one,
	// with the finish reason and usage on the last.
	chunk(g *generation, text string, ids []int32, finish *string, u *usage) any
	// whole is the answer of a request that does not stream.
	whole(g *generation, text, finish string, u *usage) any
}

// completionShape is the form of /v1/completions.
type completionShape struct{ base completionResponse }

func (c *completionShape) chunk(g *generation, text string, ids []int32, finish *string, u *usage) any {
	r := c.base
	r.Choices = []choice{{Text: text, TokenIDs: ids, Logprobs: g.logprobs(), FinishReason: finish}}
	r.Usage = u
	return r
}

func (c *completionShape) whole(g *generation, text, finish string, u *usage) any {
	return c.chunk(g, text, g.ids, &finish, u)
}

// generation is one completion as its handler sees it.
type generation struct {
	s      *Server
	c      *completion
	req    *genRequest // nil when max_tokens is 0
	shape  answerShape
	ids    []int32 // generated, without a final EOS
	full   string  // decoded text of ids, cut at a stop string
	sent   int     // bytes of full already streamed
	finish string  // "length" or "stop"
	// lps are the logprobs of the echoed prompt (when echo) and of ids,
	// lpSent how many of them have been answered, lpOffset the text
	// offset of the next one.
	lps      []tokenLP
	lpSent   int
	lpOffset int
}

// echo is the prompt's text when the answer echoes it, else "".
func (g *generation) echo() string {
	if g.c.echo {
		return g.c.text
	}
	return ""
}

// tokenLP is one token of a logprobs block.
type tokenLP struct {
	id  int32
	lp  *float64 // nil for the first token of an echoed prompt
	top []tokenLogprob
}

// tokenText is a token's text in logprobs: its decoded text, or its id
// without a tokenizer.
func (g *generation) tokenText(id int32) string {
	if g.s.cfg.Tokenizer == nil {
		return strconv.Itoa(int(id))
	}
	return g.s.cfg.Tokenizer.Decode([]int32{id})
}

// logprobs returns the block of the tokens not yet answered (nil without
// logprobs).
func (g *generation) logprobs() *logprobsBlock {
	if g.c.logprobs < 0 {
		return nil
	}
	b := &logprobsBlock{Tokens: []string{}, TokenLogprobs: []*float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, t := range g.lps[g.lpSent:] {
		text := g.tokenText(t.id)
		b.Tokens = append(b.Tokens, text)
		b.TokenLogprobs = append(b.TokenLogprobs, t.lp)
		var top map[string]float64
		if t.lp != nil {
			top = map[string]float64{}
			for _, a := range t.top {
				if k := g.tokenText(a.id); !hasKey(top, k) {
					top[k] = a.lp
				}
			}
		}
		b.TopLogprobs = append(b.TopLogprobs, top)
		b.TextOffset = append(b.TextOffset, g.lpOffset)
		g.lpOffset += len(text)
	}
	g.lpSent = len(g.lps)
	return b
}

func hasKey(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}

// echoPrompt readies the echoed prompt: its logprobs (when asked for,
// from one scoring call over the prompt), and its text before the
// completion's.
func (g *generation) echoPrompt(ctx context.Context) error {
	if !g.c.echo {
		return nil
	}
	g.full = g.c.text
	g.sent = 0
	if g.c.logprobs < 0 {
		return nil
	}
	p := g.c.prompt
	g.lps = append(g.lps, tokenLP{id: p[0]})
	if len(p) < 2 {
		return nil
	}
	return g.s.sc.run(ctx, [][]int32{p}, func(_ int, l runtime.Logits) error {
		for t := 0; t+1 < len(p); t++ {
			lse, top := topLogprobs(l.Row(t), g.c.logprobs)
			lp := float64(l.Row(t)[p[t+1]]) - lse
			g.lps = append(g.lps, tokenLP{id: p[t+1], lp: &lp, top: top})
		}
		return nil
	})
}

// run receives the decoder's tokens until max_tokens, EOS or a stop
// string, calling emit (if set) after each token but the last.
func (g *generation) run(ctx context.Context, emit func() error) error {
	if g.req == nil {
		return nil
	}
	for {
		var ev genEvent
		select {
		case ev = <-g.req.events:
		case <-ctx.Done():
			return ctx.Err()
		case <-g.s.dec.done: // the decoder stopped; take what it sent before
			select {
			case ev = <-g.req.events:
			default:
				return errClosed
			}
		}
		switch {
		case ev.err != nil:
			return ev.err
		case ev.eos:
			g.finish = "stop"
			return nil
		case ev.done:
			return nil
		}
		g.ids = append(g.ids, ev.id)
		if g.c.logprobs >= 0 {
			g.lps = append(g.lps, tokenLP{id: ev.id, lp: &ev.logprob, top: ev.top})
		}
		if g.decode() {
			g.finish = "stop"
			g.req.cancel()
			return nil
		}
		if emit != nil && len(g.ids) < g.c.maxTokens { // the last token goes with the finish reason
			if err := emit(); err != nil {
				return err
			}
		}
	}
}

// decode refreshes the text and reports whether it reached a stop string
// (the text is then cut before it).
func (g *generation) decode() bool {
	if g.s.cfg.Tokenizer == nil {
		return false
	}
	gen := g.s.cfg.Tokenizer.Decode(g.ids)
	stopped := false
	for _, st := range g.c.stop {
		if i := strings.Index(gen, st); i >= 0 {
			gen, stopped = gen[:i], true
			break
		}
	}
	g.full = g.echo() + gen
	return stopped
}

// text returns the text not yet sent: all of it at the end, else the part
// that can no longer change (it holds back a partial UTF-8 character and
// a tail that may begin a stop string).
func (g *generation) text(final bool) string {
	end := len(g.full)
	if !final {
		for end > g.sent {
			r, size := utf8.DecodeLastRuneInString(g.full[:end])
			if r != utf8.RuneError {
				break
			}
			end -= size
		}
		end = g.sent + safePrefix(g.full[g.sent:end], g.c.stop)
	}
	if end < g.sent {
		end = g.sent
	}
	t := g.full[g.sent:end]
	g.sent = end
	return t
}

// safePrefix is the length of s without its longest suffix that begins
// one of the stop strings.
func safePrefix(s string, stops []string) int {
	cut := len(s)
	for _, st := range stops {
		for k := min(len(st)-1, len(s)); k > 0; k-- {
			if strings.HasSuffix(s, st[:k]) {
				cut = min(cut, len(s)-k)
				break
			}
		}
	}
	return cut
}

// streamTo sends the completion as server-sent events: one event per
// token, a last event with the finish reason, then "data: [DONE]". Each
// event must reach the client within StreamIdleTimeout (in place of the
// connection's write timeout); a stream that fails after its 200 header
// is counted in the metrics under its failure's status.
func (g *generation) streamTo(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sent := 0
	idle := g.s.cfg.StreamIdleTimeout
	event := func(v any) error {
		b, _ := json.Marshal(v)
		_ = rc.SetWriteDeadline(time.Now().Add(idle))
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	err := g.run(ctx, func() error {
		ids := g.ids[sent:]
		sent = len(g.ids)
		return event(g.shape.chunk(g, g.text(false), ids, nil, nil))
	})
	if err != nil {
		if r.Context().Err() != nil {
			setOutcome(w, 499) // the client left
			return
		}
		if errors.Is(err, context.Canceled) && g.s.closing.Err() != nil {
			err = errClosed
		}
		code, msg := statusOf(err, g.s.cfg.Timeout)
		setOutcome(w, code)
		e := newOpenAIError(code, msg, "", "")
		e.Status = code
		_ = event(map[string]openAIError{"error": e})
		return
	}
	finish := g.finish
	if event(g.shape.chunk(g, g.text(true), g.ids[sent:], &finish, g.usage())) != nil {
		setOutcome(w, 499) // the client stopped reading
		return
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
