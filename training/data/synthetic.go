package data

import (
	"cmp"
	"fmt"
	"math/rand/v2"
)

// The synthetic corpus's vocabulary. Ids are fixed, whatever the config, so a
// model built with SyntheticVocab fits every configuration.
const (
	// SyntheticVocab is the vocabulary size of the synthetic corpus.
	SyntheticVocab = 512
	// SynBOS starts every sequence.
	SynBOS int32 = 0
	// SynSet introduces a statement "SynSet key value".
	SynSet int32 = 1
	// SynAsk introduces a query "SynAsk key value"; value is the answer.
	SynAsk int32 = 2
	// SynKeyBase is the first key id; keys are SynKeyBase .. SynKeyBase+Keys-1.
	SynKeyBase int32 = 16
	// SynMaxKeys bounds SyntheticConfig.Keys.
	SynMaxKeys = 96
	// SynValueBase is the first value id.
	SynValueBase int32 = 112
	// SynMaxValues bounds SyntheticConfig.Values.
	SynMaxValues = 144
	// SynFillerBase is the first filler ("ordinary text") id; filler ids run
	// up to SyntheticVocab-1.
	SynFillerBase int32 = 256
	// SynFillers is the number of filler ids.
	SynFillers = SyntheticVocab - int(SynFillerBase)
)

// SyntheticConfig shapes the synthetic corpus. Zero fields take the defaults
// given with each field.
//
// Each sequence is SeqLen tokens: SynBOS, then filler text (a fixed random
// bigram language over the filler ids) into which Pairs statements
// "SynSet k v" (distinct keys k, random values v) are placed early, and, much
// later, one query "SynAsk k v" per statement, in random order. Predicting the
// v of a query requires recalling the statement at least MinGap tokens back;
// nothing else in the sequence reveals it (chance level is 1/Values).
type SyntheticConfig struct {
	SeqLen int // tokens per sequence, SynBOS included; default 256
	Pairs  int // statements (and queries) per sequence; default 4
	Keys   int // distinct keys, at most SynMaxKeys; default 64
	Values int // distinct values, at most SynMaxValues; default 128
	MinGap int // least distance from a statement's start to its query's start; default SeqLen/2
	// Grammar seeds the filler bigram language; it is shared by the train
	// and eval streams of a SyntheticCorpus. Default 0 is a valid seed.
	Grammar uint64
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SyntheticConfig) WithDefaults() SyntheticConfig {
	c.SeqLen = cmp.Or(c.SeqLen, 256)
	c.Pairs = cmp.Or(c.Pairs, 4)
	c.Keys = cmp.Or(c.Keys, 64)
	c.Values = cmp.Or(c.Values, 128)
	c.MinGap = cmp.Or(c.MinGap, c.SeqLen/2)
	return c
}

// regionWidth is the width of the statement region at the start of a
// sequence (after SynBOS) and of the query region at its end; with this
// width every query starts at least MinGap after its statement, and the two
// regions do not overlap.
func (c SyntheticConfig) regionWidth() int { return min((c.SeqLen+2-c.MinGap)/2, (c.SeqLen-1)/2) }

// Validate reports a configuration that cannot be generated (after defaults).
func (c SyntheticConfig) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.SeqLen < 8:
		return fmt.Errorf("synthetic corpus: SeqLen %d, need at least 8", c.SeqLen)
	case c.Pairs < 1:
		return fmt.Errorf("synthetic corpus: Pairs %d, need at least 1", c.Pairs)
	case c.Keys < c.Pairs || c.Keys > SynMaxKeys:
		return fmt.Errorf("synthetic corpus: Keys %d, need Pairs (%d) to %d", c.Keys, c.Pairs, SynMaxKeys)
	case c.Values < 2 || c.Values > SynMaxValues:
		return fmt.Errorf("synthetic corpus: Values %d, need 2 to %d", c.Values, SynMaxValues)
	case c.MinGap < 1:
		return fmt.Errorf("synthetic corpus: MinGap %d, need at least 1", c.MinGap)
	}
	if w := c.regionWidth(); w < 3*c.Pairs {
		return fmt.Errorf("synthetic corpus: %d pairs (3 tokens each) with MinGap %d do not fit in SeqLen %d: "+
			"lower Pairs or MinGap, or raise SeqLen", c.Pairs, c.MinGap, c.SeqLen)
	}
	return nil
}

