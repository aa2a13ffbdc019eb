package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
)

// ---- Gather / GatherGrad ----

func checkIDs(ids []int32, v int, what string) error {
	for i, id := range ids {
		if id < 0 || int(id) >= v {
			return fmt.Errorf("%s %d at position %d is outside [0,%d)", what, id, i, v)
		}
	}
	return nil
}

// checkTargets is checkIDs for cross-entropy targets, which may also be
// ir.IgnoreTarget.
func checkTargets(ids []int32, v int) error {
	for i, id := range ids {
		if id != ir.IgnoreTarget && (id < 0 || int(id) >= v) {
			return fmt.Errorf("target %d at position %d is outside [0,%d) and is not the ignored target %d", id, i, v, ir.IgnoreTarget)
		}
	}
	return nil
}

func (p *program[T]) buildGather(in, out []*tensor[T]) (func() error, error) {
	w, ids, o := in[0], in[1], out[0]
	if len(w.shape) != 2 || ids.v.DType != ir.I32 {
		return nil, fmt.Errorf("want W[V,D] and i32 ids")
	}
	V, D := w.shape[0], w.shape[1]
	return func() error {
		id := ids.i
		if err := checkIDs(id, V, "id"); err != nil {
			return err
		}
		src, dst := w.f, o.f
		parallelFor(len(id), max(1, grainCheap/max(D, 1)), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				k := int(id[r])
				copy(dst[r*D:(r+1)*D], src[k*D:(k+1)*D])
			}
		})
		return nil
	}, nil
}

func (p *program[T]) buildGatherGrad(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	dy, ids, o := in[0], in[1], out[0]
	if ids.v.DType != ir.I32 {
		return nil, fmt.Errorf("ids must be i32")
	}
	V, D := o.shape[0], o.shape[1]
	if ids.numel()*D != dy.numel() {
		return nil, fmt.Errorf("dy%v does not match ids%v", dy.shape, ids.shape)
	}
	return func() error {
		id := ids.i
		if err := checkIDs(id, V, "id"); err != nil {
			return err
		}
		g, dw := dy.f, o.f
		parallelFor(len(dw), grainCheap, func(lo, hi int) { clear(dw[lo:hi]) })
		// Each worker owns a column range of dW, so rows never collide.
		parallelFor(D, 32, func(c0, c1 int) {
			for r, k := range id {
				dst := dw[int(k)*D+c0 : int(k)*D+c1]
				src := g[r*D+c0 : r*D+c1]
				for j, x := range src {
					dst[j] += x
				}
			}
		})
		return nil
	}, nil
}

// ---- Slice / SliceGrad ----

func sliceGeom(s ir.Shape, a ir.Attrs) (outer, full, inner, start, end int, err error) {
	ax := a.Int("axis", 0)
	if ax < 0 {
		ax += len(s)
	}
	if ax < 0 || ax >= len(s) {
		return 0, 0, 0, 0, 0, fmt.Errorf("slice axis %d out of range for %v", a.Int("axis", 0), s)
	}
	start, end = a.Int("start", 0), a.Int("end", 0)
	if start < 0 || end > s[ax] || start >= end {
		return 0, 0, 0, 0, 0, fmt.Errorf("bad slice [%d,%d) of axis %d of %v", start, end, ax, s)
	}
	outer, inner = 1, 1
	for _, d := range s[:ax] {
		outer *= d
	}
	for _, d := range s[ax+1:] {
		inner *= d
	}
	return outer, s[ax], inner, start, end, nil
}

func (p *program[T]) buildSlice(n *ir.Node, in, out []*tensor[T], grad bool) (func() error, error) {
	x, o := in[0], out[0]
	full := x.shape
	if grad {
		full = o.shape
	}
	outer, d, inner, st, en, err := sliceGeom(full, n.Attrs)
	if err != nil {
		return nil, err
	}
	w := (en - st) * inner
	if grad && x.numel() != outer*w {
		return nil, fmt.Errorf("dy%v does not fit slice of %v", x.shape, full)
	}
	return func() error {
		src, dst := x.f, o.f
		parallelFor(outer, max(1, grainCheap/max(d*inner, 1)), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				big := r*d*inner + st*inner
				if grad {
					row := dst[r*d*inner : (r+1)*d*inner]
					clear(row[:st*inner])
					clear(row[en*inner:])
					copy(dst[big:big+w], src[r*w:(r+1)*w])
				} else {
					copy(dst[r*w:(r+1)*w], src[big:big+w])
				}
			}
		})
		return nil
	}, nil
}

// ---- Transpose ----

