// Package optim holds the optimizer side of training: AdamW with decoupled
// weight decay, global-norm gradient clipping and the paper's learning-rate
// schedule (optional warmup, a flat prelude at the peak, cosine decay to a
// nonzero floor).
//
// Parameters and gradients are flat float32 slices keyed by their PyTorch
// module paths ("blocks.3.attn.Wq.weight"); the optimizer never sees shapes.
package optim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/training/checkpoint"
)

// AdamWConfig configures AdamW. Zero Beta1, Beta2 and Eps take PyTorch's
// defaults (0.9, 0.999, 1e-8); WeightDecay has no default (zero disables it).
type AdamWConfig struct {
	Beta1, Beta2 float64
	Eps          float64
	// WeightDecay is the decoupled decay coefficient λ: each step multiplies
	// a decayed parameter by (1 - lr·λ) before the Adam update.
	WeightDecay float64
	// Decay selects the parameters that are decayed; nil means DefaultDecay.
	Decay func(name string) bool
	// Workers is the number of goroutines for the update of large tensors;
	// zero means GOMAXPROCS.
	Workers int
}

// DefaultDecay selects every tensor whose name ends in ".weight" except
// normalization weights (a module named like "norm1", "ln_f", "layernorm"):
// linear and embedding matrices are decayed; biases, LayerNorm gains and
// scalar parameters (tau_att, kappa, pos_beta, centers, log_sigma) are not.
func DefaultDecay(name string) bool {
	mod, ok := strings.CutSuffix(name, ".weight")
	if !ok {
		return false
	}
	if i := strings.LastIndexByte(mod, '.'); i >= 0 {
		mod = mod[i+1:]
	}
	return !isNorm(strings.ToLower(mod))
}

