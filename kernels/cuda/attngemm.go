package cuda

import "github.com/rpac-dev/rpac/ir"

// attnPath is the kernels that run an attention node.
type attnPath uint8

const (
	// attnScalar: attention.cu's fp32 kernels, a block per row (fp32
	// GEMMs, and heads of at most SmallGEMMDim).
	attnScalar attnPath = iota
	// attnFlash: flash.cu's tensor-core kernels; the [T,T] scores never
	// exist in device memory.
	attnFlash
	// attnGEMM: attngemm.cu's row kernels around batched cuBLASLt GEMMs
	// (bf16 inputs, fp32 accumulation); the scores of one node at a time
	// in a work buffer of attnGEMMBytes at most.
	attnGEMM
)

// AttentionPath is the tensor-core path a backend prefers
// (Options.Attention): attnGEMM where its work buffer fits attnGEMMBytes
// (the default), or flash.cu's kernels always. flash.cu stays, though an
// H200 measured it slower (187 against 141 ms a paper step): it is the
// path of every attention whose GEMM work buffer would not fit.
type AttentionPath uint8

const (
	// AttentionGEMM: attngemm.cu's row kernels around cuBLASLt GEMMs
	// where the work buffer fits, flash.cu's kernels elsewhere.
	AttentionGEMM AttentionPath = iota
	// AttentionFlash: flash.cu's kernels always (to compare).
	AttentionFlash
)

// String is the path as RPAC_CUDA_ATTENTION names it.
func (c AttentionPath) String() string {
	if c == AttentionFlash {
		return "flash"
	}
	return "gemm"
}

// attnGEMMBytes caps the GEMM path's work buffer, which the graph's
// memory plan does not count: it comes out of the share of the device's
// memory a run leaves unplanned (training.gpuBudgetFraction). At the paper
// preset (T = 768, 32 sequences of 6 heads of 85) the backward needs
// 1.62 GB.
const attnGEMMBytes = 2 << 30

// agAlign: each region of the work buffer starts on 256 bytes (cuBLASLt's
// preferred operand alignment).
const agAlign = 256

// agRegion is one operand's bytes in the work buffer.
type agRegion struct{ off, n int64 }

// in is the region in the work buffer at work.
func (r agRegion) in(work uint64) Buffer {
	return Buffer{Ptr: work + uint64(r.off), Bytes: uint64(r.n)}
}

// agLayout is where the GEMM path's operands sit in the work buffer. The
// forward's regions come first: a program without a gradient node needs
// only fwdBytes.
type agLayout struct {
	Hp, Tp int // the head and the key length rounded up to 8 (bf16 rows of 16 bytes)
	// forward: the scores S (fp32 [BH,T,T]), P (bf16 [BH,T,Tp]), packed q,
	// k, v (bf16 [BH,T,Hp]) and a GEMM result (fp32 [BH,T,Hp]: o, then dq)
	S, P, Q, K, V, R0 agRegion
	fwdBytes          int64
	// backward: dP (fp32 [BH,T,T]), dS (bf16 [BH,T,Tp]), packed dO, the
	// results dk and dv, and with a bias its gradient's partial sums (fp32
	// [G,T,T], G = agBiasGroups)
	DP, DS, DO, R1, R2, DB agRegion
	bytes                  int64
}

func newAGLayout(a *attention) agLayout {
	l := agLayout{Hp: bf16LD(a.Hd), Tp: bf16LD(a.T)}
	BH, T := int64(a.BH), int64(a.T)
	scores, weights := 4*BH*T*T, 2*BH*T*int64(l.Tp)
	packed, result := 2*BH*T*int64(l.Hp), 4*BH*T*int64(l.Hp)
	at := int64(0)
	next := func(n int64) agRegion {
		r := agRegion{at, n}
		at += (n + agAlign - 1) / agAlign * agAlign
		return r
	}
	l.S, l.P = next(scores), next(weights)
	l.Q, l.K, l.V, l.R0 = next(packed), next(packed), next(packed), next(result)
	l.fwdBytes = at
	l.DP, l.DS, l.DO = next(scores), next(weights), next(packed)
	l.R1, l.R2 = next(result), next(result)
	if a.bias != nil {
		l.DB = next(4 * int64(agBiasGroups(a)) * T * T)
	}
	l.bytes = at
	return l
}

