package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"testing"
)

// TestEachAndNextLogits: Each hands out the rows Logits returns, without
// copies, in the calls forEach groups them into; NextLogits is each
// sequence's last row.
func TestEachAndNextLogits(t *testing.T) {
	const V, eos = 5, 4
	m, runners := fakeModel(V, eos, 2, 8, 3)
	batch := [][]int32{{1, 2, 3, 0, 1}, {2}, {0, 1}, {3, 3, 3}, {1, 1, 1, 1, 1, 1, 1, 1}}
	want, err := m.Logits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	before := len(runners[3].inputs) + len(runners[8].inputs)
	seen := make([]bool, len(batch))
	err = m.Each(context.Background(), batch, func(i int, l Logits) error {
		if seen[i] {
			t.Errorf("sequence %d handed out twice", i)
		}
		seen[i] = true
		if fmt.Sprint(l.Data) != fmt.Sprint(want[i].Data) || l.Len != len(batch[i]) || l.Vocab != V {
			t.Errorf("sequence %d: Each gave %d×%d %v, Logits %v", i, l.Len, l.Vocab, l.Data, want[i].Data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Length 3: three sequences in two calls of batch 2; length 8: two in one.
	if got := len(runners[3].inputs) + len(runners[8].inputs) - before; got != 3 {
		t.Fatalf("Each made %d calls, want 3", got)
	}
	next, err := m.NextLogits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range batch {
		if fmt.Sprint(next[i]) != fmt.Sprint(want[i].Row(len(batch[i])-1)) {
			t.Errorf("NextLogits[%d] = %v, want %v", i, next[i], want[i].Row(len(batch[i])-1))
		}
	}
	stop := errors.New("stop")
	if err := m.Each(context.Background(), batch, func(int, Logits) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("an error from fn: Each returned %v", err)
	}
	if _, err := m.NextLogits(context.Background(), [][]int32{{9}}); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Fatalf("bad id: %v", err)
	}
}

func TestBatchSizeAndLengthFor(t *testing.T) {
	m, _ := fakeModel(5, 4, 3, 8, 3)
	if b := m.BatchSize(); b != 3 {
		t.Fatalf("BatchSize %d, want 3", b)
	}
	for n, want := range map[int]int{1: 3, 3: 3, 4: 8, 8: 8} {
		if L, err := m.LengthFor(n); err != nil || L != want {
			t.Errorf("LengthFor(%d) = %d, %v; want %d", n, L, err, want)
		}
	}
	for _, n := range []int{9} {
		if _, err := m.LengthFor(n); err == nil {
			t.Errorf("LengthFor(%d): no error", n)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if b := m.BatchSize(); b != 0 {
		t.Fatalf("BatchSize of a closed model %d", b)
	}
}

// TestSamplerMatchesGenerate: with and without TopK, a decoding loop of
// NextLogits and a Sampler draws what Generate draws for the same seed
// (Generate's top_k is the Sampler's selection: a sort of the candidates
// draws in another order, and other tokens).
func TestSamplerMatchesGenerate(t *testing.T) {
	m, _ := fakeModel(7, 6, 1, 16)
	for _, c := range []struct {
		temp float64
		topK int
	}{{0, 0}, {3, 0}, {40, 0}, {3, 3}, {40, 3}, {40, 6}} {
		temp := c.temp
		o := GenerateOptions{MaxNewTokens: 10, Temperature: temp, TopK: c.topK, Seed: 99}
		want, err := m.Generate(context.Background(), []int32{1, 0}, o)
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSampler(SampleOptions{Temperature: temp, TopK: c.topK}, 99)
		if err != nil {
			t.Fatal(err)
		}
		seq := []int32{1, 0}
		for range o.MaxNewTokens {
			next, err := m.NextLogits(context.Background(), [][]int32{seq})
			if err != nil {
				t.Fatal(err)
			}
			id, err := s.Next(next[0])
			if err != nil {
				t.Fatal(err)
			}
			seq = append(seq, id)
		}
		if fmt.Sprint(seq[2:]) != fmt.Sprint(want) {
			t.Errorf("temperature %v, top_k %d: sampler %v, Generate %v", temp, c.topK, seq[2:], want)
		}
	}
}

// TestGenerateTopKLinear: Generate's top_k draws over a GPT-2-sized
// vocabulary compare O(V) pairs of logits (the bound of TestTopKLinear),
// not the V log2 V of a sort.
func TestGenerateTopKLinear(t *testing.T) {
	const V = 50257
	m, _ := fakeModel(V, 0, 1, 8)
	for _, k := range []int{40, V / 2} {
		s, err := NewSampler(SampleOptions{Temperature: 1e6, TopK: k}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.generate(context.Background(), []int32{1}, GenerateOptions{MaxNewTokens: 3, Temperature: 1e6, TopK: k}, s); err != nil {
			t.Fatal(err)
		}
		perEntry := 6
		if k <= heapLimit {
			perEntry = 2 + 2*bits.Len(uint(k))
		}
		if s.compared == 0 || s.compared > perEntry*V {
			t.Errorf("top_k %d: %d comparisons for %d logits (want 1 to %d per logit)", k, s.compared, V, perEntry)
		}
	}
}

// TestSamplerFilters: frequencies under TopK and TopP follow the kept
// tokens' renormalised softmax.
func TestSamplerFilters(t *testing.T) {
	// Probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1.
	row := []float32{0, float32(math.Log(2)), float32(math.Log(3)), float32(math.Log(4))}
	nan := float32(math.NaN())
	for _, c := range []struct {
		o    SampleOptions
		want []float64
	}{
		{SampleOptions{Temperature: 1}, []float64{0.1, 0.2, 0.3, 0.4}},
		{SampleOptions{Temperature: 1, TopK: 2}, []float64{0, 0, 3.0 / 7, 4.0 / 7}},
		{SampleOptions{Temperature: 1, TopP: 0.65}, []float64{0, 0, 3.0 / 7, 4.0 / 7}},       // 0.4 < 0.65 <= 0.7
		{SampleOptions{Temperature: 1, TopP: 0.75}, []float64{0, 2.0 / 9, 3.0 / 9, 4.0 / 9}}, // 0.7 < 0.75 <= 0.9
		{SampleOptions{Temperature: 1, TopP: 0.1}, []float64{0, 0, 0, 1}},
		{SampleOptions{Temperature: 1, TopK: 3, TopP: 0.5}, []float64{0, 0, 3.0 / 7, 4.0 / 7}}, // of 0.2,0.3,0.4: 0.4/0.9 < 0.5
		{SampleOptions{TopK: 1, TopP: 0.5}, []float64{0, 0, 0, 1}},                             // greedy
	} {
		s, err := NewSampler(c.o, 5)
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]float64, 4)
		const n = 20000
		for range n {
			id, err := s.Next(row)
			if err != nil {
				t.Fatal(err)
			}
			counts[id]++
		}
		for i := range counts {
			if math.Abs(counts[i]/n-c.want[i]) > 0.015 || (c.want[i] == 0) != (counts[i] == 0) {
				t.Errorf("%+v: frequencies %v, want %v", c.o, counts, c.want)
				break
			}
		}
	}
	// Ties: TopK keeps the lower ids.
	ties, _ := NewSampler(SampleOptions{Temperature: 1, TopK: 2}, 3)
	seen := map[int32]int{}
	for range 1000 {
		id, err := ties.Next([]float32{5, 5, 5, 5, 5})
		if err != nil {
			t.Fatal(err)
		}
		seen[id]++
	}
	if len(seen) != 2 || seen[0] < 400 || seen[1] < 400 {
		t.Fatalf("top-2 of five equal logits drew %v, want ids 0 and 1 evenly", seen)
	}
	s, _ := NewSampler(SampleOptions{Temperature: 1, TopK: 2, TopP: 0.9}, 1)
	if id, err := s.Next([]float32{nan, 2, nan, 1}); err != nil || (id != 1 && id != 3) {
		t.Fatalf("NaN logits: drew %d, %v", id, err)
	}
	if _, err := s.Next([]float32{nan, nan}); err == nil {
		t.Fatal("all-NaN row: no error")
	}
	for _, o := range []SampleOptions{{Temperature: math.NaN()}, {TopK: -1}, {TopP: 1.5}, {TopP: -0.1}, {TopP: math.NaN()}} {
		if _, err := NewSampler(o, 1); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}
