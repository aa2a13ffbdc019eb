package data

import (
	"cmp"
	"fmt"
	"math/rand/v2"
)

// The MQAR corpus's fixed ids; keys and values follow, their ranges set by
// MQARConfig.Vocab (see MQARConfig.KeyBase and ValueBase).
const (
	// MQARBOS starts every sequence.
	MQARBOS int32 = 0
	// MQARBlank fills the query region between queries.
	MQARBlank int32 = 1
	// mqarFirstKey is the first key id.
	mqarFirstKey int32 = 2
	// MQARMaxVocab bounds MQARConfig.Vocab.
	MQARMaxVocab = 1 << 16
)

// MQARDraw says which pairs a sequence's queries ask for.
type MQARDraw string

const (
	// MQARDrawEach queries every pair once, in random order (the default).
	// A model that only remembers which values were already asked for
	// answers the last query of a sequence right without matching keys
	// ("elimination").
	MQARDrawEach MQARDraw = "each"
	// MQARDrawRandom draws each query's pair uniformly at random, with
	// replacement: a pair may be asked for twice or not at all, so the
	// values already asked for tell nothing about the next answer and only
	// matching the query's key to its pair scores above 1/Pairs.
	MQARDrawRandom MQARDraw = "random"
)

// Phrase says what d does, for protocol lines.
func (d MQARDraw) Phrase() string {
	if d == MQARDrawRandom {
		return "queries drawn at random with replacement"
	}
	return "each pair queried once"
}

// ParseMQARDraw checks a draw's name ("" is MQARDrawEach).
func ParseMQARDraw(s string) (MQARDraw, error) {
	switch d := MQARDraw(s); d {
	case "", MQARDrawEach:
		return MQARDrawEach, nil
	case MQARDrawRandom:
		return d, nil
	}
	return "", fmt.Errorf("mqar: draw %q: choose %s or %s", s, MQARDrawEach, MQARDrawRandom)
}

// MQARConfig shapes the multi-query associative recall corpus (MQAR, after
// Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient
// Language Models"). Zero fields take the defaults given with each field.
//
// Each sequence is SeqLen tokens: MQARBOS, then Pairs key-value pairs
// "k v" (distinct keys, random values) back to back, then the query region:
// MQARBlank tokens into which Pairs queries "k v" are placed: one per pair
// in random order, or pairs drawn at random (Draw). The distance of a query
// (from its pair's key to the query's key) lies in [MinDist, MaxDist]. Predicting the v of a query requires recalling
// the pair; nothing else in the sequence reveals it. The vocabulary is
// MQARBOS, MQARBlank, then (Vocab-2)/2 key ids and the rest value ids
// (chance level 1/Values()).
type MQARConfig struct {
	SeqLen  int      `json:"seq_len"`        // tokens per sequence, MQARBOS included; default 128
	Pairs   int      `json:"pairs"`          // key-value pairs (and queries) per sequence; default 8
	Vocab   int      `json:"vocab"`          // vocabulary size; default 256
	MinDist int      `json:"min_dist"`       // least distance from a pair's key to its query's key; default 1 (no bound)
	MaxDist int      `json:"max_dist"`       // most distance; default SeqLen (no bound)
	Draw    MQARDraw `json:"draw,omitempty"` // which pairs the queries ask for; default MQARDrawEach
}

// WithDefaults returns c with zero fields set to their defaults.
func (c MQARConfig) WithDefaults() MQARConfig {
	c.SeqLen = cmp.Or(c.SeqLen, 128)
	c.Pairs = cmp.Or(c.Pairs, 8)
	c.Vocab = cmp.Or(c.Vocab, 256)
	c.MinDist = cmp.Or(c.MinDist, 1)
	c.MaxDist = cmp.Or(c.MaxDist, c.SeqLen)
	c.Draw = cmp.Or(c.Draw, MQARDrawEach)
	return c
}

// Keys is the number of key ids.
func (c MQARConfig) Keys() int { return (c.WithDefaults().Vocab - 2) / 2 }

// Values is the number of value ids (chance level is 1/Values).
func (c MQARConfig) Values() int { c = c.WithDefaults(); return c.Vocab - 2 - c.Keys() }

// KeyBase is the first key id.
func (c MQARConfig) KeyBase() int32 { return mqarFirstKey }

// ValueBase is the first value id.
func (c MQARConfig) ValueBase() int32 { return mqarFirstKey + int32(c.Keys()) }

// keyPos is the position of pair i's key in its sequence.
func mqarKeyPos(i int) int { return 1 + 2*i }

// queryStart is the first position of the query region.
func (c MQARConfig) queryStart() int { return 1 + 2*c.Pairs }

// window returns the start positions [lo, hi] allowed to pair i's query.
func (c MQARConfig) window(i int) (lo, hi int) {
	k := mqarKeyPos(i)
	return max(c.queryStart(), k+c.MinDist), min(c.SeqLen-2, k+c.MaxDist)
}

