package cpu

import "math"

// Scalar float32 transcendental functions for the hot float32 kernels.
// Float64 programs (gradient checks) use the math package throughout.

// exp2Tab[j] = 2^(j/64); exp2Tab32 holds the same as float32 bits.
var (
	exp2Tab   [64]float64
	exp2Tab32 [64]uint32
)

func init() {
	for j := range exp2Tab {
		exp2Tab[j] = math.Exp2(float64(j) / 64)
		exp2Tab32[j] = math.Float32bits(float32(exp2Tab[j]))
	}
}

// exp32 is exp for float32 with an error of about 1 ulp. With
// x = (64n+j)·ln2/64 + r, |r| <= ln2/128: exp(x) = 2ⁿ·2^(j/64)·exp(r), a
// table for 2^(j/64), a quadratic for exp(r), and n added to the exponent bits.
// Arguments outside (-87, 88), ±Inf and NaN take the math.Exp path (at or
// below -104 the result is 0).
func exp32(x float32) float32 {
	if !(x > -87 && x < 88) {
		if x <= -104 {
			return 0
		}
		return float32(math.Exp(float64(x)))
	}
	const (
		k64   = 92.332482616893656877 // 64/ln2
		l64hi = 0.01082611083984375   // ln2/64 to 11 bits: kf·l64hi is exact
		l64lo = 4.313856405395097e-06 // ln2/64 - l64hi
		round = 12582912              // 1.5·2²³: adding it rounds to an integer
	)
	t := x*k64 + round
	kf := t - round
	k := int32(math.Float32bits(t) - 0x4B400000)
	r := (x - kf*l64hi) - kf*l64lo
	return (1 + r + 0.5*r*r) * math.Float32frombits(exp2Tab32[k&63]+uint32(k>>6)<<23)
}

const (
	invSqrt2   = 0.70710678118654752440
	invSqrt2Pi = 0.39894228040143267794
)

// GELU in float32 uses cubic Hermite interpolation of Φ(x) (forward) and
// of Φ(x) + x·φ(x) (backward) on [-8, 8) with step 1/32, built from the
// exact functions and their derivatives: absolute error below 1e-9, no
// division or exp per element. Outside the table Φ is 0 or 1 to float32
// precision (as in PyTorch's float32 GELU, where 1 + erf(x/√2) is 0 below
// about -5.5).
const (
	gTabLo    = -8
	gTabScale = 32 // intervals per unit
	gTabN     = 16 * gTabScale
)

var (
	cdfTab   [gTabN][4]float64 // Φ
	dgeluTab [gTabN][4]float64 // Φ + x·φ
)

func init() {
	const h = 1.0 / gTabScale
	fill := func(tab *[gTabN][4]float64, f, df func(float64) float64) {
		for i := range tab {
			x0 := gTabLo + float64(i)*h
			x1 := x0 + h
			f0, f1 := f(x0), f(x1)
			d0, d1 := h*df(x0), h*df(x1)
			tab[i] = [4]float64{f0, d0, 3*(f1-f0) - 2*d0 - d1, -2*(f1-f0) + d0 + d1}
		}
	}
	pdf := func(x float64) float64 { return invSqrt2Pi * math.Exp(-0.5*x*x) }
	fill(&cdfTab, normCDF64, pdf)
	fill(&dgeluTab, func(x float64) float64 { return normCDF64(x) + x*pdf(x) },
		func(x float64) float64 { return pdf(x) * (2 - x*x) })
}

// hermite evaluates tab at x in [-8, 8).
func hermite(tab *[gTabN][4]float64, x float64) float64 {
	u := (x - gTabLo) * gTabScale
	i := int(u)
	s := u - float64(i)
	c := &tab[i&(gTabN-1)]
	return c[0] + s*(c[1]+s*(c[2]+s*c[3]))
}

func gelu32(x float32) float32 {
	v := float64(x)
	switch {
	case v > -8 && v < 8:
		return float32(v * hermite(&cdfTab, v))
	case v >= 8:
		return x
	}
	return x * 0 // -0 below the table, NaN for NaN and -Inf
}

// geluGrad32 is Φ(x) + x·φ(x).
func geluGrad32(x float32) float32 {
	v := float64(x)
	switch {
	case v > -8 && v < 8:
		return float32(hermite(&dgeluTab, v))
	case v >= 8:
		return 1
	case v <= -8:
		return 0
	}
	return x // NaN
}

// geluSlice32 sets dst[i] = GELU(src[i]).
func geluSlice32(dst, src []float32) {
	src = src[:len(dst)]
	for i, x := range src {
		v := float64(x)
		if v > -8 && v < 8 {
			u := (v - gTabLo) * gTabScale
			k := int(u)
			s := u - float64(k)
			c := &cdfTab[k&(gTabN-1)]
			dst[i] = float32(v * (c[0] + s*(c[1]+s*(c[2]+s*c[3]))))
		} else {
			dst[i] = gelu32(x)
		}
	}
}

