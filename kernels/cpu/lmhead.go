package cpu

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
)

// ---- LMHeadCrossEntropy ----
//
// The forward walks the rows chunk at a time: one GEMM gives the chunk's
// logits x_c·Wᵀ in a buffer of chunk×V elements that the program reuses,
// then every row (in parallel) gets its maximum, argmax and sum in one pass
// and its log-sum-exp in a second. When the program also holds an
// LMHeadCrossEntropyGrad on the same inputs, the second pass leaves
// e = exp(logit - max) in the buffer, and the chunk's gradient
//
//	dlogits_c = softmax - ((1-ls)·onehot + ls/V) = diag(1/s)·E' - ls/V,
//	E' = E - (1-ls)·s·onehot,  s = Σ e per row,
//
// goes into two more GEMMs without another pass over the chunk:
// gx_c = E'·W and gW += E'ᵀ·(diag(1/s)·x_c). The gradient node applies the
// rest while it scales by dsm, in the one pass over dx and dW it makes
// anyway:
//
//	dx_r = dsm·(gx_r/s_r - (ls/V)·Σ_v W_v),  dW_v = dsm·(gW_v - (ls/V)·Σ_r x_r),
//
// so the logits are computed once per step and the chunk is read by the
// rows and the two GEMMs only. A row whose target is ir.IgnoreTarget gets
// its argmax, then a zero row in the buffer: it adds nothing to either sum
// or GEMM, its dx row is zero and Σ_r x_r leaves it out.

// lmhState holds what a forward accumulates for the LMHeadCrossEntropyGrad
// nodes on its inputs.
type lmhState[T float] struct {
	gx, gw []T
	inv    []float64 // 1/s per row
	run    uint64    // the Run in which the forward last completed
}

// lmHeadSameInputs reports whether gradient node gn reads the inputs of
// forward node fn.
func lmHeadSameInputs(fn, gn *ir.Node) bool {
	return gn.Inputs[1] == fn.Inputs[0] && gn.Inputs[2] == fn.Inputs[1] && gn.Inputs[3] == fn.Inputs[2]
}

// lmHeadGrads returns the LMHeadCrossEntropyGrad nodes of g that follow
// forward node n and read its inputs.
func lmHeadGrads(g *ir.Graph, n *ir.Node) []*ir.Node {
	var out []*ir.Node
	after := false
	for _, m := range g.Nodes {
		if m == n {
			after = true
			continue
		}
		if after && m.Op == ir.OpLMHeadCrossEntropyGrad && lmHeadSameInputs(n, m) {
			out = append(out, m)
		}
	}
	return out
}

func lmHeadShapes[T float](x, w, tg *tensor[T]) (N, D, V int, err error) {
	if len(x.shape) != 2 || len(w.shape) != 2 || x.shape[1] != w.shape[1] {
		return 0, 0, 0, fmt.Errorf("want x[N,D] and W[V,D], got %v and %v", x.shape, w.shape)
	}
	if tg.v.DType != ir.I32 || tg.numel() != x.shape[0] {
		return 0, 0, 0, fmt.Errorf("want targets[%d] i32, got %v", x.shape[0], tg.shape)
	}
	return x.shape[0], x.shape[1], w.shape[0], nil
}

