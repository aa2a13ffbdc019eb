package training

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/metrics"
)

// controllers drive the paper's training-time machinery between steps.
// Each has a before-step hook (what the next step runs with) and an
// end-of-interval hook (what it learns from an evaluation); their state is
// ControlState, saved with every checkpoint.
type controllers struct {
	cs   *ControlState
	ctl  Controls
	plan *Plan
	// Handles on the store: every block's τ_att and warm-in scale, and
	// λ_sat (nil without the entropy floor).
	taus, scales []*kernels.Tensor
	lambdaSat    *kernels.Tensor
	baseDropout  float64
}

// stepSettings are what the before-step hooks decided.
type stepSettings struct {
	Context int     // index into Plan.Contexts
	Dropout float64 // dropout rate of the step's program
	Chaos   float64 // chaos factor on LR and bias scale (1: none)
	Scale   float64 // bias warm-in scale × chaos
}

func newControllers(cs *ControlState, ctl Controls, p *Plan, mg *model.Graph, store *kernels.Store) *controllers {
	c := &controllers{cs: cs, ctl: ctl, plan: p, baseDropout: p.Config.Dropout, lambdaSat: store.Get(model.LambdaSat)}
	for _, l := range mg.Layers {
		c.taus = append(c.taus, store.Get(l.TauAtt))
		c.scales = append(c.scales, store.Get(l.BiasScale))
	}
	return c
}

// beforeStep runs every controller's before-step hook for step (0-based).
func (c *controllers) beforeStep(step int) stepSettings {
	cs := c.cs
	s := stepSettings{Dropout: cs.Dropout, Chaos: 1}
	if cs.Game != nil {
		s.Context = cs.Game.Sample()
	}
	if c.ctl.DropoutGlide {
		cs.Dropout = control.QuantizeDropout(control.DropoutGlide(c.baseDropout, float64(step)/float64(c.plan.Steps)), 0.005)
		s.Dropout = cs.Dropout
	}
	if cs.Chaos != nil {
		s.Chaos = cs.Chaos.Step()
	}
	s.Scale = control.WarmIn(step, c.plan.WarmIn) * s.Chaos
	c.setScale(s.Scale)
	if cs.Scripted != nil {
		c.setTaus(cs.Scripted.Tau(step + 1))
	}
	if c.lambdaSat != nil && cs.Guardian != nil {
		c.lambdaSat.Set(0, cs.Guardian.LambdaSat)
	}
	return s
}

// plainScale sets the warm-in scale without chaos (evaluations and
// checkpoints see no chaos) and returns it.
func (c *controllers) plainScale(step int) float64 {
	s := control.WarmIn(step, c.plan.WarmIn)
	c.setScale(s)
	return s
}

func (c *controllers) setScale(s float64) {
	for _, t := range c.scales {
		t.Set(0, s)
	}
}

func (c *controllers) setTaus(tau ...float64) {
	for i, t := range c.taus {
		t.Set(0, tau[min(i, len(tau)-1)])
	}
}

func (c *controllers) tauNow() []float64 {
	out := make([]float64, len(c.taus))
	for i, t := range c.taus {
		out[i] = t.At(0)
	}
	return out
}

// afterStep accumulates the interval's diagnostics and feeds the context
// game its observation.
func (c *controllers) afterStep(ci int, out *StepResult) {
	a := &c.cs.Acc
	c.ensureAcc()
	layers := len(out.Layers)
	var hMean, satMean float64
	for l, st := range out.Layers {
		a.H[l] += st.H
		a.Sat[l] += st.Sat
		hMean += st.H / float64(layers)
		satMean += st.Sat / float64(layers)
		if len(a.Usage[l]) != len(st.Usage) {
			a.Usage[l] = make([]float64, len(st.Usage))
		}
		for e, u := range st.Usage {
			a.Usage[l][e] += u
		}
	}
	a.Steps++
	a.CE[ci] += out.CE
	a.N[ci]++
	if c.cs.Game != nil {
		if layers == 0 {
			hMean, satMean = 0, 0
		}
		c.cs.Game.Observe(ci, out.CE, zeroNaN(satMean), zeroNaN(hMean))
	}
}

// gameUpdate runs the context game's replicator step when it is due.
func (c *controllers) gameUpdate(step int) {
	if c.cs.Game != nil && step%c.plan.GameEvery == 0 {
		c.cs.GameU = c.cs.Game.Update()
	}
}

