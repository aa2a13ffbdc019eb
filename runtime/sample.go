package runtime

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
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
	mask []float32 // the kept candidates' logits
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
	cand := s.candidates(row)
	if len(cand) == 0 {
		return sample(row, plain, s.rng) // reports the all-NaN row
	}
	mx := float64(cand[0].x)
	if math.IsInf(mx, 0) {
		return sample(row, plain, s.rng)
	}
	// Keep the most likely candidates, the first K cut to the nucleus,
	// and draw among them in index order: as sample would from the row
	// with every other entry NaN, without touching the other entries.
	n := len(cand)
	if s.o.TopP > 0 && s.o.TopP < 1 {
		var total, kept float64
		for _, c := range cand {
			total += math.Exp((float64(c.x) - mx) / s.o.Temperature)
		}
		for k, c := range cand {
			kept += math.Exp((float64(c.x) - mx) / s.o.Temperature)
			if kept >= s.o.TopP*total {
				n = k + 1
				break
			}
		}
	}
	kept := cand[:n]
	sort.Slice(kept, func(a, b int) bool { return kept[a].i < kept[b].i })
	s.mask = s.mask[:0]
	for _, c := range kept {
		s.mask = append(s.mask, c.x)
	}
	j, err := sample(s.mask, plain, s.rng)
	if err != nil {
		return 0, err
	}
	return int32(kept[j].i), nil
}

// candidates returns the non-NaN entries of row in decreasing order of
// logit (lower index first on ties): the TopK most likely when TopK is
// set, else all of them.
func (s *Sampler) candidates(row []float32) []logitAt {
	s.h = s.h[:0]
	k := s.o.TopK
	if k <= 0 || k >= len(row) {
		for i, x := range row {
			if x == x {
				s.h = append(s.h, logitAt{x, i})
			}
		}
		sort.Slice(s.h, func(a, b int) bool { return s.h.Less(a, b) })
		return s.h
	}
	// A min-heap (by likelihood) of the k best so far: one comparison
	// rejects most entries.
	worse := func(a, b logitAt) bool { return a.x < b.x || a.x == b.x && a.i > b.i }
	down := func(j int) {
		for {
			l := 2*j + 1
			if l >= len(s.h) {
				return
			}
			if r := l + 1; r < len(s.h) && worse(s.h[r], s.h[l]) {
				l = r
			}
			if !worse(s.h[l], s.h[j]) {
				return
			}
			s.h[j], s.h[l] = s.h[l], s.h[j]
			j = l
		}
	}
	for i, x := range row {
		if x != x {
			continue
		}
		// Once k are kept, an entry no larger than the worst kept one is
		// worse than it (ties go to the lower index, seen earlier).
		if len(s.h) == k && x <= s.h[0].x {
			continue
		}
		c := logitAt{x, i}
		switch {
		case len(s.h) < k:
			s.h = append(s.h, c)
			for j := len(s.h) - 1; j > 0; {
				p := (j - 1) / 2
				if !worse(s.h[j], s.h[p]) {
					break
				}
				s.h[j], s.h[p] = s.h[p], s.h[j]
				j = p
			}
		case worse(s.h[0], c):
			s.h[0] = c
			down(0)
		}
	}
	sort.Slice(s.h, func(a, b int) bool { return s.h.Less(a, b) })
	return s.h
}

type logitAt struct {
	x float32
	i int
}

// logitHeap holds candidates; Less orders them by decreasing logit, lower
// index first on ties.
type logitHeap []logitAt

func (h logitHeap) Less(a, b int) bool {
	if h[a].x != h[b].x {
		return h[a].x > h[b].x
	}
	return h[a].i < h[b].i
}
