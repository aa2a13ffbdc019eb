package serve

import (
	"context"
	"fmt"
	"math"
	"net/http"

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
	if err := s.decodeParams(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	// Windows of MaxLength tokens overlapping by one: every token after
	// the first is predicted exactly once, as runtime.Model.ScoreText does.
	L := s.m.MaxLength()
	most := s.cfg.Queue*(L-1) + 1 // tokens in Queue windows
	ids, err := s.scoreIDs(ctx, &req, most)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(ids) > most {
		s.fail(w, r, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the text has more than %d tokens, the most one request may score (%d windows of %d tokens, the server's queue); score it in parts", most, s.cfg.Queue, L)})
		return
	}
	var windows [][]int32
	var starts []int
	for st := 0; st+1 < len(ids); st += L - 1 {
		windows = append(windows, ids[st:min(st+L, len(ids))])
		starts = append(starts, st)
	}
	// The answer: at most about 31 bytes per token (its id and log-probability).
	release, err := s.reserve(int64(len(ids))*(float64JSONBytes+idJSONBytes(s.m.VocabSize()))+jsonOverhead, fmt.Sprintf("the score of %d tokens", len(ids)))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer release()
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
	res := scoreResponse{Model: s.cfg.ServedModelNames[0], Tokens: len(lp), TokenIDs: ids, LogProbs: lp}
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
// least two tokens, every id in the vocabulary. A text is tokenized under
// ctx and may stop once it has more than most tokens.
func (s *Server) scoreIDs(ctx context.Context, req *scoreRequest, most int) ([]int32, error) {
	var ids []int32
	switch {
	case req.Text != nil && req.IDs != nil:
		return nil, badRequest("give text or ids, not both")
	case req.Text != nil:
		if s.cfg.Tokenizer == nil {
			return nil, badRequest("this model's tokenizer cannot encode text here; send ids")
		}
		var err error
		if ids, err = s.encode(ctx, *req.Text, most); err != nil {
			return nil, err
		}
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
