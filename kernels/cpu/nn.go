package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/rpac-dev/rpac/internal/fastexp"
	"github.com/rpac-dev/rpac/ir"
)

// rowGrain is the parallel grain, in rows, for row kernels of width L.
func rowGrain(L, perElem int) int { return max(1, grainMath/max(L*perElem, 1)) }

// ---- Softmax ----

func softmaxRow[T float](dst, src []T) {
	src = src[:len(dst)]
	if d32, ok := any(dst).([]float32); ok {
		softmaxRow32(d32, any(src).([]float32))
		return
	}
	m, ok := softmaxMax(dst, src)
	if !ok {
		return
	}
	var s float64
	for i, x := range src {
		e := T(math.Exp(float64(x - m)))
		dst[i] = e
		s += float64(e)
	}
	inv := T(1 / s)
	for i := range dst {
		dst[i] *= inv
	}
}

// softmaxMax returns the maximum of src; a row with no finite maximum
// gives false, its result already written to dst (allInfRow).
func softmaxMax[T float](dst, src []T) (T, bool) {
	m := T(math.Inf(-1))
	for _, x := range src {
		if x > m {
			m = x
		}
	}
	if math.IsInf(float64(m), -1) {
		allInfRow(dst, src)
		return m, false
	}
	return m, true
}

// allInfRow: a row with no finite maximum gives zeros (NaN stays NaN).
func allInfRow[T float](dst, src []T) {
	for i, x := range src {
		if x == x {
			dst[i] = 0
		} else {
			dst[i] = x
		}
	}
}

func softmaxRow32(dst, src []float32) {
	m, ok := softmaxMax(dst, src)
	if !ok {
		return
	}
	var s float64
	for i := 0; i < len(src); i += 1024 { // float32 partial sums over short blocks
		j := min(i+1024, len(src))
		s += float64(fastexp.SubStore32(dst[i:j], src[i:j], m))
	}
	inv := float32(1 / s)
	for i := range dst {
		dst[i] *= inv
	}
}

func (p *program[T]) buildSoftmax(in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	L := lastDim(x.shape)
	if L == 0 {
		return func() error { return nil }, nil
	}
	rows := x.numel() / L
	return func() error {
		src, dst := x.f, o.f
		parallelFor(rows, rowGrain(L, 1), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				softmaxRow(dst[r*L:(r+1)*L], src[r*L:(r+1)*L])
			}
		})
		return nil
	}, nil
}

func (p *program[T]) buildSoftmaxGrad(in, out []*tensor[T]) (func() error, error) {
	dy, y, o := in[0], in[1], out[0]
	if dy.numel() != y.numel() {
		return nil, fmt.Errorf("dy%v and y%v differ", dy.shape, y.shape)
	}
	L := lastDim(y.shape)
	if L == 0 {
		return func() error { return nil }, nil
	}
	rows := y.numel() / L
	return func() error {
		g, ys, dst := dy.f, y.f, o.f
		parallelFor(rows, max(1, grainCheap/L), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				gr, yr, dr := g[r*L:(r+1)*L], ys[r*L:(r+1)*L], dst[r*L:(r+1)*L]
				var s0, s1 T
				i := 0
				for ; i+2 <= L; i += 2 {
					s0 += gr[i] * yr[i]
					s1 += gr[i+1] * yr[i+1]
				}
				if i < L {
					s0 += gr[i] * yr[i]
				}
				s := s0 + s1
				for i, v := range yr {
					dr[i] = v * (gr[i] - s)
				}
			}
		})
		return nil
	}, nil
}

// ---- CausalMask ----

