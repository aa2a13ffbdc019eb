package control

import (
	"errors"
	"fmt"
	"math"
)

// Guardian is the paper's gain-aware controller (Section 4, Appendix C
// "Guardian (full)"): a 4 → 64 → 64 tanh MLP with a diagonal Gaussian head
// over three actions (Δτ_att, Δλ_delta, Δλ_sat), trained by REINFORCE on a
// gain-shaped validation reward. It acts between training steps, once per
// epoch (rpac: once per evaluation), on the per-layer attention temperatures
// τ_att and on two penalty weights; it is disabled at inference and never
// part of a model graph.
//
// Per evaluation the trainer calls Learn with the new validation CE (the
// reward of the previous action) and then Act with the new observation.
type Guardian struct {
	Cfg    GuardianConfig `json:"config"`
	Policy Policy         `json:"policy"`
	Opt    Adam           `json:"adam"`
	// LambdaDelta and LambdaSat are the penalty weights the policy moves.
	// λ_sat scales the entropy-floor penalty, (α/2)(1+λ_sat)·relu(ηH_max−H)
	// (lm_loss_from_xy). λ_delta is moved and logged like in the listing,
	// whose code does not consume it either.
	LambdaDelta float64 `json:"lambda_delta"`
	LambdaSat   float64 `json:"lambda_sat"`
	// Beta scales every action (the listing's set_beta): BetaAt ramps it.
	Beta float64 `json:"beta"`
	// Pending is the last action, waiting for its reward.
	Pending *PendingAction `json:"pending,omitempty"`
	// PrevCE is the validation CE seen by the previous Learn (NaN at first).
	PrevCE F `json:"prev_ce"`
	// Baseline is the running mean of rewards subtracted from the reward
	// (a variance-reducing REINFORCE baseline; the listing has none).
	Baseline     F    `json:"baseline"`
	HaveBaseline bool `json:"have_baseline"`
	Updates      int  `json:"updates"`
	RNG          *RNG `json:"rng"`
}

// PendingAction is an action taken and the state it was taken in.
type PendingAction struct {
	State  []float64 `json:"state"`
	Action []float64 `json:"action"`
	Beta   float64   `json:"beta"`
}

// GuardianConfig are Guardian's constants. Zero fields take the defaults of
// DefaultGuardianConfig in Normalize.
type GuardianConfig struct {
	Hidden int     `json:"hidden"` // MLP width (listing: 64)
	LR     float64 `json:"lr"`     // Adam learning rate of the policy (listing: 1e-3)
	// TauStep and LambdaStep turn an action into a move: τ += TauStep·β·a₀,
	// λ += LambdaStep·β·a (listing: 0.03 and 0.01).
	TauStep    float64 `json:"tau_step"`
	LambdaStep float64 `json:"lambda_step"`
	// τ_att is projected to [TauMin, TauMax] with a soft barrier (Project).
	TauMin        float64 `json:"tau_min"`
	TauMax        float64 `json:"tau_max"`
	BarrierMargin float64 `json:"barrier_margin"`
	BarrierPull   float64 `json:"barrier_pull"`
	// Bounds of the penalty weights (listing: [0,1] and [0,0.6]).
	LambdaDeltaMax float64 `json:"lambda_delta_max"`
	LambdaSatMax   float64 `json:"lambda_sat_max"`
	Reward         Reward  `json:"reward"`
	// BaselineMomentum is the weight of the old mean in the reward baseline
	// (negative: no baseline, the listing's plain REINFORCE).
	BaselineMomentum float64 `json:"baseline_momentum"`
	// BetaStart and BetaRamp: β = 0 before step BetaStart, then rises
	// linearly to 1 over BetaRamp steps.
	BetaStart int `json:"beta_start"`
	BetaRamp  int `json:"beta_ramp"`
}

