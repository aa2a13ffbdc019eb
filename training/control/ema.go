package control

import "fmt"

// EMA keeps an exponential moving average of the weights, updated after
// every optimizer step: shadow ← d·shadow + (1−d)·w with
// d = min(Decay, (1+n)/(10+n)) after n updates, so the average forgets its
// initial weights quickly in short runs (the warm-up of TensorFlow's
// ExponentialMovingAverage). The shadow tensors live beside the model's
// parameters under the names "ema.<param>".
type EMA struct {
	Decay   float64 `json:"decay"`
	Updates int     `json:"updates"`
}

// Prefix of the EMA tensors in a checkpoint's model.safetensors.
const EMAPrefix = "ema."

// NewEMA checks the decay.
func NewEMA(decay float64) (*EMA, error) {
	if !(decay > 0 && decay < 1) {
		return nil, fmt.Errorf("ema: decay %g must lie in (0, 1)", decay)
	}
	return &EMA{Decay: decay}, nil
}

// Rate is the decay used by the next update.
func (e *EMA) Rate() float64 {
	n := float64(e.Updates)
	return min(e.Decay, (1+n)/(10+n))
}

// Update moves each shadow toward its weight (shadow and w are paired by
// index and must have equal lengths).
func (e *EMA) Update(shadow, w [][]float32) {
	d := e.Next()
	for k, s := range shadow {
		x := w[k]
		for i := range s {
			s[i] = d*s[i] + (1-d)*x[i]
		}
	}
}

// Next returns the rate of the update about to be made and counts it (an
// update made elsewhere, on a device, with the same rounding).
func (e *EMA) Next() float32 {
	d := float32(e.Rate())
	e.Updates++
	return d
}
