package onnx

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
)

// AttentionOpset is the first ai.onnx opset with the Attention op.
const AttentionOpset = 23

func init() {
	lowerings["FusedAttention"] = lowerFusedAttention
}

// FusedAttention(q, k, v, mask?; scale, causal) -> Attention(Q, K, V,
// attn_mask; scale, is_causal) on 4-D [B,H,T,Hd] inputs (opset 23+). The
// float attn_mask [T,S] broadcasts over batch and heads and is added to the
// scaled scores; is_causal masks the entries j > i. Below opset 23 the op
// is spelled out as MatMul, Mul, Add, Where, Softmax and MatMul.
func lowerFusedAttention(b *builder, n *ir.Node, in []string, out string) (string, error) {
	if ir.AttnLayoutOf(n.Attrs) != ir.AttnBHTD {
		return "", fmt.Errorf("%s: layout bthd (a training backend's) has no ONNX lowering", n.Op)
	}
	scale := float32(n.Attrs.Float("scale", 1/math.Sqrt(float64(n.Inputs[0].Shape[3]))))
	causal := n.Attrs.Bool("causal", false)
	if b.opts.Opset >= AttentionOpset {
		args := []string{in[0], in[1], in[2]}
		if len(in) == 4 {
			args = append(args, in[3])
		}
		c := int64(0)
		if causal {
			c = 1
		}
		return b.emitTo(out, "Attention", args, attrFloat("scale", scale), attrInt("is_causal", c)), nil
	}
	kt := b.swapLast(in[1], 4)
	s := b.emit(out+".scores", "MatMul", []string{in[0], kt})
	s = b.emit(out+".scaled", "Mul", []string{s, b.scalar(scale)})
	if len(in) == 4 {
		s = b.emit(out+".masked", "Add", []string{s, in[3]})
	}
	if causal {
		T, S := n.Inputs[0].Shape[2], n.Inputs[1].Shape[2]
		keep := make([]bool, T*S)
		for i := 0; i < T; i++ {
			for j := 0; j <= i && j < S; j++ {
				keep[i*S+j] = true
			}
		}
		mask := b.boolConst(fmt.Sprintf("causal_mask_%d", T), []int64{int64(T), int64(S)}, keep)
		s = b.emit(out+".causal", "Where", []string{mask, s, b.scalar(float32(math.Inf(-1)))})
	}
	p := b.softmax(s, b.fresh(out+".probs"))
	return b.emitTo(out, "MatMul", []string{p, in[2]}), nil
}