// agWarps is about the warps the backward row kernel should run to keep
// every SM's memory requests in flight (132 SMs × 64 resident warps); a
// variable so that tests can make groups of several pairs at small shapes.
var agWarps = 8192

// agBiasGroups: the groups of (sequence, head) pairs attn_softmax_bwd_f32
// sums the bias gradient over, each a partial [T,T] sum: a warp per query
// and group, about agWarps in all (at most one group per pair). At the
// paper preset (T = 768, 192 pairs) 11 groups of 17 or 18 pairs, 26 MB of
// partial sums.
func agBiasGroups(a *attention) int {
	return max(1, min(a.BH, (agWarps+a.T-1)/a.T))
}

// attnGEMMFits: the work buffer within attnGEMMBytes: the backward's
// when the program has an attention backward, else the forward's.
func attnGEMMFits(a *attention, backward bool) bool {
	l := newAGLayout(a)
	if backward {
		return l.bytes <= attnGEMMBytes
	}
	return l.fwdBytes <= attnGEMMBytes
}

// hasAttentionGrad: the program's graph has a FusedAttentionGrad node.
func (p *program) hasAttentionGrad() bool {
	for _, n := range p.g.Nodes {
		if n.Op == ir.OpFusedAttentionGrad {
			return true
		}
	}
	return false
}

// agBlock: the score GEMMs go over the causal triangle in blocks of this
// many queries, so the scores above the diagonal are mostly not formed:
// at T = 768, 21 of 36 blocks of 128×128.
const agBlock = 128

// agBlocks are the row ranges [r0, r1) of the blocks of T.
func agBlocks(T int) [][2]int {
	var out [][2]int
	for r0 := 0; r0 < T; r0 += agBlock {
		out = append(out, [2]int{r0, min(T, r0+agBlock)})
	}
	return out
}

// agCall is one batched GEMM of the path: C = alpha·op(A)·op(B) over the
// (sequence, head) pairs, A, B and C offset into their regions.
type agCall struct {
	s          GemmShape
	offA, offB int64 // bytes into A's and B's regions
	offC       int64 // bytes into C's region
}

// agScores are the GEMMs S = alpha·x·yᵀ over packed operands x and y
// ([T,Hp] each) into the fp32 [T,T] scores, query block by query block,
// each over the keys up to its last query.
func agScores(a *attention, l agLayout) []agCall {
	T, Hp := int64(a.T), int64(l.Hp)
	var out []agCall
	for _, b := range agBlocks(a.T) {
		r0 := int64(b[0])
		s := GemmShape{TransB: true, M: b[1] - b[0], N: b[1], K: l.Hp, Batch: a.BH, StrideA: T * Hp, StrideB: T * Hp,
			StrideC: T * T, LDC: a.T}
		out = append(out, agCall{s: s, offA: 2 * r0 * Hp, offC: 4 * r0 * T})
	}
	return out
}

// agApply is the GEMM C = alpha·op(W)·x, W the [T,T] weights in rows of
// Tp (zero above the diagonal; transposed for trans) and x a packed
// [T,Hp] operand, into the fp32 [T,Hp] result: o = P·v, dq = scale·dS·k,
// dv = Pᵀ·dO, dk = scale·dSᵀ·q. One GEMM over the whole square: the model
// predicts blocks over the triangle slower here (at T = 768, 4.3 against
// 3.7 ms per paper step on an H200: K is T, not 88, so the tiles' fixed
// cost outweighs the products saved).
func agApply(a *attention, l agLayout, trans bool) []agCall {
	T, Hp, Tp := int64(a.T), int64(l.Hp), int64(l.Tp)
	s := GemmShape{TransA: trans, M: a.T, N: l.Hp, K: a.T, Batch: a.BH, StrideA: T * Tp, StrideB: T * Hp, StrideC: T * Hp, LDA: l.Tp}
	return []agCall{{s: s}}
}

