// Package cpu is rpac's CPU backend. It compiles an ir.Graph into a program
// that runs the graph's nodes in order over buffers laid out once at compile
// time (by a kernels.Plan when one is given), with a hand-written kernel per
// op, generic over float32 (training) and float64 (gradient checks).
//
// Dense matrix products go through the GEMM seam in kernels/cpu/blas as
// single large calls; the other kernels run in parallel over the cores with
// a small parallel-for and allocate nothing per row.
package cpu

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

type float interface{ float32 | float64 }

type backend struct{ prec ir.Precision }

// New returns the CPU backend computing in precision p.
func New(p ir.Precision) kernels.Backend { return &backend{prec: p} }

func (b *backend) Name() string            { return "cpu" }
func (b *backend) Precision() ir.Precision { return b.prec }

// Capabilities: the unfused attention core (its GEMMs are this backend's
// fastest path), in the host's memory; the training steps run the experts
// of a mixture on their routed tokens only (ExpertFFN: the same results,
// faster; the dense form on request, passes.DispatchDense).
func (b *backend) Capabilities() kernels.Capabilities {
	return kernels.Capabilities{RoutedExperts: true}
}

// Compile checks g against the store and the op table, lays out its buffers
// and prepares one kernel per node.
func (b *backend) Compile(g *ir.Graph, plan *kernels.Plan, store *kernels.Store) (kernels.Program, error) {
	if b.prec == ir.FP64 {
		return compile[float64](b.prec, g, plan, store)
	}
	return compile[float32](b.prec, g, plan, store)
}

// tensor is the storage of one IR value inside a program.
type tensor[T float] struct {
	v     *ir.Value
	shape ir.Shape
	f     []T     // float data (nil for i32 values)
	i     []int32 // i32 data
	slot  int     // plan slot, or -1
	conv  []T     // Input: buffer for feeds of the other precision
}

func (t *tensor[T]) numel() int { return t.shape.Numel() }

// step is one compiled node.
type step struct {
	node *ir.Node
	exec func() error
	post func() // copies outputs computed into temporaries (slot aliasing)
}

type program[T float] struct {
	prec   ir.Precision
	g      *ir.Graph
	store  *kernels.Store
	vals   []*tensor[T] // by value ID
	inputs []*tensor[T]
	stored []*tensor[T] // params and buffers, bound from the store each Run
	steps  []step
	outs   map[string]*kernels.Tensor
	outT   map[string]*tensor[T]
	slots  [][]T
	parts  int // partial accumulators per reduction kernel

	seed uint64
	runs uint64
	// ce caches per-row log-sum-exp of CrossEntropy logits (by value ID) so
	// CrossEntropyGrad on the same logits makes one pass instead of three.
	ce map[int]*ceCache
	// lmh holds, by node ID, the gradient accumulators of LMHeadCrossEntropy
	// nodes whose gradient the program also computes.
	lmh map[int]*lmhState[T]
	// shared is the scratch of the nodes whose ops share theirs
	// (ir.OpDef.SharedScratch), sharedNeed the most one of them takes.
	shared     []T
	sharedNeed int
	closed     bool
}

type ceCache struct {
	lse     []float64 // per-row log-sum-exp
	inv     []float64 // in-place mode: 1/Σexp(x - max) per row
	inPlace bool      // the forward leaves exp(x - max) in the logits buffer
	run     uint64    // the Run in which the forward last completed
}

var errUnsupported = errors.New("no cpu kernel")