func (p *program[T]) buildCausalMask(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	s := x.shape
	if len(s) < 2 || s[len(s)-1] != s[len(s)-2] {
		return nil, fmt.Errorf("want [...,T,T], got %v", s)
	}
	L := s[len(s)-1]
	if L == 0 {
		return func() error { return nil }, nil
	}
	fill := T(n.Attrs.Float("fill", math.Inf(-1)))
	rows := x.numel() / L
	return func() error {
		src, dst := x.f, o.f
		parallelFor(rows, max(1, grainCheap/L), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				i := r % L
				d := dst[r*L : (r+1)*L]
				if &d[0] != &src[r*L] {
					copy(d[:i+1], src[r*L:r*L+i+1])
				}
				for j := i + 1; j < L; j++ {
					d[j] = fill
				}
			}
		})
		return nil
	}, nil
}

// ---- LayerNorm ----

// rowStats returns the mean and 1/sqrt(biased var + eps) of a row.
func rowStats[T float](x []T, eps float64) (mean, rstd float64) {
	D := float64(len(x))
	mean = sum64(x) / D
	var v0, v1 float64
	i := 0
	for ; i+2 <= len(x); i += 2 {
		a, b := float64(x[i])-mean, float64(x[i+1])-mean
		v0 += a * a
		v1 += b * b
	}
	if i < len(x) {
		a := float64(x[i]) - mean
		v0 += a * a
	}
	return mean, 1 / math.Sqrt((v0+v1)/D+eps)
}

func (p *program[T]) buildLayerNorm(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, g, b, o := in[0], in[1], in[2], out[0]
	D, W := lastDim(x.shape), ir.LayerNormWidth(x.shape, n.Attrs)
	if g.numel() != W || b.numel() != W {
		return nil, fmt.Errorf("x%v with g%v, b%v", x.shape, g.shape, b.shape)
	}
	if D == 0 {
		return func() error { return nil }, nil
	}
	eps := n.Attrs.Float("eps", 1e-5)
	rows := x.numel() / D
	return func() error {
		xs, gs, bs, ys := x.f, g.f, b.f, o.f
		parallelFor(rows, max(1, grainCheap/(4*D)), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				xr, yr := xs[r*D:r*D+W], ys[r*D:(r+1)*D]
				mean, rstd := rowStats(xr, eps)
				m, rs := T(mean), T(rstd)
				for i, v := range xr {
					yr[i] = (v-m)*rs*gs[i] + bs[i]
				}
				clear(yr[W:])
			}
		})
		return nil
	}, nil
}

func (p *program[T]) buildLayerNormGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	dy, x, g := in[0], in[1], in[2]
	dx, dg, db := out[0], out[1], out[2]
	D, W := lastDim(x.shape), ir.LayerNormWidth(x.shape, n.Attrs)
	if g.numel() != W || dy.numel() != x.numel() {
		return nil, fmt.Errorf("dy%v, x%v, g%v", dy.shape, x.shape, g.shape)
	}
	eps := n.Attrs.Float("eps", 1e-5)
	rows := 0
	if D > 0 {
		rows = x.numel() / D
	}
	parts := p.parts
	partial := make([][]float64, parts) // [dg | db] per part
	for i := range partial {
		partial[i] = make([]float64, 2*W)
	}
	return func() error {
		dys, xs, gs, dxs := dy.f, x.f, g.f, dx.f
		parallelParts(rows, parts, max(1, grainCheap/(6*max(D, 1))), func(w, lo, hi int) {
			acc := partial[w]
			clear(acc)
			adg, adb := acc[:W], acc[W:]
			for r := lo; r < hi; r++ {
				xr, gr, dr := xs[r*D:r*D+W], dys[r*D:r*D+W], dxs[r*D:(r+1)*D]
				mean, rstd := rowStats(xr, eps)
				var m1, m2 float64
				for i, v := range xr {
					xh := (float64(v) - mean) * rstd
					gd := float64(gs[i]) * float64(gr[i])
					m1 += gd
					m2 += gd * xh
					adg[i] += float64(gr[i]) * xh
					adb[i] += float64(gr[i])
				}
				m1 /= float64(W)
				m2 /= float64(W)
				for i, v := range xr {
					xh := (float64(v) - mean) * rstd
					gd := float64(gs[i]) * float64(gr[i])
					dr[i] = T(rstd * (gd - m1 - xh*m2))
				}
				clear(dr[W:])
			}
		})
		dgs, dbs := dg.f, db.f
		for i := 0; i < W; i++ {
			var sg, sb float64
			for w := range partial {
				sg += partial[w][i]
				sb += partial[w][W+i]
			}
			dgs[i], dbs[i] = T(sg), T(sb)
		}
		return nil
	}, nil
}

