package inferbench

import (
	"fmt"
	"math"
	"time"

	"golang.org/x/perf/benchmath"
)

// Confidence is the confidence level of the intervals this package
// reports (golang.org/x/perf/benchmath, as benchstat computes them).
const Confidence = 0.95

// Latency summarises timed runs. P50 is benchmath's median with its
// confidence interval [Lo, Hi] (assuming nothing about the distribution);
// P95, P99, Mean and Fast are read off the same sorted sample.
type Latency struct {
	P50, Lo, Hi, P95, P99, Mean time.Duration
	// Fast is the mean of the fastest half of the runs: a background load
	// only ever adds time, so the fastest runs are the least disturbed.
	Fast time.Duration
	N    int
}

// sample is ts in nanoseconds as a benchmath sample (sorted).
func sample(ts []time.Duration) *benchmath.Sample {
	v := make([]float64, len(ts))
	for i, d := range ts {
		v[i] = float64(d)
	}
	return benchmath.NewSample(v, &benchmath.DefaultThresholds)
}

// Summarize summarises timed runs.
func Summarize(ts []time.Duration) Latency {
	if len(ts) == 0 {
		return Latency{}
	}
	s := sample(ts)
	sum := benchmath.AssumeNothing.Summary(s, Confidence)
	v, n := s.Values, len(s.Values)
	var total, fast float64
	for _, x := range v {
		total += x
	}
	h := max(1, n/2)
	for _, x := range v[:h] {
		fast += x
	}
	at := func(pct int) time.Duration { return time.Duration(v[min(n-1, (n*pct+99)/100-1)]) }
	return Latency{P50: time.Duration(sum.Center), Lo: duration(sum.Lo), Hi: duration(sum.Hi), P95: at(95), P99: at(99),
		Mean: time.Duration(total / float64(n)), Fast: time.Duration(fast / float64(h)), N: n}
}

// duration converts a bound that may be infinite (too few runs for the
// interval) to a Duration, 0 for an infinite one.
func duration(x float64) time.Duration {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	return time.Duration(x)
}

// Noise is the half-width of the median's confidence interval in % of the
// median (benchstat's ±), NaN when the runs are too few for an interval.
func (l Latency) Noise() float64 {
	if l.Lo == 0 || l.Hi == 0 || l.P50 == 0 {
		return math.NaN()
	}
	return 100 * math.Max(float64(l.Hi)/float64(l.P50)-1, 1-float64(l.Lo)/float64(l.P50))
}

// Diff is the relative latency difference of two models timed in the same
// blocks, (a − b)/b in %, by several estimators, and the Mann-Whitney U
// test of the two samples.
type Diff struct {
	P50, Fast float64
	// Paired is the median over blocks of the ratio of the two models'
	// block medians, − 1; PairedNoise the half-width of its confidence
	// interval (NaN with too few blocks).
	Paired, PairedNoise float64
	Test                benchmath.Comparison
}

// Compare compares the runs of a and b; blocksA and blocksB give the
// block of every run, rounds the number of blocks.
func Compare(a, b []time.Duration, blocksA, blocksB []int, rounds int) Diff {
	la, lb := Summarize(a), Summarize(b)
	pct := func(x, y time.Duration) float64 { return 100 * (float64(x) - float64(y)) / float64(y) }
	d := Diff{P50: pct(la.P50, lb.P50), Fast: pct(la.Fast, lb.Fast), Test: benchmath.AssumeNothing.Compare(sample(a), sample(b))}
	var ratios []float64
	for k := range rounds {
		x, y := Summarize(inBlock(a, blocksA, k)), Summarize(inBlock(b, blocksB, k))
		if x.N > 0 && y.N > 0 {
			ratios = append(ratios, float64(x.P50)/float64(y.P50))
		}
	}
	d.Paired, d.PairedNoise = math.NaN(), math.NaN()
	if len(ratios) > 0 {
		s := benchmath.AssumeNothing.Summary(benchmath.NewSample(ratios, &benchmath.DefaultThresholds), Confidence)
		d.Paired = 100 * (s.Center - 1)
		if !math.IsInf(s.Lo, 0) && !math.IsInf(s.Hi, 0) {
			d.PairedNoise = 100 * math.Max(s.Hi-s.Center, s.Center-s.Lo)
		}
	}
	return d
}

// inBlock returns the runs of block k.
func inBlock(ts []time.Duration, blocks []int, k int) []time.Duration {
	var out []time.Duration
	for i, b := range blocks {
		if b == k {
			out = append(out, ts[i])
		}
	}
	return out
}

func (d Diff) String() string {
	return fmt.Sprintf("%+.2f%% p50, %+.2f%% fast½, %+.2f%% ± %s paired (median per block), Mann-Whitney %v",
		d.P50, d.Fast, d.Paired, pctOrDash(d.PairedNoise), d.Test)
}

func pctOrDash(x float64) string {
	if math.IsNaN(x) {
		return "?"
	}
	return fmt.Sprintf("%.2f%%", x)
}
