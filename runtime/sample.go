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
	idx  []int     // their indices, increasing
	h    logitHeap
	nc   []nucleusCand
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
	if s.o.TopK <= 0 || s.o.TopK >= len(row) {
		return s.nucleus(row) // top_p alone: O(V), no sort
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

// nucleusCand is an entry of the row in Sampler.nucleus: its logit, index
// and weight exp((x - max) / temperature).
type nucleusCand struct {
	w float64
	x float32
	i int32
}

// before orders candidates by decreasing logit, lower index first on ties
// (the order of Sampler.candidates).
func (a nucleusCand) before(b nucleusCand) bool { return a.x > b.x || a.x == b.x && a.i < b.i }

// nucleus draws with TopP and without TopK. It keeps what Next keeps with
// the sorted candidates, the shortest prefix of the row in decreasing order
// of logit whose weights reach TopP of the total, without sorting the row: a
// quickselect finds the last kept entry (expected O(V)), and the kept
// entries are gathered in index order by comparing with it. The sums are
// taken in another order than the sorted loop's, so a prefix whose sum lies
// within rounding (about 1e-16 relative) of the threshold may end one
// entry apart; the draw among the kept entries is the same.
func (s *Sampler) nucleus(row []float32) (int32, error) {
	plain := GenerateOptions{Temperature: s.o.Temperature}
	mx, found := float32(0), false
	for _, x := range row {
		if x == x && (!found || x > mx) {
			mx, found = x, true
		}
	}
	if !found || math.IsInf(float64(mx), 0) {
		return sample(row, plain, s.rng) // all NaN (reported), or an infinite maximum
	}
	s.nc = s.nc[:0]
	var total float64
	for i, x := range row {
		if x == x {
			w := math.Exp((float64(x) - float64(mx)) / s.o.Temperature)
			s.nc = append(s.nc, nucleusCand{w, x, int32(i)})
			total += w
		}
	}
	last := s.nc[nucleusCut(s.nc, s.o.TopP*total)]
	s.mask, s.idx = s.mask[:0], s.idx[:0]
	for i, x := range row {
		if x == x && !last.before(nucleusCand{x: x, i: int32(i)}) { // kept: last or before it
			s.mask = append(s.mask, x)
			s.idx = append(s.idx, i)
		}
	}
	j, err := sample(s.mask, plain, s.rng)
	if err != nil {
		return 0, err
	}
	return int32(s.idx[j]), nil
}

// nucleusCut reorders c and returns the position of the last entry, in
// the order of before, of the shortest prefix whose weights sum to at least
// target (the last entry of all when rounding leaves every prefix short).
func nucleusCut(c []nucleusCand, target float64) int {
	lo, hi := 0, len(c)
	var acc float64 // weight of the entries before lo, all in the prefix
	for rounds := 0; hi-lo > 1; rounds++ {
		if rounds > 64 { // pathological pivots: finish by sorting
			sort.Slice(c[lo:hi], func(a, b int) bool { return c[lo+a].before(c[lo+b]) })
			for k := lo; k < hi; k++ {
				if acc += c[k].w; acc >= target {
					return k
				}
			}
			return hi - 1
		}
		m, better := partition(c, lo, hi)
		switch {
		case acc+better >= target:
			hi = m // the cut is among the entries before the pivot
		case acc+better+c[m].w >= target:
			return m
		default:
			acc += better + c[m].w
			lo = m + 1
		}
	}
	if hi > lo {
		return lo // one entry left: the prefix reaches target with it
	}
	return lo - 1 // rounding left the prefix short: the cut is the last entry before hi
}

// partition reorders c[lo:hi] around a pivot (the median of three
// entries): the entries before it, then it, then the others. It returns the
// pivot's position and the summed weight of the entries before it.
func partition(c []nucleusCand, lo, hi int) (int, float64) {
	a, b, d := lo, lo+(hi-lo)/2, hi-1
	if c[b].before(c[a]) {
		a, b = b, a
	} // c[a] before c[b]
	if c[d].before(c[b]) { // the median is the later of a and d
		b = d
		if c[b].before(c[a]) {
			b = a
		}
	}
	c[b], c[hi-1] = c[hi-1], c[b]
	p := c[hi-1]
	m := lo
	var better float64
	for k := lo; k < hi-1; k++ {
		if c[k].before(p) {
			better += c[k].w
			c[k], c[m] = c[m], c[k]
			m++
		}
	}
	c[m], c[hi-1] = c[hi-1], c[m]
	return m, better
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