// ---- Dropout / GumbelNoise ----

// buildDropout draws from the node's stream: attribute stream (a Dropout
// step of a FusedElementwise body), else its id.
func (p *program[T]) buildDropout(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	return p.dropoutKernel(n.Attrs.Float("p", 0), n.Stream(), in[0], out[0])
}

// buildDropoutGrad draws the mask of the Dropout node n.Attrs["stream"]
// again and applies it to dy.
func (p *program[T]) buildDropoutGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	stream := n.Attrs.Int("stream", -1)
	if stream < 0 {
		return nil, fmt.Errorf("DropoutGrad: no stream (the Dropout node's id)")
	}
	return p.dropoutKernel(n.Attrs.Float("p", 0), stream, in[0], out[0])
}

// dropoutKernel sets y = x·mask, mask the draws of stream id with
// probability 1−pr of keeping (kept elements scaled by 1/(1−pr)).
func (p *program[T]) dropoutKernel(pr float64, id int, x, y *tensor[T]) (func() error, error) {
	keep := 1 - pr
	var scale T
	if keep > 0 {
		scale = T(1 / keep)
	}
	// Element i keeps when its 32-bit draw (half i&1 of hash i>>1) is
	// below keep·2³².
	var thresh uint64
	switch {
	case pr <= 0:
		thresh = 1 << 32
	case keep > 0:
		thresh = uint64(keep * (1 << 32))
	}
	return func() error {
		key := streamKey(p.seed, id)
		xs, ys := x.f, y.f
		parallelFor(len(ys), grainCheap, func(lo, hi int) {
			for i := lo; i < hi; {
				h := mix64(key + uint64(i>>1+1)*golden)
				for ; i < hi; i++ {
					m := T(0)
					if uint64(uint32(h>>(32*(i&1)))) < thresh {
						m = scale
					}
					ys[i] = xs[i] * m
					if i&1 == 1 {
						i++
						break
					}
				}
			}
		})
		return nil
	}, nil
}

func (p *program[T]) buildGumbel(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, y := in[0], out[0]
	id := n.Stream()
	return func() error {
		key := streamKey(p.seed, id)
		xs, ys := x.f, y.f
		parallelFor(len(ys), grainMath, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				u := min(max(uniform(key, i), 1e-6), 1-1e-6)
				ys[i] = xs[i] - T(math.Log(-math.Log(u)))
			}
		})
		return nil
	}, nil
}

// ---- TopKMask ----

// beats reports whether entry (a at index i) ranks above (b at index j):
// larger first, NaN last, ties to the lower index.
func beats[T float](a T, i int, b T, j int) bool {
	if a != b {
		if b != b {
			return a == a
		}
		return a > b
	}
	return i < j
}

