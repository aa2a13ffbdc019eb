package training

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/optim"
)

// Ranges of the numbers of state.json (docs/FILES.md lists them). They are
// far beyond any real run and far below what would exhaust memory or make
// a loop run for long: a value outside comes from a damaged or hostile file.
const (
	MaxSteps      = 1 << 30 // step, total_steps, optim_step, skipped_steps, epochs
	MaxBatch      = 1 << 20 // sequences per step at one length
	MaxLengths    = 16      // context lengths of one run (the context game's)
	maxPolicySize = 1 << 10 // Guardian's policy: inputs, hidden units, outputs
	maxMembers    = 1 << 20 // SWA members
)

// rangeCheck collects every out-of-range number of a file, by JSON path.
type rangeCheck struct{ errs []string }

func (c *rangeCheck) bad(format string, a ...any) { c.errs = append(c.errs, fmt.Sprintf(format, a...)) }

func (c *rangeCheck) int(name string, v, lo, hi int) {
	if v < lo || v > hi {
		c.bad("%s %d is outside %d..%d", name, v, lo, hi)
	}
}

// num checks a float: finite and in [lo, hi].
func (c *rangeCheck) num(name string, v, lo, hi float64) {
	if !(v >= lo && v <= hi) {
		c.bad("%s %g is outside [%g, %g]", name, v, lo, hi)
	}
}

// finite checks a float that may take any finite value (orNaN: or NaN,
// meaning "none yet").
func (c *rangeCheck) finite(name string, v float64, orNaN bool) {
	if math.IsInf(v, 0) || (math.IsNaN(v) && !orNaN) {
		c.bad("%s %g is not a finite number", name, v)
	}
}

func (c *rangeCheck) finites(name string, v []float64) {
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			c.bad("%s[%d] %g is not a finite number", name, i, x)
			return
		}
	}
}

func (c *rangeCheck) count(name string, n, hi int) {
	if n > hi {
		c.bad("%s has %d entries, at most %d", name, n, hi)
	}
}