// DefaultGuardianConfig is the listing's controller with rpac's choices for
// what the paper leaves open (reward weights, barrier, baseline, β ramp).
func DefaultGuardianConfig() GuardianConfig {
	return GuardianConfig{
		Hidden: 64, LR: 1e-3, TauStep: 0.03, LambdaStep: 0.01,
		TauMin: 0.3, TauMax: 1.6, BarrierMargin: 0.05, BarrierPull: 0.10,
		LambdaDeltaMax: 1.0, LambdaSatMax: 0.6,
		Reward:           DefaultReward(),
		BaselineMomentum: 0.8,
	}
}

// Normalize fills zero fields with defaults and checks the rest.
func (c *GuardianConfig) Normalize() error {
	d := DefaultGuardianConfig()
	if c.Hidden == 0 {
		c.Hidden = d.Hidden
	}
	for _, p := range []struct {
		v *float64
		d float64
	}{
		{&c.LR, d.LR}, {&c.TauStep, d.TauStep}, {&c.LambdaStep, d.LambdaStep}, {&c.TauMin, d.TauMin},
		{&c.TauMax, d.TauMax}, {&c.BarrierPull, d.BarrierPull}, {&c.LambdaDeltaMax, d.LambdaDeltaMax},
		{&c.LambdaSatMax, d.LambdaSatMax},
	} {
		if *p.v == 0 {
			*p.v = p.d
		}
	}
	if c.Reward == (Reward{}) {
		c.Reward = d.Reward
	}
	switch {
	case c.Hidden < 1:
		return fmt.Errorf("guardian: hidden width %d must be positive", c.Hidden)
	case !(c.TauMin > 0 && c.TauMax > c.TauMin):
		return fmt.Errorf("guardian: τ bounds [%g, %g] must satisfy 0 < min < max", c.TauMin, c.TauMax)
	case c.BarrierMargin < 0 || 2*c.BarrierMargin > c.TauMax-c.TauMin:
		return fmt.Errorf("guardian: barrier margin %g must lie in [0, (τmax−τmin)/2]", c.BarrierMargin)
	case c.BarrierPull < 0 || c.BarrierPull > 1:
		return fmt.Errorf("guardian: barrier pull %g must lie in [0, 1]", c.BarrierPull)
	case !(c.LR > 0):
		return fmt.Errorf("guardian: policy learning rate %g must be positive", c.LR)
	case c.BaselineMomentum >= 1:
		return fmt.Errorf("guardian: baseline momentum %g must be below 1", c.BaselineMomentum)
	}
	return nil
}

// NewGuardian returns a Guardian with a freshly initialised policy.
func NewGuardian(cfg GuardianConfig, seed uint64) (*Guardian, error) {
	if err := cfg.Normalize(); err != nil {
		return nil, err
	}
	rng := NewRNG(seed, 0x6a09e667f3bcc908)
	p := NewPolicy(4, cfg.Hidden, 3, rng)
	return &Guardian{Cfg: cfg, Policy: p, Opt: NewAdam(cfg.LR, p.Params()), PrevCE: F(math.NaN()), RNG: rng}, nil
}

// Observation is Guardian's state (GuardianState of the listing).
type Observation struct {
	GateDelta float64 // change of the MoE gate's expert usage between evaluations
	SatFrac   float64 // saturation fraction of the fuzzy memberships
	MuEntropy float64 // membership entropy H(μ)
	ValCE     float64 // validation cross-entropy
}

// Vector is the policy input [gate_delta, sat_frac, mu_entropy, val_loss].
func (o Observation) Vector() []float64 {
	return []float64{o.GateDelta, o.SatFrac, o.MuEntropy, o.ValCE}
}

// Action is what one Act did.
type Action struct {
	Raw         []float64 // the sampled (Δτ, Δλ_delta, Δλ_sat)
	Beta        float64
	LambdaDelta float64
	LambdaSat   float64
}

