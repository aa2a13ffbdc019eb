package control

import (
	"fmt"
	"math"
)

// Scripted is the scripted temperature schedule of Algorithm 1 (the baseline
// controller): τ rises linearly from TauMin to TauMax over the first Warm
// steps, then follows a cosine from TauMax down to TauMin + Floor·(TauMax −
// TauMin) at the last step. While the latest validation CE lies below Zone
// and improved by less than Gate since the previous evaluation, τ is nudged
// up by Nudge (capped at TauMax) to avoid over-tightening.
//
// Algorithm 1 recomputes τ every step and nudges it while the condition
// holds; the condition changes only at evaluations, so the nudge lasts until
// the next evaluation (it does not accumulate).
type Scripted struct {
	TauMin float64 `json:"tau_min"`
	TauMax float64 `json:"tau_max"`
	Warm   int     `json:"warm"`
	Total  int     `json:"total"`
	Floor  float64 `json:"floor"`
	Zone   F       `json:"zone"`
	Gate   float64 `json:"gate"`
	Nudge  float64 `json:"nudge"`
	// Nudging is the condition of the latest evaluation.
	Nudging bool `json:"nudging"`
	PrevCE  F    `json:"prev_ce"`
}

// NewScripted returns the schedule with rpac's defaults for the constants
// the paper leaves open: floor 0.1, zone +Inf (every CE is in the zone),
// gain gate 0.005 nats, nudge 0.05.
func NewScripted(tauMin, tauMax float64, warm, total int) (*Scripted, error) {
	if !(tauMin > 0 && tauMax > tauMin) {
		return nil, fmt.Errorf("scripted schedule: τ bounds [%g, %g] must satisfy 0 < min < max", tauMin, tauMax)
	}
	if total < 1 {
		return nil, fmt.Errorf("scripted schedule: total steps %d must be positive", total)
	}
	return &Scripted{TauMin: tauMin, TauMax: tauMax, Warm: max(0, warm), Total: total, Floor: 0.1,
		Zone: F(math.Inf(1)), Gate: 0.005, Nudge: 0.05, PrevCE: F(math.NaN())}, nil
}

// Base is τ(t) without the nudge, for steps t = 1, 2, …
func (s *Scripted) Base(t int) float64 {
	span := s.TauMax - s.TauMin
	if t <= s.Warm && s.Warm > 0 {
		return s.TauMin + span*float64(max(t, 0))/float64(s.Warm)
	}
	u := 1.0
	if s.Total > s.Warm {
		u = math.Min(1, float64(t-s.Warm)/float64(s.Total-s.Warm))
	}
	return s.TauMin + span*(s.Floor+(1-s.Floor)*(1+math.Cos(math.Pi*u))/2)
}

// Tau is τ at step t including the nudge.
func (s *Scripted) Tau(t int) float64 {
	tau := s.Base(t)
	if s.Nudging {
		tau = math.Min(tau+s.Nudge, s.TauMax)
	}
	return tau
}

// Observe takes a new validation CE and decides whether to nudge.
func (s *Scripted) Observe(ce float64) {
	prev := float64(s.PrevCE)
	improvement := math.Inf(1)
	if !math.IsNaN(prev) {
		improvement = prev - ce
	}
	s.Nudging = ce < float64(s.Zone) && improvement < s.Gate
	s.PrevCE = F(ce)
}