func (p *program[T]) buildTopKMask(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	L := lastDim(x.shape)
	k := n.Attrs.Int("k", 1)
	if L == 0 {
		return func() error { return nil }, nil
	}
	rows := x.numel() / L
	parts := p.parts
	var scratch [][]int32
	large := k > 8 && k < L
	if large {
		scratch = make([][]int32, parts)
		for i := range scratch {
			scratch[i] = make([]int32, L)
		}
	}
	return func() error {
		xs, ys := x.f, o.f
		parallelParts(rows, parts, max(1, grainCheap/(L*min(max(k, 1), 8))), func(w, lo, hi int) {
			for r := lo; r < hi; r++ {
				xr, yr := xs[r*L:(r+1)*L], ys[r*L:(r+1)*L]
				switch {
				case k <= 0:
					clear(yr)
				case k >= L:
					for i := range yr {
						yr[i] = 1
					}
				case large:
					idx := scratch[w]
					for i := range idx {
						idx[i] = int32(i)
					}
					slices.SortFunc(idx, func(a, b int32) int {
						if beats(xr[a], int(a), xr[b], int(b)) {
							return -1
						}
						return 1
					})
					clear(yr)
					for _, i := range idx[:k] {
						yr[i] = 1
					}
				default:
					clear(yr)
					for t := 0; t < k; t++ {
						best := -1
						for i, v := range xr {
							if yr[i] != 0 {
								continue
							}
							if best < 0 || beats(v, i, xr[best], best) {
								best = i
							}
						}
						yr[best] = 1
					}
				}
			}
		})
		return nil
	}, nil
}

// ---- CrossEntropy ----
//
// Both kernels work row by row (one row per token, V ≈ 50k columns) in
// parallel over rows, with float64 row statistics.
//
// In-place mode: when the logits value is an intermediate that only this
// CrossEntropy and later CrossEntropyGrad nodes read (and not a graph
// output), the forward leaves exp(x - max) in the logits buffer and records
// 1/Σexp per row; the gradient is then c·e/Σ - offsets, one pass without
// exp. Otherwise the forward records the row log-sum-exp, and a gradient on
// the same logits in the same run makes one exp pass instead of three.

// rowMaxSum returns the row maximum and sum. A row holding NaN or ±Inf
// gives a non-finite sum; callers then take the plain path.
func rowMaxSum[T float](x []T) (m T, sum float64) {
	if x32, ok := any(x).([]float32); ok {
		m32, s := rowMaxSum32(x32)
		return T(m32), s
	}
	n := len(x)
	if n == 0 {
		return T(math.Inf(-1)), 0
	}
	m, a0, a1, a2, a3 := maxSum4[T, float64](x)
	return m, (a0 + a1) + (a2 + a3)
}

// rowMaxSum32 is rowMaxSum for float32, summing in float32 over blocks.
func rowMaxSum32(x []float32) (m float32, sum float64) {
	m = float32(math.Inf(-1))
	for b := 0; b < len(x); b += 1024 {
		bm, bs := blockMaxSum32(x[b:min(b+1024, len(x))])
		if bm > m || b == 0 {
			m = bm
		}
		sum += bs
	}
	return m, sum
}

// blockMaxSum32 returns the maximum of a non-empty block and its sum,
// accumulated in float32 over four lanes.
func blockMaxSum32(blk []float32) (float32, float64) {
	m, s0, s1, s2, s3 := maxSum4[float32, float32](blk)
	return m, float64(s0+s1) + float64(s2+s3)
}

// maxSum4 returns the maximum of a non-empty x and its sums in A over four
// lanes: lane l adds the elements 4i+l of the whole quads, lane 0 also the
// tail.
func maxSum4[T, A float](x []T) (m T, s0, s1, s2, s3 A) {
	m0, m1 := x[0], x[0]
	i := 0
	for ; i+4 <= len(x); i += 4 {
		v0, v1, v2, v3 := x[i], x[i+1], x[i+2], x[i+3]
		if v0 > m0 {
			m0 = v0
		}
		if v1 > m1 {
			m1 = v1
		}
		if v2 > m0 {
			m0 = v2
		}
		if v3 > m1 {
			m1 = v3
		}
		s0 += A(v0)
		s1 += A(v1)
		s2 += A(v2)
		s3 += A(v3)
	}
	for ; i < len(x); i++ {
		if x[i] > m0 {
			m0 = x[i]
		}
		s0 += A(x[i])
	}
	if m1 > m0 {
		m0 = m1
	}
	return m0, s0, s1, s2, s3
}

