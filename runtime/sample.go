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
// TopP it draws exactly as Generate does (Generate draws with one), so the
// same seed, TopK and logits give the same tokens. A Sampler is not safe
// for concurrent use.
type Sampler struct {
	o    SampleOptions
	rng  *rand.Rand
	mask []float32 // the kept candidates' logits
	idx  []int     // their indices, increasing
	nc   []nucleusCand
	// compared counts the comparisons of entries the last draw's selection
	// and sorting made (the bound TestTopKLinear checks).
	compared int
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
	filter := s.o.Temperature > 0 && ((s.o.TopK > 0 && s.o.TopK < len(row)) || (s.o.TopP > 0 && s.o.TopP < 1))
	if !filter {
		return sample(row, s.o.Temperature, s.rng)
	}
	if s.o.TopK <= 0 || s.o.TopK >= len(row) {
		return s.nucleus(row) // top_p alone: O(V), no sort
	}
	return s.topK(row)
}

// sortedCutLimit is the largest TopK whose candidates topK sorts to cut
// them to TopP, summing in decreasing order of logit; above it, the cut is
// nucleusCut's, in O(K).
const sortedCutLimit = 1024

// topK draws with TopK (below the vocabulary size) and, when set, TopP. It
// keeps the TopK most likely entries (decreasing logit, lower index first
// on ties), cut to the shortest prefix whose weights reach TopP of theirs,
// and draws among them in index order: as sample would from the row with
// every other entry NaN. A heap keeps the K best up to heapLimit (one
// comparison rejects most entries; at most about 2 log2 K per entry), a
// selection finds the K-th entry above it, in expected O(V) whatever K is;
// only with TopP and K up to sortedCutLimit are the kept entries sorted.
func (s *Sampler) topK(row []float32) (int32, error) {
	var mx float32
	var found bool
	if s.o.TopK <= heapLimit {
		mx, found = s.heapTopK(row)
	} else {
		mx, found = s.gather(row)
	}
	if !found || math.IsInf(float64(mx), 0) {
		return sample(row, s.o.Temperature, s.rng) // all NaN (reported), or an infinite maximum
	}
	k := min(s.o.TopK, len(s.nc))
	if s.o.TopK > heapLimit {
		s.compared += selectNth(s.nc, k-1)
	}
	kept := s.nc[:k]
	last := kept[0] // the heap's root: its least likely entry
	if s.o.TopK > heapLimit {
		last = kept[k-1]
	}
	if s.o.TopP > 0 && s.o.TopP < 1 {
		var total float64
		for j := range kept {
			kept[j].w = math.Exp((float64(kept[j].x) - float64(mx)) / s.o.Temperature)
			total += kept[j].w
		}
		last = kept[s.cut(kept, s.o.TopP*total)]
	}
	return s.drawThrough(row, last)
}

// cut returns the position in c, reordered, of the last entry of the
// shortest prefix in decreasing order of logit whose weights reach target:
// by sorting and summing in that order up to sortedCutLimit entries, else by
// nucleusCut.
func (s *Sampler) cut(c []nucleusCand, target float64) int {
	if len(c) > sortedCutLimit {
		return nucleusCut(c, target, &s.compared)
	}
	sort.Slice(c, func(a, b int) bool { s.compared++; return c[a].before(c[b]) })
	var acc float64
	for j := range c {
		if acc += c[j].w; acc >= target {
			return j
		}
	}
	return len(c) - 1
}

// heapLimit is the largest TopK whose most likely entries topK keeps in a
// heap rather than by a selection.
const heapLimit = 64

// heapTopK fills s.nc with a min-heap (by likelihood) of the TopK most
// likely non-NaN entries of row (all of them when fewer), without weights,
// and returns their maximum (found false when there is none).
func (s *Sampler) heapTopK(row []float32) (mx float32, found bool) {
	s.nc, s.compared = s.nc[:0], len(row) // one comparison per entry, and the sifts
	k := s.o.TopK
	worse := func(a, b nucleusCand) bool { s.compared++; return b.before(a) }
	for i, x := range row {
		if x != x {
			continue
		}
		if !found || x > mx {
			mx, found = x, true
		}
		// Once k are kept, an entry no larger than the worst kept one is
		// worse than it (ties go to the lower index, seen earlier).
		if len(s.nc) == k && x <= s.nc[0].x {
			continue
		}
		c := nucleusCand{x: x, i: int32(i)}
		if len(s.nc) < k {
			s.nc = append(s.nc, c)
			siftUp(s.nc, len(s.nc)-1, worse)
		} else {
			s.nc[0] = c
			siftDown(s.nc, 0, worse)
		}
	}
	return mx, found
}

