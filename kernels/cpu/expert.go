package cpu

import (
	"github.com/rpac-dev/rpac/ir"
)

// ExpertFFN and ExpertFFNGrad: expert e's network on its routed tokens
// only. The tokens are the rows t with w[t,e] ≠ 0, in ascending order;
// their rows of x are gathered into a scratch matrix (the program's shared
// scratch: ir.OpDef.SharedScratch), the two products run over those rows,
// and the results are scattered back weighted.

func expertKernels[T float](k kernelTable[T]) {
	k.add(ir.OpExpertFFN, (*program[T]).buildExpertFFN)
	k.add(ir.OpExpertFFNGrad, (*program[T]).buildExpertFFNGrad)
}

// expertRun is what an ExpertFFN node and its gradient share: the
// geometry, the expert, the dropout and the rows of this step.
type expertRun[T float] struct {
	s      ir.ExpertShape
	e      int
	drop   dropRule[T]
	s1, s2 int
	rows   []int // the routed tokens of the step
}

func newExpertRun[T float](n *ir.Node, x, w, w1 ir.Shape) (*expertRun[T], error) {
	s, err := ir.ExpertShapeOf(x, w, w1)
	if err != nil {
		return nil, err
	}
	s1, s2 := ir.ExpertStreams(n)
	return &expertRun[T]{s: s, e: ir.ExpertOf(n), drop: newDropRule[T](n.Attrs.Float("p", 0)), s1: s1, s2: s2,
		rows: make([]int, 0, s.N)}, nil
}

// route lists the tokens with w[t,e] ≠ 0 and gathers their rows of x
// into xg.
func (r *expertRun[T]) route(w, x, xg []T) int {
	E, D := r.s.E, r.s.D
	r.rows = r.rows[:0]
	for t := range r.s.N {
		if w[t*E+r.e] != 0 {
			r.rows = append(r.rows, t)
		}
	}
	parallelFor(len(r.rows), max(1, grainCheap/max(D, 1)), func(lo, hi int) {
		for i, t := range r.rows[lo:hi] {
			copy(xg[(lo+i)*D:(lo+i+1)*D], x[t*D:(t+1)*D])
		}
	})
	return len(r.rows)
}

// dropRows multiplies the routed rows of m [R,width] by the dropout mask
// of stream id at the tokens' elements t·width + j.
func (r *expertRun[T]) dropRows(p *program[T], id int, m []T, width int) {
	if !r.drop.active() {
		return
	}
	key := streamKey(p.seed, id)
	parallelFor(len(r.rows), max(1, grainCheap/max(width, 1)), func(lo, hi int) {
		for i, t := range r.rows[lo:hi] {
			row := m[(lo+i)*width : (lo+i+1)*width]
			for j := range row {
				row[j] *= r.drop.mask(key, t*width+j)
			}
		}
	})
}

// dropRule is a Dropout's keep threshold and scale (dropoutKernel's).
type dropRule[T float] struct {
	thresh uint64
	scale  T
	p      float64
}

func newDropRule[T float](pr float64) dropRule[T] {
	d := dropRule[T]{p: pr, thresh: 1 << 32}
	if keep := 1 - pr; pr > 0 && keep > 0 {
		d.thresh, d.scale = uint64(keep*(1<<32)), T(1/keep)
	} else if pr > 0 {
		d.thresh = 0
	}
	return d
}

func (d dropRule[T]) active() bool { return d.p > 0 }

// mask is element i's multiplier: its 32-bit draw (half i&1 of hash i>>1)
// below the threshold keeps it, scaled.
func (d dropRule[T]) mask(key uint64, i int) T {
	h := mix64(key + uint64(i>>1+1)*golden)
	if uint64(uint32(h>>(32*(i&1)))) < d.thresh {
		return d.scale
	}
	return 0
}

// addRows adds b to each of the first rows rows of m [.,len(b)].
func addRows[T float](m []T, rows int, b []T) {
	W := len(b)
	parallelFor(rows, max(1, grainCheap/max(W, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := m[r*W : (r+1)*W]
			for j, v := range b {
				row[j] += v
			}
		}
	})
}

// colSums sets dst[j] = Σ over the first rows rows of m [.,len(dst)] of
// m[r,j], in float64, rows in order.
func colSums[T float](dst, m []T, rows int) {
	W := len(dst)
	const block = 256
	parallelFor((W+block-1)/block, max(1, grainCheap/max(rows*block, 1)), func(lo, hi int) {
		acc := make([]float64, block)
		for c := lo * block; c < min(hi*block, W); c += block {
			cw := min(block, W-c)
			clear(acc)
			for r := range rows {
				for j, v := range m[r*W+c : r*W+c+cw] {
					acc[j] += float64(v)
				}
			}
			for j := range cw {
				dst[c+j] = T(acc[j])
			}
		}
	})
}

// gelu sets dst = GELU(src) (the GELU kernel's formula for T).
func gelu[T float](dst, src []T) {
	if d32, ok := any(dst).([]float32); ok {
		parallelFor(len(dst), grainMath, func(lo, hi int) { geluSlice32(d32[lo:hi], any(src).([]float32)[lo:hi]) })
		return
	}
	f := ir.ElementwiseOf(ir.OpGELU).F64
	d64, s64 := any(dst).([]float64), any(src).([]float64)
	parallelFor(len(dst), grainMath, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d64[i] = f(s64[i], 0, ir.EwParams[float64]{})
		}
	})
}

