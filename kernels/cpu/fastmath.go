package cpu

import "math"

// Scalar float32 transcendental functions for the hot float32 kernels.
// Float64 programs (gradient checks) use the math package throughout.

// exp32 is exp for float32 with an error of about 1 ulp: Cody–Waite range
// reduction x = n·ln2 + r, a degree-6 polynomial for exp(r) on
// [-ln2/2, ln2/2], and the exponent written into the bits of 2ⁿ. Arguments
// outside (-87, 88), ±Inf and NaN take the math.Exp path.
func exp32(x float32) float32 {
	if !(x > -87 && x < 88) {
		if x <= -104 {
			return 0
		}
		return float32(math.Exp(float64(x)))
	}
	const (
		log2e = 1.44269504088896341
		c1    = 0.693359375
		c2    = -2.12194440e-4
		round = 12582912 // 1.5·2²³: adding it rounds to an integer
	)
	t := x*log2e + round
	n := t - round
	r := x - n*c1
	r -= n * c2
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*(r*r) + r + 1
	return y * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// expApprox is exp for float64 arguments with a relative error below 1e-8:
// enough for float32 results whose argument must not be rounded to float32
// first (exp(-z²) in the normal tails).
func expApprox(x float64) float64 {
	if !(x > -700 && x < 700) {
		return math.Exp(x)
	}
	const (
		log2e = 1.44269504088896340736
		ln2hi = 6.93147180369123816490e-01
		ln2lo = 1.90821492927058770002e-10
		round = 6755399441055744 // 1.5·2⁵²
	)
	t := x*log2e + round
	n := t - round
	r := x - n*ln2hi - n*ln2lo
	p := 1.0 / 5040
	p = p*r + 1.0/720
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	return p * math.Float64frombits(uint64(int64(n)+1023)<<52)
}

// erfcPos is erfc(z) for z >= 0 with a relative error of about 1.2e-7
// (Chebyshev fit of erfc(z)·exp(z²) in t = 1/(1+z/2)), for float32 results.
func erfcPos(z float64) float64 {
	t := 1 / (1 + 0.5*z)
	p := 0.17087277
	p = p*t - 0.82215223
	p = p*t + 1.48851587
	p = p*t - 1.13520398
	p = p*t + 0.27886807
	p = p*t - 0.18628806
	p = p*t + 0.09678418
	p = p*t + 0.37409196
	p = p*t + 1.00002368
	p = p*t - 1.26551223
	return t * expApprox(p-z*z)
}

const (
	invSqrt2   = 0.70710678118654752440
	invSqrt2Pi = 0.39894228040143267794
)

// normCDF32 is Φ(x), the standard normal CDF, for float32 results.
func normCDF32(x float64) float64 {
	if x < 0 {
		return 0.5 * erfcPos(-x*invSqrt2)
	}
	if x >= 0 {
		return 1 - 0.5*erfcPos(x*invSqrt2)
	}
	return x // NaN
}

func gelu32(x float32) float32 {
	v := float64(x)
	return float32(v * normCDF32(v))
}

// geluGrad32 is Φ(x) + x·φ(x).
func geluGrad32(x float32) float32 {
	v := float64(x)
	return float32(normCDF32(v) + v*invSqrt2Pi*expApprox(-0.5*v*v))
}

func sigmoid32(x float32) float32 { return 1 / (1 + exp32(-x)) }

func normCDF64(x float64) float64 { return 0.5 * math.Erfc(-x*invSqrt2) }

func gelu64(x float64) float64 { return x * normCDF64(x) }

func geluGrad64(x float64) float64 {
	return normCDF64(x) + x*invSqrt2Pi*math.Exp(-0.5*x*x)
}

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// expT and logT dispatch by precision; they are for cold paths (the hot
// float32 loops call exp32 directly).
func expT[T float](x T) T {
	if v, ok := any(x).(float32); ok {
		return T(exp32(v))
	}
	return T(math.Exp(float64(x)))
}

func logT[T float](x T) T { return T(math.Log(float64(x))) }

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
