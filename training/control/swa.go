package control

import (
	"fmt"
	"math"
)

// SWASelect is selective stochastic weight averaging (Section 5): the
// weights at the end of an epoch join the average only when
//
//   - the epoch is at least Start,
//   - its validation CE lies in the helpful zone: ZoneLo ≤ CE ≤ ZoneHi and,
//     when Band > 0, CE ≤ (1+Band)·(best CE seen so far), and
//   - it gained at least MinGain relative to its entry snapshot (the weights
//     at the start of the epoch): (CE_entry − CE)/CE_entry ≥ MinGain.
//
// The average is the plain mean of the members, kept beside the model's
// parameters under the names "swa.<param>". rpac's epoch is one evaluation
// interval (--eval-every steps).
type SWASelect struct {
	ZoneLo  F       `json:"zone_lo"`
	ZoneHi  F       `json:"zone_hi"`
	Band    float64 `json:"band"`
	MinGain float64 `json:"min_gain"`
	Start   int     `json:"start_epoch"`
	// Best is the lowest validation CE seen so far; EntryCE the CE of the
	// current epoch's entry snapshot (NaN before the first evaluation).
	Best    F     `json:"best"`
	EntryCE F     `json:"entry_ce"`
	Members []int `json:"members"` // epochs averaged so far
}

// Prefix of the SWA tensors in a checkpoint's model.safetensors.
const SWAPrefix = "swa."

// NewSWASelect checks the thresholds.
func NewSWASelect(zoneLo, zoneHi, band, minGain float64, start int) (*SWASelect, error) {
	if math.IsNaN(zoneLo) || math.IsNaN(zoneHi) || zoneLo > zoneHi {
		return nil, fmt.Errorf("swa-select: zone [%g, %g] is empty", zoneLo, zoneHi)
	}
	if band < 0 || math.IsNaN(band) {
		return nil, fmt.Errorf("swa-select: band %g must not be negative", band)
	}
	if math.IsNaN(minGain) {
		return nil, fmt.Errorf("swa-select: minimum gain is NaN")
	}
	return &SWASelect{ZoneLo: F(zoneLo), ZoneHi: F(zoneHi), Band: band, MinGain: minGain, Start: start,
		Best: F(math.Inf(1)), EntryCE: F(math.NaN())}, nil
}

// Decision explains one Consider call.
type Decision struct {
	Join             bool
	InZone, Gained   bool
	RelGain, EntryCE float64
}

// Consider applies the rule to the epoch that just ended with validation CE
// ce, then makes ce the entry CE of the next epoch. The caller adds the
// weights to the average (Accumulate) when Join is true.
func (s *SWASelect) Consider(epoch int, ce float64) Decision {
	entry := float64(s.EntryCE)
	if ce < float64(s.Best) {
		s.Best = F(ce)
	}
	d := Decision{EntryCE: entry, RelGain: math.NaN()}
	if !math.IsNaN(entry) && entry > 0 {
		d.RelGain = (entry - ce) / entry
	}
	d.InZone = ce >= float64(s.ZoneLo) && ce <= float64(s.ZoneHi) &&
		(s.Band <= 0 || ce <= (1+s.Band)*float64(s.Best))
	d.Gained = !math.IsNaN(d.RelGain) && d.RelGain >= s.MinGain
	d.Join = epoch >= s.Start && d.InZone && d.Gained && !math.IsNaN(ce)
	if d.Join {
		s.Members = append(s.Members, epoch)
	}
	s.EntryCE = F(ce)
	return d
}

// Count is the number of members.
func (s *SWASelect) Count() int { return len(s.Members) }

// Accumulate adds w as the n-th member (n = Count() after Consider) to the
// running mean avg: avg += (w − avg)/n; the first member is copied.
func Accumulate(avg, w [][]float32, n int) {
	if n < 1 {
		return
	}
	inv := 1 / float32(n)
	for k, a := range avg {
		x := w[k]
		if n == 1 {
			copy(a, x)
			continue
		}
		for i := range a {
			a[i] += (x[i] - a[i]) * inv
		}
	}
}