func isNorm(mod string) bool {
	if strings.Contains(mod, "norm") {
		return true
	}
	rest, ok := strings.CutPrefix(mod, "ln")
	if !ok {
		return false
	}
	if rest == "" || rest[0] == '_' {
		return true
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// AdamW implements torch.optim.AdamW (amsgrad off): for each parameter with
// a gradient g at its t-th update,
//
//	p ← p·(1 − lr·λ)                    (decayed parameters only)
//	m ← β1·m + (1 − β1)·g
//	v ← β2·v + (1 − β2)·g²
//	p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)
//
// Scalars are computed in float64 per element; parameters and moments are
// stored as float32. Like PyTorch, each parameter keeps its own step count t
// and a parameter without a gradient in a step is left untouched.
type AdamW struct {
	cfg   AdamWConfig
	state map[string]*moments
	steps int
	err   error
}

type moments struct {
	m, v []float32
	t    int
}

// DefaultAdamW is torch.optim.AdamW's default configuration: betas (0.9,
// 0.999), eps 1e-8, weight decay 0.01 on the parameters DefaultDecay selects.
func DefaultAdamW() AdamWConfig {
	return AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}
}

// withDefaults fills the zero fields.
func (cfg AdamWConfig) withDefaults() AdamWConfig {
	cfg.Beta1 = cmp.Or(cfg.Beta1, 0.9)
	cfg.Beta2 = cmp.Or(cfg.Beta2, 0.999)
	cfg.Eps = cmp.Or(cfg.Eps, 1e-8)
	if cfg.Decay == nil {
		cfg.Decay = DefaultDecay
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	return cfg
}

// Validate reports a configuration out of range (after zero fields take
// their defaults).
func (cfg AdamWConfig) Validate() error {
	cfg = cfg.withDefaults()
	switch {
	case !(cfg.Beta1 > 0 && cfg.Beta1 < 1), !(cfg.Beta2 > 0 && cfg.Beta2 < 1):
		return fmt.Errorf("optim: AdamW betas (%g, %g) must lie in (0, 1)", cfg.Beta1, cfg.Beta2)
	case !(cfg.Eps > 0) || math.IsInf(cfg.Eps, 0):
		return fmt.Errorf("optim: AdamW eps %g must be positive", cfg.Eps)
	case !(cfg.WeightDecay >= 0) || math.IsInf(cfg.WeightDecay, 0):
		return fmt.Errorf("optim: AdamW weight decay %g must be finite and non-negative", cfg.WeightDecay)
	}
	return nil
}

// NewAdamW returns an optimizer with empty state. A configuration that
// fails Validate is reported by every Step (and Err) instead of a panic.
func NewAdamW(cfg AdamWConfig) *AdamW {
	return &AdamW{cfg: cfg.withDefaults(), state: map[string]*moments{}, err: cfg.Validate()}
}

// Err is the configuration error, if any.
func (o *AdamW) Err() error { return o.err }

// Config returns the configuration with defaults filled in.
func (o *AdamW) Config() AdamWConfig { return o.cfg }

// Steps is the number of successful Step calls (restored by Import).
func (o *AdamW) Steps() int { return o.steps }

// Decays reports whether the named parameter is weight-decayed.
func (o *AdamW) Decays(name string) bool { return o.cfg.Decay(name) }

// chunk is the unit of parallel work: a range of one tensor.
const chunk = 1 << 14

// Step applies one update in place to every parameter that has a gradient.
// A gradient without a parameter, a length mismatch, a bad learning rate or
// an invalid configuration is an error and nothing is updated.
func (o *AdamW) Step(params, grads map[string][]float32, lr float64) error {
	if o.err != nil {
		return o.err
	}
	if !(lr >= 0) || math.IsInf(lr, 0) {
		return fmt.Errorf("optim: learning rate %g must be finite and non-negative", lr)
	}
	names := make([]string, 0, len(grads))
	for name, g := range grads {
		p, ok := params[name]
		if !ok {
			return fmt.Errorf("optim: gradient for %q has no parameter", name)
		}
		if len(p) != len(g) {
			return fmt.Errorf("optim: %s: parameter has %d values, gradient %d", name, len(p), len(g))
		}
		if st := o.state[name]; st != nil && len(st.m) != len(p) {
			return fmt.Errorf("optim: %s: optimizer state has %d values, parameter %d; the state belongs to another model", name, len(st.m), len(p))
		}
		names = append(names, name)
	}
	sort.Strings(names)

	type job struct {
		p, g, m, v []float32
		k          coeffs
	}
	var jobs []job
	total := 0
	b1, b2 := o.cfg.Beta1, o.cfg.Beta2
	for _, name := range names {
		st := o.state[name]
		if st == nil {
			n := len(params[name])
			st = &moments{m: make([]float32, n), v: make([]float32, n)}
			o.state[name] = st
		}
		st.t++
		t := float64(st.t)
		k := coeffs{
			decay:    1,
			b1:       b1,
			b2:       b2,
			stepSize: lr / (1 - math.Pow(b1, t)),
			bc2Sqrt:  math.Sqrt(1 - math.Pow(b2, t)),
			eps:      o.cfg.Eps,
		}
		if o.cfg.WeightDecay != 0 && o.cfg.Decay(name) {
			k.decay = 1 - lr*o.cfg.WeightDecay
		}
		p, g := params[name], grads[name]
		total += len(p)
		for lo := 0; lo < len(p); lo += chunk {
			hi := min(lo+chunk, len(p))
			jobs = append(jobs, job{p[lo:hi], g[lo:hi], st.m[lo:hi], st.v[lo:hi], k})
		}
	}
	workers := o.cfg.Workers
	if total < 4*chunk {
		workers = 1
	}
	parallelFor(len(jobs), workers, func(i int) {
		j := jobs[i]
		adamw(j.p, j.g, j.m, j.v, j.k)
	})
	o.steps++
	return nil
}

type coeffs struct {
	decay, b1, b2, stepSize, bc2Sqrt, eps float64
}

func adamw(p, g, m, v []float32, k coeffs) {
	g = g[:len(p)]
	m = m[:len(p)]
	v = v[:len(p)]
	for i := range p {
		gi := float64(g[i])
		mi := k.b1*float64(m[i]) + (1-k.b1)*gi
		vi := k.b2*float64(v[i]) + (1-k.b2)*gi*gi
		m[i], v[i] = float32(mi), float32(vi)
		denom := math.Sqrt(vi)/k.bc2Sqrt + k.eps
		p[i] = float32(float64(p[i])*k.decay - k.stepSize*mi/denom)
	}
}

// State tensor name prefixes used by Export and Import.
const (
	PrefixM    = "adam.m."
	PrefixV    = "adam.v."
	PrefixStep = "adam.step."
)

// Export returns the optimizer state as named tensors, sorted by name, and
// the Step count: for each parameter "adam.m.<name>" and "adam.v.<name>"
// (flat, shape [n]) and "adam.step.<name>" (a scalar holding the parameter's
// update count, exact up to 2^24 steps). The tensors share no memory with
// the optimizer. Import of the result continues bit-exactly.
func (o *AdamW) Export() ([]checkpoint.Named, int) {
	names := make([]string, 0, len(o.state))
	for n := range o.state {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]checkpoint.Named, 0, 3*len(names))
	for _, n := range names {
		st := o.state[n]
		l := len(st.m)
		out = append(out,
			checkpoint.Named{Name: PrefixM + n, Shape: []int{l}, Data: append([]float32{}, st.m...)},
			checkpoint.Named{Name: PrefixStep + n, Shape: []int{}, Data: []float32{float32(st.t)}},
			checkpoint.Named{Name: PrefixV + n, Shape: []int{l}, Data: append([]float32{}, st.v...)},
		)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, o.steps
}

// Import replaces the optimizer state with one produced by Export (possibly
// after a checkpoint round trip). Tensors not starting with "adam." are an
// error; so is an incomplete triple or a bad step count. On error the state
// is unchanged.
func (o *AdamW) Import(ts []checkpoint.Named, steps int) error {
	if steps < 0 {
		return fmt.Errorf("optim: negative step count %d", steps)
	}
	state := map[string]*moments{}
	get := func(name string) *moments {
		st := state[name]
		if st == nil {
			st = &moments{t: -1}
			state[name] = st
		}
		return st
	}
	for _, t := range ts {
		if len(t.Data) != numel(t.Shape) {
			return fmt.Errorf("optim: state tensor %s: shape %v does not match %d values", t.Name, t.Shape, len(t.Data))
		}
		switch {
		case strings.HasPrefix(t.Name, PrefixM):
			get(t.Name[len(PrefixM):]).m = append([]float32{}, t.Data...)
		case strings.HasPrefix(t.Name, PrefixV):
			get(t.Name[len(PrefixV):]).v = append([]float32{}, t.Data...)
		case strings.HasPrefix(t.Name, PrefixStep):
			if len(t.Data) != 1 {
				return fmt.Errorf("optim: state tensor %s must hold one value, has %d", t.Name, len(t.Data))
			}
			f := t.Data[0]
			if !(f >= 0) || f > 1<<24 || f != float32(math.Trunc(float64(f))) {
				return fmt.Errorf("optim: state tensor %s holds %v, not a step count", t.Name, f)
			}
			get(t.Name[len(PrefixStep):]).t = int(f)
		default:
			return fmt.Errorf("optim: %q is not AdamW state (want %s*, %s*, %s*)", t.Name, PrefixM, PrefixV, PrefixStep)
		}
	}
	for name, st := range state {
		switch {
		case st.m == nil || st.v == nil || st.t < 0:
			return errors.New("optim: incomplete AdamW state for " + name + ": want adam.m, adam.v and adam.step entries")
		case len(st.m) != len(st.v):
			return fmt.Errorf("optim: AdamW state for %s: m has %d values, v %d", name, len(st.m), len(st.v))
		}
	}
	o.state = state
	o.steps = steps
	return nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
