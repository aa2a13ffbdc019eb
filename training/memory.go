package training

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/internal/sysmem"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/passes"
)

// DefaultBudgetFraction is the share of the available memory a run plans
// for when no --mem-budget is given.
const DefaultBudgetFraction = 0.8

// AvailableMemory returns the memory this process can still take (see
// sysmem.Available).
func AvailableMemory() (int64, error) { return sysmem.Available() }

// DefaultMemBudget is DefaultBudgetFraction of AvailableMemory.
func DefaultMemBudget() (int64, error) {
	a, err := AvailableMemory()
	if err != nil {
		return 0, fmt.Errorf("cannot tell the available memory (%v); pass --mem-budget", err)
	}
	return int64(float64(a) * DefaultBudgetFraction), nil
}

// ParseBytes reads a size such as 1GiB, 512MiB, 2G, 1.5GB or 1048576.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || v*mult > 1<<62 {
		return 0, fmt.Errorf("size %q: want a positive amount such as 1GiB, 512MiB or 2G", s)
	}
	return int64(v * mult), nil
}

// FormatBytes prints a size in GiB or MiB.
func FormatBytes(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// MemoryPlan is what a run plans to hold, in bytes.
type MemoryPlan struct {
	Budget int64
	// Static: weights and buffers, AdamW moments, gradient accumulators,
	// EMA/SWA weights, and a checkpoint's copy of the tensors while saving.
	Static int64
	Steps  []int64 // each training length's step program (intermediates and scratch)
	Eval   int64   // the evaluation program
	Total  int64
}

// memEstimator measures programs by building and planning their graphs
// (nothing is allocated); results are cached.
type memEstimator struct {
	cfg   *model.Config
	steps map[[2]int]int64
	evals map[int]int64
	batch bool
	caps  kernels.Capabilities // plan the graphs this backend runs (fused ones)
	// experts: the step graphs' dispatch of the experts
	experts passes.Dispatch
}

func (e *memEstimator) step(T, micro int) (int64, error) {
	k := [2]int{T, micro}
	if b, ok := e.steps[k]; ok {
		return b, nil
	}
	_, plan, err := stepGraph(e.cfg, T, micro, e.cfg.Dropout, LossAll, (&passes.Context{Experts: e.experts}).ForBackend(e.caps))
	if err != nil {
		return 0, err
	}
	e.steps[k] = planBytes(plan)
	return e.steps[k], nil
}

func (e *memEstimator) eval(T, micro int) (int64, error) {
	if b, ok := e.evals[micro]; ok {
		return b, nil
	}
	_, plan, err := evalGraph(e.cfg, T, micro, e.batch, e.caps)
	if err != nil {
		return 0, err
	}
	e.evals[micro] = planBytes(plan)
	return e.evals[micro], nil
}

// staticBytes counts the tensors that live for the whole run.
func staticBytes(cfg *model.Config, T int, ctl Controls) (int64, error) {
	mg, err := model.Build(cfg, model.Opts{T: T, B: 1, Mode: model.Train})
	if err != nil {
		return 0, err
	}
	var params, bufs int64
	for _, s := range mg.Specs {
		if s.Param {
			params += int64(s.Shape.Numel())
		} else {
			bufs += int64(s.Shape.Numel())
		}
	}
	shadows := int64(0)
	if ctl.EMA {
		shadows += params
	}
	if ctl.SWA {
		shadows += params
	}
	live := params*4 + bufs + shadows // weights, Adam m and v, accumulators
	save := params*3 + bufs + shadows // the checkpoint's float32 copy
	const runtimeSlack = 64 << 20
	return 4*(live+save) + runtimeSlack, nil
}

// planMemory chooses each training length's micro-batch (and the
// evaluation's) so that the run fits the memory budget: the largest
// micro-batches that fit with --micro-batch auto, the given one otherwise.
// It fails, before anything is written, when even one sequence per
// micro-batch does not fit.
func (p *Plan) planMemory(o Options, caps kernels.Capabilities, prev *Run) error {
	budget := o.MemBudget
	if budget == 0 {
		var err error
		if budget, err = DefaultMemBudget(); err != nil {
			return err
		}
	}
	static, err := staticBytes(&p.Config, p.EvalT, o.Control)
	if err != nil {
		return err
	}
	est := &memEstimator{cfg: &p.Config, steps: map[[2]int]int64{}, evals: map[int]int64{}, batch: p.EvalStats == "batch",
		caps: caps, experts: o.Experts}
	p.Memory = MemoryPlan{Budget: budget, Static: static}
	fixed := o.MicroBatch > 0
	for i := range p.Lengths { // at most each rank's share
		p.Lengths[i].Micro = p.Lengths[i].Batch / max(1, p.Ranks)
	}
	switch {
	case fixed:
		for i := range p.Lengths {
			l := &p.Lengths[i]
			share := l.Batch / p.Ranks // each rank's sequences
			l.Micro = min(o.MicroBatch, share)
			if share%l.Micro != 0 {
				return fmt.Errorf("--micro-batch %d does not divide the %d sequences of each of %d rank(s) at context %d (batch = tokens per step ÷ context); choose a divisor of %d",
					o.MicroBatch, share, p.Ranks, l.T, share)
			}
		}
	case prev != nil && len(prev.State.Lengths) == len(p.Lengths):
		for i := range p.Lengths { // a resumed run keeps its micro-batches
			if m := prev.State.Lengths[i]; m.T == p.Lengths[i].T && m.Micro > 0 && p.Lengths[i].Batch/p.Ranks%m.Micro == 0 {
				p.Lengths[i].Micro = m.Micro
			}
		}
		fixed = true
	}
	for _, tokens := range p.microTokenCandidates(fixed) {
		if !fixed {
			p.setMicroTokens(tokens)
		}
		p.EvalMicro = largestDivisor(p.EvalBatch, max(1, p.maxMicroTokens()/p.EvalT))
		total, err := p.measure(est)
		if err != nil {
			return err
		}
		if total <= budget {
			return nil
		}
	}
	what := "one sequence per micro-batch"
	if fixed {
		what = fmt.Sprintf("micro-batches of %v sequences", p.micros())
	}
	return fmt.Errorf("%w: %s needs %s (weights, optimizer and checkpoint copy %s, step programs %s, evaluation %s), the budget is %s; raise --mem-budget, lower --micro-batch, shorten --context or choose a smaller model",
		errNoFit, what, FormatBytes(p.Memory.Total), FormatBytes(p.Memory.Static), formatSizes(p.Memory.Steps), FormatBytes(p.Memory.Eval), FormatBytes(budget))
}

// microTokenCandidates lists, largest first, the tokens per micro-batch to
// try: every length's divisors of its batch times its length (a single
// entry, the current plan, when fixed).
func (p *Plan) microTokenCandidates(fixed bool) []int {
	if fixed {
		return []int{p.maxMicroTokens()}
	}
	seen := map[int]bool{}
	var out []int
	for _, l := range p.Lengths {
		for d := 1; d <= l.Batch; d++ {
			if l.Batch%d == 0 && !seen[d*l.T] {
				seen[d*l.T] = true
				out = append(out, d*l.T)
			}
		}
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// setMicroTokens gives every length the largest micro-batch of at most
// tokens tokens (at least one sequence).
func (p *Plan) setMicroTokens(tokens int) {
	for i := range p.Lengths {
		l := &p.Lengths[i]
		l.Micro = largestDivisor(l.Batch/max(1, p.Ranks), max(1, tokens/l.T))
	}
}

func (p *Plan) maxMicroTokens() int {
	m := 0
	for _, l := range p.Lengths {
		m = max(m, l.Micro*l.T)
	}
	return m
}

func (p *Plan) micros() []int {
	var out []int
	for _, l := range p.Lengths {
		out = append(out, l.Micro)
	}
	return out
}

// measure fills p.Memory for the current micro-batches.
func (p *Plan) measure(est *memEstimator) (int64, error) {
	m := &p.Memory
	m.Steps = m.Steps[:0]
	m.Total = m.Static
	for _, l := range p.Lengths {
		b, err := est.step(l.T, l.Micro)
		if err != nil {
			return 0, err
		}
		m.Steps = append(m.Steps, b)
		m.Total += b
	}
	var err error
	if m.Eval, err = est.eval(p.EvalT, p.EvalMicro); err != nil {
		return 0, err
	}
	m.Total += m.Eval
	return m.Total, nil
}

// largestDivisor is the largest divisor of n that is at most k (≥ 1).
func largestDivisor(n, k int) int {
	for d := min(n, k); d > 1; d-- {
		if n%d == 0 {
			return d
		}
	}
	return 1
}

func formatSizes(b []int64) string {
	s := make([]string, len(b))
	for i, x := range b {
		s[i] = FormatBytes(x)
	}
	return strings.Join(s, " + ")
}
