package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/rpac-dev/rpac/runtime"
)

// scoreRequest is the body of POST /v1/score: a text, or token ids.
type scoreRequest struct {
	Text *string `json:"text"`
	IDs  []int64 `json:"ids"`
}

type scoreResponse struct {
	Model      string    `json:"model"`
	Tokens     int       `json:"tokens"` // predictions scored (ids after the first)
	NLL        float64   `json:"nll"`    // summed negative log-likelihood, nats
	CE         float64   `json:"ce"`     // NLL / tokens
	Perplexity float64   `json:"perplexity"`
	TokenIDs   []int32   `json:"token_ids"`
	LogProbs   []float64 `json:"token_logprobs"` // log p(token_ids[t+1] | token_ids[..t])
}

func (s *Server) score(w http.ResponseWriter, r *http.Request) {
	var req scoreRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ids, err := s.scoreIDs(&req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	// Windows of MaxLength tokens overlapping by one: every token after
	// the first is predicted exactly once, as runtime.Model.ScoreText does.
	L := s.m.MaxLength()
	var windows [][]int32
	var starts []int
	for st := 0; st+1 < len(ids); st += L - 1 {
		windows = append(windows, ids[st:min(st+L, len(ids))])
		starts = append(starts, st)
	}
	if len(windows) > s.cfg.Queue {
		s.fail(w, r, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the text has %d tokens; one request may score at most %d (%d windows of %d)", len(ids), s.cfg.Queue*(L-1)+1, s.cfg.Queue, L)})
		return
	}
	lp := make([]float64, len(ids)-1)
	err = s.sc.run(ctx, windows, func(i int, l runtime.Logits) error {
		w := windows[i]
		for t := 0; t+1 < len(w); t++ {
			lp[starts[i]+t] = runtime.LogProb(l.Row(t), int(w[t+1]))
		}
		return nil
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res := scoreResponse{Model: s.cfg.Name, Tokens: len(lp), TokenIDs: ids, LogProbs: lp}
	for _, x := range lp {
		res.NLL -= x
	}
	res.CE = res.NLL / float64(res.Tokens)
	res.Perplexity = math.Exp(res.CE)
	if math.IsNaN(res.CE) || math.IsInf(res.CE, 0) {
		s.fail(w, r, fmt.Errorf("the model's log-probabilities are not finite (CE %v)", res.CE))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// scoreIDs validates a score request: exactly one of text and ids, at
// least two tokens, every id in the vocabulary.
func (s *Server) scoreIDs(req *scoreRequest) ([]int32, error) {
	var ids []int32
	switch {
	case req.Text != nil && req.IDs != nil:
		return nil, badRequest("give text or ids, not both")
	case req.Text != nil:
		if s.cfg.Tokenizer == nil {
			return nil, badRequest("this model's tokenizer cannot encode text here; send ids")
		}
		ids = s.cfg.Tokenizer.Encode(*req.Text)
	case req.IDs != nil:
		V := int64(s.m.VocabSize())
		for i, id := range req.IDs {
			if id < 0 || id >= V {
				return nil, badRequest("ids[%d]: id %d is outside the vocabulary [0,%d)", i, id, V)
			}
			ids = append(ids, int32(id))
		}
	default:
		return nil, badRequest("give text (a string) or ids (an array of token ids) to score")
	}
	if len(ids) < 2 {
		return nil, badRequest("%d tokens: scoring needs at least two", len(ids))
	}
	if s.m.MaxLength() < 2 {
		return nil, badRequest("the longest exported length is %d; scoring needs at least 2", s.m.MaxLength())
	}
	return ids, nil
}

// inferTensor is a KServe v2 tensor.
type inferTensor struct {
	Name     string          `json:"name"`
	Shape    []int64         `json:"shape"`
	Datatype string          `json:"datatype"`
	Data     json.RawMessage `json:"data,omitempty"`
}

type inferRequest struct {
	ID      string        `json:"id,omitempty"`
	Inputs  []inferTensor `json:"inputs"`
	Outputs []struct {
		Name string `json:"name"`
	} `json:"outputs,omitempty"`
}

// infer answers a KServe v2 inference: input_ids [B,T] (INT64 or INT32,
// flat or nested row-major data) gives logits [B,T,V] (FP32).
func (s *Server) infer(w http.ResponseWriter, r *http.Request) {
	if !s.checkName(w, r) {
		return
	}
	var req inferRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	seqs, err := s.inferInput(&req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	B, T, V := len(seqs), len(seqs[0]), s.m.VocabSize()
	out := make([]float32, B*T*V)
	err = s.sc.run(ctx, seqs, func(i int, l runtime.Logits) error {
		copy(out[i*T*V:], l.Data)
		return nil
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data, err := floatsJSON(out)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"model_name": s.cfg.Name, "model_version": "1", "id": req.ID,
		"outputs": []inferTensor{{Name: "logits", Shape: []int64{int64(B), int64(T), int64(V)}, Datatype: "FP32", Data: data}},
	})
}

// inferInput validates the request's one input and returns its rows.
func (s *Server) inferInput(req *inferRequest) ([][]int32, error) {
	if len(req.Inputs) != 1 || req.Inputs[0].Name != "input_ids" {
		return nil, badRequest("want exactly one input, input_ids (INT64 [B,T])")
	}
	for _, o := range req.Outputs {
		if o.Name != "logits" {
			return nil, badRequest("unknown output %q; the model's output is logits", o.Name)
		}
	}
	in := req.Inputs[0]
	if in.Datatype != "INT64" && in.Datatype != "INT32" {
		return nil, badRequest("input_ids datatype %q: want INT64 (or INT32)", in.Datatype)
	}
	if len(in.Shape) != 2 || in.Shape[0] < 1 || in.Shape[1] < 1 {
		return nil, badRequest("input_ids shape %v: want [B,T] with B, T >= 1", in.Shape)
	}
	B, T, V := in.Shape[0], in.Shape[1], int64(s.m.VocabSize())
	if T > int64(s.m.MaxLength()) {
		return nil, badRequest("input_ids has T=%d; the longest exported length is %d", T, s.m.MaxLength())
	}
	if B > int64(s.cfg.Queue) || B*T*V > int64(s.cfg.MaxInferValues) {
		return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("input_ids [%d,%d] asks for %d logits; the server's limits are %d rows and %d values per request", B, T, B*T*V, s.cfg.Queue, s.cfg.MaxInferValues)}
	}
	flat, err := flatInts(in.Data, int(B*T))
	if err != nil {
		return nil, badRequest("input_ids data: %v", err)
	}
	if int64(len(flat)) != B*T {
		return nil, badRequest("input_ids data holds %d values, the shape [%d,%d] needs %d", len(flat), B, T, B*T)
	}
	seqs := make([][]int32, B)
	for b := range seqs {
		seqs[b] = make([]int32, T)
		for t := range seqs[b] {
			id := flat[int64(b)*T+int64(t)]
			if id < 0 || id >= V {
				return nil, badRequest("input_ids[%d,%d] = %d is outside the vocabulary [0,%d)", b, t, id, V)
			}
			seqs[b][t] = int32(id)
		}
	}
	return seqs, nil
}

// flatInts reads a JSON array of integers, possibly nested (row-major),
// of at most limit values.
func flatInts(raw json.RawMessage, limit int) ([]int64, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("missing")
	}
	var out []int64
	var walk func(b json.RawMessage, depth int) error
	walk = func(b json.RawMessage, depth int) error {
		b = bytes.TrimSpace(b)
		if len(b) > 0 && b[0] == '[' {
			if depth > 8 {
				return fmt.Errorf("nested deeper than the tensor's rank")
			}
			var items []json.RawMessage
			if err := json.Unmarshal(b, &items); err != nil {
				return err
			}
			for _, it := range items {
				if err := walk(it, depth+1); err != nil {
					return err
				}
			}
			return nil
		}
		var x int64
		if err := json.Unmarshal(b, &x); err != nil {
			return fmt.Errorf("%s is not an integer", b)
		}
		if len(out) >= limit {
			return fmt.Errorf("more values than the shape holds")
		}
		out = append(out, x)
		return nil
	}
	if err := walk(raw, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// floatsJSON renders logits as a JSON array (NaN and ±Inf, which JSON
// cannot hold, are an error).
func floatsJSON(xs []float32) (json.RawMessage, error) {
	var b bytes.Buffer
	b.Grow(len(xs) * 10)
	b.WriteByte('[')
	for i, x := range xs {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("logit %d is %v, which JSON cannot carry", i, x)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(strconv.AppendFloat(nil, float64(x), 'g', -1, 32))
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}
