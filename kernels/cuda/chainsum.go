package cuda

import (
	"github.com/rpac-dev/rpac/ir"
)

// Column sums folded into the chains that make what they sum. A bias
// gradient is the column sum of a generated chain's result (an expert's
// GELU gradient, a residual's gradient): the chain writes the result in
// fp32 and reduce_cols_f32 reads it back. When a SumTo, ReduceSum or
// ReduceMean sums a chain's result over all its rows (midAxis with A = 1),
// the chain runs in reduce_cols_f32's layout instead of a grid-stride loop
// (blocks of 32 columns × 8 row lanes, each block a chunk of rows, the
// chunks planReduce gives the same shape) and sums as it goes: each
// partial is the one reduce_cols_f32 forms, of the same floats in the same
// order, so the reduction node, which then only adds the partials
// (reduce_parts_f32), gives the same bits. When nothing else reads the
// fp32 result (only the sum, and bf16 GEMMs through the chain's bf16
// copy, packed.go), the chain does not write it at all. The partials live
// in the twins' pool from the chain to the reduction. RPAC_CUDA_SUMS=off
// keeps the separate reduction.

// chainSum is a reduction a chain folded: its chunks, the partials the
// chain writes (plan.outputs()·plan.chunks doubles) and the scale the
// reduction applies (a mean's 1/R).
type chainSum struct {
	plan  reducePlan
	part  Buffer
	scale float32
}

// finish is the reduction node's step: the partials' sums into o.
func (s chainSum) finish(p *program, o *dval) func() error {
	return func() error {
		return sumParts(p.launch, o.buf.Ptr, s.part.Ptr, s.plan.chunks, s.scale, s.plan.outputs())
	}
}

// foldedSum is the reduction of FusedElementwise node n's result that the
// chain can fold: a SumTo, ReduceSum or ReduceMean of it alone over all its
// rows, into at least two columns; ok is false for none.
func (p *program) foldedSum(n *ir.Node) (r *ir.Node, plan reducePlan, scale float32, ok bool) {
	o := n.Outputs[0]
	if !p.be.sums || p.be.fusedInterp || o.Kind != ir.Intermediate || o.DType != ir.F32 || o.Shape.Numel() == 0 {
		return nil, reducePlan{}, 0, false
	}
	for _, m := range p.g.Nodes {
		switch m.Op {
		case "SumTo", "ReduceSum", "ReduceMean":
		default:
			continue
		}
		if len(m.Inputs) != 1 || m.Inputs[0] != o {
			continue
		}
		red, mean, err := reductionOf(m, o.Shape)
		if err != nil {
			continue
		}
		mid, ok := midAxisOf(reduceViews(o.Shape, red))
		if !ok || mid.A != 1 || mid.C < 2 {
			continue
		}
		return m, planReduce(mid), reduceScale(mid.R, mean), true
	}
	return nil, reducePlan{}, 0, false
}

// foldSum sets up the folded reduction r of node n's result (foldedSum):
// the partials' buffer, recorded for r's build.
func (p *program) foldSum(n, r *ir.Node, plan reducePlan, scale float32) (chainSum, bool, error) {
	doubles := plan.outputs() * plan.chunks
	part, ok, err := p.twinBuffer(uint64(8*doubles), p.index(n), p.index(r))
	if !ok || err != nil {
		return chainSum{}, false, err
	}
	s := chainSum{plan: plan, part: part, scale: scale}
	if p.sums == nil {
		p.sums = map[int]chainSum{}
	}
	p.sums[r.ID] = s
	return s, true, nil
}

// keepsF32: something reads chain n's fp32 result besides the folded
// reduction r and what the chain's bf16 copy serves (the GEMMs, with a
// twin of its own; the lazy Concat, with its columns of the Concat's
// rows).
func (p *program) keepsF32(n, r *ir.Node) bool {
	o := n.Outputs[0]
	for _, x := range p.g.Outputs {
		if x == o {
			return true
		}
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
			if _, written := p.twins[m.Outputs[0].ID]; part && m.Op == "Concat" && written {
				continue
			}
			return true
		}
	}
	return false
}

// sumsEnv reads RPAC_CUDA_SUMS: unset or "on" (chains fold the column sums
// of their results), or "off" (a separate reduction reads the result).
func sumsEnv() (bool, error) {
	return envChoice("RPAC_CUDA_SUMS", map[string]bool{"": true, "on": true, "off": false},
		"on (the default: chains fold the column sums of their results) or off")
}
