package runtime

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
)

// SampleOptions choose how a Sampler draws the next token from a row of
// logits.
type SampleOptions struct {
	// Temperature divides the logits; 0 (or less) is greedy decoding
	// (argmax, lower id on ties), which ignores TopK and TopP.
	Temperature float64
	// TopK keeps only the K most likely tokens (0: all).
	TopK int
	// TopP keeps the smallest set of most likely tokens (after TopK) whose
	// probabilities, at Temperature, sum to at least TopP (nucleus
	// sampling); 0 or 1 keeps them all.
	TopP float64
}

// Validate checks the options' ranges.
func (o SampleOptions) Validate() error {
	switch {
	case math.IsNaN(o.Temperature) || math.IsInf(o.Temperature, 0):
		return fmt.Errorf("temperature %v is not a finite number", o.Temperature)
	case o.TopK < 0:
		return fmt.Errorf("top_k %d is negative", o.TopK)
	case math.IsNaN(o.TopP) || o.TopP < 0 || o.TopP > 1:
		return fmt.Errorf("top_p %v is outside [0,1]", o.TopP)
	}
	return nil
}

// Sampler draws tokens one at a time from a seeded generator. Without
// TopK and TopP it draws exactly as Generate does, so the same seed and
// logits give the same tokens. A Sampler is not safe for concurrent use.
type Sampler struct {
	o    SampleOptions
	rng  *rand.Rand
	mask []float32
	h    logitHeap
}

// NewSampler returns a sampler for o seeded with seed.
func NewSampler(o SampleOptions, seed uint64) (*Sampler, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	return &Sampler{o: o, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, nil
}

// Next draws a token from row (NaN logits are never drawn).
func (s *Sampler) Next(row []float32) (int32, error) {
	plain := GenerateOptions{Temperature: s.o.Temperature}
	filter := s.o.Temperature > 0 && ((s.o.TopK > 0 && s.o.TopK < len(row)) || (s.o.TopP > 0 && s.o.TopP < 1))
	if !filter {
		return sample(row, plain, s.rng)
	}
	// Keep the candidates in a max-heap by logit; pop the K (or nucleus)
	// most likely into mask and leave every other entry NaN, which sample
	// ignores.
	s.h = s.h[:0]
	for i, x := range row {
		if x == x {
			s.h = append(s.h, logitAt{x, i})
		}
	}
	if len(s.h) == 0 {
		return sample(row, plain, s.rng) // reports the all-NaN row
	}
	heap.Init(&s.h)
	mx := float64(s.h[0].x)
	if math.IsInf(mx, 0) {
		return sample(row, plain, s.rng)
	}
	var total float64
	if s.o.TopP > 0 && s.o.TopP < 1 {
		for _, c := range s.h {
			total += math.Exp((float64(c.x) - mx) / s.o.Temperature)
		}
	}
	if cap(s.mask) < len(row) {
		s.mask = make([]float32, len(row))
	}
	s.mask = s.mask[:len(row)]
	nan := float32(math.NaN())
	for i := range s.mask {
		s.mask[i] = nan
	}
	k := len(s.h)
	if s.o.TopK > 0 {
		k = min(k, s.o.TopK)
	}
	var kept float64
	for n := 0; n < k; n++ {
		c := heap.Pop(&s.h).(logitAt)
		s.mask[c.i] = c.x
		if total > 0 {
			kept += math.Exp((float64(c.x) - mx) / s.o.Temperature)
			if kept >= s.o.TopP*total {
				break
			}
		}
	}
	return sample(s.mask, plain, s.rng)
}

type logitAt struct {
	x float32
	i int
}

// logitHeap is a max-heap by logit, lower index first on ties.
type logitHeap []logitAt

func (h logitHeap) Len() int { return len(h) }
func (h logitHeap) Less(a, b int) bool {
	if h[a].x != h[b].x {
		return h[a].x > h[b].x
	}
	return h[a].i < h[b].i
}
func (h logitHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *logitHeap) Push(x any)   { *h = append(*h, x.(logitAt)) }
func (h *logitHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
