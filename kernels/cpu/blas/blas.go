// Package blas is the one seam through which rpac's CPU backend does dense
// matrix multiplication. Row-major, BLAS-style arguments:
//
//	C = alpha·op(A)·op(B) + beta·C,  op(A) is m×k, op(B) is k×n, C is m×n.
//
// lda/ldb/ldc are the row strides of A, B, C as stored (before transposition).
//
// With cgo the work goes to OpenBLAS (cblas_sgemm/cblas_dgemm, row-major),
// except for tiny products where the call overhead dominates; without cgo
// (or with the build tag noopenblas) a blocked, parallel pure-Go GEMM is
// used. The pure-Go path is always available as SgemmGo and DgemmGo.
//
// Either way the parallelism is Go's: a large product is cut into
// GOMAXPROCS parts of C, each a single-threaded GEMM on its own goroutine
// (OpenBLAS is set to one thread). OpenBLAS's own threads spin for a while
// after each call, waiting for the next; on a machine with few cores they
// took that time from the Go kernels that run between the GEMMs.
//
// As in reference BLAS, C is not read when beta is 0 (NaN or Inf already in
// C are overwritten), and A and B are not read when alpha is 0 or k is 0.
package blas

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// nativeMinWork is the smallest m·n·k handed to OpenBLAS. A cgo call costs
// about 0.1 µs, and OpenBLAS finishes an 8×8×8 product in about that time,
// twice as fast as the pure-Go path; only the very smallest products are
// cheaper without the call.
const nativeMinWork = 4 * 4 * 4

// nativeAlign: a split of C by columns cuts at multiples of this many
// columns, so that no part but the last ends in a partial register tile of
// OpenBLAS's x86-64 single-precision kernels (16 elements wide).
const nativeAlign = 16

// Sgemm is float32 GEMM.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemm("Sgemm", nativeSgemm, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// Dgemm is float64 GEMM.
func Dgemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	gemm("Dgemm", nativeDgemm, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmGo is Sgemm computed by the pure-Go kernel whatever the build, with
// the same arguments and semantics.
func SgemmGo(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemm[float32]("SgemmGo", nil, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// DgemmGo is Dgemm computed by the pure-Go kernel whatever the build, with
// the same arguments and semantics.
func DgemmGo(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	gemm[float64]("DgemmGo", nil, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// gemm checks the arguments of fn and computes with native (OpenBLAS) when
// it is given, built in and worth the call, else with the pure-Go kernel.
func gemm[T float32 | float64](fn string, native func(transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int),
	transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if !checkArgs(fn, transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc) {
		return
	}
	if native != nil && haveNative && alpha != 0 && useNative(m, n, k, lda, ldb, ldc) {
		splitGemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nativeAlign, native)
		return
	}
	gemmGo(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// Impl names the implementation in use: "openblas" or "pure-go".
func Impl() string { return implName }

// Core names OpenBLAS's kernel family for this CPU ("Haswell",
// "SkylakeX", "Zen", "NeoverseV2", ...; OPENBLAS_CORETYPE overrides it),
// or "" without OpenBLAS. Results of tests and benchmarks depend on it, so
// reports name it.
func Core() string { return coreName() }

// useNative reports whether a product is large enough to be worth the cgo
// call and fits OpenBLAS's 32-bit integer arguments.
func useNative(m, n, k, lda, ldb, ldc int) bool {
	const max32 = 1<<31 - 1
	if m > max32 || n > max32 || k > max32 || lda > max32 || ldb > max32 || ldc > max32 {
		return false
	}
	return float64(m)*float64(n)*float64(k) >= nativeMinWork
}

// checkArgs panics on inconsistent arguments (negative sizes, strides
// shorter than a row, slices too short for the strides) and reports whether
// there is anything to compute.
func checkArgs(fn string, transA, transB bool, m, n, k, na, lda, nb, ldb, nc, ldc int) bool {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("blas: %s: negative size m=%d n=%d k=%d", fn, m, n, k))
	}
	// Rows and columns of A, B, C as stored.
	ar, ac := OpDims(transA, m, k)
	br, bc := OpDims(transB, k, n)
	checkMat(fn, "a", ar, ac, na, lda)
	checkMat(fn, "b", br, bc, nb, ldb)
	checkMat(fn, "c", m, n, nc, ldc)
	return m > 0 && n > 0
}

// OpDims returns the rows and columns of op(X) for X of rows×cols: swapped
// when trans is set. Since the swap is its own inverse, it also gives the
// stored dimensions of an operand from op(X)'s.
func OpDims(trans bool, rows, cols int) (int, int) {
	if trans {
		return cols, rows
	}
	return rows, cols
}

func checkMat(fn, name string, rows, cols, length, ld int) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("blas: %s: ld%s=%d less than row length %d", fn, name, ld, cols))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; length < need {
		panic(fmt.Sprintf("blas: %s: len(%s)=%d, want at least %d for %d×%d with stride %d", fn, name, length, need, rows, cols, ld))
	}
}

// Measure runs n×n×n GEMM through Sgemm (prec "f32") or Dgemm (prec "f64")
// once to warm up, then repeatedly for at least minDur, and returns the
// achieved rate in GFLOP/s counting 2n³ flops per call.
func Measure(n int, prec string, minDur time.Duration) (gflops float64, err error) {
	if n <= 0 {
		return 0, fmt.Errorf("blas: Measure: size %d, want n > 0", n)
	}
	var call func()
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	switch prec {
	case "f32":
		a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
		for i := range a {
			a[i] = rng.Float32() - 0.5
			b[i] = rng.Float32() - 0.5
		}
		call = func() { Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n) }
	case "f64":
		a, b, c := make([]float64, n*n), make([]float64, n*n), make([]float64, n*n)
		for i := range a {
			a[i] = rng.Float64() - 0.5
			b[i] = rng.Float64() - 0.5
		}
		call = func() { Dgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n) }
	default:
		return 0, fmt.Errorf("blas: Measure: precision %q, want f32 or f64", prec)
	}
	call()
	calls := 0
	start := time.Now()
	var elapsed time.Duration
	for calls == 0 || elapsed < minDur {
		call()
		calls++
		elapsed = time.Since(start)
	}
	flops := 2 * float64(n) * float64(n) * float64(n) * float64(calls)
	return flops / elapsed.Seconds() / 1e9, nil
}
