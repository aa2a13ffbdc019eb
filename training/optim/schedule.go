package optim

import (
	"fmt"
	"math"
)

// Schedule is the paper's learning-rate schedule: an optional linear warmup,
// a flat prelude at Peak, then cosine decay to a nonzero floor, held
// afterwards.
//
//	step < WarmupSteps:            Peak·(step+1)/WarmupSteps
//	step < FlatEnd():              Peak
//	FlatEnd() <= step <= Total:    Floor + (Peak−Floor)·(1 + cos(π·(step−FlatEnd)/(Total−FlatEnd)))/2
//	step > Total:                  Floor
//
// with Floor = FloorFrac·Peak (the paper keeps it at 5–10% of the peak) and
// FlatEnd = max(WarmupSteps, ⌊FlatFrac·Total⌋). Steps count from 0.
type Schedule struct {
	Peak        float64
	FloorFrac   float64
	FlatFrac    float64
	WarmupSteps int
	Total       int
}

// Floor is the final learning rate.
func (s Schedule) Floor() float64 { return s.FloorFrac * s.Peak }

// FlatEnd is the first step of the cosine decay.
func (s Schedule) FlatEnd() int {
	return min(max(s.WarmupSteps, int(math.Floor(s.FlatFrac*float64(s.Total)))), max(s.Total, s.WarmupSteps))
}

// Validate reports a schedule whose fields are out of range.
func (s Schedule) Validate() error {
	switch {
	case !(s.Peak > 0) || math.IsInf(s.Peak, 0):
		return fmt.Errorf("optim: schedule peak learning rate %g must be positive", s.Peak)
	case !(s.FloorFrac >= 0 && s.FloorFrac <= 1):
		return fmt.Errorf("optim: schedule floor fraction %g must lie in [0, 1] (the paper uses 0.05-0.1)", s.FloorFrac)
	case !(s.FlatFrac >= 0 && s.FlatFrac <= 1):
		return fmt.Errorf("optim: schedule flat fraction %g must lie in [0, 1]", s.FlatFrac)
	case s.WarmupSteps < 0:
		return fmt.Errorf("optim: schedule warmup steps %d must not be negative", s.WarmupSteps)
	case s.Total <= 0:
		return fmt.Errorf("optim: schedule total steps %d must be positive", s.Total)
	}
	return nil
}

// LR is the learning rate for a step (negative steps count as 0).
func (s Schedule) LR(step int) float64 {
	step = max(step, 0)
	if step < s.WarmupSteps {
		return s.Peak * float64(step+1) / float64(s.WarmupSteps)
	}
	flatEnd := s.FlatEnd()
	if step < flatEnd {
		return s.Peak
	}
	floor := s.Floor()
	if step >= s.Total || s.Total <= flatEnd {
		return floor
	}
	progress := float64(step-flatEnd) / float64(s.Total-flatEnd)
	return floor + (s.Peak-floor)*0.5*(1+math.Cos(math.Pi*progress))
}