// siftUp moves h[j] up the heap ordered by less (least at the root).
func siftUp(h []nucleusCand, j int, less func(a, b nucleusCand) bool) {
	for j > 0 {
		p := (j - 1) / 2
		if !less(h[j], h[p]) {
			return
		}
		h[j], h[p] = h[p], h[j]
		j = p
	}
}

// siftDown moves h[j] down the heap ordered by less (least at the root).
func siftDown(h []nucleusCand, j int, less func(a, b nucleusCand) bool) {
	for {
		l := 2*j + 1
		if l >= len(h) {
			return
		}
		if r := l + 1; r < len(h) && less(h[r], h[l]) {
			l = r
		}
		if !less(h[l], h[j]) {
			return
		}
		h[j], h[l] = h[l], h[j]
		j = l
	}
}

// gather fills s.nc with the non-NaN entries of row (weights unset),
// starts s.compared at zero, and returns their maximum (found false when
// there is none).
func (s *Sampler) gather(row []float32) (mx float32, found bool) {
	s.nc, s.compared = s.nc[:0], 0
	for i, x := range row {
		if x == x {
			s.nc = append(s.nc, nucleusCand{x: x, i: int32(i)})
			if !found || x > mx {
				mx, found = x, true
			}
		}
	}
	return mx, found
}

// drawThrough draws, in index order, among the non-NaN entries of row that
// are last or before it.
func (s *Sampler) drawThrough(row []float32, last nucleusCand) (int32, error) {
	s.mask, s.idx = s.mask[:0], s.idx[:0]
	for i, x := range row {
		if x == x && !last.before(nucleusCand{x: x, i: int32(i)}) {
			s.mask = append(s.mask, x)
			s.idx = append(s.idx, i)
		}
	}
	j, err := sample(s.mask, s.o.Temperature, s.rng)
	if err != nil {
		return 0, err
	}
	return int32(s.idx[j]), nil
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
	mx, found := s.gather(row)
	if !found || math.IsInf(float64(mx), 0) {
		return sample(row, s.o.Temperature, s.rng) // all NaN (reported), or an infinite maximum
	}
	var total float64
	for j := range s.nc {
		s.nc[j].w = math.Exp((float64(s.nc[j].x) - float64(mx)) / s.o.Temperature)
		total += s.nc[j].w
	}
	return s.drawThrough(row, s.nc[nucleusCut(s.nc, s.o.TopP*total, &s.compared)])
}

// nucleusCut reorders c and returns the position of the last entry, in
// the order of before, of the shortest prefix whose weights sum to at least
// target (the last entry of all when rounding leaves every prefix short).
// It adds the comparisons it makes to *compared.
func nucleusCut(c []nucleusCand, target float64, compared *int) int {
	lo, hi := 0, len(c)
	var acc float64 // weight of the entries before lo, all in the prefix
	for rounds := 0; hi-lo > 1; rounds++ {
		if rounds > 64 { // pathological pivots: finish by sorting
			sort.Slice(c[lo:hi], func(a, b int) bool { *compared++; return c[lo+a].before(c[lo+b]) })
			for k := lo; k < hi; k++ {
				if acc += c[k].w; acc >= target {
					return k
				}
			}
			return hi - 1
		}
		*compared += hi - lo
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

// selectNth reorders c so that c[n] is the entry that would be there were
// c sorted by before, with the entries before it ahead of it and the others
// after it (a quickselect, expected O(len(c))). It returns the number of
// comparisons it made: about 2-4 len(c) unless the pivots are
// pathological, when it finishes by sorting the rest.
func selectNth(c []nucleusCand, n int) (scanned int) {
	lo, hi := 0, len(c)
	for rounds := 0; hi-lo > 1; rounds++ {
		if rounds > 64 {
			sort.Slice(c[lo:hi], func(a, b int) bool { scanned++; return c[lo+a].before(c[lo+b]) })
			return scanned
		}
		scanned += hi - lo
		m, _ := partition(c, lo, hi)
		switch {
		case n < m:
			hi = m
		case n > m:
			lo = m + 1
		default:
			return scanned
		}
	}
	return scanned
}