// tplan is a transpose with merged dimensions: output dims (outermost first)
// and the input stride of each.
type tplan struct {
	dims, str []int
	n         int
}

func makeTPlan(x ir.Shape, perm []int) (tplan, error) {
	r := len(x)
	if len(perm) != r {
		return tplan{}, fmt.Errorf("perm %v for rank %d", perm, r)
	}
	seen := make([]bool, r)
	xs := make([]int, r)
	acc := 1
	for i := r - 1; i >= 0; i-- {
		xs[i] = acc
		acc *= x[i]
	}
	var dims, str []int // innermost first
	for i := r - 1; i >= 0; i-- {
		j := perm[i]
		if j < 0 || j >= r || seen[j] {
			return tplan{}, fmt.Errorf("bad perm %v", perm)
		}
		seen[j] = true
		d, s := x[j], xs[j]
		if d == 1 {
			continue
		}
		k := len(dims) - 1
		if k >= 0 && s == str[k]*dims[k] {
			dims[k] *= d
			continue
		}
		dims = append(dims, d)
		str = append(str, s)
	}
	tp := tplan{n: x.Numel()}
	for k := len(dims) - 1; k >= 0; k-- {
		tp.dims = append(tp.dims, dims[k])
		tp.str = append(tp.str, str[k])
	}
	return tp, nil
}

func transposeRun[T float](tp *tplan, dst, src []T) {
	k := len(tp.dims)
	switch {
	case k == 0:
		if tp.n > 0 {
			dst[0] = src[0]
		}
		return
	case tp.str[k-1] == 1: // contiguous rows
		L := tp.dims[k-1]
		rows := tp.n / L
		parallelFor(rows, max(1, grainCheap/L), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				base := tOffset(tp, r, k-1)
				copy(dst[r*L:(r+1)*L], src[base:base+L])
			}
		})
	case k >= 2:
		// Blocks of the last two output dims, tiled for the cache.
		M, N := tp.dims[k-2], tp.dims[k-1]
		sm, sn := tp.str[k-2], tp.str[k-1]
		blocks := tp.n / (M * N)
		const tile = 32
		tilesM := (M + tile - 1) / tile
		parallelFor(blocks*tilesM, max(1, grainCheap/(tile*N)), func(lo, hi int) {
			for t := lo; t < hi; t++ {
				b, tm := t/tilesM, t%tilesM
				base := tOffset(tp, b, k-2)
				ob := b * M * N
				i0, i1 := tm*tile, min(tm*tile+tile, M)
				for j0 := 0; j0 < N; j0 += tile {
					j1 := min(j0+tile, N)
					for i := i0; i < i1; i++ {
						row := dst[ob+i*N : ob+i*N+N]
						s := base + i*sm
						for j := j0; j < j1; j++ {
							row[j] = src[s+j*sn]
						}
					}
				}
			}
		})
	default: // one strided dimension
		sn := tp.str[0]
		for j := range tp.dims[0] {
			dst[j] = src[j*sn]
		}
	}
}

// tOffset is the input offset of outer block b over the first nd dims.
func tOffset(tp *tplan, b, nd int) int {
	off := 0
	for d := nd - 1; d >= 0; d-- {
		off += (b % tp.dims[d]) * tp.str[d]
		b /= tp.dims[d]
	}
	return off
}

func (p *program[T]) buildTranspose(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	tp, err := makeTPlan(x.shape, n.Attrs.Ints("perm"))
	if err != nil {
		return nil, err
	}
	return func() error { transposeRun(&tp, o.f, x.f); return nil }, nil
}

// ---- BroadcastTo / SumTo / ReduceSum / ReduceMean ----

func (p *program[T]) buildBroadcastTo(in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	if !ir.CanSumTo(o.shape, x.shape) {
		return nil, fmt.Errorf("cannot broadcast %v to %v", x.shape, o.shape)
	}
	bp := makeBPlan(o.shape, x.shape, x.shape)
	return func() error {
		src, dst := x.f, o.f
		parallelFor(bp.n, grainCheap, func(lo, hi int) {
			bp.walk(lo, hi, func(i, ia, _, cnt int) {
				if bp.sa != 0 {
					copy(dst[i:i+cnt], src[ia:ia+cnt])
				} else {
					v := src[ia]
					d := dst[i : i+cnt]
					for j := range d {
						d[j] = v
					}
				}
			})
		})
		return nil
	}, nil
}

