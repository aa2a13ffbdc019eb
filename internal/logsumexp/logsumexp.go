// Package logsumexp is the scorer's log-softmax kernel: log Σ exp(x) over
// a row of float32 logits, and the float32 exp it is built on. With cgo the
// loops are C (kernel.c) that the compiler vectorizes, in one clone per
// x86-64 level (AVX-512, AVX2+FMA, SSE2) chosen when the program starts,
// and NEON on arm64, with a polynomial exp; without cgo they are Go, with
// internal/fastexp's exp (a table and a quadratic: faster than a scalar
// polynomial), unrolled. Both take the maximum, then Σ exp(x - max) in
// float32 lanes flushed to float64 every Block logits, so they agree to
// float32 rounding of the sums (the tests bound the difference).
package logsumexp

import (
	"math"

	"github.com/rpac-dev/rpac/internal/fastexp"
)

// Block is how many logits the float32 lane sums take before they are
// added into the float64 total.
const Block = 1024

// The C kernel's exp: with x = n·ln2 + r, |r| <= ln2/2, exp(x) =
// 2ⁿ·exp(r), exp(r) by its Taylor polynomial of degree 7 (truncation below
// 6e-9 relative), 2ⁿ by exponent bits. Arguments below Lo give 0 (exp(Lo)
// is 2^-125, the results in between would be subnormal), above Hi +Inf;
// NaN gives NaN. The Go path's exp is internal/fastexp's (a table of
// 2^(j/64) and a quadratic: 1 ulp, subnormal results down to -104).
const (
	Lo = -86.64340
	Hi = 88.72283
)

// Exp sets dst[i] = exp(src[i]) (within 2 ulp where the result is a
// normal float32; 0 below Lo, or subnormal on the Go path; +Inf above Hi).
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
// NaN), over four partial maxima.
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
// - m), in Go (fastexp.SubSum32: float32 sums flushed to float64 every
// Block logits).
func maxSumExpGo(row []float32) (float32, float64) {
	m := maxGo(row)
	return m, fastexp.SubSum32(row, m)
}

// expGo is Exp in Go.
func expGo(dst, src []float32) {
	for i, x := range src {
		dst[i] = fastexp.Exp32(x)
	}
}
