// Package logsumexp is the scorer's log-softmax kernel: log Σ exp(x) over
// a row of float32 logits, and the float32 exp it is built on. With cgo the
// loops are C (kernel.c) that the compiler vectorizes, in one clone per
// x86-64 level (AVX-512, AVX2+FMA, SSE2) chosen when the program starts,
// and NEON on arm64; without cgo they are Go (unrolled, scalar). Both
// compute the same thing in the same way — the maximum, then exp(x - max)
// by one polynomial, summed in float32 lanes flushed to float64 every
// Block logits — so they agree to float32 rounding of the sums (the
// tests bound the difference).
package logsumexp

import "math"

// Block is how many logits the float32 lane sums take before they are
// added into the float64 total.
const Block = 1024

// lanes is the number of float32 partial sums (and maxima) the C kernel
// keeps: one AVX-512 register, two AVX2 or four SSE/NEON registers.
const lanes = 16

// The exp: with x = n·ln2 + r, |r| <= ln2/2, exp(x) = 2ⁿ·exp(r), exp(r) by
// its Taylor polynomial of degree 7 (truncation below 6e-9 relative), 2ⁿ
// by exponent bits. Arguments below Lo give 0 (exp(Lo) is 2^-125, the
// results in between would be subnormal), above Hi +Inf; NaN gives NaN.
const (
	Lo     = -86.64340
	Hi     = 88.72283
	log2e  = 1.44269504088896341
	ln2hi  = 0.693145751953125      // 15 significant bits: n·ln2hi is exact
	ln2lo  = 1.42860682030941723e-6 // ln2 - ln2hi
	rround = 12582912               // 1.5·2²³: adding it rounds to an integer
	c2     = 1.0 / 2
	c3     = 1.0 / 6
	c4     = 1.0 / 24
	c5     = 1.0 / 120
	c6     = 1.0 / 720
	c7     = 1.0 / 5040
)

// exp32 is the kernel's exp of one float32 (the Go path).
func exp32(x float32) float32 {
	c := min(max(x, Lo), Hi) // NaN stays NaN
	t := c*log2e + rround
	n := t - rround
	k := int32(math.Float32bits(t) - 0x4B400000)
	r := (c - n*ln2hi) - n*ln2lo
	p := 1 + r*(1+r*(c2+r*(c3+r*(c4+r*(c5+r*(c6+r*c7))))))
	e := p * math.Float32frombits(uint32(k+126)<<23) * 2 // 2^(n-1)·2: n = 128 stays finite
	if x < Lo {
		return 0
	}
	if x > Hi {
		return float32(math.Inf(1))
	}
	return e
}

// Exp sets dst[i] = exp(src[i]) (within 2 ulp where the result is a
// normal float32; see Lo and Hi).
func Exp(dst, src []float32) {
	src = src[:len(dst)]
	if len(dst) > 0 {
		expRow(dst, src)
	}
}

// LogSumExp is log Σ exp(row[i]), computed as max + log Σ exp(row[i] -
// max): NaN when a logit is NaN or +Inf (or all are -Inf); -Inf entries
// (masked logits) add nothing. An empty row gives -Inf.
func LogSumExp(row []float32) float64 {
	if len(row) == 0 {
		return math.Inf(-1)
	}
	m, s := maxSumExp(row)
	return math.Log(s) + float64(m)
}

// maxGo is the largest of row's values ignoring NaNs (row[0] when all are
// NaN), over lanes partial maxima.
func maxGo(row []float32) float32 {
	m0, m1, m2, m3 := row[0], row[0], row[0], row[0]
	i := 0
	for ; i+4 <= len(row); i += 4 {
		m0, m1, m2, m3 = maxNum(m0, row[i]), maxNum(m1, row[i+1]), maxNum(m2, row[i+2]), maxNum(m3, row[i+3])
	}
	for ; i < len(row); i++ {
		m0 = maxNum(m0, row[i])
	}
	return maxNum(maxNum(m0, m1), maxNum(m2, m3))
}

// maxNum is b when b > a, else a (a NaN b is skipped).
func maxNum(a, b float32) float32 {
	if b > a {
		return b
	}
	return a
}

// logSumExpGo is LogSumExp on the Go path.
func logSumExpGo(row []float32) float64 {
	m, s := maxSumExpGo(row)
	return math.Log(s) + float64(m)
}

// maxSumExpGo returns the maximum m of row (NaNs skipped) and Σ exp(row[i]
// - m), in Go.
func maxSumExpGo(row []float32) (float32, float64) {
	m := maxGo(row)
	var acc float64
	for len(row) > 0 {
		blk := row[:min(len(row), Block)]
		row = row[len(blk):]
		var s0, s1, s2, s3 float32
		i := 0
		for ; i+4 <= len(blk); i += 4 {
			s0 += exp32(blk[i] - m)
			s1 += exp32(blk[i+1] - m)
			s2 += exp32(blk[i+2] - m)
			s3 += exp32(blk[i+3] - m)
		}
		for ; i < len(blk); i++ {
			s0 += exp32(blk[i] - m)
		}
		acc += float64((s0 + s1) + (s2 + s3))
	}
	return m, acc
}

// expGo is Exp in Go.
func expGo(dst, src []float32) {
	for i, x := range src {
		dst[i] = exp32(x)
	}
}