// expRowSum returns Σ exp(x - m); with store set it also writes the terms
// over x.
func expRowSum[T float](x []T, m T, store bool) float64 {
	if x32, ok := any(x).([]float32); ok {
		m32 := any(m).(float32)
		if store {
			var s float64
			for len(x32) > 0 { // float32 partial sums over short blocks
				blk := x32[:min(len(x32), 1024)]
				x32 = x32[len(blk):]
				s += float64(fastexp.SubStore32(blk, blk, m32))
			}
			return s
		}
		return fastexp.SubSum32(x32, m32)
	}
	var s float64
	for i, v := range x {
		e := math.Exp(float64(v - m))
		if store {
			x[i] = T(e)
		}
		s += e
	}
	return s
}

// ceInPlaceOK reports whether CrossEntropy node n may overwrite its logits:
// no later reader but its gradient (an alias op reading them shares their
// slot), and not the output of an alias op (ir.OpDef.Alias), whose input
// may live on in that slot.
func ceInPlaceOK(g *ir.Graph, n *ir.Node) bool {
	lg := n.Inputs[0]
	if lg.Kind != ir.Intermediate || lg.DType != ir.F32 || isAlias(lg.Def) {
		return false
	}
	for _, v := range g.Outputs {
		if v == lg {
			return false
		}
	}
	after := false
	for _, m := range g.Nodes {
		if m == n {
			after = true
			continue
		}
		for i, v := range m.Inputs {
			if v != lg {
				continue
			}
			if !after || m.Op != ir.OpCrossEntropyGrad || i != 1 {
				return false
			}
		}
	}
	return true
}

// isAlias: n is an alias op (its output may share its input's slot).
func isAlias(n *ir.Node) bool {
	return n != nil && ir.Ops[n.Op] != nil && ir.Ops[n.Op].Alias
}

func (p *program[T]) buildCrossEntropy(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	lg, tg := in[0], in[1]
	if len(lg.shape) != 2 || tg.v.DType != ir.I32 || tg.numel() != lg.shape[0] {
		return nil, fmt.Errorf("want logits[N,V] and targets[N] i32, got %v and %v", lg.shape, tg.shape)
	}
	N, V := lg.shape[0], lg.shape[1]
	ls := n.Attrs.Float("label_smoothing", 0)
	if p.ce[lg.v.ID] != nil {
		return nil, fmt.Errorf("a second CrossEntropy on logits %s", lg.v)
	}
	cache := &ceCache{lse: make([]float64, N), inPlace: ceInPlaceOK(p.g, n)}
	if cache.inPlace {
		cache.inv = make([]float64, N)
	}
	p.ce[lg.v.ID] = cache
	rowS := make([]float64, N)
	rowP := make([]float64, N)
	return func() error {
		t := tg.i
		if err := checkTargets(t, V); err != nil {
			return err
		}
		xs := lg.f
		cache.run = 0 // logits are being rewritten
		parallelFor(N, 1, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				row := xs[r*V : (r+1)*V]
				m, sum := rowMaxSum(row)
				var xt float64 // the target's logit, read before an in-place pass rewrites the row
				if t[r] != ir.IgnoreTarget {
					xt = float64(row[t[r]])
				}
				var lse float64
				if math.IsInf(sum, 0) || sum != sum {
					// NaN or ±Inf in the row: plain formula (NaN or ±Inf results)
					var s float64
					for _, v := range row {
						s += math.Exp(float64(v - m))
					}
					lse = float64(m) + math.Log(s)
					if cache.inPlace {
						for i := range row {
							row[i] = T(math.Exp(float64(row[i] - m)))
						}
						cache.inv[r] = 1 / s
					}
				} else {
					s := expRowSum(row, m, cache.inPlace)
					lse = float64(m) + math.Log(s)
					if cache.inPlace {
						cache.inv[r] = 1 / s
					}
				}
				cache.lse[r] = lse
				if t[r] == ir.IgnoreTarget {
					rowP[r], rowS[r] = 0, 0
					continue
				}
				nll := lse - xt
				rowP[r] = nll
				rowS[r] = (1-ls)*nll + ls*(lse-sum/float64(V))
			}
		})
		cache.run = p.runs
		var s, pure float64
		for r := range rowS {
			s += rowS[r]
			pure += rowP[r]
		}
		out[0].f[0] = T(s)
		out[1].f[0] = T(pure)
		return nil
	}, nil
}

