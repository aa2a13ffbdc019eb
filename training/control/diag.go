package control

import "math"

// SatThreshold is rpac's saturation threshold: a token's membership is
// saturated when its largest regime membership max_r μ[r] exceeds it.
const SatThreshold = 0.9

// SatFraction is the saturation fraction of memberships mu [N,R] (row-major):
// the fraction of the N tokens whose largest membership exceeds thr. The
// paper derives the saturation fraction "from fuzzy memberships" without a
// formula; this is rpac's definition.
func SatFraction(mu []float32, R int, thr float64) float64 {
	if R < 1 || len(mu) < R {
		return math.NaN()
	}
	n := len(mu) / R
	sat := 0
	for t := 0; t < n; t++ {
		m := float32(math.Inf(-1))
		for _, v := range mu[t*R : (t+1)*R] {
			m = max(m, v)
		}
		if float64(m) > thr {
			sat++
		}
	}
	return float64(sat) / float64(n)
}

// GateDelta is rpac's "gate delta": the total-variation distance
// ½·Σ_e |p_e − q_e| between two expert-usage vectors of the FuzzyMoE gate,
// averaged over layers. The trainer compares each epoch's mean usage with
// the previous epoch's. Missing or mismatched vectors give 0.
func GateDelta(prev, cur [][]float64) float64 {
	if len(prev) == 0 || len(prev) != len(cur) {
		return 0
	}
	var s float64
	for l := range cur {
		if len(prev[l]) != len(cur[l]) {
			return 0
		}
		var d float64
		for e := range cur[l] {
			d += math.Abs(cur[l][e] - prev[l][e])
		}
		s += d / 2
	}
	return s / float64(len(cur))
}