// AnswerStream is a token stream whose recall is scored at marked
// positions: the generated corpora (synthetic, MQAR) share it.
type AnswerStream struct {
	// IDs holds whole sequences of the corpus's SeqLen tokens followed by
	// one final BOS, so that with T = SeqLen (or a multiple) every sequence
	// is exactly one evaluation chunk (see EvalChunks).
	IDs []int32
	// Answers[p] marks IDs[p] as the value of a query: the positions whose
	// prediction measures recall.
	Answers []bool
}

// SyntheticStream is one generated token stream.
type SyntheticStream struct {
	Config SyntheticConfig // with defaults applied
	Seed   int64
	AnswerStream
}

// SyntheticCorpus is a pair of streams from the same language with
// different seeds.
type SyntheticCorpus = Corpus[SyntheticStream]

// NewSyntheticCorpus generates a train stream with seed and an eval stream
// with a seed derived from it, never equal to it.
func NewSyntheticCorpus(seed int64, trainTokens, evalTokens int, cfg SyntheticConfig) (*SyntheticCorpus, error) {
	return newCorpus(seed, trainTokens, evalTokens, cfg, Synthetic)
}

// Corpus is a train and an eval stream of a generated corpus: the same
// configuration, different seeds.
type Corpus[S any] struct {
	Train, Eval *S
}

// newCorpus generates a train stream with seed and an eval stream with
// EvalSeed(seed), both with gen.
func newCorpus[S, C any](seed int64, trainTokens, evalTokens int, cfg C, gen func(int64, int, C) (*S, error)) (*Corpus[S], error) {
	train, err := gen(seed, trainTokens, cfg)
	if err != nil {
		return nil, err
	}
	eval, err := gen(EvalSeed(seed), evalTokens, cfg)
	if err != nil {
		return nil, err
	}
	return &Corpus[S]{Train: train, Eval: eval}, nil
}

// EvalSeed returns the eval stream's seed for a corpus seed.
func EvalSeed(seed int64) int64 { return seed ^ 0x5eed_e7a1_0000_0001 }

// sequenceCount returns the number of whole seqLen-token sequences of a
// stream of at least nTokens tokens (with its final BOS): the smallest, at
// least one; the error names the corpus by prefix.
func sequenceCount(prefix string, nTokens, seqLen int) (int, error) {
	if nTokens < 0 {
		return 0, fmt.Errorf("%s: nTokens %d is negative", prefix, nTokens)
	}
	return max(1, (nTokens-1+seqLen-1)/seqLen), nil
}

// Synthetic generates a stream of at least nTokens tokens: the smallest
// number (at least one) of whole sequences that, with the final SynBOS, reach
// nTokens. It is a pure function of its arguments.
func Synthetic(seed int64, nTokens int, cfg SyntheticConfig) (*SyntheticStream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	nSeq, err := sequenceCount("synthetic corpus", nTokens, cfg.SeqLen)
	if err != nil {
		return nil, err
	}
	g := newGrammar(cfg.Grammar)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x73796e7468657469))
	s := &SyntheticStream{Config: cfg, Seed: seed, AnswerStream: AnswerStream{
		IDs: make([]int32, 0, nSeq*cfg.SeqLen+1), Answers: make([]bool, nSeq*cfg.SeqLen+1)}}
	for range nSeq {
		s.IDs = appendSequence(s.IDs, s.Answers, cfg, g, rng)
	}
	s.IDs = append(s.IDs, SynBOS)
	return s, nil
}

// grammar is a bigram language over the filler ids: each filler has a few
// likely successors.
type grammar struct {
	next [SynFillers][4]int32
}

func newGrammar(seed uint64) *grammar {
	r := rand.New(rand.NewPCG(seed, 0x6772616d6d6172))
	g := &grammar{}
	for i := range g.next {
		for j := range g.next[i] {
			g.next[i][j] = SynFillerBase + int32(r.IntN(SynFillers))
		}
	}
	return g
}

// filler returns the filler token after prev (a filler id, or anything else
// at the start of a run).
func (g *grammar) filler(prev int32, rng *rand.Rand) int32 {
	if prev < SynFillerBase || rng.IntN(10) == 0 {
		return SynFillerBase + int32(rng.IntN(SynFillers))
	}
	// successors weighted 4:2:1:1
	k := [8]int{0, 0, 0, 0, 1, 1, 2, 3}[rng.IntN(8)]
	return g.next[prev-SynFillerBase][k]
}

