package cuda

import (
	"github.com/rpac-dev/rpac/ir"
)

// Sums folded into the chains that make what they sum. A bias gradient is
// the column sum of a generated chain's result (an expert's GELU gradient,
// a residual's gradient), a gate's gradient the row sums of the products
// of a chain's result and another value: the chain writes the result in
// fp32 and reduce_cols_f32 or reduce_rows_f32 reads it back. When a SumTo,
// ReduceSum or ReduceMean sums a chain's result over the middle axis of
// [A, R, C] with A = 1 (all its rows) or C = 1 (along its rows), or a
// SumToProduct sums the products of it and a value already made, the chain
// runs in that reduction's layout instead of a grid-stride loop (the
// chunks planReduce gives the same shape) and sums as it goes: each
// partial is the one the reduction's first pass forms, of the same floats
// (a product rounded to float as red_term rounds it) in the same order,
// so the reduction node, which then only adds the partials
// (reduce_parts_f32), gives the same bits. When nothing else reads the
// fp32 result (only the sum, and bf16 GEMMs through the chain's bf16
// copy, packed.go), the chain does not write it at all. The partials live
// in the twins' pool from the chain to the reduction. Options.Sums off
// keeps the separate reductions.

// chainSum is a reduction a chain folded and the partials the chain
// writes (plan.outputs()·plan.chunks doubles).
type chainSum struct {
	foldable
	part Buffer
}

// finish is the reduction node's step: the partials' sums into o.
func (s chainSum) finish(p *program, o *dval) func() error {
	return func() error {
		return sumParts(p.launch, o.buf.Ptr, s.part.Ptr, s.plan.chunks, s.scale, s.plan.outputs())
	}
}

// foldable is a reduction of a chain's result that the chain can fold
// (foldedSum): the reduction node, its chunks, the scale it applies (a
// mean's 1/R) and, for a sum of products, the other factor.
type foldable struct {
	r     *ir.Node
	plan  reducePlan
	scale float32
	y     *ir.Value
}

// foldedSum is the reduction of FusedElementwise node n's result that the
// chain can fold; ok is false for none.
func (p *program) foldedSum(n *ir.Node) (f foldable, ok bool) {
	o := n.Outputs[0]
	if !p.be.sums || o.Kind != ir.Intermediate || o.DType != ir.F32 || o.Shape.Numel() == 0 {
		return foldable{}, false
	}
	for _, m := range p.g.Nodes {
		if f, ok := p.foldableBy(n, m); ok {
			return f, true
		}
	}
	return foldable{}, false
}

// foldableBy: node m is a reduction of chain n's result o that n can
// fold: a SumTo, ReduceSum or ReduceMean of o, or a SumToProduct of o and
// a value y ≠ o made before n, over the middle axis of [1, R, C] or
// [A, R, 1].
func (p *program) foldableBy(n, m *ir.Node) (foldable, bool) {
	o := n.Outputs[0]
	f := foldable{r: m}
	switch {
	case (m.Op == ir.OpSumTo || m.Op == ir.OpReduceSum || m.Op == ir.OpReduceMean) && len(m.Inputs) == 1 && m.Inputs[0] == o:
	case m.Op == ir.OpSumToProduct && len(m.Inputs) == 2 && (m.Inputs[0] == o) != (m.Inputs[1] == o):
		f.y = m.Inputs[0]
		if f.y == o {
			f.y = m.Inputs[1]
		}
		if !f.y.Shape.Equal(o.Shape) || f.y.DType != ir.F32 || !p.madeBefore(f.y, n) {
			return foldable{}, false
		}
	default:
		return foldable{}, false
	}
	red, mean, err := reductionOf(m, o.Shape)
	if err != nil {
		return foldable{}, false
	}
	mid, ok := midAxisOf(reduceViews(o.Shape, red))
	if !ok || (mid.A != 1 && mid.C != 1) {
		return foldable{}, false
	}
	f.plan, f.scale = planReduce(mid), reduceScale(mid.R, mean)
	return f, true
}

// madeBefore: value v exists when node n runs (a graph input or weight,
// or made by an earlier node).
func (p *program) madeBefore(v *ir.Value, n *ir.Node) bool {
	prod := p.producer[v.ID]
	return prod == nil || p.index(prod) < p.index(n)
}

// foldSum sets up the folded reduction f of node n's result (foldedSum):
// the partials' buffer, recorded for the reduction node's build.
func (p *program) foldSum(n *ir.Node, f foldable) (chainSum, bool, error) {
	doubles := f.plan.outputs() * f.plan.chunks
	part, ok, err := p.twinBuffer(uint64(8*doubles), p.index(n), p.index(f.r))
	if !ok || err != nil {
		return chainSum{}, false, err
	}
	s := chainSum{foldable: f, part: part}
	if p.sums == nil {
		p.sums = map[int]chainSum{}
	}
	p.sums[f.r.ID] = s
	return s, true, nil
}

// keepsF32: something reads chain n's fp32 result besides the folded
// reduction r and what the chain's bf16 copy serves (the GEMMs, with a
// twin of its own; the lazy Concat, with its columns of the Concat's
// rows).
func (p *program) keepsF32(n, r *ir.Node) bool {
	o := n.Outputs[0]
	if p.isOutput(o) {
		return true
	}
	_, ownTwin := p.twins[o.ID]
	_, part := p.parts[o.ID]
	for _, m := range p.g.Nodes {
		for i, x := range m.Inputs {
			if x != o || m == r {
				continue
			}
			if ownTwin && p.bf16Operand(m, i, o, false) {
				continue
			}
			if _, written := p.twins[m.Outputs[0].ID]; part && m.Op == ir.OpConcat && written {
				continue
			}
			return true
		}
	}
	return false
}