// agRows: the row kernels' rows per block, a warp each (AG_ROWS in
// attngemm.cu).
const agRows = 8

// agRowGrid: the row kernels' grid, a warp per row (bh, i).
func agRowGrid(a *attention) [3]uint32 {
	return agWarpGrid(a.BH * a.T)
}

// agWarpGrid: a grid of agRows warps per block for n warps.
func agWarpGrid(n int) [3]uint32 {
	return [3]uint32{uint32((n + agRows - 1) / agRows), 1, 1}
}

var agRowBlock = [3]uint32{32 * agRows, 1, 1}

// agGEMM runs the bf16 GEMMs of calls on the regions A, B and C (fp32).
func (p *program) agGEMM(calls []agCall, alpha float32, A, B, C Buffer) error {
	return p.agGEMMInto(calls, alpha, A, B, C, F32)
}

// agGEMMInto is agGEMM with C of type ct (BF16: the results rounded in the
// GEMMs' epilogue, at half the offsets agApply gives for fp32).
func (p *program) agGEMMInto(calls []agCall, alpha float32, A, B, C Buffer, ct DType) error {
	at := func(b Buffer, off int64) Buffer {
		return Buffer{Ptr: b.Ptr + uint64(off), Bytes: b.Bytes - uint64(off)}
	}
	for _, c := range calls {
		offC := c.offC
		if ct == BF16 {
			offC /= 2
		}
		if err := p.matmul(c.s, BF16, GemmCall{Alpha: alpha, A: at(A, c.offA), B: at(B, c.offB), C: at(C, offC), CType: ct}); err != nil {
			return err
		}
	}
	return nil
}

// agPack converts an attention operand into its packed bf16 region (or
// copies it there, where its GEMM wrote it as bf16: halfOutput).
func (p *program) agPack(a *attention, l agLayout, dst Buffer, src *dval) error {
	half := int32(0)
	if p.half[src.v.ID] {
		half = 1
	}
	return p.launch("attn_pack_bf16", agRowGrid(a), agRowBlock, 0, dst.Ptr, src.buf.Ptr, int32(a.BH), int32(a.T), int32(a.Hd), int32(a.H),
		int32(l.Hp), half)
}

// agUnpack writes a packed fp32 GEMM result into an attention output
// and, when tw has a buffer, its bf16 copy (attnOutTwin).
func (p *program) agUnpack(a *attention, l agLayout, dst uint64, src Buffer, tw twin) error {
	return p.launch("attn_unpack_f32", agRowGrid(a), agRowBlock, 0, dst, src.Ptr, int32(a.BH), int32(a.T), int32(a.Hd), int32(a.H), int32(l.Hp),
		tw.buf.Ptr, int32(tw.ld))
}

// agPackQKV packs q, k and v.
func (p *program) agPackQKV(a *attention, l agLayout, work uint64, q, k, v *dval) error {
	for _, x := range []struct {
		r   agRegion
		src *dval
	}{{l.Q, q}, {l.K, k}, {l.V, v}} {
		if err := p.agPack(a, l, x.r.in(work), x.src); err != nil {
			return err
		}
	}
	return nil
}

// Lean stores (Options.AGLean, on by default; off: whole rows of weights
// written, fp32 GEMM results converted; both give the same bits). The row
// kernels' weights (P, and in the backward Pd and dS) are bf16 rows of Tp
// that the GEMMs
// o = P·v, dv = Pᵀ·dO, dq = dS·k and dk = dSᵀ·q read whole, zero above the
// diagonal. Where every attention node of a program runs the GEMM path
// with one layout, nothing else writes those regions of the work buffer:
// it is zeroed once when allocated and the row kernels write only the
// pairs of columns up to the diagonal (agUpperZero), half of their stores
// at T = 768. And dq, dk and dv, which go into the joined gradient's bf16
// rows, come out of their GEMMs as bf16 (rounded in the epilogue as the
// conversion rounds), which attn_unpack_bf16 copies into place.

