package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/internal/fastexp"
	"github.com/rpac-dev/rpac/ir"
)

// Parallel grains (elements per chunk) for elementwise work.
const (
	grainCheap = 1 << 15 // one or two flops per element
	grainMath  = 1 << 12 // exp, erf, log per element
)

// elementwiseKernels registers a kernel for every op of ir.Elementwise,
// which runs the spec's formula (EwSpec.F32 or F64), and for the copies
// (Reshape, StopGradient). The kernels here are faster ones for some ops
// in float32 (fastUnary32, fastGrad32) and the four arithmetic ops
// (binOps); they give the results they always gave, which the specs'
// formulas give in float64.
func elementwiseKernels[T float](k kernelTable[T]) {
	for _, s := range ir.Elementwise {
		k.add(s.Name, func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
			switch s.Kind {
			case ir.EwBinary:
				return p.buildBinary(s, in, out)
			case ir.EwGrad:
				return p.buildGradUnary(n, s, in, out)
			}
			return p.buildUnary(n, s, in, out)
		})
	}
	for _, op := range []ir.OpName{ir.OpReshape, ir.OpStopGradient} {
		k.add(op, func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
			return p.buildCopy(in, out)
		})
	}
}

// formulaOf is s's formula in T.
func formulaOf[T float](s *ir.EwSpec) func(x, y T, p ir.EwParams[T]) T {
	if isF32[T]() {
		return any(s.F32).(func(x, y T, p ir.EwParams[T]) T)
	}
	return any(s.F64).(func(x, y T, p ir.EwParams[T]) T)
}

// paramsOf are a node's parameters of s in T.
func paramsOf[T float](s *ir.EwSpec, a ir.Attrs) ir.EwParams[T] {
	if isF32[T]() {
		return any(s.Params32(a)).(ir.EwParams[T])
	}
	return any(s.Params64(a)).(ir.EwParams[T])
}

// grainOf is the parallel grain of s's kernel.
func grainOf(s *ir.EwSpec) int {
	if s.Costly {
		return grainMath
	}
	return grainCheap
}

// ---- broadcasting ----

// bplan walks an output shape with the broadcast offsets of two operands.
// Dimensions of size 1 are dropped and adjacent dimensions that are
// contiguous in the output and in both operands are merged, so the common
// cases become one or two loops: equal shapes (one dimension), a trailing
// row broadcast ([B,T,D]+[D]: outer stride 0 for b), a per-row scalar
// ([B,T,D]·[B,T,1]: inner stride 0 for b).
type bplan struct {
	n      int
	inner  int // length of the innermost merged dimension
	sa, sb int // its strides in a and b (0 or 1)
	outer  []int
	oa, ob []int
}

func contiguousStrides(s ir.Shape, rank int) []int {
	st := make([]int, rank)
	acc := 1
	for i := rank - 1; i >= 0; i-- {
		j := i - (rank - len(s))
		d := 1
		if j >= 0 {
			d = s[j]
		}
		if d == 1 {
			st[i] = 0
		} else {
			st[i] = acc
		}
		acc *= d
	}
	return st
}

func makeBPlan(out, a, b ir.Shape) bplan {
	r := len(out)
	sa := contiguousStrides(a, r)
	sb := contiguousStrides(b, r)
	// merged dimensions, innermost first
	var dims, da, db []int
	for i := r - 1; i >= 0; i-- {
		d := out[i]
		if d == 1 {
			continue
		}
		k := len(dims) - 1
		if k >= 0 && sa[i] == da[k]*dims[k] && sb[i] == db[k]*dims[k] {
			dims[k] *= d
			continue
		}
		dims = append(dims, d)
		da = append(da, sa[i])
		db = append(db, sb[i])
	}
	bp := bplan{n: out.Numel(), inner: 1}
	if len(dims) == 0 {
		return bp
	}
	bp.inner, bp.sa, bp.sb = dims[0], da[0], db[0]
	for k := len(dims) - 1; k >= 1; k-- { // outermost first
		bp.outer = append(bp.outer, dims[k])
		bp.oa = append(bp.oa, da[k])
		bp.ob = append(bp.ob, db[k])
	}
	return bp
}

