package runtime

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// sortedNucleus is the top_p draw as Sampler.Next made it before nucleus:
// every candidate sorted by decreasing logit (lower index first on ties),
// the shortest prefix whose weights reach TopP of the total, drawn in index
// order. It is the reference of TestNucleusMatchesSorted.
func sortedNucleus(row []float32, o SampleOptions, rng *rand.Rand) (int32, []int) {
	var cand []logitAt
	for i, x := range row {
		if x == x {
			cand = append(cand, logitAt{x, i})
		}
	}
	h := logitHeap(cand)
	sort.Slice(h, func(a, b int) bool { return h.Less(a, b) })
	mx := float64(cand[0].x)
	n := len(cand)
	var total, kept float64
	for _, c := range cand {
		total += math.Exp((float64(c.x) - mx) / o.Temperature)
	}
	for k, c := range cand {
		kept += math.Exp((float64(c.x) - mx) / o.Temperature)
		if kept >= o.TopP*total {
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
		idx = append(idx, c.i)
	}
	j, _ := sample(mask, GenerateOptions{Temperature: o.Temperature}, rng)
	return int32(idx[j]), idx
}

// TestNucleusMatchesSorted: top_p without top_k keeps the tokens the sorted
// prefix keeps and draws what it draws from the same seed, over rows of
// every shape (a GPT-2-sized vocabulary, ties, NaN, peaked and flat rows).
func TestNucleusMatchesSorted(t *testing.T) {
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
	for name, row := range rows {
		for _, temp := range []float64{0.3, 1, 2.5} {
			for _, p := range []float64{0.01, 0.5, 0.9, 0.95, 0.999} {
				o := SampleOptions{Temperature: temp, TopP: p}
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
						t.Fatalf("%s, T %v, p %v, draw %d: drew %d keeping %d tokens, the sorted prefix draws %d keeping %d",
							name, temp, p, draw, got, len(s.idx), want, len(keep))
					}
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
				k := nucleusCut(c, target)
				want := max(0, int(math.Ceil(target))-1)
				if c[k] != sorted[want] {
					t.Fatalf("%d %s, target %v: cut %+v, want %+v", n, order, target, c[k], sorted[want])
				}
			}
		}
	}
}

// BenchmarkSampleTopP draws with top_p 0.95 (no top_k) from GPT-2-sized
// rows of logits; BenchmarkSampleTopK with top_k 40 for comparison.
func BenchmarkSampleTopP(b *testing.B) { benchSample(b, SampleOptions{Temperature: 0.8, TopP: 0.95}) }
func BenchmarkSampleTopK(b *testing.B) { benchSample(b, SampleOptions{Temperature: 0.8, TopK: 40}) }

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