func (c *rangeCheck) err(what string) error {
	if len(c.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", what, strings.Join(head(c.errs, 8), "; "))
}

// Validate checks every number of a run state against its documented range
// (the model config by model.Config.Validate, the rest here).
func (s *RunState) Validate() error {
	if s.Format != 1 && s.Format != stateFormat {
		return fmt.Errorf("run state format %d is not supported (this build reads 1..%d)", s.Format, stateFormat)
	}
	if s.Config.Model == model.KindUnset {
		return fmt.Errorf("it has no model config; it was not written by rpac train")
	}
	if err := s.Config.Validate(); err != nil {
		return err
	}
	var c rangeCheck
	maxLen := s.Config.MaxLen
	c.int("step", s.Step, 0, MaxSteps)
	c.int("total_steps", s.TotalSteps, 0, MaxSteps)
	c.int("optim_step", s.OptimStep, 0, MaxSteps)
	c.int("skipped_steps", s.SkippedSteps, 0, MaxSteps)
	if s.Tokens < 0 || s.Tokens > math.MaxInt64/2 {
		c.bad("tokens %d is negative or out of range", s.Tokens)
	}
	c.int("context", s.Context, 1, maxLen)
	c.int("batch", s.Batch, 1, MaxBatch)
	c.count("contexts", len(s.Contexts), MaxLengths)
	seen := map[int]bool{}
	for i, T := range s.Contexts {
		c.int(fmt.Sprintf("contexts[%d]", i), T, 1, maxLen)
		if seen[T] {
			c.bad("contexts lists %d twice", T)
		}
		seen[T] = true
	}
	c.count("data_rngs", len(s.DataRNGs), MaxLengths)
	c.count("lengths", len(s.Lengths), MaxLengths)
	for i, l := range s.Lengths {
		c.int(fmt.Sprintf("lengths[%d].T", i), l.T, 1, maxLen)
		c.int(fmt.Sprintf("lengths[%d].batch", i), l.Batch, 1, MaxBatch)
		c.int(fmt.Sprintf("lengths[%d].micro_batch", i), l.Micro, 0, max(l.Batch, 1))
	}
	c.count("running_initialised", len(s.RunningOK), 1<<20)
	c.finite("last_val_ce", float64(s.LastValCE), true)
	c.num("peak_lr", s.PeakLR, 0, math.MaxFloat64)
	if cs := s.Control; cs != nil {
		s.checkControl(&c, cs)
	}
	return c.err("run state")
}

// checkControl checks the controllers' state.
func (s *RunState) checkControl(c *rangeCheck, cs *ControlState) {
	L, E := s.Config.Layers, max(s.Config.Experts, 1)
	c.int("control.epoch", cs.Epoch, 0, MaxSteps)
	c.int("control.eval_every", cs.EvalEvery, 0, MaxSteps)
	c.int("control.game_every", cs.GameEvery, 0, MaxSteps)
	c.num("control.dropout", cs.Dropout, 0, 1)
	c.count("control.game_utility", len(cs.GameU), MaxLengths)
	c.finites("control.game_utility", cs.GameU)
	c.count("control.prev_usage", len(cs.PrevUsage), L)
	for _, u := range cs.PrevUsage {
		c.count("control.prev_usage[]", len(u), E)
		c.finites("control.prev_usage[]", u)
	}
	a := cs.Acc
	c.int("control.epoch_stats.steps", a.Steps, 0, MaxSteps)
	c.count("control.epoch_stats.h", len(a.H), L)
	c.count("control.epoch_stats.sat", len(a.Sat), L)
	c.count("control.epoch_stats.usage", len(a.Usage), L)
	for _, u := range a.Usage {
		c.count("control.epoch_stats.usage[]", len(u), E)
	}
	c.count("control.epoch_stats.ce", len(a.CE), MaxLengths)
	c.count("control.epoch_stats.n", len(a.N), MaxLengths)
	for _, n := range a.N {
		c.int("control.epoch_stats.n[]", n, 0, MaxSteps)
	}
	if g := cs.Guardian; g != nil {
		p := g.Policy
		c.int("control.guardian.policy.in", p.In, 1, maxPolicySize)
		c.int("control.guardian.policy.hidden", p.Hidden, 1, maxPolicySize)
		c.int("control.guardian.policy.out", p.Out, 1, maxPolicySize)
		if len(c.errs) == 0 {
			if err := p.Validate(); err != nil {
				c.bad("control.guardian: %v", err)
			}
			for _, w := range p.Params() {
				c.finites("control.guardian.policy", w)
			}
		}
		c.int("control.guardian.adam.t", g.Opt.T, 0, MaxSteps)
		c.count("control.guardian.adam.m", len(g.Opt.M), 8)
		c.count("control.guardian.adam.v", len(g.Opt.V), 8)
		for _, m := range append(append([][]float64{}, g.Opt.M...), g.Opt.V...) {
			c.count("control.guardian.adam moments", len(m), maxPolicySize*maxPolicySize)
			c.finites("control.guardian.adam moments", m)
		}
		c.int("control.guardian.updates", g.Updates, 0, MaxSteps)
		c.finite("control.guardian.beta", g.Beta, false)
		c.finite("control.guardian.lambda_delta", g.LambdaDelta, false)
		c.finite("control.guardian.lambda_sat", g.LambdaSat, false)
		if pa := g.Pending; pa != nil {
			c.count("control.guardian.pending.state", len(pa.State), maxPolicySize)
			c.count("control.guardian.pending.action", len(pa.Action), maxPolicySize)
		}
	}
	if sc := cs.Scripted; sc != nil {
		c.int("control.scripted.warm", sc.Warm, 0, MaxSteps)
		c.int("control.scripted.total", sc.Total, 1, MaxSteps)
		c.finite("control.scripted.tau_min", sc.TauMin, false)
		c.finite("control.scripted.tau_max", sc.TauMax, false)
	}
	if g := cs.Game; g != nil {
		n := len(g.Contexts)
		c.count("control.context_game.contexts", n, MaxLengths)
		for _, T := range g.Contexts {
			c.int("control.context_game.contexts[]", T, 1, s.Config.MaxLen)
		}
		for name, l := range map[string]int{"log_w": len(g.LogW), "sum_ce": len(g.SumCE), "sum_sat": len(g.SumSat),
			"sum_h": len(g.SumH), "n": len(g.N), "u": len(g.U), "known": len(g.Known)} {
			if l != n && l != 0 {
				c.bad("control.context_game.%s has %d entries for %d contexts", name, l, n)
			}
		}
		c.finites("control.context_game.log_w", g.LogW)
		c.num("control.context_game.min_prob", g.MinProb, 0, 1)
		c.finite("control.context_game.temp", g.Temp, false)
	}
	if ch := cs.Chaos; ch != nil {
		c.num("control.chaos.r", ch.R, 0, 4)
		c.num("control.chaos.x", ch.X, 0, 1)
		c.num("control.chaos.amp", ch.Amp0, 0, 1)
		c.num("control.chaos.decay", ch.Decay, 0, math.MaxFloat64)
		c.int("control.chaos.t", ch.T, 0, MaxSteps)
	}
	if e := cs.EMA; e != nil {
		c.num("control.ema.decay", e.Decay, 0, 1)
		c.int("control.ema.updates", e.Updates, 0, MaxSteps)
	}
	if w := cs.SWA; w != nil {
		c.int("control.swa.start_epoch", w.Start, 0, MaxSteps)
		c.count("control.swa.members", len(w.Members), maxMembers)
		for _, m := range w.Members {
			c.int("control.swa.members[]", m, 0, MaxSteps)
		}
	}
}

// runLengths are the context lengths whose graphs a run's store holds
// tensors of: its training lengths and its evaluation length.
func (s *RunState) runLengths() []int {
	var ls []int
	add := func(T int) {
		for _, x := range ls {
			if x == T {
				return
			}
		}
		ls = append(ls, T)
	}
	add(s.Context)
	for _, T := range s.Contexts {
		add(T)
	}
	for _, l := range s.Lengths {
		add(l.T)
	}
	return ls
}

// checkpointSchemas are the tensors a checkpoint of the run may hold: in
// model.safetensors every parameter and buffer of the training and
// evaluation graphs at the run's lengths, and the EMA and SWA copies of
// the parameters; in optim.safetensors AdamW's moments and step count of
// each parameter. All float32, of the model's shapes.
//
// Building a graph takes time in proportion to its length and depth, so
// the graphs are built at two short lengths only and the per-length
// buffers ("<name>.T<length>", with dimensions that follow the length)
// derived for the run's lengths; a model whose tensors do not follow that
// pattern is built at every length instead.
func checkpointSchemas(s *RunState) (weights, moments checkpoint.Schema, err error) {
	weights, moments = checkpoint.Schema{}, checkpoint.Schema{}
	lengths := s.runLengths()
	for _, mode := range []model.Mode{model.Train, model.Eval} {
		if err := derivedSpecs(&s.Config, mode, lengths, weights, moments); err == errNoPattern {
			for _, T := range lengths {
				mg, err := model.Build(&s.Config, model.Opts{T: T, B: 1, Mode: mode})
				if err != nil {
					return nil, nil, err
				}
				addSpecs(mg.Specs, weights, moments)
			}
		} else if err != nil {
			return nil, nil, err
		}
	}
	return weights, moments, nil
}

var errNoPattern = errors.New("tensors do not follow the per-length pattern")

// derivedSpecs adds the tensors of the graphs of mode at lengths, derived
// from builds at lengths 2 and 3 (errNoPattern when they cannot be).
func derivedSpecs(cfg *model.Config, mode model.Mode, lengths []int, weights, moments checkpoint.Schema) error {
	if cfg.MaxLen < 3 {
		return errNoPattern
	}
	var specs [2][]model.Spec
	for i, T := range []int{2, 3} {
		mg, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: mode})
		if err != nil {
			return err
		}
		specs[i] = mg.Specs
		if i == 0 && !slices.ContainsFunc(mg.Specs, func(sp model.Spec) bool { return strings.HasSuffix(sp.Name, ".T2") }) {
			addSpecs(mg.Specs, weights, moments) // nothing depends on the length
			return nil
		}
	}
	a, b := specs[0], specs[1]
	if len(a) != len(b) {
		return errNoPattern
	}
	var static []model.Spec
	type perLength struct {
		base  string
		shape []int
		track []bool
	}
	var varying []perLength
	for i := range a {
		sa, sb := a[i], b[i]
		if sa.Name == sb.Name && slices.Equal(sa.Shape, sb.Shape) {
			static = append(static, sa)
			continue
		}
		base, ok2 := strings.CutSuffix(sa.Name, ".T2")
		baseB, ok3 := strings.CutSuffix(sb.Name, ".T3")
		if !ok2 || !ok3 || base != baseB || sa.Param || len(sa.Shape) != len(sb.Shape) {
			return errNoPattern
		}
		v := perLength{base: base, shape: append([]int{}, sa.Shape...), track: make([]bool, len(sa.Shape))}
		for j := range sa.Shape {
			switch {
			case sa.Shape[j] == sb.Shape[j]:
			case sa.Shape[j] == 2 && sb.Shape[j] == 3:
				v.track[j] = true
			default:
				return errNoPattern
			}
		}
		varying = append(varying, v)
	}
	addSpecs(static, weights, moments)
	for _, v := range varying {
		for _, T := range lengths {
			shape := append([]int{}, v.shape...)
			for j, t := range v.track {
				if t {
					shape[j] = T
				}
			}
			weights[v.base+".T"+strconv.Itoa(T)] = shape
		}
	}
	return nil
}

// addSpecs adds a graph's tensors (and the copies and optimizer state of
// its parameters).
func addSpecs(specs []model.Spec, weights, moments checkpoint.Schema) {
	for _, sp := range specs {
		shape := append([]int{}, sp.Shape...)
		weights[sp.Name] = shape
		if !sp.Param {
			continue
		}
		weights[control.EMAPrefix+sp.Name] = shape
		weights[control.SWAPrefix+sp.Name] = shape
		n := []int{sp.Shape.Numel()}
		moments[optim.PrefixM+sp.Name] = n
		moments[optim.PrefixV+sp.Name] = n
		moments[optim.PrefixStep+sp.Name] = []int{}
	}
}
