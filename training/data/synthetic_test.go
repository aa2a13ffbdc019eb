package data

import (
	"slices"
	"strings"
	"testing"
)

func TestSyntheticConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  SyntheticConfig
		want string // "" = valid
	}{
		{"defaults", SyntheticConfig{}, ""},
		{"small", SyntheticConfig{SeqLen: 32, Pairs: 2, Keys: 8, Values: 8, MinGap: 16}, ""},
		{"seq too short", SyntheticConfig{SeqLen: 4}, "SeqLen 4"},
		{"too many keys", SyntheticConfig{Keys: SynMaxKeys + 1}, "Keys 97"},
		{"fewer keys than pairs", SyntheticConfig{Keys: 2, Pairs: 3}, "Keys 2"},
		{"too many values", SyntheticConfig{Values: SynMaxValues + 1}, "Values 145"},
		{"one value", SyntheticConfig{Values: 1}, "Values 1"},
		{"pairs do not fit", SyntheticConfig{SeqLen: 32, Pairs: 8, MinGap: 20}, "do not fit"},
		{"gap too large", SyntheticConfig{SeqLen: 64, MinGap: 70}, "do not fit"},
		{"negative gap", SyntheticConfig{MinGap: -1}, "MinGap -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := Synthetic(1, 1000, tc.cfg); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error mentioning %q", err, tc.want)
			}
			if _, err := Synthetic(1, 1000, tc.cfg); err == nil {
				t.Fatal("Synthetic accepted an invalid config")
			}
		})
	}
}

// checkStream verifies the structure the recall score relies on.
func checkStream(t *testing.T, s *SyntheticStream) {
	t.Helper()
	cfg := s.Config
	L := cfg.SeqLen
	if (len(s.IDs)-1)%L != 0 || s.IDs[len(s.IDs)-1] != SynBOS || len(s.Answers) != len(s.IDs) {
		t.Fatalf("length %d is not whole sequences of %d plus a final BOS", len(s.IDs), L)
	}
	nSeq := (len(s.IDs) - 1) / L
	if s.NumAnswers() != nSeq*cfg.Pairs {
		t.Fatalf("%d answers, want %d", s.NumAnswers(), nSeq*cfg.Pairs)
	}
	for _, id := range s.IDs {
		if id < 0 || id >= SyntheticVocab {
			t.Fatalf("id %d outside [0, %d)", id, SyntheticVocab)
		}
	}
	for q := range nSeq {
		seq := s.IDs[q*L : (q+1)*L]
		if seq[0] != SynBOS {
			t.Fatalf("sequence %d does not start with BOS", q)
		}
		stated := map[int32]int32{}
		statedAt := map[int32]int{}
		for p := 1; p < L; p++ {
			switch {
			case seq[p] == SynBOS:
				t.Fatalf("BOS inside sequence %d", q)
			case seq[p] == SynSet:
				k, v := seq[p+1], seq[p+2]
				if k < SynKeyBase || k >= SynKeyBase+int32(cfg.Keys) || v < SynValueBase || v >= SynValueBase+int32(cfg.Values) {
					t.Fatalf("bad statement %v", seq[p:p+3])
				}
				if _, dup := stated[k]; dup {
					t.Fatalf("key %d stated twice in sequence %d", k, q)
				}
				stated[k], statedAt[k] = v, p
			case seq[p] == SynAsk:
				k := seq[p+1]
				v, ok := stated[k]
				if !ok {
					t.Fatalf("query of unstated key %d", k)
				}
				if seq[p+2] != v {
					t.Fatalf("query answer %d, stated %d", seq[p+2], v)
				}
				if p-statedAt[k] < cfg.MinGap {
					t.Fatalf("gap %d < MinGap %d", p-statedAt[k], cfg.MinGap)
				}
				if !s.Answers[q*L+p+2] {
					t.Fatalf("answer position not marked")
				}
			}
		}
		if len(stated) != cfg.Pairs {
			t.Fatalf("%d statements in sequence %d, want %d", len(stated), q, cfg.Pairs)
		}
	}
	for p, a := range s.Answers {
		if a && (p < 2 || s.IDs[p-2] != SynAsk) {
			t.Fatalf("marked position %d is not a query answer", p)
		}
	}
}

