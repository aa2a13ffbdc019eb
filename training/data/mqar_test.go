package data

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/ir"
)

func TestMQARConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  MQARConfig
		want string // "" = valid
	}{
		{"defaults", MQARConfig{}, ""},
		{"short distances", MQARConfig{SeqLen: 64, Pairs: 4, Vocab: 64, MinDist: 8, MaxDist: 24}, ""},
		{"long distances", MQARConfig{SeqLen: 512, Pairs: 16, MinDist: 256, MaxDist: 480}, ""},
		{"seq too short", MQARConfig{SeqLen: 3}, "seq_len 3"},
		{"no pairs", MQARConfig{Pairs: -1}, "pairs -1"},
		{"vocab too small", MQARConfig{Vocab: 5}, "vocab 5"},
		{"too few keys", MQARConfig{Vocab: 10, Pairs: 8}, "distinct keys"},
		{"inverted distances", MQARConfig{MinDist: 20, MaxDist: 10}, "min_dist"},
		{"window too narrow", MQARConfig{SeqLen: 64, Pairs: 8, MinDist: 30, MaxDist: 34}, "query positions"},
		{"pairs do not fit", MQARConfig{SeqLen: 32, Pairs: 12}, "query positions"},
		{"random draw", MQARConfig{SeqLen: 64, Pairs: 8, MinDist: 1, MaxDist: 64, Draw: MQARDrawRandom}, ""},
		{"unknown draw", MQARConfig{Draw: "sometimes"}, `draw "sometimes"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := MQAR(1, 10000, tc.cfg); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error mentioning %q", err, tc.want)
			}
			if _, err := MQAR(1, 1000, tc.cfg); err == nil {
				t.Fatal("MQAR generated an invalid configuration")
			}
		})
	}
}

func TestMQARDeterminism(t *testing.T) {
	cfg := MQARConfig{SeqLen: 96, Pairs: 6, Vocab: 128}
	a, err := MQAR(7, 5000, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := MQAR(7, 5000, cfg)
	if !slices.Equal(a.IDs, b.IDs) || !slices.Equal(a.Answers, b.Answers) || !slices.Equal(a.Distances, b.Distances) {
		t.Fatal("the same seed gave two different streams")
	}
	// The streams of the runs docs/RESULTS.md reports must not change:
	// this is the FNV-1a hash of this stream's ids as first generated.
	h := fnv.New64a()
	if err := binary.Write(h, binary.LittleEndian, a.IDs); err != nil {
		t.Fatal(err)
	}
	if got := h.Sum64(); got != 0x13d0b4c42399ea24 {
		t.Fatalf("the stream of seed 7 changed: ids hash to %#x", got)
	}
	c, _ := MQAR(8, 5000, cfg)
	if slices.Equal(a.IDs, c.IDs) {
		t.Fatal("seeds 7 and 8 gave the same stream")
	}
	corp, err := NewMQARCorpus(7, 5000, 2000, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(corp.Train.IDs, a.IDs) || slices.Equal(corp.Eval.IDs[:1000], corp.Train.IDs[:1000]) {
		t.Fatal("the corpus's train stream is not MQAR(seed) or its eval stream repeats it")
	}
}

// TestMQARStructure checks every sequence: the layout, each query's answer
// is the value its key was paired with earlier, and every distance lies in
// [MinDist, MaxDist].
func TestMQARStructure(t *testing.T) {
	for _, cfg := range []MQARConfig{
		{},
		{SeqLen: 64, Pairs: 4, Vocab: 64, MinDist: 8, MaxDist: 24},
		{SeqLen: 256, Pairs: 16, Vocab: 300, MinDist: 100, MaxDist: 200},
		{SeqLen: 40, Pairs: 2, Vocab: 6},
		{SeqLen: 64, Pairs: 4, Vocab: 64, MinDist: 8, MaxDist: 24, Draw: MQARDrawRandom},
		{SeqLen: 256, Pairs: 16, Vocab: 300, MinDist: 100, MaxDist: 200, Draw: MQARDrawRandom},
	} {
		s, err := MQAR(3, 20000, cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := s.Config
		L := c.SeqLen
		repeats := 0 // queries of a pair queried before in their sequence
		if (len(s.IDs)-1)%L != 0 || s.IDs[len(s.IDs)-1] != MQARBOS || len(s.Answers) != len(s.IDs) {
			t.Fatalf("%+v: stream of %d tokens is not whole sequences plus BOS", c, len(s.IDs))
		}
		isKey := func(id int32) bool { return id >= c.KeyBase() && id < c.ValueBase() }
		isVal := func(id int32) bool { return id >= c.ValueBase() && id < int32(c.Vocab) }
		for base := 0; base+L < len(s.IDs); base += L {
			seq := s.IDs[base : base+L]
			if seq[0] != MQARBOS {
				t.Fatalf("sequence at %d does not start with BOS", base)
			}
			pairs := map[int32]int32{} // key -> value
			keyPos := map[int32]int{}
			for i := range c.Pairs {
				k, v := seq[1+2*i], seq[2+2*i]
				if !isKey(k) || !isVal(v) {
					t.Fatalf("pair %d (%d, %d) is not a key and a value", i, k, v)
				}
				if _, dup := pairs[k]; dup {
					t.Fatalf("key %d stated twice", k)
				}
				pairs[k], keyPos[k] = v, 1+2*i
			}
			queried := map[int32]bool{}
			queries := 0
			for p := 1 + 2*c.Pairs; p < L; p++ {
				ans := s.Answers[base+p]
				switch id := seq[p]; {
				case id == MQARBlank:
					if ans {
						t.Fatalf("a blank at %d is marked as an answer", p)
					}
				case isKey(id):
					v, ok := pairs[id]
					if !ok || (c.Draw == MQARDrawEach && queried[id]) {
						t.Fatalf("query of key %d at %d: stated %v, queried before %v", id, p, ok, queried[id])
					}
					if queried[id] {
						repeats++
					}
					queried[id] = true
					queries++
					if p+1 >= L || seq[p+1] != v || !s.Answers[base+p+1] {
						t.Fatalf("query of key %d at %d is not followed by its marked value %d", id, p, v)
					}
					d := p - keyPos[id]
					if d < c.MinDist || d > c.MaxDist || int(s.Distances[base+p+1]) != d {
						t.Fatalf("query distance %d (recorded %d) outside [%d, %d]", d, s.Distances[base+p+1], c.MinDist, c.MaxDist)
					}
				case isVal(id):
					if !ans {
						t.Fatalf("a value at %d is not marked as an answer", p)
					}
				default:
					t.Fatalf("unexpected id %d at %d", id, p)
				}
			}
			if queries != c.Pairs || (c.Draw == MQARDrawEach && len(queried) != c.Pairs) {
				t.Fatalf("%d queries of %d distinct pairs, want %d", queries, len(queried), c.Pairs)
			}
			for p := range 1 + 2*c.Pairs {
				if s.Answers[base+p] {
					t.Fatalf("position %d of the pairs is marked as an answer", p)
				}
			}
		}
		if n := s.NumAnswers(); n != c.Pairs*(len(s.IDs)-1)/L {
			t.Fatalf("%d answers, want %d", n, c.Pairs*(len(s.IDs)-1)/L)
		}
		// Drawn with replacement, a query repeats an earlier pair of its
		// sequence with probability (j−distinct so far)/Pairs: about a third
		// of all queries for 4 pairs.
		if c.Draw == MQARDrawRandom && repeats == 0 {
			t.Fatalf("%+v: no pair queried twice in %d sequences", c, (len(s.IDs)-1)/L)
		}
	}
}

// TestMQARRecallScoring: scoring through the evaluation batches' answer
// masks counts only the answers; the oracle scores 1, a constant value about
// chance, and predicting every target but the answers scores 0.
func TestMQARRecallScoring(t *testing.T) {
	cfg := MQARConfig{SeqLen: 64, Pairs: 8, Vocab: 64}
	s, err := MQAR(11, 1<<16, cfg)
	if err != nil {
		t.Fatal(err)
	}
	T, B := 64, 8
	eb, err := NewEvalBatcher(s.IDs, T, B)
	if err != nil {
		t.Fatal(err)
	}
	var oracle, constant, allButAnswers Recall
	for k, bt := range eb.All() {
		mask := s.BatchAnswerMask(eb, k)
		r, err := RecallAccuracy(bt.Y, bt.Y, mask)
		if err != nil {
			t.Fatal(err)
		}
		oracle = oracle.Add(r)
		c := make([]int32, len(bt.Y))
		for j := range c {
			c[j] = s.Config.ValueBase() + 3
		}
		r, _ = RecallAccuracy(c, bt.Y, mask)
		constant = constant.Add(r)
		w := slices.Clone(bt.Y)
		for j, m := range mask {
			if m {
				w[j] = MQARBlank
			}
		}
		r, _ = RecallAccuracy(w, bt.Y, mask)
		allButAnswers = allButAnswers.Add(r)
	}
	wantN := eb.NumBatches() * B * cfg.Pairs
	if oracle.Total != wantN || oracle.Accuracy() != 1 {
		t.Fatalf("oracle: %+v, want %d of %d", oracle, wantN, wantN)
	}
	chance := 1 / float64(s.Config.Values())
	if a := constant.Accuracy(); math.Abs(a-chance) > 4*math.Sqrt(chance/float64(constant.Total)) {
		t.Fatalf("constant prediction scores %.4f, chance is %.4f", a, chance)
	}
	if allButAnswers.Correct != 0 {
		t.Fatalf("predicting all but the answers scores %+v", allButAnswers)
	}
}

func TestTrainBatcherAlign(t *testing.T) {
	ids := make([]int32, 10*16+1)
	for i := range ids {
		ids[i] = int32(i)
	}
	tb, err := NewTrainBatcher(ids, 16, 16*64, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.SetAlign(16); err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for range 10 {
		bt := tb.Next()
		for r := range bt.B {
			x0 := bt.X[r*bt.T]
			if x0%16 != 0 {
				t.Fatalf("chunk starts at %d, not a multiple of 16", x0)
			}
			seen[x0] = true
		}
	}
	if len(seen) != 10 {
		t.Fatalf("%d of the 10 aligned starts drawn", len(seen))
	}
}

// TestTrainBatcherTargetMask: with the MQAR stream's answers as the mask,
// exactly the answer targets survive (with their values), every other
// target is ir.IgnoreTarget, the inputs are untouched, and the batches are
// those drawn without a mask.
func TestTrainBatcherTargetMask(t *testing.T) {
	s, err := MQAR(3, 64*40, MQARConfig{SeqLen: 64, Pairs: 4, Vocab: 64})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := NewTrainBatcher(s.IDs, 64, 64*8, 9)
	masked, _ := NewTrainBatcher(s.IDs, 64, 64*8, 9)
	for _, tb := range []*TrainBatcher{plain, masked} {
		if err := tb.SetAlign(64); err != nil {
			t.Fatal(err)
		}
	}
	if err := masked.SetTargetMask(s.Answers[1:]); err == nil {
		t.Fatal("a mask of the wrong length was accepted")
	}
	if err := masked.SetTargetMask(s.Answers); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		a, b := plain.Next(), masked.Next()
		if !slices.Equal(a.X, b.X) {
			t.Fatal("the mask changed the inputs or the draw")
		}
		kept := 0
		for j := range a.Y {
			switch {
			case b.Y[j] == ir.IgnoreTarget:
			case b.Y[j] == a.Y[j] && b.Y[j] >= s.Config.ValueBase():
				kept++
			default:
				t.Fatalf("target %d: %d, unmasked %d", j, b.Y[j], a.Y[j])
			}
		}
		if kept != a.B*4 { // each chunk is one whole sequence: its 4 answers
			t.Fatalf("%d targets kept, want %d", kept, a.B*4)
		}
	}
}
