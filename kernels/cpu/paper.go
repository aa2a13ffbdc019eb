package cpu

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/ir"
)

// ---- GaussianMembership (GaussianFuzzy.forward of the paper's appendix) ----

// gaussScales returns, per regime, e_r = exp(-2·log_sigma_r) and its clamp
// s_r = clamp(e_r, 1e-3, 1e3).
func gaussScales[T float](ls []T, e, s []float64) {
	for r, v := range ls {
		e[r] = math.Exp(-2 * float64(v))
		s[r] = min(max(e[r], 1e-3), 1e3)
		if e[r] != e[r] {
			s[r] = e[r]
		}
	}
}

// sqDist is ‖z - c‖².
func sqDist[T float](z, c []T) float64 {
	c = c[:len(z)]
	var a0, a1 float64
	i := 0
	for ; i+2 <= len(z); i += 2 {
		d0 := float64(z[i]) - float64(c[i])
		d1 := float64(z[i+1]) - float64(c[i+1])
		a0 += d0 * d0
		a1 += d1 * d1
	}
	if i < len(z) {
		d := float64(z[i]) - float64(c[i])
		a0 += d * d
	}
	return a0 + a1
}

func gaussGeom[T float](z, c, ls *tensor[T]) (N, D, R int, err error) {
	if len(c.shape) != 2 || ls.numel() != c.shape[0] || lastDim(z.shape) != c.shape[1] {
		return 0, 0, 0, fmt.Errorf("want z[...,D], centers[R,D], log_sigma[R]; got %v, %v, %v", z.shape, c.shape, ls.shape)
	}
	R, D = c.shape[0], c.shape[1]
	if D > 0 {
		N = z.numel() / D
	} else {
		N = z.numel()
	}
	return N, D, R, nil
}

func (p *program[T]) buildGaussian(in, out []*tensor[T]) (func() error, error) {
	z, c, ls, mu := in[0], in[1], in[2], out[0]
	N, D, R, err := gaussGeom(z, c, ls)
	if err != nil {
		return nil, err
	}
	if mu.numel() != N*R {
		return nil, fmt.Errorf("output %v for %d rows of %d regimes", mu.shape, N, R)
	}
	e, s := make([]float64, R), make([]float64, R)
	return func() error {
		gaussScales(ls.f, e, s)
		zs, cs, ms := z.f, c.f, mu.f
		parallelFor(N, max(1, grainCheap/max(R*D*3, 1)), func(lo, hi int) {
			for n := lo; n < hi; n++ {
				zr, mr := zs[n*D:(n+1)*D], ms[n*R:(n+1)*R]
				// logits, then softmax in place, then nan_to_num(1/R)
				m := math.Inf(-1)
				nan := false
				for r := 0; r < R; r++ {
					l := -0.5 * sqDist(zr, cs[r*D:(r+1)*D]) * s[r]
					l = clamp64(l, -30, 30)
					if l != l {
						nan = true
					}
					m = max(m, l)
					mr[r] = T(l)
				}
				if nan || math.IsInf(m, 0) {
					for r := range mr {
						mr[r] = T(1 / float64(R))
					}
					continue
				}
				var sum float64
				for r := range mr {
					ex := math.Exp(float64(mr[r]) - m)
					mr[r] = T(ex)
					sum += ex
				}
				for r := range mr {
					mr[r] = T(float64(mr[r]) / sum)
				}
			}
		})
		return nil
	}, nil
}

// clamp64 is torch.clamp: NaN stays NaN.
func clamp64(x, lo, hi float64) float64 {
	if x < lo {
		return lo
	}
	if x > hi {
		return hi
	}
	return x
}