func (c *controllers) ensureAcc() {
	a := &c.cs.Acc
	layers := len(c.taus)
	if c.plan.Config.Model != model.Fuzzy {
		layers = 0
	}
	if len(a.H) != layers {
		a.H, a.Sat, a.Usage = make([]float64, layers), make([]float64, layers), make([][]float64, layers)
	}
	if len(a.CE) != len(c.plan.Contexts) {
		a.CE, a.N = make([]float64, len(c.plan.Contexts)), make([]int, len(c.plan.Contexts))
	}
}

// intervalStats are an evaluation interval's mean diagnostics over its
// steps: what the τ controllers observe (Guardian's Observation) and what
// the metrics record writes. Zero when the model has no fuzzy layers or the
// interval no steps.
type intervalStats struct {
	// Usage is the per-layer expert usage (nil: no diagnostics).
	Usage [][]float64
	// MuEntropy, SatFrac and GateDelta are the means over layers of the
	// membership entropy H(μ) and the saturation fraction, and the change
	// of the expert usage since the previous interval.
	MuEntropy, SatFrac, GateDelta float64
}

// observation is Guardian's input for an interval evaluated at ce.
func (s intervalStats) observation(ce float64) control.Observation {
	return control.Observation{GateDelta: s.GateDelta, SatFrac: s.SatFrac, MuEntropy: s.MuEntropy, ValCE: ce}
}

// intervalDiagnostics computes the interval's mean diagnostics and writes
// them into rec.
func (c *controllers) intervalDiagnostics(rec *metrics.Record) intervalStats {
	a := &c.cs.Acc
	c.ensureAcc()
	var st intervalStats
	if layers := len(a.H); layers > 0 && a.Steps > 0 {
		n := float64(a.Steps)
		hs, sats := make([]float64, layers), make([]float64, layers)
		usage := make([][]float64, layers)
		for l := range layers {
			hs[l], sats[l] = a.H[l]/n, a.Sat[l]/n
			for _, u := range a.Usage[l] {
				usage[l] = append(usage[l], u/n)
			}
		}
		st = intervalStats{Usage: usage, MuEntropy: mean(hs), SatFrac: mean(sats), GateDelta: control.GateDelta(c.cs.PrevUsage, usage)}
		rec.MuEntropyLayers, rec.MuEntropy = hs, metrics.N(st.MuEntropy)
		rec.SatFracLayers, rec.SatFrac = sats, metrics.N(st.SatFrac)
		rec.ExpertUsage = usage
		rec.GateDelta = metrics.N(st.GateDelta)
	}
	rec.TauAtt = c.tauNow()
	if c.cs.Game != nil {
		rec.Contexts, rec.QContext = c.plan.Contexts, c.cs.Game.Probs()
		rec.GameUtility = c.cs.GameU
	}
	byCtx := map[string]float64{}
	for i, ctx := range c.plan.Contexts {
		if a.N[i] > 0 {
			byCtx[fmt.Sprint(ctx)] = a.CE[i] / float64(a.N[i])
		}
	}
	rec.TrainCEByContext = byCtx
	return st
}

// endOfInterval runs the τ controllers' end-of-interval hooks on the
// evaluation's CE (Guardian learns and, before the last step, acts; the
// scripted schedule observes), then starts the next interval.
func (c *controllers) endOfInterval(step int, ce float64, final bool, st intervalStats, rec *metrics.Record) {
	cs := c.cs
	switch {
	case cs.Guardian != nil:
		c.guardianInterval(step, st.observation(ce), final, rec)
	case cs.Scripted != nil:
		cs.Scripted.Observe(ce)
		rec.ScriptedNudge = new(cs.Scripted.Nudging)
	}
	cs.PrevUsage = st.Usage
	cs.Epoch++
	cs.Acc = EpochStats{}
	c.ensureAcc()
}

// guardianInterval lets Guardian learn from the interval's evaluation
// (obs.ValCE) and, before the last step, act on obs.
func (c *controllers) guardianInterval(step int, obs control.Observation, final bool, rec *metrics.Record) {
	g := c.cs.Guardian
	r, adv := g.Learn(obs.ValCE)
	rec.GuardianReward, rec.GuardianAdvantage = metrics.N(r), metrics.N(adv)
	if !final {
		g.Beta = g.Cfg.BetaAt(step)
		tau := c.tauNow()
		act := g.Act(obs, tau)
		c.setTaus(tau...)
		rec.GuardianAction = act.Raw
		rec.GuardianState = obs.Vector()
		rec.TauAttAfter = slices.Clone(tau)
	}
	rec.GuardianBeta, rec.LambdaDelta, rec.LambdaSat = metrics.N(g.Beta), metrics.N(g.LambdaDelta), metrics.N(g.LambdaSat)
}