// noteAttnWork records attention node a's use of the work buffer, which
// decides agUpperZero.
func (p *program) noteAttnWork(a *attention) {
	if a.path != attnGEMM {
		p.agOther = p.agOther || a.path == attnFlash
	} else if l := newAGLayout(a); p.agLayouts == nil {
		p.agLayouts = &l
	} else if *p.agLayouts != l {
		p.agOther = true
	}
	p.agUpperZero = p.be.agLean && p.agLayouts != nil && !p.agOther
}

// agFull: the row kernels' flag to write the weights' rows whole (zeros
// above the diagonal included), 0 where agUpperZero keeps them zero.
func (p *program) agFull() int32 {
	if p.agUpperZero {
		return 0
	}
	return 1
}

// Saved packs. A training step's attention backward reads the q, k and v
// its forward packed. Where both run in one program, the forward packs
// them into buffers of their own instead of the work buffer (agSavedCap
// in all: 934 MB for the paper step's 12 layers at T = 768) and the
// backward's GEMMs read those, packing nothing.
var agSavedCap int64 = 1 << 30 // a variable: tests set it to 0 to compare

// agPacks is an attention's packed q, k and v (bf16 [BH,T,Hp] each).
type agPacks struct{ Q, K, V Buffer }

// agSaveKey names an attention's q, k and v values.
func agSaveKey(q, k, v *dval) [3]int { return [3]int{q.v.ID, k.v.ID, v.v.ID} }

// saveAGPacks gives forward attention a buffers of its own for its packed
// q, k and v where a FusedAttentionGrad of the program reads the same
// values, within agSavedCap (Options.AGSave).
func (p *program) saveAGPacks(a *attention, q, k, v *dval) error {
	key := agSaveKey(q, k, v)
	if !p.be.agSave || a.path != attnGEMM || p.agSaved[key] != nil || !p.attentionGradReads(key) {
		return nil
	}
	size := newAGLayout(a).Q.n
	if p.agSavedBytes+3*size > agSavedCap {
		return nil
	}
	var bufs [3]Buffer
	for i := range bufs {
		b, err := p.alloc(int((size + 3) / 4))
		if err != nil {
			return err
		}
		bufs[i] = b
	}
	if p.agSaved == nil {
		p.agSaved = map[[3]int]*agPacks{}
	}
	p.agSaved[key] = &agPacks{bufs[0], bufs[1], bufs[2]}
	p.agSavedBytes += 3 * size
	return nil
}

// attentionGradReads: a FusedAttentionGrad node of the program takes the
// q, k and v values key names.
func (p *program) attentionGradReads(key [3]int) bool {
	for _, n := range p.g.Nodes {
		if n.Op != ir.OpFusedAttentionGrad {
			continue
		}
		in, _, _ := ir.SplitAttentionGrad(n.Attrs, n.Inputs)
		if len(in) >= 4 && [3]int{in[1].ID, in[2].ID, in[3].ID} == key {
			return true
		}
	}
	return false
}

// agQKV is where the packed q, k and v of a run go (forward) or are
// (backward: packed already when saved): the saved buffers, else the work
// buffer's regions, packed now.
func (p *program) agQKV(a *attention, l agLayout, w uint64, q, k, v *dval, forward bool) (Q, K, V Buffer, err error) {
	if s := p.agSaved[agSaveKey(q, k, v)]; s != nil {
		if forward {
			for _, x := range []struct {
				dst Buffer
				src *dval
			}{{s.Q, q}, {s.K, k}, {s.V, v}} {
				if err := p.agPack(a, l, x.dst, x.src); err != nil {
					return Q, K, V, err
				}
			}
		}
		return s.Q, s.K, s.V, nil
	}
	if err := p.agPackQKV(a, l, w, q, k, v); err != nil {
		return Q, K, V, err
	}
	return l.Q.in(w), l.K.in(w), l.V.in(w), nil
}