func (p *program[T]) buildLMHeadCE(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, w, tg := in[0], in[1], in[2]
	N, D, V, err := lmHeadShapes(x, w, tg)
	if err != nil {
		return nil, err
	}
	ls := n.Attrs.Float("label_smoothing", 0)
	rows := ir.LMHeadChunkRows(n)
	var st *lmhState[T]
	var xs1 []T // the chunk's rows of x scaled by 1/s
	if grads := lmHeadGrads(p.g, n); len(grads) > 0 {
		for _, gn := range grads {
			if gl := gn.Attrs.Float("label_smoothing", 0); gl != ls {
				return nil, fmt.Errorf("LMHeadCrossEntropyGrad node %d has label_smoothing %g, its forward %g", gn.ID, gl, ls)
			}
		}
		st = &lmhState[T]{gx: make([]T, N*D), gw: make([]T, V*D), inv: make([]float64, N)}
		p.lmh[n.ID] = st
		xs1 = make([]T, rows*D)
	}
	buf := make([]T, rows*V)
	rowS := make([]float64, rows)
	rowP := make([]float64, rows)
	hit := 1 - ls
	return func() error {
		t := tg.i
		if err := checkTargets(t, V); err != nil {
			return err
		}
		xs, ws, pred := x.f, w.f, out[2].i
		grad := st != nil
		if grad {
			st.run = 0
			if N == 0 {
				clear(st.gw)
			}
		}
		var sm, pure float64
		for r0 := 0; r0 < N; r0 += rows {
			c := min(rows, N-r0)
			lg := buf[:c*V]
			xc := xs[r0*D : (r0+c)*D]
			gemm(false, true, c, V, D, 1, xc, D, ws, D, 0, lg, V)
			tc, pc := t[r0:r0+c], pred[r0:r0+c]
			parallelFor(c, 1, func(lo, hi int) {
				for r := lo; r < hi; r++ {
					row := lg[r*V : (r+1)*V]
					ti := tc[r]
					if ti == ir.IgnoreTarget {
						pc[r] = int32(lmHeadIgnoredRow(row, grad))
						rowP[r], rowS[r] = 0, 0
						if grad {
							st.inv[r0+r] = 0
							clear(xs1[r*D : (r+1)*D])
						}
						continue
					}
					m, arg, sum := rowMaxArgSum(row)
					xt := float64(row[ti])
					var s float64
					if math.IsInf(sum, 0) || sum != sum {
						// NaN or ±Inf in the row: the plain formula, as CrossEntropy
						arg = argmaxRow(row)
						for _, v := range row {
							s += math.Exp(float64(v - m))
						}
						if grad {
							for i, v := range row {
								row[i] = T(math.Exp(float64(v - m)))
							}
						}
					} else {
						s = expRowSum(row, m, grad)
					}
					pc[r] = int32(arg)
					lse := float64(m) + math.Log(s)
					nll := lse - xt
					rowP[r] = nll
					rowS[r] = (1-ls)*nll + ls*(lse-sum/float64(V))
					if grad {
						row[ti] = T(float64(row[ti]) - hit*s)
						inv := 1 / s
						st.inv[r0+r] = inv
						a := T(inv)
						xr, dr := xc[r*D:(r+1)*D], xs1[r*D:(r+1)*D]
						for i, v := range xr {
							dr[i] = a * v
						}
					}
				}
			})
			for r := 0; r < c; r++ {
				sm += rowS[r]
				pure += rowP[r]
			}
			if grad {
				beta := T(1)
				if r0 == 0 {
					beta = 0
				}
				gemm(false, false, c, D, V, 1, lg, V, ws, D, 0, st.gx[r0*D:(r0+c)*D], D)
				gemm(true, false, V, D, c, 1, lg, V, xs1[:c*D], D, beta, st.gw, D)
			}
		}
		out[0].f[0] = T(sm)
		out[1].f[0] = T(pure)
		if grad {
			st.run = p.runs
		}
		return nil
	}, nil
}

// lmHeadIgnoredRow returns the argmax of a row whose target is ignored and,
// with grad, clears the row so that it adds nothing to the gradient GEMMs.
func lmHeadIgnoredRow[T float](row []T, grad bool) int {
	_, arg, sum := rowMaxArgSum(row)
	if math.IsInf(sum, 0) || sum != sum {
		arg = argmaxRow(row)
	}
	if grad {
		clear(row)
	}
	return arg
}

// sumRows sets dst[j] = Σ_i a[i·D + j] over rows rows of a, summing in
// float64 with one partial sum per entry of partial; with targets, the rows
// whose target is ir.IgnoreTarget are left out.
func sumRows[T float](dst, a []T, rows, D int, partial [][]float64, targets []int32) {
	parallelParts(rows, len(partial), max(1, grainCheap/max(D, 1)), func(w, lo, hi int) {
		acc := partial[w]
		clear(acc)
		for r := lo; r < hi; r++ {
			if targets != nil && targets[r] == ir.IgnoreTarget {
				continue
			}
			for j, v := range a[r*D : (r+1)*D] {
				acc[j] += float64(v)
			}
		}
	})
	for j := range dst {
		var s float64
		for w := range partial {
			s += partial[w][j]
		}
		dst[j] = T(s)
	}
}

