package passes

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// AttentionOpPadded is AttentionOp with the head sizes of q, k and v made
// one multiple of HeadAlign (PadAttentionHeads): onnxruntime's CUDA
// provider runs flash attention only for equal q/k and v head sizes that
// are multiples of 8, which neither the paper preset (85) nor a rank fold
// (85 + K + 1 against 85) has.

// HeadAlign is the head-size multiple of AttentionOpPadded.
const HeadAlign = 8

// PadAttentionHeads pads every FusedAttention node's q, k and v with zero
// components to one head size, the smallest multiple of align that holds
// them all, and slices the output back to v's width. Zero components add
// nothing to q·kᵀ, and the zero columns of v only produce output columns
// that the slice drops, so the logits are unchanged; the scale attribute
// is explicit, so the wider head does not change it.
func PadAttentionHeads(g *ir.Graph, align int) error {
	if align < 1 {
		return fmt.Errorf("pad attention heads: alignment %d", align)
	}
	zeros := map[[2]int]*ir.Value{}
	for _, n := range append([]*ir.Node(nil), g.Nodes...) {
		if n.Op != ir.OpFusedAttention {
			continue
		}
		qk, hv := n.Inputs[0].Shape[3], n.Inputs[2].Shape[3]
		w := (max(qk, hv) + align - 1) / align * align
		if qk == w && hv == w {
			continue
		}
		at := nodeIndex(g, n)
		pad := func(x *ir.Value) (*ir.Value, error) {
			p := w - x.Shape[3]
			if p == 0 {
				return x, nil
			}
			T := x.Shape[2]
			z, ok := zeros[[2]int{T, p}]
			if !ok {
				z = newConst(g, fmt.Sprintf("attn.head_pad.T%d.W%d", T, p), ir.Shape{T, p}, make([]float64, T*p))
				zeros[[2]int{T, p}] = z
			}
			s := x.Shape.Clone()
			s[3] = p
			b, err := insertAt(g, at, "BroadcastTo", ir.Attrs{"shape": []int(s)}, z)
			if err != nil {
				return nil, err
			}
			at++
			c, err := insertAt(g, at, "Concat", ir.Attrs{"axis": 3}, x, b)
			at++
			return c, err
		}
		ins := append([]*ir.Value(nil), n.Inputs...)
		var err error
		for i := range ins[:3] {
			if ins[i], err = pad(ins[i]); err != nil {
				return fmt.Errorf("pad attention heads: %w", err)
			}
		}
		o, err := insertAt(g, at, "FusedAttention", n.Attrs.Clone(), ins...)
		if err != nil {
			return fmt.Errorf("pad attention heads: %w", err)
		}
		at++
		out := o
		if hv != w {
			if out, err = insertAt(g, at, "Slice", ir.Attrs{"axis": 3, "start": 0, "end": hv}, o); err != nil {
				return fmt.Errorf("pad attention heads: %w", err)
			}
		}
		replaceUses(g, n.Outputs[0], out)
	}
	return nil
}
