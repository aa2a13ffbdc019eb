package control

import (
	"fmt"
	"math"
)

// Chaos is the ChaosController of Appendix C: a logistic map
// x ← r·x·(1−x) with a decaying amplitude a(t) = amp·exp(−decay·t); each
// step returns the factor (1−a) + a·x ∈ [1−a, 1], which rpac multiplies
// into the learning rate and the RPA bias scale. At r = 3.9 the map is
// chaotic: a deterministic, bounded, decaying perturbation.
type Chaos struct {
	R     float64 `json:"r"`
	X     float64 `json:"x"`
	Amp0  float64 `json:"amp"`
	Decay float64 `json:"decay"`
	T     int     `json:"t"`
	Last  float64 `json:"last"`
}

// NewChaos returns the listing's controller (r 3.9, x0 0.721) with the given
// amplitude and decay per step.
func NewChaos(r, amp, decay float64) (*Chaos, error) {
	if !(r > 0 && r <= 4) {
		return nil, fmt.Errorf("chaos: r = %g must lie in (0, 4] to keep x in [0, 1]", r)
	}
	if amp < 0 || amp > 1 {
		return nil, fmt.Errorf("chaos: amplitude %g must lie in [0, 1]", amp)
	}
	if decay < 0 {
		return nil, fmt.Errorf("chaos: decay %g must not be negative", decay)
	}
	return &Chaos{R: r, X: 0.721, Amp0: amp, Decay: decay, Last: 1}, nil
}

// Amp is the amplitude after T steps.
func (c *Chaos) Amp() float64 { return c.Amp0 * math.Exp(-c.Decay*float64(c.T)) }

// Step advances the map and returns the new factor.
func (c *Chaos) Step() float64 {
	c.X = c.R * c.X * (1 - c.X)
	c.T++
	a := c.Amp()
	c.Last = (1 - a) + a*c.X
	return c.Last
}

// Factor is the last factor returned by Step (1 before the first step).
func (c *Chaos) Factor() float64 { return c.Last }

// Temp is the listing's temperature 1 + maxExtra·a(t).
func (c *Chaos) Temp(maxExtra float64) float64 { return 1 + maxExtra*c.Amp() }