func (p *program[T]) buildCrossEntropyGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	dl, lg, tg, o := in[0], in[1], in[2], out[0]
	if len(lg.shape) != 2 || tg.v.DType != ir.I32 || tg.numel() != lg.shape[0] || dl.numel() != 1 {
		return nil, fmt.Errorf("want dloss[], logits[N,V], targets[N] i32; got %v, %v, %v", dl.shape, lg.shape, tg.shape)
	}
	N, V := lg.shape[0], lg.shape[1]
	ls := n.Attrs.Float("label_smoothing", 0)
	cache := p.ce[lg.v.ID] // set when a CrossEntropy on the same logits precedes this node
	return func() error {
		t := tg.i
		if err := checkTargets(t, V); err != nil {
			return err
		}
		xs, gs := lg.f, o.f
		c := float64(dl.f[0])
		off := T(c * ls / float64(V))
		hit := T(c * (1 - ls))
		cached := cache != nil && cache.run == p.runs
		inPlace := cached && cache.inPlace
		if cache != nil && cache.inPlace && !cached {
			return fmt.Errorf("CrossEntropyGrad on %s needs the CrossEntropy on it to run first in the same run", lg.v)
		}
		parallelFor(N, 1, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				row, g := xs[r*V:(r+1)*V], gs[r*V:(r+1)*V]
				if t[r] == ir.IgnoreTarget {
					clear(g)
					continue
				}
				if inPlace {
					a := T(c * cache.inv[r])
					for i, e := range row {
						g[i] = a*e - off
					}
				} else {
					var lse float64
					if cached {
						lse = cache.lse[r]
					} else {
						m, _ := rowMaxSum(row)
						lse = float64(m) + math.Log(expRowSum(row, m, false))
					}
					ceGradRow(g, row, T(c), T(lse), off)
				}
				g[t[r]] -= hit
			}
		})
		return nil
	}, nil
}

// ceGradRow writes g = c·exp(x - lse) - off.
func ceGradRow[T float](g, x []T, c, lse, off T) {
	x = x[:len(g)]
	if g32, ok := any(g).([]float32); ok {
		fastexp.ScaledSub32(g32, any(x).([]float32), float32(lse), float32(c), float32(off))
		return
	}
	for i, v := range x {
		g[i] = c*T(math.Exp(float64(v-lse))) - off
	}
}

func nnKernels[T float](k kernelTable[T]) {
	k.add("Softmax", withoutNode((*program[T]).buildSoftmax))
	k.add("SoftmaxGrad", withoutNode((*program[T]).buildSoftmaxGrad))
	k.add("CausalMask", (*program[T]).buildCausalMask)
	k.add("LayerNorm", (*program[T]).buildLayerNorm)
	k.add("LayerNormGrad", (*program[T]).buildLayerNormGrad)
	k.add("Dropout", (*program[T]).buildDropout)
	k.add("DropoutGrad", (*program[T]).buildDropoutGrad)
	k.add("GumbelNoise", (*program[T]).buildGumbel)
	k.add("TopKMask", (*program[T]).buildTopKMask)
	k.add("CrossEntropy", (*program[T]).buildCrossEntropy)
	k.add("CrossEntropyGrad", (*program[T]).buildCrossEntropyGrad)
}
