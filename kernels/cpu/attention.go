package cpu

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
)

// FusedAttention: softmax(scale·q·kᵀ + mask, causal)·v per (batch, head)
// (v's head size may differ from q's and k's),
// with the T×S score matrix in a per-worker scratch buffer. The scale
// defaults to 1/sqrt(Hd).
func (p *program[T]) buildFusedAttention(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	if len(in) != 3 && len(in) != 4 {
		return nil, fmt.Errorf("want q, k, v and an optional mask, got %d inputs", len(in))
	}
	q, k, v, o := in[0], in[1], in[2], out[0]
	qs, ks := q.shape, k.shape
	if len(qs) != 4 || len(ks) != 4 || len(v.shape) != 4 || !ks[:3].Equal(v.shape[:3]) || qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
		return nil, fmt.Errorf("q %v, k %v, v %v do not agree", qs, ks, v.shape)
	}
	BH, Tq, S, Hd, Hv := qs[0]*qs[1], qs[2], ks[2], qs[3], v.shape[3]
	var mask *tensor[T]
	if len(in) == 4 {
		mask = in[3]
		if mask.numel() != Tq*S {
			return nil, fmt.Errorf("mask %v, want [%d,%d]", mask.shape, Tq, S)
		}
	}
	causal := n.Attrs.Bool("causal", false)
	if causal && Tq != S {
		return nil, fmt.Errorf("causal attention wants T == S, got %d and %d", Tq, S)
	}
	scale := 1.0
	if Hd > 0 {
		scale = 1 / math.Sqrt(float64(Hd))
	}
	scale = n.Attrs.Float("scale", scale)
	parts := p.parts
	scratch := make([][]T, parts)
	for i := range scratch {
		scratch[i] = make([]T, Tq*S)
	}
	negInf := T(math.Inf(-1))
	return func() error {
		Q, K, V, O := q.f, k.f, v.f, o.f
		var M []T
		if mask != nil {
			M = mask.f
		}
		parallelParts(BH, parts, 1, func(w, lo, hi int) {
			sc := scratch[w]
			for bh := lo; bh < hi; bh++ {
				qb := Q[bh*Tq*Hd : (bh+1)*Tq*Hd]
				kb := K[bh*S*Hd : (bh+1)*S*Hd]
				vb := V[bh*S*Hv : (bh+1)*S*Hv]
				ob := O[bh*Tq*Hv : (bh+1)*Tq*Hv]
				if S == 0 {
					clear(ob)
					continue
				}
				gemm(false, true, Tq, S, Hd, T(scale), qb, Hd, kb, Hd, 0, sc, S)
				for i := 0; i < Tq; i++ {
					row := sc[i*S : (i+1)*S]
					if M != nil {
						mr := M[i*S : (i+1)*S]
						for j := range row {
							row[j] += mr[j]
						}
					}
					if causal {
						for j := i + 1; j < S; j++ {
							row[j] = negInf
						}
					}
					softmaxRow(row, row)
				}
				gemm(false, false, Tq, Hv, S, 1, sc, S, vb, Hv, 0, ob, Hv)
			}
		})
		return nil
	}, nil
}