// sumToKernel sums x into a shape that broadcasts to x (fewer or equal rank,
// size-1 axes reduced). scale multiplies the result (ReduceMean).
func (p *program[T]) sumToKernel(x, o *tensor[T], target ir.Shape, scale float64) (func() error, error) {
	if !ir.CanSumTo(x.shape, target) || target.Numel() != o.numel() {
		return nil, fmt.Errorf("cannot sum %v to %v", x.shape, target)
	}
	// Walk x; "a" is the output with stride 0 on reduced axes.
	bp := makeBPlan(x.shape, target, target)
	parts := p.parts
	var partial [][]T
	leading := len(bp.outer) == 1 && bp.oa[0] == 0 && bp.sa == 1 // [R,C] -> [C]
	trailing := len(bp.outer) <= 1 && bp.sa == 0                 // [R,C] -> [R] or all -> []
	if leading && parts > 1 {
		partial = make([][]T, parts)
		for i := range partial {
			partial[i] = make([]T, bp.inner)
		}
	}
	sc := T(scale)
	return func() error {
		src, dst := x.f, o.f
		switch {
		case bp.n == 0:
			clear(dst)
		case trailing:
			L := bp.inner
			parallelFor(len(dst), max(1, grainCheap/L), func(lo, hi int) {
				for r := lo; r < hi; r++ {
					dst[r] = sc * T(sum64(src[r*L:(r+1)*L]))
				}
			})
		case leading && parts > 1:
			L, R := bp.inner, bp.outer[0]
			parallelParts(R, parts, max(1, grainCheap/L), func(w, lo, hi int) {
				acc := partial[w]
				clear(acc)
				for r := lo; r < hi; r++ {
					row := src[r*L : (r+1)*L]
					for j, v := range row {
						acc[j] += v
					}
				}
			})
			parallelFor(L, 1024, func(lo, hi int) {
				for j := lo; j < hi; j++ {
					var s T
					for w := range partial {
						s += partial[w][j]
					}
					dst[j] = sc * s
				}
			})
		default:
			clear(dst)
			bp.walk(0, bp.n, func(i, ia, _, cnt int) {
				xs := src[i : i+cnt]
				if bp.sa != 0 {
					d := dst[ia : ia+cnt]
					for j, v := range xs {
						d[j] += v
					}
				} else {
					dst[ia] += T(sum64(xs))
				}
			})
			if sc != 1 {
				for j := range dst {
					dst[j] *= sc
				}
			}
		}
		return nil
	}, nil
}

// sum64 adds xs in float64 with four accumulators.
func sum64[T float](xs []T) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(xs); i += 4 {
		s0 += float64(xs[i])
		s1 += float64(xs[i+1])
		s2 += float64(xs[i+2])
		s3 += float64(xs[i+3])
	}
	for ; i < len(xs); i++ {
		s0 += float64(xs[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func (p *program[T]) buildReduce(n *ir.Node, in, out []*tensor[T], mean bool) (func() error, error) {
	x, o := in[0], out[0]
	keep, err := ir.ReduceShape(x.shape, n.Attrs.Ints("axes"), true)
	if err != nil {
		return nil, err
	}
	scale := 1.0
	if mean && keep.Numel() > 0 {
		scale = float64(keep.Numel()) / float64(x.numel())
	}
	return p.sumToKernel(x, o, keep, scale)
}

func shapeKernels[T float](k kernelTable[T]) {
	k.add("Gather", withoutNode((*program[T]).buildGather))
	k.add("GatherGrad", (*program[T]).buildGatherGrad)
	k.add("Slice", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return p.buildSlice(n, in, out, false)
	})
	k.add("SliceGrad", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return p.buildSlice(n, in, out, true)
	})
	k.add("Transpose", (*program[T]).buildTranspose)
	k.add("BroadcastTo", withoutNode((*program[T]).buildBroadcastTo))
	k.add("SumTo", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return p.sumToKernel(in[0], out[0], ir.Shape(n.Attrs.Ints("shape")), 1)
	})
	// SumToProduct: the products into a buffer of the node's own (only
	// the CUDA pipeline makes this op; here it is the reference its kernels
	// are checked against), then SumTo.
	k.add("SumToProduct", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		x, y := in[0], in[1]
		prod := &tensor[T]{v: x.v, shape: x.shape, f: make([]T, x.numel()), slot: -1}
		sum, err := p.sumToKernel(prod, out[0], ir.Shape(n.Attrs.Ints("shape")), 1)
		if err != nil {
			return nil, err
		}
		return func() error {
			for i := range prod.f {
				prod.f[i] = x.f[i] * y.f[i]
			}
			return sum()
		}, nil
	})
	k.add("ReduceSum", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return p.buildReduce(n, in, out, false)
	})
	k.add("ReduceMean", func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
		return p.buildReduce(n, in, out, true)
	})
}
