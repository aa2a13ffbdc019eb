package control

import "math"

// WarmIn is apply_warm_in's bias scale: min(1, step / max(1, warmSteps)).
// warmSteps ≤ 0 gives 1 from the start.
func WarmIn(step, warmSteps int) float64 {
	if warmSteps <= 0 {
		return 1
	}
	return math.Min(1, float64(max(step, 0))/float64(warmSteps))
}

// DropoutGlide is dropout_glide: for a base rate p ≥ 0.08 the rate glides
// linearly from p to 0.08 over the first 60% of training (phase =
// step/total ∈ [0,1]) and stays at 0.08; a base rate below 0.08 is left
// alone.
func DropoutGlide(base, phase float64) float64 {
	if base < 0.08 {
		return base
	}
	tail := math.Max(0, 1-phase/0.60)
	return 0.08 + (base-0.08)*tail
}

// QuantizeDropout rounds a dropout rate to a multiple of step (the trainer
// recompiles the training graph when the rate changes, so the glide moves in
// steps of 0.005 by default rather than every step).
func QuantizeDropout(p, step float64) float64 {
	if step <= 0 {
		return p
	}
	return math.Round(p/step) * step
}
