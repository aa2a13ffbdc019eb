package cpu

import (
	"math"

	"github.com/rpac-dev/rpac/internal/fastexp"
)

// Scalar float32 transcendental functions for the hot float32 kernels
// (exp is internal/fastexp, shared with the runtime's scorer).
// Float64 programs (gradient checks) use the math package throughout.

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
//
// The loops of geluSlice32 and geluGradSlice32 name the input only as the
// float64 v. With the float32 kept alive as well (for the out-of-table
// call), the compiler widened it into another register (CVTSS2SD X0, X1):
// an instruction that writes only the low half of its destination and so
// waits for the previous element's result in it. Every element then waited
// for the one before, 4× slower (BenchmarkGELU).
func geluSlice32(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		v := float64(src[i])
		if v > -8 && v < 8 {
			u := (v - gTabLo) * gTabScale
			k := int(u)
			s := u - float64(k)
			c := &cdfTab[k&(gTabN-1)]
			dst[i] = float32(v * (c[0] + s*(c[1]+s*(c[2]+s*c[3]))))
		} else {
			dst[i] = gelu32(float32(v))
		}
	}
}

// geluGradSlice32 sets dst[i] = dy[i]·(Φ(x) + x·φ(x)).
func geluGradSlice32(dst, dy, x []float32) {
	dy, x = dy[:len(dst)], x[:len(dst)]
	for i := range dst {
		v := float64(x[i])
		if v > -8 && v < 8 {
			u := (v - gTabLo) * gTabScale
			k := int(u)
			s := u - float64(k)
			c := &dgeluTab[k&(gTabN-1)]
			dst[i] = dy[i] * float32(c[0]+s*(c[1]+s*(c[2]+s*c[3])))
		} else {
			dst[i] = dy[i] * geluGrad32(float32(v))
		}
	}
}

func sigmoid32(x float32) float32 { return 1 / (1 + fastexp.Exp32(-x)) }

func normCDF64(x float64) float64 { return 0.5 * math.Erfc(-x*invSqrt2) }

func isF32[T float]() bool {
	var z T
	_, ok := any(z).(float32)
	return ok
}
