package runtime

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// sortedNucleus is the top_k and top_p draw as Sampler.Next made it before
// nucleus and topK: every candidate sorted by decreasing logit (lower index
// first on ties), the first TopK, the shortest prefix of those whose
// weights reach TopP of their total, drawn in index order. It is the
// reference of TestNucleusMatchesSorted and TestTopKMatchesSorted.
func sortedNucleus(row []float32, o SampleOptions, rng *rand.Rand) (int32, []int) {
	var cand []nucleusCand
	for i, x := range row {
		if x == x {
			cand = append(cand, nucleusCand{x: x, i: int32(i)})
		}
	}
	sort.Slice(cand, func(a, b int) bool { return cand[a].before(cand[b]) })
	if o.TopK > 0 && o.TopK < len(cand) {
		cand = cand[:o.TopK]
	}
	mx := float64(cand[0].x)
	n := len(cand)
	var total, kept float64
	for _, c := range cand {
		total += math.Exp((float64(c.x) - mx) / o.Temperature)
	}
	for k, c := range cand {
		kept += math.Exp((float64(c.x) - mx) / o.Temperature)
		if o.TopP > 0 && o.TopP < 1 && kept >= o.TopP*total {
			n = k + 1
			break
		}
	}
	keep := cand[:n]
	sort.Slice(keep, func(a, b int) bool { return keep[a].i < keep[b].i })
	var mask []float32
	var idx []int
	for _, c := range keep {
		mask = append(mask, c.x)
		idx = append(idx, int(c.i))
	}
	j, _ := sample(mask, o.Temperature, rng)
	return int32(idx[j]), idx
}

// TestNucleusMatchesSorted: top_p without top_k keeps the tokens the sorted
// prefix keeps and draws what it draws from the same seed, over rows of
// every shape (a GPT-2-sized vocabulary, ties, NaN, peaked and flat rows).
func TestNucleusMatchesSorted(t *testing.T) {
	for name, row := range sampleRows() {
		for _, temp := range []float64{0.3, 1, 2.5} {
			for _, p := range []float64{0.01, 0.5, 0.9, 0.95, 0.999} {
				checkMatchesSorted(t, name, row, SampleOptions{Temperature: temp, TopP: p})
			}
		}
	}
}

// TestTopKMatchesSorted: top_k, alone and with top_p, keeps the tokens the
// sorted prefix keeps and draws what it draws from the same seed, for small
// and large K (up to the vocabulary size less one).
func TestTopKMatchesSorted(t *testing.T) {
	for name, row := range sampleRows() {
		for _, k := range []int{1, 2, 40, 1000, 1500, 25000, len(row) - 1} {
			if k < 1 || k >= len(row) {
				continue
			}
			for _, p := range []float64{0, 0.5, 0.95} {
				checkMatchesSorted(t, name, row, SampleOptions{Temperature: 0.8, TopK: k, TopP: p})
			}
		}
	}
}

// checkMatchesSorted draws five tokens from row with o and compares them,
// and the kept tokens, with sortedNucleus's from the same seed.
func checkMatchesSorted(t *testing.T, name string, row []float32, o SampleOptions) {
	t.Helper()
	s, err := NewSampler(o, 7)
	if err != nil {
		t.Fatal(err)
	}
	ref := rand.New(rand.NewPCG(7, 7^0x9e3779b97f4a7c15))
	for draw := range 5 {
		want, keep := sortedNucleus(row, o, ref)
		got, err := s.Next(row)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || !slices.Equal(s.idx, keep) {
			t.Fatalf("%s, %+v, draw %d: drew %d keeping %d tokens, the sorted prefix draws %d keeping %d",
				name, o, draw, got, len(s.idx), want, len(keep))
		}
	}
}