func TestSyntheticStructure(t *testing.T) {
	for _, cfg := range []SyntheticConfig{
		{},
		{SeqLen: 32, Pairs: 2, Keys: 8, Values: 8, MinGap: 16},
		{SeqLen: 512, Pairs: 8, Keys: SynMaxKeys, Values: SynMaxValues, MinGap: 400},
		{SeqLen: 64, Pairs: 1, Keys: 1, Values: 2, MinGap: 1},
	} {
		for _, seed := range []int64{0, 1, -5} {
			s, err := Synthetic(seed, 5000, cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkStream(t, s)
		}
	}
}

func TestSyntheticLength(t *testing.T) {
	tests := []struct{ n, want int }{
		{0, 257}, {1, 257}, {257, 257}, {258, 513}, {2*256 + 1, 513}, {1000, 4*256 + 1},
	}
	for _, tc := range tests {
		s, err := Synthetic(3, tc.n, SyntheticConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.IDs) != tc.want {
			t.Errorf("Synthetic(n=%d) has %d tokens, want %d", tc.n, len(s.IDs), tc.want)
		}
	}
	if _, err := Synthetic(3, -1, SyntheticConfig{}); err == nil {
		t.Error("negative nTokens accepted")
	}
}

func TestSyntheticDeterminism(t *testing.T) {
	a, _ := Synthetic(11, 4000, SyntheticConfig{})
	b, _ := Synthetic(11, 4000, SyntheticConfig{})
	c, _ := Synthetic(12, 4000, SyntheticConfig{})
	if !slices.Equal(a.IDs, b.IDs) || !slices.Equal(a.Answers, b.Answers) {
		t.Fatal("same seed, different streams")
	}
	if slices.Equal(a.IDs, c.IDs) {
		t.Fatal("different seeds, same stream")
	}
	corp, err := NewSyntheticCorpus(11, 4000, 2000, SyntheticConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(corp.Train.IDs, a.IDs) || corp.Eval.Seed == corp.Train.Seed || slices.Equal(corp.Eval.IDs[:2000], a.IDs[:2000]) {
		t.Fatal("corpus streams are not the seed's train stream and a different eval stream")
	}
	checkStream(t, corp.Eval)
}

func TestSyntheticFillerIsLearnable(t *testing.T) {
	// The filler follows a bigram language: the most frequent successor of a
	// filler token is far above chance (1/256).
	s, _ := Synthetic(5, 200_000, SyntheticConfig{})
	counts := map[[2]int32]int{}
	from := map[int32]int{}
	for i := 1; i < len(s.IDs); i++ {
		a, b := s.IDs[i-1], s.IDs[i]
		if a >= SynFillerBase && b >= SynFillerBase {
			counts[[2]int32{a, b}]++
			from[a]++
		}
	}
	best := map[int32]int{}
	for k, c := range counts {
		best[k[0]] = max(best[k[0]], c)
	}
	hit, total := 0, 0
	for a, n := range from {
		hit += best[a]
		total += n
	}
	if acc := float64(hit) / float64(total); acc < 0.3 {
		t.Fatalf("bigram oracle accuracy %.3f, want well above chance", acc)
	}
}

func TestRecallAccuracy(t *testing.T) {
	cfg := SyntheticConfig{SeqLen: 64, Pairs: 3, Keys: 16, Values: 32, MinGap: 30}
	s, err := Synthetic(9, 64*10+1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := NewEvalBatcher(s.IDs, cfg.SeqLen, 4)
	if err != nil {
		t.Fatal(err)
	}
	var oracle, wrongVal, onlyFiller Recall
	for k, b := range eb.All() {
		mask := s.BatchAnswerMask(eb, k)
		if len(mask) != len(b.Y) {
			t.Fatalf("mask length %d, batch %d", len(mask), len(b.Y))
		}
		// A perfect model predicts every target.
		r, err := RecallAccuracy(b.Y, b.Y, mask)
		if err != nil {
			t.Fatal(err)
		}
		oracle = oracle.Add(r)
		// A model that predicts a value other than the right one at answers
		// but is perfect elsewhere scores zero.
		pred := slices.Clone(b.Y)
		for j, m := range mask {
			if m {
				pred[j] = SynValueBase + (pred[j]-SynValueBase+1)%int32(cfg.Values)
			}
		}
		r, _ = RecallAccuracy(pred, b.Y, mask)
		wrongVal = wrongVal.Add(r)
		// Errors away from answers do not count.
		pred = slices.Clone(b.Y)
		for j, m := range mask {
			if !m {
				pred[j] = 0
			}
		}
		r, _ = RecallAccuracy(pred, b.Y, mask)
		onlyFiller = onlyFiller.Add(r)
	}
	// 8 full chunks in 2 batches of 4; 3 answers per chunk.
	if oracle.Total != 8*3 || oracle.Accuracy() != 1 {
		t.Fatalf("oracle %+v", oracle)
	}
	if wrongVal.Correct != 0 || wrongVal.Total != 24 || wrongVal.Accuracy() != 0 {
		t.Fatalf("wrong values %+v", wrongVal)
	}
	if onlyFiller.Accuracy() != 1 {
		t.Fatalf("errors off the answers counted: %+v", onlyFiller)
	}
	if _, err := RecallAccuracy([]int32{1}, []int32{1, 2}, []bool{true, true}); err == nil {
		t.Fatal("length mismatch accepted")
	}
	if (Recall{}).Accuracy() != 0 {
		t.Fatal("empty recall accuracy")
	}
}

func TestAnswerMask(t *testing.T) {
	s, _ := Synthetic(2, 300, SyntheticConfig{SeqLen: 32, Pairs: 2, Keys: 4, Values: 4, MinGap: 16})
	for start := range len(s.IDs) {
		m := s.AnswerMask(start, 8)
		if len(m) != 8 {
			t.Fatalf("mask length %d", len(m))
		}
		for j := range m {
			want := start+1+j < len(s.Answers) && s.Answers[start+1+j]
			if m[j] != want {
				t.Fatalf("AnswerMask(%d)[%d] = %v", start, j, m[j])
			}
		}
	}
}
