// Package fastexp is exp for float32 with an error of about 1 ulp, and the
// loops over slices built on it (Σ exp(x-m), softmax numerators, scaled
// gradients) that carry the hot float32 work of the CPU kernels' Softmax
// and CrossEntropy and of the runtime's scorer. It imports only math.
package fastexp

import "math"

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

// Exp32 is exp for float32 with an error of about 1 ulp. With
// x = (64n+j)·ln2/64 + r, |r| <= ln2/128: exp(x) = 2ⁿ·2^(j/64)·exp(r), a
// table for 2^(j/64), a quadratic for exp(r), and n added to the exponent bits.
// Arguments outside (-87, 88), ±Inf and NaN take the math.Exp path (at or
// below -104 the result is 0).
func Exp32(x float32) float32 {
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

// The loops below inline Exp32's fast path: they carry the hot float32
// work of Softmax and CrossEntropy. With |r| <= ln2/128 the quadratic
// 1 + r + r²/2 is already within float32 rounding (r³/6 < 2.7e-8).

const (
	e32k64   = 92.332482616893656877
	e32l64hi = 0.01082611083984375
	e32l64lo = 4.313856405395097e-06
	e32round = 12582912
)

// ExpFast32 is Exp32 for arguments in (-87, 88) (callers check the range).
func ExpFast32(a float32) float32 {
	t := a*e32k64 + e32round
	kf := t - e32round
	k := int32(math.Float32bits(t) - 0x4B400000)
	r := (a - kf*e32l64hi) - kf*e32l64lo
	return (1 + r + 0.5*r*r) * math.Float32frombits(exp2Tab32[k&63]+uint32(k>>6)<<23)
}

func InRange(a float32) bool { return a > -87 && a < 88 }

// SubStore32 sets dst[i] = exp(src[i] - m) and returns the sum.
func SubStore32(dst, src []float32, m float32) float32 {
	src = src[:len(dst)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(src); i += 2 {
		a0, a1 := src[i]-m, src[i+1]-m
		var e0, e1 float32
		if InRange(a0) && InRange(a1) {
			e0, e1 = ExpFast32(a0), ExpFast32(a1)
		} else {
			e0, e1 = Exp32(a0), Exp32(a1)
		}
		dst[i], dst[i+1] = e0, e1
		s0 += e0
		s1 += e1
	}
	if i < len(src) {
		e := Exp32(src[i] - m)
		dst[i] = e
		s0 += e
	}
	return s0 + s1
}

// SubSum32 returns Σ exp(src[i] - m) in float64.
func SubSum32(src []float32, m float32) float64 {
	var acc float64
	for len(src) > 0 {
		blk := src[:min(len(src), 1024)] // short float32 partial sums
		src = src[len(blk):]
		var s0, s1 float32
		i := 0
		for ; i+2 <= len(blk); i += 2 {
			a0, a1 := blk[i]-m, blk[i+1]-m
			if InRange(a0) && InRange(a1) {
				s0 += ExpFast32(a0)
				s1 += ExpFast32(a1)
			} else {
				s0 += Exp32(a0)
				s1 += Exp32(a1)
			}
		}
		if i < len(blk) {
			s0 += Exp32(blk[i] - m)
		}
		acc += float64(s0) + float64(s1)
	}
	return acc
}

// ScaledSub32 sets g[i] = c·exp(x[i] - l) - off.
func ScaledSub32(g, x []float32, l, c, off float32) {
	x = x[:len(g)]
	i := 0
	for ; i+2 <= len(x); i += 2 {
		a0, a1 := x[i]-l, x[i+1]-l
		if InRange(a0) && InRange(a1) {
			g[i] = c*ExpFast32(a0) - off
			g[i+1] = c*ExpFast32(a1) - off
		} else {
			g[i] = c*Exp32(a0) - off
			g[i+1] = c*Exp32(a1) - off
		}
	}
	if i < len(x) {
		g[i] = c*Exp32(x[i]-l) - off
	}
}
