package cpu

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/internal/fastexp"
	"github.com/rpac-dev/rpac/ir"
)

// Parallel grains (elements per chunk) for elementwise work.
const (
	grainCheap = 1 << 15 // one or two flops per element
	grainMath  = 1 << 12 // exp, erf, log per element
)

func elementwiseKernels[T float](k kernelTable[T]) {
	for op, code := range map[string]binOp{"Add": opAdd, "Sub": opSub, "Mul": opMul, "Div": opDiv} {
		k.add(op, func(p *program[T], _ *ir.Node, in, out []*tensor[T]) (func() error, error) {
			return p.buildBinary(code, in, out)
		})
	}
	for op, code := range map[string]unOp{"Reshape": opCopy, "StopGradient": opCopy, "Neg": opNeg, "Exp": opExp,
		"Log": opLog, "Sigmoid": opSigmoid, "Tanh": opTanh, "GELU": opGELU, "ReLU": opReLU, "Scale": opScale,
		"Clamp": opClamp, "NanToNum": opNanToNum} {
		k.add(op, func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
			return p.buildUnary(n, code, in, out)
		})
	}
	for op, code := range map[string]gradOp{"SigmoidGrad": opSigmoidGrad, "TanhGrad": opTanhGrad,
		"GELUGrad": opGELUGrad, "ReLUGrad": opReLUGrad, "ClampGrad": opClampGrad, "NanToNumGrad": opNanToNumGrad} {
		k.add(op, func(p *program[T], n *ir.Node, in, out []*tensor[T]) (func() error, error) {
			return p.buildGradUnary(n, code, in, out)
		})
	}
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

func (p *program[T]) buildBinary(op binOp, in, out []*tensor[T]) (func() error, error) {
	x, y, o := in[0], in[1], out[0]
	bp := makeBPlan(o.shape, x.shape, y.shape)
	return func() error {
		a, b, dst := x.f, y.f, o.f
		parallelFor(bp.n, grainCheap, func(lo, hi int) {
			bp.walk(lo, hi, func(i, ia, ib, cnt int) {
				binSeg(op, dst[i:i+cnt], a[ia:], bp.sa, b[ib:], bp.sb)
			})
		})
		return nil
	}, nil
}

// ---- unary ops ----

type unOp uint8

const (
	opCopy unOp = iota
	opNeg
	opExp
	opLog
	opSigmoid
	opTanh
	opGELU
	opReLU
	opScale
	opClamp
	opNanToNum
)

type unParams struct {
	alpha, beta  float64 // Scale
	lo, hi       float64 // Clamp
	nan, pinf, n float64 // NanToNum (n: the -Inf replacement)
}

func unSeg[T float](op unOp, pr *unParams, dst, src []T) {
	src = src[:len(dst)]
	switch op {
	case opCopy:
		if len(dst) > 0 && &dst[0] != &src[0] {
			copy(dst, src)
		}
	case opNeg:
		for i, x := range src {
			dst[i] = -x
		}
	case opExp:
		if d, ok := any(dst).([]float32); ok {
			s := any(src).([]float32)
			for i, x := range s {
				d[i] = fastexp.Exp32(x)
			}
			return
		}
		for i, x := range src {
			dst[i] = T(math.Exp(float64(x)))
		}
	case opLog:
		for i, x := range src {
			dst[i] = T(math.Log(float64(x)))
		}
	case opSigmoid:
		if d, ok := any(dst).([]float32); ok {
			s := any(src).([]float32)
			for i, x := range s {
				d[i] = sigmoid32(x)
			}
			return
		}
		for i, x := range src {
			dst[i] = T(sigmoid64(float64(x)))
		}
	case opTanh:
		for i, x := range src {
			dst[i] = T(math.Tanh(float64(x)))
		}
	case opGELU:
		if d, ok := any(dst).([]float32); ok {
			geluSlice32(d, any(src).([]float32))
			return
		}
		for i, x := range src {
			dst[i] = T(gelu64(float64(x)))
		}
	case opReLU:
		for i, x := range src {
			if x > 0 {
				dst[i] = x
			} else {
				dst[i] = 0
			}
		}
	case opScale:
		al, be := T(pr.alpha), T(pr.beta)
		if be == 0 {
			for i, x := range src {
				dst[i] = al * x
			}
			return
		}
		for i, x := range src {
			dst[i] = al*x + be
		}
	case opClamp:
		lo, hi := T(pr.lo), T(pr.hi)
		for i, x := range src {
			if x < lo {
				x = lo
			}
			if x > hi {
				x = hi
			}
			dst[i] = x
		}
	case opNanToNum:
		nan, pinf, ninf := T(pr.nan), T(pr.pinf), T(pr.n)
		for i, x := range src {
			switch {
			case x != x:
				x = nan
			case math.IsInf(float64(x), 1):
				x = pinf
			case math.IsInf(float64(x), -1):
				x = ninf
			}
			dst[i] = x
		}
	}
}