// walk calls seg(o, ia, ib, cnt) for the output range [lo,hi), split at
// inner-row boundaries: cnt outputs from o, operand a from ia with stride
// sa, operand b from ib with stride sb.
func (bp *bplan) walk(lo, hi int, seg func(o, ia, ib, cnt int)) {
	if lo >= hi {
		return
	}
	L := bp.inner
	k := len(bp.outer)
	if k == 0 {
		seg(lo, lo*bp.sa, lo*bp.sb, hi-lo)
		return
	}
	var buf [8]int
	var idx []int
	if k <= len(buf) {
		idx = buf[:k]
	} else {
		idx = make([]int, k)
	}
	row, col := lo/L, lo%L
	ia, ib := 0, 0
	for d := k - 1; d >= 0; d-- {
		i := row % bp.outer[d]
		row /= bp.outer[d]
		idx[d] = i
		ia += i * bp.oa[d]
		ib += i * bp.ob[d]
	}
	for o := lo; o < hi; {
		cnt := min(L-col, hi-o)
		seg(o, ia+col*bp.sa, ib+col*bp.sb, cnt)
		o += cnt
		col = 0
		for d := k - 1; d >= 0; d-- {
			idx[d]++
			ia += bp.oa[d]
			ib += bp.ob[d]
			if idx[d] < bp.outer[d] {
				break
			}
			ia -= bp.oa[d] * bp.outer[d]
			ib -= bp.ob[d] * bp.outer[d]
			idx[d] = 0
		}
	}
}

// ---- binary ops ----

type binOp uint8

const (
	opAdd binOp = iota
	opSub
	opMul
	opDiv
)

// binOps are the binary ops binSeg runs (the others run their formula).
var binOps = map[ir.OpName]binOp{ir.OpAdd: opAdd, ir.OpSub: opSub, ir.OpMul: opMul, ir.OpDiv: opDiv}

func binSeg[T float](op binOp, out, a []T, sa int, b []T, sb int) {
	n := len(out)
	switch {
	case sa != 0 && sb != 0:
		a, b = a[:n], b[:n]
		switch op {
		case opAdd:
			for i := range out {
				out[i] = a[i] + b[i]
			}
		case opSub:
			for i := range out {
				out[i] = a[i] - b[i]
			}
		case opMul:
			for i := range out {
				out[i] = a[i] * b[i]
			}
		case opDiv:
			for i := range out {
				out[i] = a[i] / b[i]
			}
		}
	case sa != 0:
		a = a[:n]
		y := b[0]
		switch op {
		case opAdd:
			for i := range out {
				out[i] = a[i] + y
			}
		case opSub:
			for i := range out {
				out[i] = a[i] - y
			}
		case opMul:
			for i := range out {
				out[i] = a[i] * y
			}
		case opDiv:
			for i := range out {
				out[i] = a[i] / y
			}
		}
	case sb != 0:
		b = b[:n]
		x := a[0]
		switch op {
		case opAdd:
			for i := range out {
				out[i] = x + b[i]
			}
		case opSub:
			for i := range out {
				out[i] = x - b[i]
			}
		case opMul:
			for i := range out {
				out[i] = x * b[i]
			}
		case opDiv:
			for i := range out {
				out[i] = x / b[i]
			}
		}
	default:
		var v T
		switch op {
		case opAdd:
			v = a[0] + b[0]
		case opSub:
			v = a[0] - b[0]
		case opMul:
			v = a[0] * b[0]
		case opDiv:
			v = a[0] / b[0]
		}
		for i := range out {
			out[i] = v
		}
	}
}

func (p *program[T]) buildBinary(s *ir.EwSpec, in, out []*tensor[T]) (func() error, error) {
	x, y, o := in[0], in[1], out[0]
	bp := makeBPlan(o.shape, x.shape, y.shape)
	f, pr := formulaOf[T](s), ir.EwParams[T]{}
	seg := func(dst, a []T, sa int, b []T, sb int) {
		for i := range dst {
			dst[i] = f(a[i*sa], b[i*sb], pr)
		}
	}
	if op, ok := binOps[s.Name]; ok {
		seg = func(dst, a []T, sa int, b []T, sb int) { binSeg(op, dst, a, sa, b, sb) }
	}
	return func() error {
		a, b, dst := x.f, y.f, o.f
		parallelFor(bp.n, grainOf(s), func(lo, hi int) {
			bp.walk(lo, hi, func(i, ia, ib, cnt int) {
				seg(dst[i:i+cnt], a[ia:], bp.sa, b[ib:], bp.sb)
			})
		})
		return nil
	}, nil
}

