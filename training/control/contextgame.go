package control

import (
	"fmt"
	"math"
	"slices"
)

// ContextGame is the context game of Section 5.1: a distribution q over
// context lengths, updated once per epoch by the replicator/logit step
//
//	log w(c) += η·u(c),   q = (1 − K·q_min)·softmax(log w / temp) + q_min
//	u(c) = −L(c) − λs·[sat(c) − s0]₊ + λh·H(c)/H_max
//
// where L(c), sat(c) and H(c) are the training CE, the saturation fraction
// and the membership entropy averaged over the steps of the epoch that ran at
// context c. A context not sampled in an epoch keeps its last utility (or the
// mean of the others' before it was ever sampled), so q follows relative
// utilities. q_min keeps every length alive (the paper's temperatured
// softmax over running log-weights, with a floor).
type ContextGame struct {
	Contexts []int     `json:"contexts"`
	LogW     []float64 `json:"log_w"`
	Eta      float64   `json:"eta"`
	Temp     float64   `json:"temp"`
	MinProb  float64   `json:"min_prob"`
	LambdaS  float64   `json:"lambda_s"`
	S0       float64   `json:"s0"`
	LambdaH  float64   `json:"lambda_h"`
	HMax     float64   `json:"h_max"`
	// Per-epoch sums of the observations at each context.
	SumCE  []float64 `json:"sum_ce"`
	SumSat []float64 `json:"sum_sat"`
	SumH   []float64 `json:"sum_h"`
	N      []int     `json:"n"`
	// U is each context's last utility; Known says whether it has one.
	U     []float64 `json:"u"`
	Known []bool    `json:"known"`
	RNG   *RNG      `json:"rng"`
}

// GameConfig are the context game's step sizes and utility weights.
type GameConfig struct {
	Eta     float64 // replicator step size η
	Temp    float64 // softmax temperature
	MinProb float64 // probability floor per context
	LambdaS float64 // saturation penalty λs
	S0      float64 // saturation threshold s0
	LambdaH float64 // entropy bonus λh
}

// DefaultGameConfig: η = 2, temperature 1, floor 0.05, λs = 1, s0 = 0.5,
// λh = 0.1 (the paper gives the form of the update, not its constants).
func DefaultGameConfig() GameConfig {
	return GameConfig{Eta: 2, Temp: 1, MinProb: 0.05, LambdaS: 1, S0: 0.5, LambdaH: 0.1}
}

// NewContextGame starts a game over contexts with uniform q; hMax is log R.
func NewContextGame(contexts []int, cfg GameConfig, hMax float64, seed uint64) (*ContextGame, error) {
	if len(contexts) == 0 {
		return nil, fmt.Errorf("context game: no context lengths")
	}
	for i, c := range contexts {
		if c < 2 {
			return nil, fmt.Errorf("context game: context %d is too short", c)
		}
		if slices.Contains(contexts[:i], c) {
			return nil, fmt.Errorf("context game: context %d listed twice", c)
		}
	}
	if !(cfg.Temp > 0) || cfg.Eta < 0 || cfg.MinProb < 0 || cfg.MinProb*float64(len(contexts)) >= 1 {
		return nil, fmt.Errorf("context game: want temperature > 0, η ≥ 0 and 0 ≤ floor < 1/%d (got %g, %g, %g)",
			len(contexts), cfg.Temp, cfg.Eta, cfg.MinProb)
	}
	k := len(contexts)
	return &ContextGame{Contexts: slices.Clone(contexts), LogW: make([]float64, k), Eta: cfg.Eta, Temp: cfg.Temp,
		MinProb: cfg.MinProb, LambdaS: cfg.LambdaS, S0: cfg.S0, LambdaH: cfg.LambdaH, HMax: math.Max(hMax, 1e-9),
		SumCE: make([]float64, k), SumSat: make([]float64, k), SumH: make([]float64, k), N: make([]int, k),
		U: make([]float64, k), Known: make([]bool, k), RNG: NewRNG(seed, 0x3c6ef372fe94f82b)}, nil
}

// Probs is q.
func (g *ContextGame) Probs() []float64 {
	k := len(g.LogW)
	q := make([]float64, k)
	mx := math.Inf(-1)
	for _, l := range g.LogW {
		mx = math.Max(mx, l/g.Temp)
	}
	var s float64
	for i, l := range g.LogW {
		q[i] = math.Exp(l/g.Temp - mx)
		s += q[i]
	}
	for i := range q {
		q[i] = (1-float64(k)*g.MinProb)*q[i]/s + g.MinProb
	}
	return q
}

// Sample draws a context index from q.
func (g *ContextGame) Sample() int {
	q := g.Probs()
	u := g.RNG.Float64()
	for i, p := range q {
		if u < p {
			return i
		}
		u -= p
	}
	return len(q) - 1
}

// Observe records one training step at context index i.
func (g *ContextGame) Observe(i int, ce, sat, h float64) {
	if math.IsNaN(ce) || math.IsNaN(sat) || math.IsNaN(h) {
		return
	}
	g.SumCE[i] += ce
	g.SumSat[i] += sat
	g.SumH[i] += h
	g.N[i]++
}

// Utility is u(c) for mean observations.
func (g *ContextGame) Utility(ce, sat, h float64) float64 {
	return -ce - g.LambdaS*math.Max(sat-g.S0, 0) + g.LambdaH*h/g.HMax
}

// Update ends an epoch: utilities of the observed contexts are refreshed,
// the others keep their last (or the mean observed) utility, and the
// log-weights take one replicator step. It returns the utilities used.
func (g *ContextGame) Update() []float64 {
	var sum float64
	var n int
	for i := range g.Contexts {
		if g.N[i] > 0 {
			c := float64(g.N[i])
			g.U[i] = g.Utility(g.SumCE[i]/c, g.SumSat[i]/c, g.SumH[i]/c)
			g.Known[i] = true
		}
		if g.Known[i] {
			sum += g.U[i]
			n++
		}
	}
	u := make([]float64, len(g.Contexts))
	if n == 0 {
		return u
	}
	mean := sum / float64(n)
	for i := range g.Contexts {
		u[i] = mean
		if g.Known[i] {
			u[i] = g.U[i]
		}
		g.LogW[i] += g.Eta * (u[i] - mean) // shift-free: q depends on differences only
		g.SumCE[i], g.SumSat[i], g.SumH[i], g.N[i] = 0, 0, 0, 0
	}
	return u
}