// geluGrad sets dst = GELUGrad(dy, x) (the GELUGrad kernel's formula for T).
func geluGrad[T float](dst, dy, x []T) {
	if d32, ok := any(dst).([]float32); ok {
		dy32, x32 := any(dy).([]float32), any(x).([]float32)
		parallelFor(len(dst), grainMath, func(lo, hi int) { geluGradSlice32(d32[lo:hi], dy32[lo:hi], x32[lo:hi]) })
		return
	}
	f := ir.ElementwiseOf(ir.OpGELUGrad).F64
	d64, dy64, x64 := any(dst).([]float64), any(dy).([]float64), any(x).([]float64)
	parallelFor(len(dst), grainMath, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d64[i] = f(dy64[i], x64[i], ir.EwParams[float64]{})
		}
	})
}

// buildExpertFFN: u = xg·W1ᵀ + b1, a = Dropout(GELU(u)), h = Dropout(a·W2ᵀ
// + b2) over the routed rows, out[t] = w[t,e]·h[r] (0 elsewhere).
func (p *program[T]) buildExpertFFN(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	r, err := newExpertRun[T](n, in[0].shape, in[1].shape, in[2].shape)
	if err != nil {
		return nil, err
	}
	s := r.s
	p.needShared(s.N * s.D)
	return func() error {
		xg := p.sharedScratch()[:s.N*s.D]
		x, w, w1, b1, w2, b2 := in[0].f, in[1].f, in[2].f, in[3].f, in[4].f, in[5].f
		o, u, a, h := out[0].f, out[1].f, out[2].f, out[3].f
		R := r.route(w, x, xg)
		gemm(false, true, R, s.F, s.D, 1, xg, s.D, w1, s.D, 0, u, s.F)
		addRows(u, R, b1)
		gelu(a[:R*s.F], u[:R*s.F])
		r.dropRows(p, r.s1, a, s.F)
		gemm(false, true, R, s.D, s.F, 1, a, s.F, w2, s.F, 0, h, s.D)
		addRows(h, R, b2)
		r.dropRows(p, r.s2, h, s.D)
		clear(o)
		r.scatter(o, h, func(t int) T { return w[t*s.E+r.e] })
		return nil
	}, nil
}

// scatter sets o[t] = wt(t)·src[r] for routed row r of token t.
func (r *expertRun[T]) scatter(o, src []T, wt func(t int) T) {
	D := r.s.D
	parallelFor(len(r.rows), max(1, grainCheap/max(D, 1)), func(lo, hi int) {
		for i, t := range r.rows[lo:hi] {
			k, dst := wt(t), o[t*D:(t+1)*D]
			for j, v := range src[(lo+i)*D : (lo+i+1)*D] {
				dst[j] = k * v
			}
		}
	})
}

// buildExpertFFNGrad: the backward of buildExpertFFN over the same rows
// and draws.
func (p *program[T]) buildExpertFFNGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	r, err := newExpertRun[T](n, in[1].shape, in[2].shape, in[3].shape)
	if err != nil {
		return nil, err
	}
	s := r.s
	p.needShared(2*s.N*s.D + s.N*s.F)
	return func() error {
		sc := p.sharedScratch()
		xg, dh, dz := sc[:s.N*s.D], sc[s.N*s.D:2*s.N*s.D], sc[2*s.N*s.D:2*s.N*s.D+s.N*s.F]
		dout, x, w, w1, w2, u, a, h := in[0].f, in[1].f, in[2].f, in[3].f, in[4].f, in[5].f, in[6].f, in[7].f
		dx, dw, dw1, db1, dw2, db2 := out[0].f, out[1].f, out[2].f, out[3].f, out[4].f, out[5].f
		R := r.route(w, x, xg)
		clear(dw)
		r.outputGrad(dh, dw, dout, w, h)
		r.dropRows(p, r.s2, dh, s.D)
		gemm(true, false, s.D, s.F, R, 1, dh, s.D, a, s.F, 0, dw2, s.F)
		colSums(db2, dh, R)
		gemm(false, false, R, s.F, s.D, 1, dh, s.D, w2, s.F, 0, dz, s.F)
		r.dropRows(p, r.s1, dz, s.F)
		geluGrad(dz[:R*s.F], dz[:R*s.F], u[:R*s.F])
		gemm(true, false, s.F, s.D, R, 1, dz, s.F, xg, s.D, 0, dw1, s.D)
		colSums(db1, dz, R)
		gemm(false, false, R, s.D, s.F, 1, dz, s.F, w1, s.D, 0, dh, s.D)
		clear(dx)
		r.scatter(dx, dh, func(int) T { return 1 })
		return nil
	}, nil
}

// outputGrad sets, for routed row r of token t, dh[r] = w[t,e]·dout[t]
// (the gradient of h before the output dropout's mask) and dw[t,e] =
// Σ_d dout[t,d]·h[r,d].
func (r *expertRun[T]) outputGrad(dh, dw, dout, w, h []T) {
	D, E, e := r.s.D, r.s.E, r.e
	parallelFor(len(r.rows), max(1, grainCheap/max(D, 1)), func(lo, hi int) {
		for i, t := range r.rows[lo:hi] {
			k, g := w[t*E+e], dout[t*D:(t+1)*D]
			var dot float64
			for j, v := range h[(lo+i)*D : (lo+i+1)*D] {
				dot += float64(g[j] * v)
				dh[(lo+i)*D+j] = g[j] * k
			}
			dw[t*E+e] = T(dot)
		}
	})
}