// geluGradSlice32 sets dst[i] = dy[i]·(Φ(x) + x·φ(x)).
func geluGradSlice32(dst, dy, x []float32) {
	dy, x = dy[:len(dst)], x[:len(dst)]
	for i, xv := range x {
		v := float64(xv)
		if v > -8 && v < 8 {
			u := (v - gTabLo) * gTabScale
			k := int(u)
			s := u - float64(k)
			c := &dgeluTab[k&(gTabN-1)]
			dst[i] = dy[i] * float32(c[0]+s*(c[1]+s*(c[2]+s*c[3])))
		} else {
			dst[i] = dy[i] * geluGrad32(xv)
		}
	}
}

func sigmoid32(x float32) float32 { return 1 / (1 + exp32(-x)) }

func normCDF64(x float64) float64 { return 0.5 * math.Erfc(-x*invSqrt2) }

func gelu64(x float64) float64 { return x * normCDF64(x) }

func geluGrad64(x float64) float64 {
	return normCDF64(x) + x*invSqrt2Pi*math.Exp(-0.5*x*x)
}

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func isF32[T float]() bool {
	var z T
	_, ok := any(z).(float32)
	return ok
}

// maxFinite is the largest finite value of T.
func maxFinite[T float]() float64 {
	if isF32[T]() {
		return math.MaxFloat32
	}
	return math.MaxFloat64
}

// The loops below inline exp32's fast path: they carry the hot float32
// work of Softmax and CrossEntropy. With |r| <= ln2/128 the quadratic
// 1 + r + r²/2 is already within float32 rounding (r³/6 < 2.7e-8).

const (
	e32k64   = 92.332482616893656877
	e32l64hi = 0.01082611083984375
	e32l64lo = 4.313856405395097e-06
	e32round = 12582912
)

// expFast32 is exp32 for arguments in (-87, 88) (callers check the range).
func expFast32(a float32) float32 {
	t := a*e32k64 + e32round
	kf := t - e32round
	k := int32(math.Float32bits(t) - 0x4B400000)
	r := (a - kf*e32l64hi) - kf*e32l64lo
	return (1 + r + 0.5*r*r) * math.Float32frombits(exp2Tab32[k&63]+uint32(k>>6)<<23)
}

func expInRange(a float32) bool { return a > -87 && a < 88 }

// expSubStore32 sets dst[i] = exp(src[i] - m) and returns the sum.
func expSubStore32(dst, src []float32, m float32) float32 {
	src = src[:len(dst)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(src); i += 2 {
		a0, a1 := src[i]-m, src[i+1]-m
		var e0, e1 float32
		if expInRange(a0) && expInRange(a1) {
			e0, e1 = expFast32(a0), expFast32(a1)
		} else {
			e0, e1 = exp32(a0), exp32(a1)
		}
		dst[i], dst[i+1] = e0, e1
		s0 += e0
		s1 += e1
	}
	if i < len(src) {
		e := exp32(src[i] - m)
		dst[i] = e
		s0 += e
	}
	return s0 + s1
}

// expSubSum32 returns Σ exp(src[i] - m) in float64.
func expSubSum32(src []float32, m float32) float64 {
	var acc float64
	for len(src) > 0 {
		blk := src[:min(len(src), 1024)] // short float32 partial sums
		src = src[len(blk):]
		var s0, s1 float32
		i := 0
		for ; i+2 <= len(blk); i += 2 {
			a0, a1 := blk[i]-m, blk[i+1]-m
			if expInRange(a0) && expInRange(a1) {
				s0 += expFast32(a0)
				s1 += expFast32(a1)
			} else {
				s0 += exp32(a0)
				s1 += exp32(a1)
			}
		}
		if i < len(blk) {
			s0 += exp32(blk[i] - m)
		}
		acc += float64(s0) + float64(s1)
	}
	return acc
}

// scaledExpSub32 sets g[i] = c·exp(x[i] - l) - off.
func scaledExpSub32(g, x []float32, l, c, off float32) {
	x = x[:len(g)]
	i := 0
	for ; i+2 <= len(x); i += 2 {
		a0, a1 := x[i]-l, x[i+1]-l
		if expInRange(a0) && expInRange(a1) {
			g[i] = c*expFast32(a0) - off
			g[i+1] = c*expFast32(a1) - off
		} else {
			g[i] = c*exp32(a0) - off
			g[i+1] = c*exp32(a1) - off
		}
	}
	if i < len(x) {
		g[i] = c*exp32(x[i]-l) - off
	}
}