func (p *program[T]) buildGaussianGrad(in, out []*tensor[T]) (func() error, error) {
	dmu, z, c, ls, mu := in[0], in[1], in[2], in[3], in[4]
	dz, dc, dls := out[0], out[1], out[2]
	N, D, R, err := gaussGeom(z, c, ls)
	if err != nil {
		return nil, err
	}
	if dmu.numel() != N*R || mu.numel() != N*R {
		return nil, fmt.Errorf("dμ%v and μ%v for %d rows of %d regimes", dmu.shape, mu.shape, N, R)
	}
	e, s := make([]float64, R), make([]float64, R)
	parts := p.parts
	type part struct {
		a          []float64 // Σ_rows dz2_r·z  [R,D]
		sum, ds    []float64 // Σ_rows dz2_r; Σ_rows g_r·(-z2_r/2)
		z2, g, dz2 []float64 // row scratch
		lpre       []float64
	}
	ps := make([]part, parts)
	for i := range ps {
		ps[i] = part{a: make([]float64, R*D), sum: make([]float64, R), ds: make([]float64, R),
			z2: make([]float64, R), g: make([]float64, R), dz2: make([]float64, R), lpre: make([]float64, R)}
	}
	return func() error {
		gaussScales(ls.f, e, s)
		zs, cs, dms, ms, dzs := z.f, c.f, dmu.f, mu.f, dz.f
		parallelParts(N, parts, max(1, grainCheap/max(R*D*4, 1)), func(w, lo, hi int) {
			pt := &ps[w]
			clear(pt.a)
			clear(pt.sum)
			clear(pt.ds)
			for n := lo; n < hi; n++ {
				zr, dzr := zs[n*D:(n+1)*D], dzs[n*D:(n+1)*D]
				dmr, mr := dms[n*R:(n+1)*R], ms[n*R:(n+1)*R]
				nan := false
				for r := 0; r < R; r++ {
					pt.z2[r] = sqDist(zr, cs[r*D:(r+1)*D])
					pt.lpre[r] = -0.5 * pt.z2[r] * s[r]
					if pt.lpre[r] != pt.lpre[r] {
						nan = true
					}
				}
				if nan { // nan_to_num: no gradient through replaced entries
					clear(dzr)
					continue
				}
				var dot float64
				for r := 0; r < R; r++ {
					dot += float64(dmr[r]) * float64(mr[r])
				}
				for r := 0; r < R; r++ {
					g := float64(mr[r]) * (float64(dmr[r]) - dot)
					if !(pt.lpre[r] >= -30 && pt.lpre[r] <= 30) {
						g = 0
					}
					pt.ds[r] += g * (-0.5 * pt.z2[r])
					pt.dz2[r] = g * (-0.5 * s[r])
					pt.sum[r] += pt.dz2[r]
				}
				for d, zv := range zr {
					var acc float64
					for r := 0; r < R; r++ {
						acc += pt.dz2[r] * (float64(zv) - float64(cs[r*D+d]))
					}
					dzr[d] = T(2 * acc)
				}
				for r := 0; r < R; r++ {
					k := pt.dz2[r]
					if k == 0 {
						continue
					}
					ar := pt.a[r*D : (r+1)*D]
					for d, zv := range zr {
						ar[d] += k * float64(zv)
					}
				}
			}
		})
		dcs, dlss := dc.f, dls.f
		for r := 0; r < R; r++ {
			var sum, ds float64
			for w := range ps {
				sum += ps[w].sum[r]
				ds += ps[w].ds[r]
			}
			for d := 0; d < D; d++ {
				var a float64
				for w := range ps {
					a += ps[w].a[r*D+d]
				}
				dcs[r*D+d] = T(-2*a + 2*sum*float64(cs[r*D+d]))
			}
			if e[r] >= 1e-3 && e[r] <= 1e3 {
				dlss[r] = T(ds * -2 * e[r])
			} else {
				dlss[r] = 0
			}
		}
		return nil
	}, nil
}

// ---- Sinkhorn ----

const sinkEps = 1e-9

// sinkhornForward runs iters rounds on x (float64, in place). When rec is
// non-nil it records, per round, X before the row step, the row sums, X
// before the column step and the column sums.
func sinkhornForward(x []float64, R, K, iters int, rec *sinkRecord) {
	for it := 0; it < iters; it++ {
		if rec != nil {
			copy(rec.xr[it*R*K:(it+1)*R*K], x)
		}
		for i := 0; i < R; i++ {
			row := x[i*K : (i+1)*K]
			var s float64
			for _, v := range row {
				s += v
			}
			if rec != nil {
				rec.rs[it*R+i] = s
			}
			for j := range row {
				row[j] /= s + sinkEps
			}
		}
		if rec != nil {
			copy(rec.xc[it*R*K:(it+1)*R*K], x)
		}
		for j := 0; j < K; j++ {
			var s float64
			for i := 0; i < R; i++ {
				s += x[i*K+j]
			}
			if rec != nil {
				rec.cs[it*K+j] = s
			}
			for i := 0; i < R; i++ {
				x[i*K+j] /= s + sinkEps
			}
		}
	}
}

type sinkRecord struct{ xr, xc, rs, cs []float64 }

func (p *program[T]) buildSinkhorn(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	if len(x.shape) != 2 {
		return nil, fmt.Errorf("want X[R,K], got %v", x.shape)
	}
	R, K := x.shape[0], x.shape[1]
	iters := n.Attrs.Int("iters", 0)
	if iters < 0 {
		return nil, fmt.Errorf("iters %d < 0", iters)
	}
	work := make([]float64, R*K)
	return func() error {
		for i, v := range x.f {
			work[i] = float64(v)
		}
		sinkhornForward(work, R, K, iters, nil)
		for i, v := range work {
			o.f[i] = T(v)
		}
		return nil
	}, nil
}