func (p *program[T]) buildLMHeadCEGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	dsm, x, w, tg := in[0], in[1], in[2], in[3]
	N, D, V, err := lmHeadShapes(x, w, tg)
	if err != nil {
		return nil, err
	}
	if dsm.numel() != 1 {
		return nil, fmt.Errorf("dsm %v, want a scalar", dsm.shape)
	}
	var fwd *ir.Node
	for _, m := range p.g.Nodes {
		if m == n {
			break
		}
		if m.Op == ir.OpLMHeadCrossEntropy && lmHeadSameInputs(m, n) {
			fwd = m
		}
	}
	if fwd == nil {
		return nil, fmt.Errorf("no LMHeadCrossEntropy on %s, %s, %s before it: the gradient is computed by that forward", x.v, w.v, tg.v)
	}
	st := p.lmh[fwd.ID]
	if st == nil {
		return nil, fmt.Errorf("the LMHeadCrossEntropy node %d on its inputs keeps no gradient", fwd.ID)
	}
	off := n.Attrs.Float("label_smoothing", 0) / float64(max(V, 1))
	colW, sumX := make([]T, D), make([]T, D)
	partial := make([][]float64, p.parts)
	for i := range partial {
		partial[i] = make([]float64, D)
	}
	dx, dw := out[0], out[1]
	grain := max(1, grainCheap/max(D, 1))
	return func() error {
		if st.run != p.runs {
			return fmt.Errorf("LMHeadCrossEntropyGrad on %s, %s needs the LMHeadCrossEntropy node %d to run first in the same run", x.v, w.v, fwd.ID)
		}
		c := float64(dsm.f[0])
		if off != 0 {
			sumRows(colW, w.f, V, D, partial, nil)
			sumRows(sumX, x.f, N, D, partial, tg.i)
		} else {
			clear(colW)
			clear(sumX)
		}
		o := T(c * off)
		gx, dxs := st.gx, dx.f
		parallelFor(N, grain, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				a := T(c * st.inv[r])
				g, d := gx[r*D:(r+1)*D], dxs[r*D:(r+1)*D]
				if tg.i[r] == ir.IgnoreTarget {
					clear(d)
					continue
				}
				for i, cw := range colW {
					d[i] = a*g[i] - o*cw
				}
			}
		})
		gw, dws, a := st.gw, dw.f, T(c)
		parallelFor(V, grain, func(lo, hi int) {
			for v := lo; v < hi; v++ {
				g, d := gw[v*D:(v+1)*D], dws[v*D:(v+1)*D]
				for i, sx := range sumX {
					d[i] = a*g[i] - o*sx
				}
			}
		})
		return nil
	}, nil
}

// rowMaxArgSum returns the row maximum, the first index holding it and the
// row sum, in one pass. A row holding NaN or ±Inf gives a non-finite sum
// (callers then take the plain path; the maximum and index are then
// unspecified).
func rowMaxArgSum[T float](x []T) (m T, arg int, sum float64) {
	if x32, ok := any(x).([]float32); ok {
		m32, a, s := rowMaxArgSum32(x32)
		return T(m32), a, s
	}
	m, sum = rowMaxSum(x)
	for i, v := range x {
		if v == m {
			return m, i, sum
		}
	}
	return m, 0, sum
}

// rowMaxArgSum32 is rowMaxSum32 that also remembers the first block of
// 1024 entries whose maximum is the row's, then finds the index in it.
func rowMaxArgSum32(x []float32) (m float32, arg int, sum float64) {
	m = float32(math.Inf(-1))
	best := 0
	for b := 0; b < len(x); b += 1024 {
		bm, bs := blockMaxSum32(x[b:min(b+1024, len(x))])
		if bm > m || b == 0 {
			m, best = bm, b
		}
		sum += bs
	}
	if len(x) == 0 {
		return m, 0, 0
	}
	for i, v := range x[best:min(best+1024, len(x))] {
		if v == m {
			return m, best + i, sum
		}
	}
	return m, best, sum
}

// argmaxRow returns the index of the largest entry (NaN ranks last, ties
// to the lower index), 0 for an empty row.
func argmaxRow[T float](x []T) int {
	best := 0
	for i := 1; i < len(x); i++ {
		if beats(x[i], i, x[best], best) {
			best = i
		}
	}
	return best
}

func lmHeadKernels[T float](k kernelTable[T]) {
	k.add("LMHeadCrossEntropy", (*program[T]).buildLMHeadCE)
	k.add("LMHeadCrossEntropyGrad", (*program[T]).buildLMHeadCEGrad)
}