func compile[T float](prec ir.Precision, g *ir.Graph, plan *kernels.Plan, store *kernels.Store) (*program[T], error) {
	if g == nil {
		return nil, errors.New("cpu: nil graph")
	}
	if err := ir.Verify(g, false); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	p := &program[T]{prec: prec, g: g, store: store, outs: map[string]*kernels.Tensor{},
		outT: map[string]*tensor[T]{}, ce: map[int]*ceCache{}, lmh: map[int]*lmhState[T]{}, parts: partsFor()}

	// Every value the graph mentions, by ID.
	all := map[int]*ir.Value{}
	add := func(v *ir.Value) { all[v.ID] = v }
	for _, v := range g.Values {
		add(v)
	}
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			add(v)
		}
		for _, v := range n.Outputs {
			add(v)
		}
	}
	for _, v := range g.Outputs {
		add(v)
	}
	maxID := -1
	for id := range all {
		maxID = max(maxID, id)
	}
	p.vals = make([]*tensor[T], maxID+1)

	if plan != nil {
		p.slots = make([][]T, len(plan.SlotElems))
		for s, n := range plan.SlotElems {
			if n < 0 {
				return nil, fmt.Errorf("cpu: plan slot %d has %d elements", s, n)
			}
			p.slots[s] = make([]T, n)
		}
	}

	readers := map[int]bool{}
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			readers[v.ID] = true
		}
	}
	for _, v := range g.Outputs {
		readers[v.ID] = true
	}

	var problems []string
	ids := make([]int, 0, len(all))
	for id := range all {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		v := all[id]
		t := &tensor[T]{v: v, shape: v.Shape.Clone(), slot: -1}
		p.vals[id] = t
		n := v.Shape.Numel()
		switch v.Kind {
		case ir.Input:
			if readers[v.ID] { // an input nothing reads needs no feed
				p.inputs = append(p.inputs, t)
			}
		case ir.Param, ir.Buffer:
			if err := p.bindStored(t); err != nil {
				problems = append(problems, err.Error())
			}
			p.stored = append(p.stored, t)
		case ir.Const:
			if len(v.Data) != n {
				problems = append(problems, fmt.Sprintf("const %s has %d values for shape %v", v, len(v.Data), v.Shape))
				continue
			}
			t.f = make([]T, n)
			for i, x := range v.Data {
				t.f[i] = T(x)
			}
		case ir.Intermediate:
			switch {
			case v.DType == ir.I32:
				t.i = make([]int32, n)
			case plan != nil:
				s, ok := plan.Slot[v.ID]
				if !ok {
					t.f = make([]T, n)
					break
				}
				if s < 0 || s >= len(p.slots) {
					problems = append(problems, fmt.Sprintf("value %s: plan slot %d out of range (%d slots)", v, s, len(p.slots)))
					continue
				}
				if len(p.slots[s]) < n {
					problems = append(problems, fmt.Sprintf("value %s%v needs %d elements, plan slot %d has %d", v, v.Shape, n, s, len(p.slots[s])))
					continue
				}
				t.slot = s
				t.f = p.slots[s][:n]
			default:
				t.f = make([]T, n)
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("cpu: compile %s: %s", g.Name, strings.Join(problems, "; "))
	}

	used := readers // values read after the node that defines them

	missing := map[ir.OpName]bool{}
	for _, n := range g.Nodes {
		in := make([]*tensor[T], len(n.Inputs))
		for i, v := range n.Inputs {
			in[i] = p.vals[v.ID]
		}
		out := make([]*tensor[T], len(n.Outputs))
		for i, v := range n.Outputs {
			out[i] = p.vals[v.ID]
		}
		out, post := p.resolveAliases(n, in, out, used)
		exec, err := p.build(n, in, out)
		if err != nil {
			if errors.Is(err, errUnsupported) {
				missing[n.Op] = true
				continue
			}
			return nil, fmt.Errorf("cpu: compile %s: %s node %d: %w", g.Name, n.Op, n.ID, err)
		}
		p.steps = append(p.steps, step{node: n, exec: exec, post: post})
	}
	if len(missing) > 0 {
		var ops []string
		for op := range missing {
			ops = append(ops, string(op))
		}
		sort.Strings(ops)
		return nil, fmt.Errorf("cpu: compile %s: no cpu kernel for op(s) %s", g.Name, strings.Join(ops, ", "))
	}

	for name, v := range g.Outputs {
		t := p.vals[v.ID]
		p.outT[name] = t
		p.outs[name] = &kernels.Tensor{Shape: v.Shape.Clone()}
		p.refreshOutput(name)
	}
	return p, nil
}

// bindStored points a Param/Buffer tensor at its store data.
func (p *program[T]) bindStored(t *tensor[T]) error {
	v := t.v
	st, err := p.store.Bind(v)
	if err != nil {
		return err
	}
	data := floatsOf[T](st)
	if data == nil || len(data) != v.Shape.Numel() {
		return fmt.Errorf("%s %q: store tensor is not %s data of %d elements (store precision %v, program %v)",
			v.Kind, v.Name, p.prec, v.Shape.Numel(), p.store.Prec, p.prec)
	}
	t.f = data
	return nil
}

// resolveAliases handles plan slots shared between a node's outputs and its
// inputs (or between its outputs). Elementwise ops may run in place; other
// kernels write such an output into a private temporary that post copies
// into the slot. A dead output that collides keeps a private buffer.
func (p *program[T]) resolveAliases(n *ir.Node, in, out []*tensor[T], used map[int]bool) ([]*tensor[T], func()) {
	var copies [][2]*tensor[T]
	res := append([]*tensor[T](nil), out...)
	slot := func(v *ir.Value) int { return p.vals[v.ID].slot }
	for i, o := range out {
		if !kernels.SlotClash(n, i, slot) {
			continue
		}
		tmp := &tensor[T]{v: o.v, shape: o.shape, f: make([]T, o.numel()), slot: -1}
		res[i] = tmp
		if used[o.v.ID] {
			copies = append(copies, [2]*tensor[T]{tmp, o})
		} else {
			p.vals[o.v.ID] = tmp
		}
	}
	if len(copies) == 0 {
		return res, nil
	}
	return res, func() {
		for _, c := range copies {
			copy(c[1].f, c[0].f)
		}
	}
}

// floatsOf returns t's data of precision T, or nil.
func floatsOf[T float](t *kernels.Tensor) []T {
	if isF32[T]() {
		if t.F32 == nil {
			return nil
		}
		return any(t.F32).([]T)
	}
	if t.F64 == nil {
		return nil
	}
	return any(t.F64).([]T)
}

func (p *program[T]) refreshOutput(name string) {
	t, o := p.outT[name], p.outs[name]
	o.F32, o.F64, o.I32 = nil, nil, nil
	switch {
	case t.v.DType == ir.I32:
		o.I32 = t.i
	case isF32[T]():
		o.F32 = any(t.f).([]float32)
	default:
		o.F64 = any(t.f).([]float64)
	}
}

// Run executes the graph once.
func (p *program[T]) Run(feeds map[string]*kernels.Tensor, seed uint64) error {
	if p.closed {
		return errors.New("cpu: Run on a closed program")
	}
	p.seed = seed
	p.runs++
	for _, t := range p.stored {
		if err := p.bindStored(t); err != nil {
			return fmt.Errorf("cpu: run %s: %w", p.g.Name, err)
		}
	}
	for _, t := range p.inputs {
		if err := p.bindFeed(t, feeds); err != nil {
			return fmt.Errorf("cpu: run %s: %w", p.g.Name, err)
		}
	}
	for _, s := range p.steps {
		if err := s.exec(); err != nil {
			return fmt.Errorf("cpu: run %s: %s node %d: %w", p.g.Name, s.node.Op, s.node.ID, err)
		}
		if s.post != nil {
			s.post()
		}
	}
	for name := range p.outs {
		p.refreshOutput(name)
	}
	return nil
}

func (p *program[T]) bindFeed(t *tensor[T], feeds map[string]*kernels.Tensor) error {
	v := t.v
	want := "float"
	if v.DType == ir.I32 {
		want = "i32"
	}
	ft, ok := feeds[v.Name]
	if !ok || ft == nil {
		return fmt.Errorf("input %q (%s%v) is not fed", v.Name, want, v.Shape)
	}
	if !ft.Shape.Equal(v.Shape) {
		return fmt.Errorf("input %q fed with shape %v, graph wants %v", v.Name, ft.Shape, v.Shape)
	}
	n := v.Shape.Numel()
	if v.DType == ir.I32 {
		if ft.I32 == nil || len(ft.I32) != n {
			return fmt.Errorf("input %q wants i32 data of %d elements (%v)", v.Name, n, v.Shape)
		}
		t.i = ft.I32
		return nil
	}
	if data := floatsOf[T](ft); data != nil {
		if len(data) != n {
			return fmt.Errorf("input %q has %d elements for shape %v", v.Name, len(data), v.Shape)
		}
		t.f = data
		return nil
	}
	// a float feed of the other precision: convert into the program's buffer
	if t.conv == nil {
		t.conv = make([]T, n)
	}
	switch {
	case ft.F32 != nil && len(ft.F32) == n:
		for i, x := range ft.F32 {
			t.conv[i] = T(x)
		}
	case ft.F64 != nil && len(ft.F64) == n:
		for i, x := range ft.F64 {
			t.conv[i] = T(x)
		}
	default:
		return fmt.Errorf("input %q wants float data of %d elements (%v)", v.Name, n, v.Shape)
	}
	t.f = t.conv
	return nil
}

// Output returns a view of a named graph output, valid until the next Run.
func (p *program[T]) Output(name string) *kernels.Tensor { return p.outs[name] }

// Close drops the program's buffers.
func (p *program[T]) Close() {
	p.closed = true
	p.vals, p.slots, p.steps, p.inputs, p.stored = nil, nil, nil, nil, nil
	p.ce, p.lmh = nil, nil
}

// needShared records a node's need of n elements of the shared scratch.
func (p *program[T]) needShared(n int) { p.sharedNeed = max(p.sharedNeed, n) }

// sharedScratch is the shared scratch (allocated at its first use, after
// every node has said its need).
func (p *program[T]) sharedScratch() []T {
	if len(p.shared) < p.sharedNeed {
		p.shared = make([]T, p.sharedNeed)
	}
	return p.shared
}