// BetaAt is the β ramp: 0 before BetaStart, then linear to 1 over BetaRamp
// steps (a step function at BetaStart when BetaRamp ≤ 0).
func (c GuardianConfig) BetaAt(step int) float64 {
	if step < c.BetaStart {
		return 0
	}
	if c.BetaRamp <= 0 {
		return 1
	}
	return math.Min(1, float64(step-c.BetaStart)/float64(c.BetaRamp))
}

// Project maps τ into [lo, hi] with a soft barrier: inside a margin m of
// either bound, τ is pulled back toward the interior by the fraction pull of
// its penetration into the margin, then clamped. With m = 0 this is the
// listing's rule, τ − 0.10·[τ − τmax]₊ clamped to [0.3, τmax]; the listing's
// pull-back alone never keeps τ off the bound (the clamp undoes it), so rpac
// applies it from a margin inside the bounds.
func Project(tau, lo, hi, margin, pull float64) float64 {
	if math.IsNaN(tau) {
		return math.Min(math.Max((lo+hi)/2, lo), hi)
	}
	if up := hi - margin; tau > up {
		tau -= pull * (tau - up)
	}
	if down := lo + margin; tau < down {
		tau += pull * (down - tau)
	}
	return math.Min(math.Max(tau, lo), hi)
}

// Act samples an action for obs and applies it: each τ in taus (one per
// layer) moves by TauStep·β·Δτ and is projected; λ_delta and λ_sat move by
// LambdaStep·β·Δλ and are clipped. The action waits for its reward in
// Pending.
func (g *Guardian) Act(obs Observation, taus []float64) Action {
	s := obs.Vector()
	for i, v := range s {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			s[i] = 0
		}
	}
	a := g.Policy.Sample(s, g.RNG)
	c := g.Cfg
	for i := range taus {
		taus[i] = Project(taus[i]+c.TauStep*g.Beta*a[0], c.TauMin, c.TauMax, c.BarrierMargin, c.BarrierPull)
	}
	g.LambdaDelta = clip(g.LambdaDelta+c.LambdaStep*g.Beta*a[1], 0, c.LambdaDeltaMax)
	g.LambdaSat = clip(g.LambdaSat+c.LambdaStep*g.Beta*a[2], 0, c.LambdaSatMax)
	g.Pending = &PendingAction{State: s, Action: a, Beta: g.Beta}
	return Action{Raw: append([]float64(nil), a...), Beta: g.Beta, LambdaDelta: g.LambdaDelta, LambdaSat: g.LambdaSat}
}

// Learn receives the validation CE measured after the pending action, forms
// the gain-shaped reward and, when an action with β > 0 is pending, takes one
// REINFORCE step: minimise −(R − b)·log π(a|s). It returns the reward and
// advantage (NaN when no update happened).
func (g *Guardian) Learn(ce float64) (reward, advantage float64) {
	reward = g.Cfg.Reward.Of(ce, float64(g.PrevCE))
	advantage = math.NaN()
	if g.Pending != nil && g.Pending.Beta > 0 && !math.IsNaN(reward) {
		b := 0.0
		if g.Cfg.BaselineMomentum >= 0 {
			if !g.HaveBaseline {
				g.Baseline, g.HaveBaseline = F(reward), true
			}
			b = float64(g.Baseline)
		}
		advantage = reward - b
		_, grads := g.Policy.LogProbGrad(g.Pending.State, g.Pending.Action)
		for _, gr := range grads {
			for i := range gr {
				gr[i] *= -advantage
			}
		}
		g.Opt.Step(g.Policy.Params(), grads)
		g.Updates++
		if g.Cfg.BaselineMomentum >= 0 {
			m := g.Cfg.BaselineMomentum
			g.Baseline = F(m*float64(g.Baseline) + (1-m)*reward)
		}
	}
	g.Pending = nil
	if !math.IsNaN(ce) {
		g.PrevCE = F(ce)
	}
	return reward, advantage
}

