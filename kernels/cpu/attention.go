package cpu

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
)

// attnShape is a FusedAttention node's geometry and attributes.
type attnShape struct {
	BH, Tq, S, Hd, Hv int
	// H and bthd: the heads per sequence, and whether q, k, v and the
	// outputs are [B,T,H,·] (ir.AttnBTHD) rather than [B,H,T,·].
	H      int
	bthd   bool
	causal bool
	scale  float64
	// dropout: keep an element when its 32-bit draw is below thresh, then
	// scale it by keep (1/(1-p)); stream is the node whose draws are used.
	dropout      bool
	thresh       uint64
	keep         float64
	stream       int
	hasMask      bool
	maskElements int
}

func newAttnShape[T float](n *ir.Node, in []*tensor[T]) (attnShape, error) {
	var a attnShape
	if len(in) != 3 && len(in) != 4 {
		return a, fmt.Errorf("want q, k, v and an optional mask, got %d inputs", len(in))
	}
	q, k, v := in[0], in[1], in[2]
	qs, ks := q.shape, k.shape
	if len(qs) != 4 || len(ks) != 4 || len(v.shape) != 4 || !ks[:3].Equal(v.shape[:3]) {
		return a, fmt.Errorf("q %v, k %v, v %v do not agree", qs, ks, v.shape)
	}
	lay := ir.AttnLayoutOf(n.Attrs)
	B, H, Tq, Hd := lay.Dims(qs)
	kB, kH, S, kD := lay.Dims(ks)
	if B != kB || H != kH || Hd != kD {
		return a, fmt.Errorf("q %v, k %v, v %v do not agree", qs, ks, v.shape)
	}
	a.BH, a.Tq, a.S, a.Hd, a.Hv = B*H, Tq, S, Hd, v.shape[3]
	a.H, a.bthd = H, lay == ir.AttnBTHD
	if len(in) == 4 {
		if in[3].numel() != a.Tq*a.S {
			return a, fmt.Errorf("mask %v, want [%d,%d]", in[3].shape, a.Tq, a.S)
		}
		a.hasMask = true
	}
	a.causal = n.Attrs.Bool("causal", false)
	if a.causal && a.Tq != a.S {
		return a, fmt.Errorf("causal attention wants T == S, got %d and %d", a.Tq, a.S)
	}
	a.scale = 1.0
	if a.Hd > 0 {
		a.scale = 1 / math.Sqrt(float64(a.Hd))
	}
	a.scale = n.Attrs.Float("scale", a.scale)
	if p := n.Attrs.Float("dropout", 0); p > 0 {
		a.dropout, a.keep = true, 1/(1-p)
		a.thresh = uint64((1 - p) * (1 << 32))
		a.stream = n.Stream()
	}
	return a, nil
}

// head is where head bh of a tensor of rows rows of d per head starts and
// its row stride: [B,H,rows,d], or [B,rows,H,d] under bthd.
func (a *attnShape) head(bh, rows, d int) (off, ld int) {
	if !a.bthd {
		return bh * rows * d, d
	}
	b, h := bh/a.H, bh%a.H
	return (b*rows*a.H + h) * d, a.H * d
}

// clearRows zeroes rows rows of d elements ld apart from off.
func clearRows[T float](x []T, off, ld, rows, d int) {
	for i := range rows {
		clear(x[off+i*ld : off+i*ld+d])
	}
}

// dropMask returns the Dropout multiplier (0 or 1/(1-p)) of element e of
// stream key, as the Dropout kernel draws it.
func (a *attnShape) dropMask(key uint64, e int) float64 {
	h := mix64(key + uint64(e>>1+1)*golden)
	if uint64(uint32(h>>(32*(e&1)))) < a.thresh {
		return a.keep
	}
	return 0
}

// weights computes the softmax weights of head bh into p [Tq,S] (before
// dropout), its q and k rows ldq and ldk apart.
func attnWeights[T float](a *attnShape, p, qb []T, ldq int, kb []T, ldk int, M []T) {
	negInf := T(math.Inf(-1))
	gemm(false, true, a.Tq, a.S, a.Hd, T(a.scale), qb, ldq, kb, ldk, 0, p, a.S)
	for i := 0; i < a.Tq; i++ {
		row := p[i*a.S : (i+1)*a.S]
		if M != nil {
			for j, m := range M[i*a.S : (i+1)*a.S] {
				row[j] += m
			}
		}
		if a.causal {
			for j := i + 1; j < a.S; j++ {
				row[j] = negInf
			}
		}
		softmaxRow(row, row)
	}
}

// applyDropout multiplies head bh's weights by its dropout mask.
func attnDropout[T float](a *attnShape, key uint64, bh int, p []T) {
	base := bh * a.Tq * a.S
	for e := range p {
		if p[e] != 0 {
			p[e] *= T(a.dropMask(key, base+e))
		}
	}
}