// newControlState builds the switched-on controllers of a fresh run.
func newControlState(ctl Controls, p *Plan, seed uint64) (*ControlState, error) {
	cs := &ControlState{Dropout: p.Config.Dropout}
	cfg, steps := &p.Config, p.Steps
	var err error
	switch ctl.controller() {
	case "guardian":
		gc := ctl.Guardian
		if gc.TauMax == 0 {
			gc.TauMax = cfg.TauMax
		}
		if gc.BetaStart == 0 && gc.BetaRamp == 0 {
			gc.BetaStart, gc.BetaRamp = p.WarmIn, max(1, steps/5)
		}
		if cs.Guardian, err = control.NewGuardian(gc, seed); err != nil {
			return nil, err
		}
	case "scripted":
		lo, hi := ctl.ScriptedTauMin, ctl.ScriptedTauMax
		if lo == 0 {
			lo = 0.6 // the model clamps τ_att to [0.6, τ_max] inside the bias
		}
		if hi == 0 {
			hi = cfg.TauMax
		}
		if cs.Scripted, err = control.NewScripted(lo, hi, p.WarmIn, steps); err != nil {
			return nil, err
		}
	}
	if p.Game() {
		gc := ctl.Game
		if gc == (control.GameConfig{}) {
			gc = control.DefaultGameConfig()
		}
		if cs.Game, err = control.NewContextGame(p.Contexts, gc, math.Log(math.Max(2, float64(cfg.R))), seed); err != nil {
			return nil, err
		}
	}
	if ctl.EMA {
		d := ctl.EMADecay
		if d == 0 {
			d = math.Min(0.9999, math.Max(0.9, 1-10/float64(max(1, steps))))
		}
		if cs.EMA, err = control.NewEMA(d); err != nil {
			return nil, err
		}
	}
	if ctl.SWA {
		if cs.SWA, err = newSWA(ctl, p); err != nil {
			return nil, err
		}
	}
	if ctl.Chaos {
		amp, decay := ctl.ChaosAmp, ctl.ChaosDecay
		if amp == 0 {
			amp = 0.25
		}
		if decay == 0 {
			decay = 4 / float64(max(1, steps))
		}
		if cs.Chaos, err = control.NewChaos(3.9, amp, decay); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

func newSWA(ctl Controls, p *Plan) (*control.SWASelect, error) {
	hi := ctl.SWAZoneHi
	if hi == 0 {
		hi = math.Inf(1)
	}
	band, gain := 0.03, 0.001
	if ctl.SWABand != nil {
		band = *ctl.SWABand
	}
	if ctl.SWAMinGain != nil {
		gain = *ctl.SWAMinGain
	}
	start := 0
	if ctl.SWAStart != nil {
		start = *ctl.SWAStart
	} else if p.EvalEvery > 0 {
		start = p.Steps / p.EvalEvery / 2 // the paper collects from epoch 60 of 110
	}
	return control.NewSWASelect(ctl.SWAZoneLo, hi, band, gain, start)
}

// checkControllers reports flags that disagree with a resumed run's
// controllers (switching a controller on or off mid-run is not a resume).
func checkControllers(cs *ControlState, ctl Controls, game bool) error {
	var diffs []string
	on := func(name string, have, want bool) {
		if have != want {
			diffs = append(diffs, fmt.Sprintf("%s is %v in the run, %v in the flags", name, onOff(have), onOff(want)))
		}
	}
	on("guardian", cs.Guardian != nil, ctl.controller() == "guardian")
	on("scripted controller", cs.Scripted != nil, ctl.controller() == "scripted")
	on("context game", cs.Game != nil, game)
	on("EMA", cs.EMA != nil, ctl.EMA)
	on("SWA-select", cs.SWA != nil, ctl.SWA)
	on("chaos", cs.Chaos != nil, ctl.Chaos)
	if len(diffs) > 0 {
		return fmt.Errorf("--resume: the flags do not match the run: %s", strings.Join(diffs, "; "))
	}
	if cs.Guardian != nil {
		if err := cs.Guardian.Policy.Validate(); err != nil {
			return fmt.Errorf("--resume: %w", err)
		}
	}
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