// sampleRows are rows of logits of every shape: a GPT-2-sized vocabulary,
// ties, NaN, peaked, flat, sorted and reversed rows.
func sampleRows() map[string][]float32 {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := map[string][]float32{}
	normal := func(n int, scale float64) []float32 {
		r := make([]float32, n)
		for i := range r {
			r[i] = float32(rng.NormFloat64() * scale)
		}
		return r
	}
	rows["gpt2 normal"] = normal(50257, 2)
	rows["gpt2 peaked"] = normal(50257, 8)
	rows["flat"] = make([]float32, 1000)
	ties := make([]float32, 3000)
	for i := range ties {
		ties[i] = float32(rng.IntN(5))
	}
	rows["ties"] = ties
	withNaN := normal(500, 1)
	for i := 0; i < len(withNaN); i += 7 {
		withNaN[i] = float32(math.NaN())
	}
	rows["NaN"] = withNaN
	rows["sorted"] = func() []float32 { r := normal(4000, 3); slices.Sort(r); return r }()
	rows["reversed"] = func() []float32 { r := rows["sorted"]; r = slices.Clone(r); slices.Reverse(r); return r }()
	rows["one"] = []float32{1.5}
	return rows
}

// TestTopKLinear: a top_k draw compares O(V) pairs of entries whatever K
// is, on rows in any order: a few per entry (a sort of the vocabulary makes
// about V log2 V, 16 V for GPT-2's).
func TestTopKLinear(t *testing.T) {
	const v = 50257
	rows := sampleRows()
	rows["increasing"] = make([]float32, v)
	for i := range rows["increasing"] {
		rows["increasing"][i] = float32(i)
	}
	for name, row := range rows {
		if len(row) < 1000 {
			continue
		}
		for _, k := range []int{40, len(row) / 2, len(row) - 1} {
			for _, p := range []float64{0, 0.95} {
				s, err := NewSampler(SampleOptions{Temperature: 1, TopK: k, TopP: p}, 1)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Next(row); err != nil {
					t.Fatal(err)
				}
				perEntry := 6 // a selection: about 2-4
				if k <= heapLimit {
					perEntry = 2 + 2*bits.Len(uint(k)) // a heap: one, and a sift in the worst case
				}
				if s.compared > perEntry*len(row) {
					t.Errorf("%s, top_k %d, top_p %v: %d comparisons for %d entries (more than %d per entry)", name, k, p, s.compared, len(row), perEntry)
				}
			}
		}
	}
}

// TestNucleusCutPivots: the selection finds the cut whatever order the
// candidates arrive in (including orders that defeat median-of-three).
func TestNucleusCutPivots(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 1000} {
		for _, order := range []string{"increasing", "decreasing", "equal", "organ"} {
			c := make([]nucleusCand, n)
			for i := range c {
				x := float32(i)
				switch order {
				case "decreasing":
					x = float32(n - i)
				case "equal":
					x = 1
				case "organ":
					x = float32(min(i, n-i))
				}
				c[i] = nucleusCand{w: 1, x: x, i: int32(i)}
			}
			sorted := slices.Clone(c)
			slices.SortFunc(sorted, func(a, b nucleusCand) int {
				if a.before(b) {
					return -1
				}
				return 1
			})
			for _, target := range []float64{0.5, 1, float64(n) / 2, float64(n)} {
				var compared int
				k := nucleusCut(c, target, &compared)
				want := max(0, int(math.Ceil(target))-1)
				if c[k] != sorted[want] {
					t.Fatalf("%d %s, target %v: cut %+v, want %+v", n, order, target, c[k], sorted[want])
				}
			}
		}
	}
}

// BenchmarkSampleTopP draws with top_p 0.95 (no top_k) from GPT-2-sized
// rows of logits; BenchmarkSampleTopK with top_k 40, 25,000 and 50,256 (the
// vocabulary less one).
func BenchmarkSampleTopP(b *testing.B) { benchSample(b, SampleOptions{Temperature: 0.8, TopP: 0.95}) }
func BenchmarkSampleTopK(b *testing.B) {
	for _, k := range []int{40, 25000, 50256} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) { benchSample(b, SampleOptions{Temperature: 0.8, TopK: k}) })
	}
}

func benchSample(b *testing.B, o SampleOptions) {
	rng := rand.New(rand.NewPCG(3, 4))
	row := make([]float32, 50257)
	for i := range row {
		row[i] = float32(rng.NormFloat64() * 3)
	}
	s, err := NewSampler(o, 1)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.Next(row); err != nil {
			b.Fatal(err)
		}
	}
}