// FusedAttention: (softmax(scale·q·kᵀ + mask, causal) ∘ dropout)·v per
// (batch, head) (v's head size may differ from q's and k's), with the T×S
// weights in a per-worker scratch buffer.
func (p *program[T]) buildFusedAttention(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	a, err := newAttnShape(n, in)
	if err != nil {
		return nil, err
	}
	q, k, v, o := in[0], in[1], in[2], out[0]
	parts := p.parts
	scratch := make([][]T, parts)
	for i := range scratch {
		scratch[i] = make([]T, a.Tq*a.S)
	}
	return func() error {
		Q, K, V, O := q.f, k.f, v.f, o.f
		var M []T
		if a.hasMask {
			M = in[3].f
		}
		key := streamKey(p.seed, a.stream)
		parallelParts(a.BH, parts, 1, func(w, lo, hi int) {
			sc := scratch[w]
			for bh := lo; bh < hi; bh++ {
				qo, ldq := a.head(bh, a.Tq, a.Hd)
				ko, ldk := a.head(bh, a.S, a.Hd)
				vo, ldv := a.head(bh, a.S, a.Hv)
				oo, ldo := a.head(bh, a.Tq, a.Hv)
				if a.S == 0 {
					clearRows(O, oo, ldo, a.Tq, a.Hv)
					continue
				}
				attnWeights(&a, sc, Q[qo:], ldq, K[ko:], ldk, M)
				if a.dropout {
					attnDropout(&a, key, bh, sc)
				}
				gemm(false, false, a.Tq, a.Hv, a.S, 1, sc, a.S, V[vo:], ldv, 0, O[oo:], ldo)
			}
		})
		return nil
	}, nil
}

// FusedAttentionGrad recomputes each head's weights P and, with D the
// dropout mask, dP = (dO·vᵀ)∘D, dS = P∘(dP − rowsum(P∘dP)):
// dq = scale·dS·k, dk = scale·dSᵀ·q, dv = (P∘D)ᵀ·dO, dmask = Σ_heads dS.
func (p *program[T]) buildFusedAttentionGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	in, _, _ = ir.SplitAttentionGrad(n.Attrs, in) // recomputed here, not read
	if len(in) < 4 {
		return nil, fmt.Errorf("want dO, q, k, v and an optional mask, got %d inputs", len(in))
	}
	a, err := newAttnShape(n, in[1:])
	if err != nil {
		return nil, err
	}
	dO, q, k, v := in[0], in[1], in[2], in[3]
	dq, dk, dv := out[0], out[1], out[2]
	parts := p.parts
	type work struct{ P, dP, dmask []T }
	ws := make([]work, parts)
	for i := range ws {
		ws[i] = work{P: make([]T, a.Tq*a.S), dP: make([]T, a.Tq*a.S)}
		if a.hasMask {
			ws[i].dmask = make([]T, a.Tq*a.S)
		}
	}
	return func() error {
		Q, K, V, G := q.f, k.f, v.f, dO.f
		var M []T
		if a.hasMask {
			M = in[4].f
			for i := range ws {
				clear(ws[i].dmask)
			}
		}
		key := streamKey(p.seed, a.stream)
		parallelParts(a.BH, parts, 1, func(w, lo, hi int) {
			P, dP := ws[w].P, ws[w].dP
			for bh := lo; bh < hi; bh++ {
				qo, ldq := a.head(bh, a.Tq, a.Hd)
				ko, ldk := a.head(bh, a.S, a.Hd)
				vo, ldv := a.head(bh, a.S, a.Hv)
				gOff, ldg := a.head(bh, a.Tq, a.Hv)
				qb, kb, vb, gb := Q[qo:], K[ko:], V[vo:], G[gOff:]
				dqb, dkb, dvb := dq.f[qo:], dk.f[ko:], dv.f[vo:]
				if a.S == 0 || a.Tq == 0 {
					clearRows(dq.f, qo, ldq, a.Tq, a.Hd)
					clearRows(dk.f, ko, ldk, a.S, a.Hd)
					clearRows(dv.f, vo, ldv, a.S, a.Hv)
					continue
				}
				attnWeights(&a, P, qb, ldq, kb, ldk, M)
				gemm(false, true, a.Tq, a.S, a.Hv, 1, gb, ldg, vb, ldv, 0, dP, a.S) // dO·vᵀ
				base := bh * a.Tq * a.S
				for i := 0; i < a.Tq; i++ {
					pr, dr := P[i*a.S:(i+1)*a.S], dP[i*a.S:(i+1)*a.S]
					var dot float64
					for j := range pr {
						if a.dropout {
							dr[j] *= T(a.dropMask(key, base+i*a.S+j))
						}
						dot += float64(pr[j]) * float64(dr[j])
					}
					for j := range pr {
						dr[j] = pr[j] * (dr[j] - T(dot)) // dS
					}
				}
				if ws[w].dmask != nil {
					for e, d := range dP {
						ws[w].dmask[e] += d
					}
				}
				gemm(false, false, a.Tq, a.Hd, a.S, T(a.scale), dP, a.S, kb, ldk, 0, dqb, ldq)
				gemm(true, false, a.S, a.Hd, a.Tq, T(a.scale), dP, a.S, qb, ldq, 0, dkb, ldk)
				if a.dropout {
					attnDropout(&a, key, bh, P)
				}
				gemm(true, false, a.S, a.Hv, a.Tq, 1, P, a.S, gb, ldg, 0, dvb, ldv)
			}
		})
		if a.hasMask {
			dm := out[3].f
			clear(dm)
			for i := range ws { // in worker order: the same sum every run
				for e, d := range ws[i].dmask {
					dm[e] += d
				}
			}
		}
		return nil
	}, nil
}

func attentionKernels[T float](k kernelTable[T]) {
	k.add("FusedAttention", (*program[T]).buildFusedAttention)
	k.add("FusedAttentionGrad", (*program[T]).buildFusedAttentionGrad)
}