// Reward is the gain-shaped reward R = −CE + λ1·(ΔCE)₊ + λ2·σ(κ·ΔCE/CE)
// with ΔCE = CE_prev − CE the improvement since the previous evaluation. The
// sigmoid term grows with the *relative* gain, so the same absolute gain is
// worth more at an already-low CE (the paper: "emphasizing improvements that
// occur at already-low CE"). The paper names the form, not the weights; they
// are rpac's choice.
type Reward struct {
	Lambda1 float64 `json:"lambda1"`
	Lambda2 float64 `json:"lambda2"`
	Kappa   float64 `json:"kappa"`
}

// DefaultReward: λ1 = 5, λ2 = 0.5, κ = 50.
func DefaultReward() Reward { return Reward{Lambda1: 5, Lambda2: 0.5, Kappa: 50} }

// Of is R(CE; CE_prev). Without a previous CE the gain terms are those of
// ΔCE = 0.
func (r Reward) Of(ce, prev float64) float64 {
	d := 0.0
	if !math.IsNaN(prev) && !math.IsInf(prev, 0) {
		d = prev - ce
	}
	rel := 0.0
	if ce > 0 {
		rel = d / ce
	}
	return -ce + r.Lambda1*math.Max(d, 0) + r.Lambda2*sigmoid(r.Kappa*rel)
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func clip(x, lo, hi float64) float64 { return math.Min(math.Max(x, lo), hi) }

// Policy is GuardianPolicy: body = Linear(in,H)·tanh·Linear(H,H)·tanh,
// mean = Linear(H,out), std = exp(log_std) with log_std a free parameter.
// Weights are row-major [out,in], initialised like torch.nn.Linear.
type Policy struct {
	In     int       `json:"in"`
	Hidden int       `json:"hidden"`
	Out    int       `json:"out"`
	W1     []float64 `json:"w1"`
	B1     []float64 `json:"b1"`
	W2     []float64 `json:"w2"`
	B2     []float64 `json:"b2"`
	W3     []float64 `json:"w3"`
	B3     []float64 `json:"b3"`
	LogStd []float64 `json:"log_std"`
}

// NewPolicy draws a policy's initial parameters: U(±1/√fan_in) for weights
// and biases, log_std = 0.
func NewPolicy(in, hidden, out int, rng *RNG) Policy {
	u := func(n, fanIn int) []float64 {
		b := 1 / math.Sqrt(float64(fanIn))
		x := make([]float64, n)
		for i := range x {
			x[i] = (2*rng.Float64() - 1) * b
		}
		return x
	}
	return Policy{In: in, Hidden: hidden, Out: out,
		W1: u(hidden*in, in), B1: u(hidden, in),
		W2: u(hidden*hidden, hidden), B2: u(hidden, hidden),
		W3: u(out*hidden, hidden), B3: u(out, hidden),
		LogStd: make([]float64, out)}
}

// Params lists the parameter slices in a fixed order (W1 B1 W2 B2 W3 B3 LogStd).
func (p *Policy) Params() [][]float64 {
	return [][]float64{p.W1, p.B1, p.W2, p.B2, p.W3, p.B3, p.LogStd}
}

// Validate checks the shapes (a policy read from a checkpoint).
func (p *Policy) Validate() error {
	want := []int{p.Hidden * p.In, p.Hidden, p.Hidden * p.Hidden, p.Hidden, p.Out * p.Hidden, p.Out, p.Out}
	for i, x := range p.Params() {
		if len(x) != want[i] {
			return errors.New("guardian: policy parameters have the wrong sizes")
		}
	}
	return nil
}

// logProb builds log π(a|s) on a tape and returns it with the parameter Vars.
func (p *Policy) logProb(t *Tape, s, a []float64) (*Var, []*Var) {
	w1, b1 := t.Leaf(p.W1, p.Hidden, p.In), t.Vec(p.B1)
	w2, b2 := t.Leaf(p.W2, p.Hidden, p.Hidden), t.Vec(p.B2)
	w3, b3 := t.Leaf(p.W3, p.Out, p.Hidden), t.Vec(p.B3)
	ls := t.Vec(p.LogStd)
	h := t.Tanh(t.Affine(w1, t.Vec(s), b1))
	h = t.Tanh(t.Affine(w2, h, b2))
	m := t.Affine(w3, h, b3)
	std := t.Affine1(t.Exp(ls), 1, 1e-8)
	z := t.Div(t.Sub(t.Vec(a), m), std)
	// −½ Σ (z² + 2·log_std + log 2π)
	inner := t.Add(t.Mul(z, z), t.Affine1(ls, 2, math.Log(2*math.Pi)))
	return t.Affine1(t.Sum(inner), -0.5, 0), []*Var{w1, b1, w2, b2, w3, b3, ls}
}

// LogProb is log π(a|s).
func (p *Policy) LogProb(s, a []float64) float64 {
	var t Tape
	lp, _ := p.logProb(&t, s, a)
	return lp.Val[0]
}

// LogProbGrad is log π(a|s) and its gradient with respect to Params().
func (p *Policy) LogProbGrad(s, a []float64) (float64, [][]float64) {
	var t Tape
	lp, vars := p.logProb(&t, s, a)
	t.Backward(lp)
	g := make([][]float64, len(vars))
	for i, v := range vars {
		g[i] = v.Grad
	}
	return lp.Val[0], g
}

// Mean is the policy mean and standard deviation at s.
func (p *Policy) Mean(s []float64) (mean, std []float64) {
	var t Tape
	h := t.Tanh(t.Affine(t.Leaf(p.W1, p.Hidden, p.In), t.Vec(s), t.Vec(p.B1)))
	h = t.Tanh(t.Affine(t.Leaf(p.W2, p.Hidden, p.Hidden), h, t.Vec(p.B2)))
	m := t.Affine(t.Leaf(p.W3, p.Out, p.Hidden), h, t.Vec(p.B3))
	std = make([]float64, p.Out)
	for i, l := range p.LogStd {
		std[i] = math.Exp(l)
	}
	return m.Val, std
}

// Sample draws a ~ N(mean(s), diag(std²)).
func (p *Policy) Sample(s []float64, rng *RNG) []float64 {
	m, std := p.Mean(s)
	a := make([]float64, len(m))
	for i := range m {
		a[i] = m[i] + std[i]*rng.Norm()
	}
	return a
}

// Adam is a plain Adam optimiser over float64 slices (the policy's
// torch.optim.Adam with default betas).
type Adam struct {
	LR    float64     `json:"lr"`
	Beta1 float64     `json:"beta1"`
	Beta2 float64     `json:"beta2"`
	Eps   float64     `json:"eps"`
	T     int         `json:"t"`
	M     [][]float64 `json:"m"`
	V     [][]float64 `json:"v"`
}

// NewAdam returns Adam state shaped like params.
func NewAdam(lr float64, params [][]float64) Adam {
	a := Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
	for _, p := range params {
		a.M = append(a.M, make([]float64, len(p)))
		a.V = append(a.V, make([]float64, len(p)))
	}
	return a
}

// Step applies one Adam update with gradients grads (shaped like params).
func (a *Adam) Step(params, grads [][]float64) {
	a.T++
	c1 := 1 - math.Pow(a.Beta1, float64(a.T))
	c2 := 1 - math.Pow(a.Beta2, float64(a.T))
	for k, p := range params {
		m, v, g := a.M[k], a.V[k], grads[k]
		for i := range p {
			m[i] = a.Beta1*m[i] + (1-a.Beta1)*g[i]
			v[i] = a.Beta2*v[i] + (1-a.Beta2)*g[i]*g[i]
			p[i] -= a.LR * (m[i] / c1) / (math.Sqrt(v[i]/c2) + a.Eps)
		}
	}
}