// placeSlots returns n sorted, non-overlapping 3-token slot offsets in
// [0, width-3], uniformly among such placements.
func placeSlots(n, width int, rng *rand.Rand) []int {
	free := width - 3*n // spare tokens
	// choose n distinct values of [0, free+n), sorted; offset i = c_i + 2i
	c := rng.Perm(free + n)[:n]
	sortInts(c)
	for i := range c {
		c[i] += 2 * i
	}
	return c
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func appendSequence(ids []int32, answers []bool, cfg SyntheticConfig, g *grammar, rng *rand.Rand) []int32 {
	base := len(ids)
	L, w := cfg.SeqLen, cfg.regionWidth()
	seq := make([]int32, L)
	fixed := make([]bool, L)
	seq[0], fixed[0] = SynBOS, true

	keys := rng.Perm(cfg.Keys)[:cfg.Pairs]
	vals := make([]int32, cfg.Pairs)
	for i := range vals {
		vals[i] = SynValueBase + int32(rng.IntN(cfg.Values))
	}
	put := func(p int, marker int32, pair int) {
		seq[p], seq[p+1], seq[p+2] = marker, SynKeyBase+int32(keys[pair]), vals[pair]
		fixed[p], fixed[p+1], fixed[p+2] = true, true, true
	}
	for i, off := range placeSlots(cfg.Pairs, w, rng) {
		put(1+off, SynSet, i)
	}
	order := rng.Perm(cfg.Pairs)
	for i, off := range placeSlots(cfg.Pairs, w, rng) {
		p := L - w + off
		put(p, SynAsk, order[i])
		answers[base+p+2] = true
	}
	prev := SynBOS
	for p := range L {
		if !fixed[p] {
			seq[p] = g.filler(prev, rng)
		}
		prev = seq[p]
	}
	return append(ids, seq...)
}

// AnswerMask returns the answer marks of the targets of the chunk whose
// first input token is IDs[start]: element j marks target IDs[start+1+j],
// for n targets. With EvalChunks over IDs, chunk i has start i*T.
func (s *AnswerStream) AnswerMask(start, n int) []bool {
	lo, hi := start+1, start+1+n
	out := make([]bool, n)
	if lo < len(s.Answers) {
		copy(out, s.Answers[lo:min(hi, len(s.Answers))])
	}
	return out
}

// NumAnswers returns the number of answer positions in the stream.
func (s *AnswerStream) NumAnswers() int {
	n := 0
	for _, a := range s.Answers {
		if a {
			n++
		}
	}
	return n
}

// Recall counts correct predictions at answer positions.
type Recall struct {
	Correct, Total int
}

// Accuracy returns Correct/Total, or 0 when Total is 0.
func (r Recall) Accuracy() float64 {
	if r.Total == 0 {
		return 0
	}
	return float64(r.Correct) / float64(r.Total)
}

// Add returns the sum of two counts.
func (r Recall) Add(o Recall) Recall {
	return Recall{r.Correct + o.Correct, r.Total + o.Total}
}

// RecallAccuracy scores next-token predictions only where mask is set: pred[j]
// is the model's argmax at input position j, targets[j] the true next token
// (a Batch's Y) and mask[j] whether targets[j] is an answer (AnswerMask). The
// three slices are aligned element by element (any [B,T] layout works).
func RecallAccuracy(pred, targets []int32, mask []bool) (Recall, error) {
	if len(pred) != len(targets) || len(mask) != len(targets) {
		return Recall{}, fmt.Errorf("recall: %d predictions, %d targets and %d mask entries; they must be equal",
			len(pred), len(targets), len(mask))
	}
	var r Recall
	for j, m := range mask {
		if m {
			r.Total++
			if pred[j] == targets[j] {
				r.Correct++
			}
		}
	}
	return r, nil
}

// BatchAnswerMask returns the [B,T] answer mask of evaluation batch k of eb
// over this stream's IDs (eb must have been built on s.IDs).
func (s *AnswerStream) BatchAnswerMask(eb *EvalBatcher, k int) []bool {
	t, b := eb.chunks.t, eb.b
	out := make([]bool, 0, b*t)
	for r := range b {
		out = append(out, s.AnswerMask(eb.chunks.Start(k*b+r), t)...)
	}
	return out
}
