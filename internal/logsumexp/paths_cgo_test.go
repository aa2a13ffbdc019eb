//go:build cgo

package logsumexp

import (
	"math"
	"testing"
)

// Agreement of the C and Go paths (the C path is vectorized for the CPU
// it runs on: AVX-512, AVX2 with FMA, SSE2, or NEON): log-sum-exp within
// maxPathDiff nats relative to the result past 1, exp within maxPathULP
// ulp of each other.
const (
	maxPathDiff = 1e-6
	maxPathULP  = 4 // measured: 3.0 (each is within maxExpULP of exp)
)

func TestPathsAgree(t *testing.T) {
	for name, row := range lseRows() {
		c, g := LogSumExp(row), logSumExpGo(row)
		if d := math.Abs(c - g); d > maxPathDiff*math.Max(1, math.Abs(g)) || math.IsNaN(c) != math.IsNaN(g) {
			t.Errorf("%s: C %.9g, Go %.9g", name, c, g)
		}
	}
	x := expCases()
	c, g := make([]float32, len(x)), make([]float32, len(x))
	Exp(c, x)
	expGo(g, x)
	for i := range x {
		if u := ulps(c[i], float64(g[i])); u > maxPathULP {
			t.Fatalf("exp(%g): C %g, Go %g (%.2f ulp)", x[i], c[i], g[i], u)
		}
	}
}