// attentionForwardGEMM: o and the rows' log-sum-exp through the scores.
func (p *program) attentionForwardGEMM(a *attention, o, lse uint64, q, k, v *dval) error {
	l, w := newAGLayout(a), p.attnWork.Ptr
	Q, K, V, err := p.agQKV(a, l, w, q, k, v, true)
	if err != nil {
		return err
	}
	S := l.S.in(w)
	if err := p.agGEMM(agScores(a, l), a.scale, Q, K, S); err != nil {
		return err
	}
	P := l.P.in(w)
	args := append([]any{P.Ptr, lse, S.Ptr, a.biasPtr(), int32(a.BH), int32(a.T), int32(l.Tp), p.agFull()}, a.dropoutArgs(p.seed)...)
	if err := p.launch("attn_softmax_fwd_f32", agRowGrid(a), agRowBlock, 0, args...); err != nil {
		return err
	}
	R := l.R0.in(w)
	if err := p.agGEMM(agApply(a, l, false), 1, P, V, R); err != nil {
		return err
	}
	return p.agUnpack(a, l, o, R, a.outTwin)
}

// attentionBackwardGEMM: dq, dk, dv and the bias gradient through the
// scores, recomputed from q and k.
func (p *program) attentionBackwardGEMM(g *attnGrad) error {
	a := g.a
	l, w := newAGLayout(a), p.attnWork.Ptr
	Q, K, V, err := p.agQKV(a, l, w, g.q, g.k, g.v, false)
	if err != nil {
		return err
	}
	dO := l.DO.in(w)
	if err := p.launch("attn_pack_do_bf16", agRowGrid(a), agRowBlock, 0, dO.Ptr, g.D, g.dO.buf.Ptr, g.o,
		int32(a.BH), int32(a.T), int32(a.Hd), int32(a.H), int32(l.Hp)); err != nil {
		return err
	}
	S, dP := l.S.in(w), l.DP.in(w)
	if err := p.agGEMM(agScores(a, l), a.scale, Q, K, S); err != nil {
		return err
	}
	if err := p.agGEMM(agScores(a, l), 1, dO, V, dP); err != nil {
		return err
	}
	Pd, dS := l.P.in(w), l.DS.in(w)
	var part uint64 // the bias gradient's partial sums
	if a.bias != nil {
		part = l.DB.in(w).Ptr
	}
	G := agBiasGroups(a)
	args := append([]any{Pd.Ptr, dS.Ptr, part, S.Ptr, dP.Ptr, a.biasPtr(), g.lse, g.D, int32(a.BH), int32(a.T), int32(l.Tp), int32(G), p.agFull()},
		a.dropoutArgs(p.seed)...)
	if err := p.launch("attn_softmax_bwd_f32", agWarpGrid(G*a.T), agRowBlock, 0, args...); err != nil {
		return err
	}
	for _, r := range []struct {
		calls []agCall
		alpha float32
		W     Buffer
		x     Buffer
		res   agRegion
		j     int // the output
	}{
		{agApply(a, l, true), 1, Pd, dO, l.R2, 2},       // dv = Pᵀ·dO
		{agApply(a, l, false), a.scale, dS, K, l.R0, 0}, // dq = scale·dS·k
		{agApply(a, l, true), a.scale, dS, Q, l.R1, 1},  // dk = scale·dSᵀ·q
	} {
		R := r.res.in(w)
		if off := g.cols[r.j]; off >= 0 { // bf16 into the joined gradient's rows (with agLean rounded by the GEMM)
			ct, half := F32, int32(0)
			if p.be.agLean {
				ct, half = BF16, 1
			}
			if err := p.agGEMMInto(r.calls, r.alpha, r.W, r.x, R, ct); err != nil {
				return err
			}
			if err := p.launch("attn_unpack_bf16", agRowGrid(a), agRowBlock, 0, g.rows.buf.Ptr, R.Ptr, int32(a.BH), int32(a.T), int32(a.Hd),
				int32(a.H), int32(l.Hp), int32(g.rows.ld), int32(off), half); err != nil {
				return err
			}
			continue
		}
		if err := p.agGEMM(r.calls, r.alpha, r.W, r.x, R); err != nil {
			return err
		}
		if err := p.agUnpack(a, l, g.out[r.j].buf.Ptr, R, twin{}); err != nil {
			return err
		}
	}
	if a.bias == nil {
		return nil
	}
	return p.each("attention_dbias_reduce_f32", a.T*a.T, g.out[3].buf.Ptr, part, int32(G), int32(a.T))
}
