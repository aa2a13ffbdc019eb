package serve

import (
	"math"
	"strconv"

	"github.com/rpac-dev/rpac/runtime"
)

// maxLogprobs is the most alternatives logprobs may ask for (OpenAI's
// limit for completions).
const maxLogprobs = 5

// maxBias bounds a logit_bias value (OpenAI's range).
const maxBias = 100

// logitAdjust is what a completion adds to the model's logits before a
// token is drawn: logit_bias, and OpenAI's presence and frequency
// penalties over the tokens generated so far:
// logits[j] -= count[j]·frequency + (count[j] > 0)·presence.
type logitAdjust struct {
	bias      map[int32]float32
	presence  float32
	frequency float32
	counts    map[int32]int // generated tokens
}

// active reports whether the adjustment changes any logit.
func (a *logitAdjust) active() bool {
	return a != nil && (len(a.bias) > 0 || a.presence != 0 || a.frequency != 0)
}

// apply adjusts row in place.
func (a *logitAdjust) apply(row []float32) {
	if !a.active() {
		return
	}
	for id, b := range a.bias {
		row[id] += b
	}
	if a.presence == 0 && a.frequency == 0 {
		return
	}
	for id, n := range a.counts {
		row[id] -= float32(n)*a.frequency + a.presence
	}
}

// observe counts a generated token.
func (a *logitAdjust) observe(id int32) {
	if a == nil || (a.presence == 0 && a.frequency == 0) {
		return
	}
	if a.counts == nil {
		a.counts = map[int32]int{}
	}
	a.counts[id]++
}

// parseAdjust validates logit_bias (token id → bias in [-100,100]) and
// the penalties (in [-2,2], OpenAI's range); nil when none is set.
func parseAdjust(bias map[string]float64, presence, frequency *float64, vocab int) (*logitAdjust, error) {
	a := &logitAdjust{}
	for k, v := range bias {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || int(id) >= vocab {
			return nil, badParam("logit_bias", "logit_bias: key %q is not a token id in [0,%d)", k, vocab)
		}
		if !(v >= -maxBias && v <= maxBias) {
			return nil, badParam("logit_bias", "logit_bias[%s] %v: want a number in [-%d,%d]", k, v, maxBias, maxBias)
		}
		if a.bias == nil {
			a.bias = map[int32]float32{}
		}
		a.bias[int32(id)] = float32(v)
	}
	for _, p := range []struct {
		name string
		v    *float64
		to   *float32
	}{{"presence_penalty", presence, &a.presence}, {"frequency_penalty", frequency, &a.frequency}} {
		if p.v == nil {
			continue
		}
		if !(*p.v >= -2 && *p.v <= 2) {
			return nil, badParam(p.name, "%s %v: want a number in [-2,2]", p.name, *p.v)
		}
		*p.to = float32(*p.v)
	}
	if !a.active() {
		return nil, nil
	}
	return a, nil
}

// tokenLogprob is a token and its log-probability.
type tokenLogprob struct {
	id int32
	lp float64
}

// topLogprobs returns log Σ exp(row) (a token j's log-probability is
// row[j] less it) and the n most likely tokens with their
// log-probabilities (most likely first, lower id on ties).
func topLogprobs(row []float32, n int) (float64, []tokenLogprob) {
	lse := runtime.LogSumExp(row)
	top := make([]tokenLogprob, 0, n)
	for j, x := range row {
		if n == 0 || math.IsNaN(float64(x)) || (len(top) == n && !(float64(x) > top[n-1].lp)) {
			continue
		}
		i := len(top)
		if i == n {
			i--
		} else {
			top = append(top, tokenLogprob{})
		}
		for ; i > 0 && float64(x) > top[i-1].lp; i-- {
			top[i] = top[i-1]
		}
		top[i] = tokenLogprob{int32(j), float64(x)}
	}
	for i := range top {
		top[i].lp -= lse
	}
	return lse, top
}