// Validate reports a configuration that cannot be generated (after
// defaults): among others, one where some pair's distance window could be
// filled by the other queries.
func (c MQARConfig) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.SeqLen < 4:
		return fmt.Errorf("mqar: seq_len %d, need at least 4", c.SeqLen)
	case c.Pairs < 1:
		return fmt.Errorf("mqar: pairs %d, need at least 1", c.Pairs)
	case c.Vocab < 6 || c.Vocab > MQARMaxVocab:
		return fmt.Errorf("mqar: vocab %d, need 6 to %d", c.Vocab, MQARMaxVocab)
	case c.Pairs > c.Keys():
		return fmt.Errorf("mqar: %d pairs need as many distinct keys; vocab %d has %d (raise vocab to at least %d)",
			c.Pairs, c.Vocab, c.Keys(), 2*c.Pairs+2)
	case c.MinDist < 1 || c.MaxDist < c.MinDist:
		return fmt.Errorf("mqar: distances [%d, %d]: need 1 ≤ min_dist ≤ max_dist", c.MinDist, c.MaxDist)
	}
	if _, err := ParseMQARDraw(string(c.Draw)); err != nil {
		return err
	}
	// A placed query blocks at most 3 start positions of another (its own
	// and the one either side), so a window of 3(Pairs-1)+1 starts always
	// has room left.
	need := 3*(c.Pairs-1) + 1
	for i := range c.Pairs {
		if lo, hi := c.window(i); hi-lo+1 < need {
			return fmt.Errorf("mqar: pair %d (key at %d) has %d query positions at distance [%d, %d] within seq_len %d, "+
				"need %d for %d pairs: widen the distances, lower pairs or raise seq_len",
				i, mqarKeyPos(i), max(0, hi-lo+1), c.MinDist, c.MaxDist, c.SeqLen, need, c.Pairs)
		}
	}
	return nil
}

// MQARStream is one generated MQAR token stream.
type MQARStream struct {
	Config MQARConfig // with defaults applied
	Seed   int64
	AnswerStream
	// Distances[p] is, at an answer position p, the distance from the
	// query's key back to its pair's key (0 elsewhere).
	Distances []int32
}

// MQARCorpus is a train and an eval stream of the same configuration with
// different seeds.
type MQARCorpus = Corpus[MQARStream]

// NewMQARCorpus generates a train stream with seed and an eval stream with
// EvalSeed(seed).
func NewMQARCorpus(seed int64, trainTokens, evalTokens int, cfg MQARConfig) (*MQARCorpus, error) {
	return newCorpus(seed, trainTokens, evalTokens, cfg, MQAR)
}

// MQAR generates a stream of at least nTokens tokens: the smallest number
// (at least one) of whole sequences that, with the final MQARBOS, reach
// nTokens. It is a pure function of its arguments.
func MQAR(seed int64, nTokens int, cfg MQARConfig) (*MQARStream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	nSeq, err := sequenceCount("mqar", nTokens, cfg.SeqLen)
	if err != nil {
		return nil, err
	}
	n := nSeq*cfg.SeqLen + 1
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6d7161722d7a6f6f))
	s := &MQARStream{Config: cfg, Seed: seed, AnswerStream: AnswerStream{IDs: make([]int32, n), Answers: make([]bool, n)},
		Distances: make([]int32, n)}
	cand := make([]int, 0, cfg.SeqLen)
	for q := range nSeq {
		s.fill(q*cfg.SeqLen, rng, cand)
	}
	s.IDs[n-1] = MQARBOS
	return s, nil
}

// fill writes one sequence at base.
func (s *MQARStream) fill(base int, rng *rand.Rand, cand []int) {
	c := s.Config
	seq := s.IDs[base : base+c.SeqLen]
	seq[0] = MQARBOS
	for p := c.queryStart(); p < c.SeqLen; p++ {
		seq[p] = MQARBlank
	}
	keys := rng.Perm(c.Keys())[:c.Pairs]
	vals := make([]int32, c.Pairs)
	for i := range c.Pairs {
		vals[i] = c.ValueBase() + int32(rng.IntN(c.Values()))
		seq[mqarKeyPos(i)], seq[mqarKeyPos(i)+1] = c.KeyBase()+int32(keys[i]), vals[i]
	}
	for _, i := range c.queried(rng) {
		lo, hi := c.window(i)
		cand = cand[:0]
		for q := lo; q <= hi; q++ {
			if seq[q] == MQARBlank && seq[q+1] == MQARBlank {
				cand = append(cand, q)
			}
		}
		q := cand[rng.IntN(len(cand))] // never empty: Validate
		seq[q], seq[q+1] = seq[mqarKeyPos(i)], vals[i]
		s.Answers[base+q+1] = true
		s.Distances[base+q+1] = int32(q - mqarKeyPos(i))
	}
}

// queried returns the pairs a sequence's queries ask for, in the order
// they are placed.
func (c MQARConfig) queried(rng *rand.Rand) []int {
	if c.Draw != MQARDrawRandom {
		return rng.Perm(c.Pairs)
	}
	picks := make([]int, c.Pairs)
	for j := range picks {
		picks[j] = rng.IntN(c.Pairs)
	}
	return picks
}
