package inferbench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"golang.org/x/perf/benchfmt"
)

func ms3(xs ...float64) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

// Summarize: the median and its interval are benchmath's; the tail and
// the fast half are read off the sorted runs.
func TestSummarize(t *testing.T) {
	l := Summarize(ms3(5, 1, 4, 2, 3, 10, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20))
	if l.N != 20 || l.P50 != 10500*time.Microsecond {
		t.Errorf("n %d p50 %v, want 20 and 10.5ms", l.N, l.P50)
	}
	if l.P95 != 19*time.Millisecond || l.P99 != 20*time.Millisecond || l.Fast != 5500*time.Microsecond || l.Mean != 10500*time.Microsecond {
		t.Errorf("p95 %v p99 %v fast %v mean %v", l.P95, l.P99, l.Fast, l.Mean)
	}
	if !(l.Lo > 0 && l.Lo < l.P50 && l.Hi > l.P50) || math.IsNaN(l.Noise()) {
		t.Errorf("interval [%v, %v], noise %v", l.Lo, l.Hi, l.Noise())
	}
	// Too few runs for a 95% interval of the median.
	if n := Summarize(ms3(1, 2, 3)).Noise(); !math.IsNaN(n) {
		t.Errorf("noise of 3 runs = %v, want NaN", n)
	}
	if (Summarize(nil) != Latency{}) {
		t.Error("Summarize(nil) is not zero")
	}
}

// Compare: a model 10% slower in every block is 10% slower by every
// estimator and the U test tells the samples apart; a model against
// itself is not.
func TestCompare(t *testing.T) {
	var a, b []time.Duration
	var blocks []int
	for k := range 10 {
		for i := range 3 {
			x := float64(10 + k%3 + i)
			a, b = append(a, ms3(1.1*x)...), append(b, ms3(x)...)
			blocks = append(blocks, k)
		}
	}
	d := Compare(a, b, blocks, blocks, 10)
	for name, v := range map[string]float64{"p50": d.P50, "fast": d.Fast, "paired": d.Paired} {
		if math.Abs(v-10) > 0.01 {
			t.Errorf("%s = %.3f%%, want 10%%", name, v)
		}
	}
	if !(d.Test.P < d.Test.Alpha) || d.PairedNoise > 0.01 {
		t.Errorf("p = %v, paired noise %v: want a significant difference with no noise", d.Test.P, d.PairedNoise)
	}
	if same := Compare(a, a, blocks, blocks, 10); same.Test.P < same.Test.Alpha || same.P50 != 0 {
		t.Errorf("a against itself: %v", same)
	}
	if !strings.Contains(d.String(), "Mann-Whitney p=") {
		t.Errorf("String() = %q", d.String())
	}
}

// The verdict needs both estimates and the noise on one side of 1%.
func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		p50, fast, noise float64
		want             string
	}{
		{0.2, 0.4, 0.3, "under 1%"},
		{3, 4, 0.5, "NOT under 1%"},
		{1.2, 1.5, 0.5, "NOT under 1% (by less than the noise)"},
		{0.5, 1.5, 0.3, "not resolved at 1%"},
		{0.5, 0.5, math.NaN(), "not resolved (too few blocks)"},
	} {
		pc := PriorCost{Cost: Diff{P50: c.p50, Fast: c.fast, PairedNoise: c.noise}}
		if got := pc.Verdict(); !strings.HasPrefix(got, c.want) {
			t.Errorf("%+v: %q, want %q", c, got, c.want)
		}
	}
}

// WriteBenchfmt writes one result per run that benchfmt (benchstat's
// reader) reads back with the case as sub-benchmark keys.
func TestWriteBenchfmt(t *testing.T) {
	r := Row{Preset: "tiny", Model: "fuzzy", Fold: FoldControl, Attention: "op", DType: "fp32", T: 128, B: 2}
	rep := &Report{Rows: []Row{r}, Runs: map[string][]time.Duration{r.Name(): ms3(2, 4)}}
	var buf bytes.Buffer
	if err := WriteBenchfmt(&buf, rep, "cpu"); err != nil {
		t.Fatal(err)
	}
	rd := benchfmt.NewReader(&buf, "out")
	var secs, tps []float64
	for rd.Scan() {
		res := rd.Result().(*benchfmt.Result)
		if got := string(res.Name.Base()); got != "Infer" {
			t.Errorf("base name %q", got)
		}
		if !strings.Contains(res.Name.String(), "/fold=rpa_2/") || res.GetConfig("provider") != "cpu" {
			t.Errorf("name %s, provider %q", res.Name, res.GetConfig("provider"))
		}
		s, _ := res.Value("sec/op")
		v, _ := res.Value("tokens/s")
		secs, tps = append(secs, s), append(tps, v)
	}
	if len(secs) != 2 || math.Abs(secs[0]-0.002) > 1e-12 || math.Abs(tps[1]-256/0.004) > 1e-6 {
		t.Errorf("sec/op %v tokens/s %v", secs, tps)
	}
}
