package cuda

import (
	"github.com/rpac-dev/rpac/ir"
)

// Values written as bf16 by their producers. Under bf16 GEMMs a value that
// only GEMMs read (a Linear's x, a LinearGradX's dy, either input of a
// LinearGradW) is needed only as its padded bf16 copy: rows of bf16LD(cols)
// elements, which f32_to_bf16_pad_kernel would make from the fp32 value
// before each GEMM that reads it (twice for a forward activation: its
// Linear, then its weight gradient in the backward, the staging buffer
// long reused in between). When the producer is a generated elementwise
// chain or a LayerNorm, it writes that copy itself, into the value's own
// buffer (2·rows·bf16LD(cols) bytes fit in the 4·rows·cols of its fp32
// slot), and the GEMMs read it as it is: no fp32 write, no conversion. The
// producer rounds each result with the conversion kernel's f32_to_bf16, so
// the GEMMs see the same bits. RPAC_CUDA_PACK=off keeps the fp32 value (to compare).

// gemmShapeOf is the GEMM a Linear, LinearGradX or LinearGradW node runs
// (before any split), from its inputs' shapes; ok is false for other ops.
func gemmShapeOf(op string, in []*ir.Value) (s GemmShape, ok bool) {
	switch op {
	case "Linear": // y = x·Wᵀ
		N, K := in[1].Shape[0], in[1].Shape[1]
		return GemmShape{TransB: true, M: in[0].Shape.Numel() / max(1, K), N: N, K: K, Batch: 1}, true
	case "LinearGradX": // dx = dy·W
		N, K := in[1].Shape[0], in[1].Shape[1]
		return GemmShape{M: in[0].Shape.Numel() / max(1, N), N: K, K: N, Batch: 1}, true
	case "LinearGradW": // dW = dyᵀ·x
		N, K := lastDim(in[0].Shape), lastDim(in[1].Shape)
		return GemmShape{TransA: true, M: N, N: K, K: in[0].Shape.Numel() / max(1, N), Batch: 1}, true
	}
	return GemmShape{}, false
}

// onlyBF16GEMMsRead: v is an intermediate value, no graph output, read at
// least once and only as a dense operand of Linear-family GEMMs that run
// in bf16, each seeing it as rows of its last dimension (so one padded
// copy serves them all). dyOnly admits only the dy of LinearGradX and
// LinearGradW (the lazy Concats of joined gradients).
func (p *program) onlyBF16GEMMsRead(v *ir.Value, dyOnly bool) bool {
	if p.be.gemm != GEMMBF16 || v.Kind != ir.Intermediate || v.DType != ir.F32 || len(v.Shape) == 0 {
		return false
	}
	for _, o := range p.g.Outputs {
		if o == v {
			return false
		}
	}
	cols := lastDim(v.Shape)
	readers := 0
	for _, m := range p.g.Nodes {
		for i, x := range m.Inputs {
			if x != v {
				continue
			}
			if !operandSlot(m.Op, i, dyOnly) {
				return false
			}
			s, _ := gemmShapeOf(m.Op, m.Inputs)
			if !p.bf16GEMM(s) {
				return false
			}
			r, c := s.storedA()
			if i == 1 {
				r, c = s.storedB()
			}
			if c != cols || r*c != v.Shape.Numel() {
				return false
			}
			readers++
		}
	}
	return readers > 0
}

// operandSlot: input i of op is a GEMM operand onlyBF16GEMMsRead admits
// (not a weight, which has its persistent copy, nor a bias).
func operandSlot(op string, i int, dyOnly bool) bool {
	switch op {
	case "Linear":
		return i == 0 && !dyOnly
	case "LinearGradX":
		return i == 0
	case "LinearGradW":
		return i == 0 || (i == 1 && !dyOnly)
	}
	return false
}

// packsOutput: node n writes its result as the padded bf16 copy its GEMM
// readers take: a generated chain (FusedElementwise) or a LayerNorm.
func (p *program) packsOutput(n *ir.Node) bool {
	if !p.be.pack || len(n.Outputs) != 1 {
		return false
	}
	switch n.Op {
	case "FusedElementwise":
		if p.be.fusedInterp {
			return false
		}
	case "LayerNorm":
	default:
		return false
	}
	o := n.Outputs[0]
	if s := p.vals[o.ID].slot; s >= 0 {
		for _, x := range n.Inputs { // in place: the bf16 rows would overrun inputs not yet read
			if p.vals[x.ID].slot == s {
				return false
			}
		}
	}
	return p.onlyBF16GEMMsRead(o, false) && lastDim(o.Shape) >= 8
}

// packInto marks o as written packed, rows of cols. On the simulator,
// whose plan slots are allocations of their own that end flush against a
// guard page (so start 4-byte aligned), o gets an allocation of exactly
// its padded bf16 rows instead: 16-byte aligned for the chain's 16-byte
// stores, the guard page right after the last row. The device's slots
// (offsets in one arena) are 256-byte aligned.
func (p *program) packInto(o *dval, cols int) error {
	if p.packed == nil {
		p.packed = map[int]bool{}
	}
	p.packed[o.v.ID] = true
	if !p.be.dev.separateSlots() {
		return nil
	}
	b, err := p.alloc(o.n / cols * bf16LD(cols) / 2)
	if err != nil {
		return err
	}
	o.buf = b
	return nil
}

// packEnv reads RPAC_CUDA_PACK: unset or "on" (chains whose results only
// bf16 GEMMs read write them as bf16), or "off".
func packEnv() (bool, error) {
	return envChoice("RPAC_CUDA_PACK", map[string]bool{"": true, "on": true, "off": false},
		"on (the default: chains write what only bf16 GEMMs read as bf16) or off")
}