func unGrain(op unOp) int {
	switch op {
	case opExp, opLog, opSigmoid, opTanh, opGELU:
		return grainMath
	}
	return grainCheap
}

func (p *program[T]) buildUnary(n *ir.Node, op unOp, in, out []*tensor[T]) (func() error, error) {
	x, o := in[0], out[0]
	if x.numel() != o.numel() {
		return nil, fmt.Errorf("input has %d elements, output %d", x.numel(), o.numel())
	}
	pr := &unParams{}
	switch op {
	case opScale:
		pr.alpha, pr.beta = n.Attrs.Float("alpha", 1), n.Attrs.Float("beta", 0)
	case opClamp:
		pr.lo, pr.hi = n.Attrs.Float("lo", math.Inf(-1)), n.Attrs.Float("hi", math.Inf(1))
	case opNanToNum:
		m := maxFinite[T]()
		pr.nan, pr.pinf, pr.n = n.Attrs.Float("nan", 0), n.Attrs.Float("posinf", m), n.Attrs.Float("neginf", -m)
	}
	if x.v.DType == ir.I32 { // Reshape of ids
		if op != opCopy {
			return nil, fmt.Errorf("i32 input %s", x.v)
		}
		return func() error { copy(o.i, x.i); return nil }, nil
	}
	g := unGrain(op)
	return func() error {
		src, dst := x.f, o.f
		parallelFor(len(dst), g, func(lo, hi int) { unSeg(op, pr, dst[lo:hi], src[lo:hi]) })
		return nil
	}, nil
}

// ---- (dy, x-or-y) -> dx ----

type gradOp uint8

const (
	opSigmoidGrad gradOp = iota
	opTanhGrad
	opGELUGrad
	opReLUGrad
	opClampGrad
	opNanToNumGrad
)

func gradSeg[T float](op gradOp, lo, hi T, dst, dy, x []T) {
	dy, x = dy[:len(dst)], x[:len(dst)]
	switch op {
	case opSigmoidGrad:
		for i, y := range x {
			dst[i] = dy[i] * y * (1 - y)
		}
	case opTanhGrad:
		for i, y := range x {
			dst[i] = dy[i] * (1 - y*y)
		}
	case opGELUGrad:
		if d, ok := any(dst).([]float32); ok {
			geluGradSlice32(d, any(dy).([]float32), any(x).([]float32))
			return
		}
		for i, v := range x {
			dst[i] = dy[i] * T(geluGrad64(float64(v)))
		}
	case opReLUGrad:
		for i, v := range x {
			if v > 0 {
				dst[i] = dy[i]
			} else {
				dst[i] = 0
			}
		}
	case opClampGrad:
		for i, v := range x {
			if lo <= v && v <= hi {
				dst[i] = dy[i]
			} else {
				dst[i] = 0
			}
		}
	case opNanToNumGrad:
		for i, v := range x {
			if v-v == 0 { // finite
				dst[i] = dy[i]
			} else {
				dst[i] = 0
			}
		}
	}
}

func (p *program[T]) buildGradUnary(n *ir.Node, op gradOp, in, out []*tensor[T]) (func() error, error) {
	dy, x, o := in[0], in[1], out[0]
	if dy.numel() != o.numel() || x.numel() != o.numel() {
		return nil, fmt.Errorf("dy%v and x%v must have the same number of elements", dy.shape, x.shape)
	}
	lo, hi := T(n.Attrs.Float("lo", math.Inf(-1))), T(n.Attrs.Float("hi", math.Inf(1)))
	g := grainCheap
	if op == opGELUGrad {
		g = grainMath
	}
	return func() error {
		d, xs, dst := dy.f, x.f, o.f
		parallelFor(len(dst), g, func(a, b int) { gradSeg(op, lo, hi, dst[a:b], d[a:b], xs[a:b]) })
		return nil
	}, nil
}