func (p *program[T]) buildSinkhornGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	dP, x, o := in[0], in[1], out[0]
	if len(x.shape) != 2 || dP.numel() != x.numel() {
		return nil, fmt.Errorf("want dP and X[R,K] of one shape, got %v and %v", dP.shape, x.shape)
	}
	R, K := x.shape[0], x.shape[1]
	iters := n.Attrs.Int("iters", 0)
	if iters < 0 {
		return nil, fmt.Errorf("iters %d < 0", iters)
	}
	rec := &sinkRecord{xr: make([]float64, iters*R*K), xc: make([]float64, iters*R*K),
		rs: make([]float64, iters*R), cs: make([]float64, iters*K)}
	work := make([]float64, R*K)
	d := make([]float64, R*K)
	return func() error {
		for i, v := range x.f {
			work[i] = float64(v)
		}
		sinkhornForward(work, R, K, iters, rec)
		for i, v := range dP.f {
			d[i] = float64(v)
		}
		for it := iters - 1; it >= 0; it-- {
			sinkNormGrad(d, rec.xc[it*R*K:(it+1)*R*K], rec.cs[it*K:(it+1)*K], R, 1, K)
			sinkNormGrad(d, rec.xr[it*R*K:(it+1)*R*K], rec.rs[it*R:(it+1)*R], K, K, 1)
		}
		for i, v := range d {
			o.f[i] = T(v)
		}
		return nil
	}, nil
}

// sinkNormGrad backpropagates d through one Sinkhorn normalization in
// place: line l (its m elements at l*ls + e*es) of y was divided by
// sums[l]+sinkEps.
func sinkNormGrad(d, y, sums []float64, m, ls, es int) {
	for l, sum := range sums {
		s := sum + sinkEps
		var q float64
		for e := 0; e < m; e++ {
			q += d[l*ls+e*es] * y[l*ls+e*es]
		}
		q /= s * s
		for e := 0; e < m; e++ {
			d[l*ls+e*es] = d[l*ls+e*es]/s - q
		}
	}
}

// ---- ZScore (torch: (x - x.mean()) / (x.std() + 1e-6), std unbiased) ----

const zEps = 1e-6

// zStats returns mean and unbiased std of x, summing per part.
func zStats[T float](x []T, partial []float64) (mean, sd float64) {
	n := len(x)
	parts := len(partial)
	parallelParts(n, parts, grainCheap, func(w, lo, hi int) { partial[w] = sum64(x[lo:hi]) })
	var s float64
	for _, v := range partial {
		s += v
	}
	mean = s / float64(n)
	parallelParts(n, parts, grainCheap, func(w, lo, hi int) {
		var a float64
		for _, v := range x[lo:hi] {
			d := float64(v) - mean
			a += d * d
		}
		partial[w] = a
	})
	var ss float64
	for _, v := range partial {
		ss += v
	}
	return mean, math.Sqrt(ss / float64(n-1))
}

func (p *program[T]) buildZScore(in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	partial := make([]float64, p.parts)
	return func() error {
		xs, ys := x.f, o.f
		if len(xs) == 0 {
			return nil
		}
		mean, sd := zStats(xs, partial)
		inv := 1 / (sd + zEps)
		parallelFor(len(xs), grainCheap, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				ys[i] = T((float64(xs[i]) - mean) * inv)
			}
		})
		return nil
	}, nil
}

func (p *program[T]) buildZScoreGrad(in, out []*tensor[T]) (func() error, error) {
	dy, x, o := in[0], in[1], out[0]
	if dy.numel() != x.numel() {
		return nil, fmt.Errorf("dy%v and x%v differ", dy.shape, x.shape)
	}
	partial := make([]float64, p.parts)
	partial2 := make([]float64, p.parts)
	return func() error {
		g, xs, dx := dy.f, x.f, o.f
		n := len(xs)
		if n == 0 {
			return nil
		}
		mean, sd := zStats(xs, partial)
		c := sd + zEps
		parallelParts(n, len(partial), grainCheap, func(w, lo, hi int) {
			var sg, sgd float64
			for i := lo; i < hi; i++ {
				gv := float64(g[i])
				sg += gv
				sgd += gv * (float64(xs[i]) - mean)
			}
			partial[w], partial2[w] = sg, sgd
		})
		var sg, sgd float64
		for w := range partial {
			sg += partial[w]
			sgd += partial2[w]
		}
		mg := sg / float64(n)
		k := 0.0
		if sd > 0 {
			k = sgd / (c * c * float64(n-1) * sd)
		}
		parallelFor(n, grainCheap, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				dx[i] = T((float64(g[i])-mg)/c - k*(float64(xs[i])-mean))
			}
		})
		return nil
	}, nil
}

func paperKernels[T float](k kernelTable[T]) {
	k.add("GaussianMembership", withoutNode((*program[T]).buildGaussian))
	k.add("GaussianMembershipGrad", withoutNode((*program[T]).buildGaussianGrad))
	k.add("Sinkhorn", (*program[T]).buildSinkhorn)
	k.add("SinkhornGrad", (*program[T]).buildSinkhornGrad)
	k.add("ZScore", withoutNode((*program[T]).buildZScore))
	k.add("ZScoreGrad", withoutNode((*program[T]).buildZScoreGrad))
}
