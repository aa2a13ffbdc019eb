package data

import (
	"slices"
	"testing"
)

func TestDistanceEdges(t *testing.T) {
	for _, c := range []struct {
		max  int
		want []int
	}{{1, []int{1, 4}}, {3, []int{1, 4}}, {4, []int{1, 4, 8}}, {61, []int{1, 4, 8, 16, 32, 64}}, {64, []int{1, 4, 8, 16, 32, 64, 128}}} {
		if got := DistanceEdges(c.max); !slices.Equal(got, c.want) {
			t.Errorf("DistanceEdges(%d) = %v, want %v", c.max, got, c.want)
		}
	}
}

// TestRecallBreakdown: the slot of every answer is the pair whose key the
// query repeats, each distance lands in its bucket, an oracle scores 1 in
// every cell, and a predictor right only on pair 0 scores exactly there.
func TestRecallBreakdown(t *testing.T) {
	cfg := MQARConfig{SeqLen: 64, Pairs: 4, Vocab: 64}
	s, err := MQAR(5, 64*50, cfg)
	if err != nil {
		t.Fatal(err)
	}
	L := s.Config.SeqLen
	for p, a := range s.Answers {
		if !a {
			continue
		}
		slot := s.AnswerSlot(p)
		base := (p - 1) / L * L
		if key := s.IDs[base+1+2*slot]; slot < 0 || slot >= 4 || key != s.IDs[p-1] {
			t.Fatalf("answer at %d: slot %d, key there %d, query key %d", p, slot, key, s.IDs[p-1])
		}
	}
	const T = 32 // chunks of half a sequence: answers fall in either half
	oracle, slot0 := cfg.NewRecallBreakdown(), cfg.NewRecallBreakdown()
	for start := 0; start+T < len(s.IDs); start += T {
		pred := slices.Clone(s.IDs[start+1 : start+1+T])
		if err := oracle.Add(s, start, pred); err != nil {
			t.Fatal(err)
		}
		for j := range pred {
			if p := start + 1 + j; s.Answers[p] && s.AnswerSlot(p) != 0 {
				pred[j] = MQARBlank
			}
		}
		if err := slot0.Add(s, start, pred); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.NumAnswers(); oracle.Total() != n || n != 50*4 {
		t.Fatalf("counted %d answers, the stream has %d", oracle.Total(), n)
	}
	dist := 0
	for _, k := range oracle.ByDist {
		dist += k.Total
		if k.Correct != k.Total {
			t.Fatalf("oracle bucket %+v", k)
		}
	}
	if dist != oracle.Total() {
		t.Fatalf("distance buckets count %d answers, slots %d", dist, oracle.Total())
	}
	for i, k := range slot0.BySlot {
		if k.Total != 50 || (i == 0) != (k.Correct == 50) || (i != 0 && k.Correct != 0) {
			t.Fatalf("slot %d: %+v", i, k)
		}
	}
	// every sequence has one query of each order; pair 0's are spread over them
	right0 := 0
	for i, k := range slot0.ByOrder {
		if k.Total != 50 || oracle.ByOrder[i].Correct != 50 {
			t.Fatalf("order %d: %+v (oracle %+v)", i, k, oracle.ByOrder[i])
		}
		right0 += k.Correct
	}
	if right0 != 50 {
		t.Fatalf("pair 0 answered %d times over the orders, want 50", right0)
	}
	// AnswerOrder counts the answers before p in its sequence
	for p, a := range s.Answers {
		if a {
			base := (p - 1) / L * L
			n := 0
			for i := base; i < p; i++ {
				if s.Answers[i] {
					n++
				}
			}
			if s.AnswerOrder(p) != n {
				t.Fatalf("order at %d: %d, want %d", p, s.AnswerOrder(p), n)
			}
		}
	}
	// Distances counted per bucket agree with the recorded ones.
	want := make([]int, len(oracle.ByDist))
	for p, a := range s.Answers {
		if a {
			want[oracle.bucket(int(s.Distances[p]))]++
		}
	}
	for i, k := range oracle.ByDist {
		if k.Total != want[i] || k.Lo >= k.Hi {
			t.Fatalf("bucket %+v, want %d", k, want[i])
		}
	}
}