// ---- unary ops ----

// fastUnary32 and fastGrad32 are float32 kernels of their own: fastexp's
// exp, GELU's interpolation table (fastmath.go).
var (
	fastUnary32 = map[ir.OpName]func(dst, src []float32){
		ir.OpExp: func(dst, src []float32) {
			for i, x := range src[:len(dst)] {
				dst[i] = fastexp.Exp32(x)
			}
		},
		ir.OpSigmoid: func(dst, src []float32) {
			for i, x := range src[:len(dst)] {
				dst[i] = sigmoid32(x)
			}
		},
		ir.OpGELU: geluSlice32,
	}
	fastGrad32 = map[ir.OpName]func(dst, dy, x []float32){ir.OpGELUGrad: geluGradSlice32}
)

// unSeg sets dst[i] = f(src[i]).
func unSeg[T float](f func(x, y T, p ir.EwParams[T]) T, pr ir.EwParams[T], dst, src []T) {
	src = src[:len(dst)]
	for i, x := range src {
		dst[i] = f(x, 0, pr)
	}
}

// scaleSeg is Scale's loop of its own (a step's most frequent unary op:
// attention scores, mean gradients), without a call per element.
func scaleSeg[T float](al, be T, dst, src []T) {
	src = src[:len(dst)]
	if be == 0 {
		for i, x := range src {
			dst[i] = al * x
		}
		return
	}
	for i, x := range src {
		dst[i] = al*x + be
	}
}

func (p *program[T]) buildUnary(n *ir.Node, s *ir.EwSpec, in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	if x.numel() != o.numel() {
		return nil, fmt.Errorf("input has %d elements, output %d", x.numel(), o.numel())
	}
	f, pr := formulaOf[T](s), paramsOf[T](s, n.Attrs)
	seg := func(dst, src []T) { unSeg(f, pr, dst, src) }
	if s.Name == ir.OpScale {
		seg = func(dst, src []T) { scaleSeg(pr[0], pr[1], dst, src) }
	}
	if fast, ok := fastUnary32[s.Name]; ok && isF32[T]() {
		seg = func(dst, src []T) { fast(any(dst).([]float32), any(src).([]float32)) }
	}
	g := grainOf(s)
	return func() error {
		src, dst := x.f, o.f
		parallelFor(len(dst), g, func(lo, hi int) { seg(dst[lo:hi], src[lo:hi]) })
		return nil
	}, nil
}

// buildCopy copies the input (Reshape, StopGradient), ids included; a
// shared plan slot copies nothing.
func (p *program[T]) buildCopy(in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	if x.numel() != o.numel() {
		return nil, fmt.Errorf("input has %d elements, output %d", x.numel(), o.numel())
	}
	if x.v.DType == ir.I32 { // Reshape of ids
		return func() error { copy(o.i, x.i); return nil }, nil
	}
	return func() error {
		src, dst := x.f, o.f
		if len(dst) > 0 && &dst[0] != &src[0] {
			parallelFor(len(dst), grainCheap, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
		}
		return nil
	}, nil
}

// ---- (dy, x-or-y) -> dx ----

func (p *program[T]) buildGradUnary(n *ir.Node, s *ir.EwSpec, in, out []*tensor[T]) (func() error, error) {
	dy, x, o := in[0], in[1], out[0]
	if dy.numel() != o.numel() || x.numel() != o.numel() {
		return nil, fmt.Errorf("dy%v and x%v must have the same number of elements", dy.shape, x.shape)
	}
	f, pr := formulaOf[T](s), paramsOf[T](s, n.Attrs)
	seg := func(dst, d, v []T) {
		d, v = d[:len(dst)], v[:len(dst)]
		for i := range dst {
			dst[i] = f(d[i], v[i], pr)
		}
	}
	if fast, ok := fastGrad32[s.Name]; ok && isF32[T]() {
		seg = func(dst, d, v []T) { fast(any(dst).([]float32), any(d).([]float32), any(v).([]float32)) }
	}
	g := grainOf(s)
	return func() error {
		d, xs, dst := dy.f, x.f, o.f
		parallelFor(len(dst), g, func(a, b int) { seg(dst[a:b], d[a:b], xs[a:b]) })
		return nil
	}, nil
}
