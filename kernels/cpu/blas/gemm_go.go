package blas

import (
	"runtime"
	"sync"
)

// Blocking of the pure-Go GEMM. The micro-kernel computes a 1×nr strip of C
// over a kc-deep slice of the product: its nr accumulators stay in
// registers, the packed B panel (kc×nr) stays in L1 while every row of the
// packed A block (mc×kc, in L2) streams past it.
const (
	nr      = 12   // width of a micro-tile (columns of C)
	ku      = 8    // unroll of the micro-kernel; packed depth is a multiple
	kcBlock = 256  // depth of one packed slice of A and B
	mcBlock = 128  // rows of A packed at a time
	ncBlock = 1536 // columns of B packed at a time (multiple of nr)

	// parMinWork is the smallest m·n·k worth splitting across goroutines.
	parMinWork = 128 * 128 * 128
)

// gemmGo computes C = alpha·op(A)·op(B) + beta·C for checked arguments with
// m, n > 0, splitting the work across GOMAXPROCS goroutines when large.
func gemmGo[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	splitGemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nr, gemmSerial[T])
}

// splitGemm runs serial, a single-threaded GEMM with splitGemm's
// arguments, over parts of C on GOMAXPROCS goroutines (one part when the
// product is small). It splits along the longer side of C: rows of C share
// B and own a band of A; columns of C share A and own a band of B, in
// multiples of align columns. Each part runs the whole blocked algorithm on
// its own sub-problem, so an element of C is summed in the same order
// however the work is split.
func splitGemm[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int,
	align int, serial func(transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)) {
	workers := runtime.GOMAXPROCS(0)
	if float64(m)*float64(n)*float64(k) < parMinWork {
		workers = 1
	}
	if m >= n {
		parts := min(workers, m)
		if parts <= 1 {
			serial(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			return
		}
		step := (m + parts - 1) / parts
		parallel(m, step, func(i0, i1 int) {
			ai := i0 * lda
			if transA {
				ai = i0
			}
			serial(transA, transB, i1-i0, n, k, alpha, a[ai:], lda, b, ldb, beta, c[i0*ldc:], ldc)
		})
		return
	}
	parts := min(workers, (n+align-1)/align)
	if parts <= 1 {
		serial(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	step := ((n+parts-1)/parts + align - 1) / align * align
	parallel(n, step, func(j0, j1 int) {
		bj := j0
		if transB {
			bj = j0 * ldb
		}
		serial(transA, transB, m, j1-j0, k, alpha, a, lda, b[bj:], ldb, beta, c[j0:], ldc)
	})
}

// parallel runs fn over [0,total) in chunks of step, the last chunk on the
// calling goroutine.
func parallel(total, step int, fn func(lo, hi int)) {
	var wg sync.WaitGroup
	lo := 0
	for ; lo+step < total; lo += step {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, lo+step)
	}
	fn(lo, total)
	wg.Wait()
}

// gemmBuf holds the packing buffers of one goroutine.
type gemmBuf[T float32 | float64] struct {
	a, b []T
}

var (
	bufPool32 sync.Pool
	bufPool64 sync.Pool
)

func pool[T float32 | float64]() *sync.Pool {
	var zero T
	if _, ok := any(zero).(float32); ok {
		return &bufPool32
	}
	return &bufPool64
}

func getBuf[T float32 | float64](na, nb int) *gemmBuf[T] {
	buf, _ := pool[T]().Get().(*gemmBuf[T])
	if buf == nil {
		buf = new(gemmBuf[T])
	}
	if cap(buf.a) < na {
		buf.a = make([]T, na)
	}
	if cap(buf.b) < nb {
		buf.b = make([]T, nb)
	}
	buf.a, buf.b = buf.a[:na], buf.b[:nb]
	return buf
}

func putBuf[T float32 | float64](buf *gemmBuf[T]) { pool[T]().Put(buf) }

// scaleC sets C = beta·C; with beta 0 C is overwritten without being read.
func scaleC[T float32 | float64](m, n int, beta T, c []T, ldc int) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// gemmSerial is the blocked algorithm on the calling goroutine.
func gemmSerial[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	scaleC(m, n, beta, c, ldc)
	if k == 0 || alpha == 0 {
		return
	}
	kcMax := roundUp(min(k, kcBlock), ku)
	buf := getBuf[T](min(m, mcBlock)*kcMax, kcMax*roundUp(min(n, ncBlock), nr))
	defer putBuf(buf)
	var out [nr]T
	for jc := 0; jc < n; jc += ncBlock {
		nb := min(ncBlock, n-jc)
		for pc := 0; pc < k; pc += kcBlock {
			kb := min(kcBlock, k-pc)
			kp := roundUp(kb, ku)
			packB(transB, b, ldb, pc, jc, kb, nb, kp, buf.b)
			for ic := 0; ic < m; ic += mcBlock {
				mb := min(mcBlock, m-ic)
				packA(transA, a, lda, ic, pc, mb, kb, kp, buf.a)
				for j0 := 0; j0 < nb; j0 += nr {
					w := min(nr, nb-j0)
					panel := buf.b[j0*kp : (j0+nr)*kp]
					for i := 0; i < mb; i++ {
						kernel1x12(kp, buf.a[i*kp:(i+1)*kp], panel, &out)
						row := c[(ic+i)*ldc+jc+j0 : (ic+i)*ldc+jc+j0+w]
						for j := range row {
							row[j] += alpha * out[j]
						}
					}
				}
			}
		}
	}
}

func roundUp(x, to int) int { return (x + to - 1) / to * to }

// packA copies the mb×kb block of op(A) at (ic, pc) into dst as mb rows of
// kp values, zero-padded beyond kb.
func packA[T float32 | float64](trans bool, a []T, lda, ic, pc, mb, kb, kp int, dst []T) {
	dst = dst[:mb*kp]
	if !trans {
		for i := 0; i < mb; i++ {
			d := dst[i*kp : (i+1)*kp]
			copy(d, a[(ic+i)*lda+pc:(ic+i)*lda+pc+kb])
			clear(d[kb:])
		}
		return
	}
	// op(A)(i, p) = A[p][i]: read rows of the stored A, scatter into columns.
	for p := 0; p < kb; p++ {
		src := a[(pc+p)*lda+ic : (pc+p)*lda+ic+mb]
		for i, v := range src {
			dst[i*kp+p] = v
		}
	}
	if kb < kp {
		for i := 0; i < mb; i++ {
			clear(dst[i*kp+kb : (i+1)*kp])
		}
	}
}

// packB copies the kb×nb block of op(B) at (pc, jc) into dst as panels of
// nr columns, each panel kp rows of nr values (row p of a panel is
// contiguous), zero-padded beyond kb rows and nb columns.
func packB[T float32 | float64](trans bool, b []T, ldb, pc, jc, kb, nb, kp int, dst []T) {
	for j0 := 0; j0 < nb; j0 += nr {
		w := min(nr, nb-j0)
		panel := dst[j0*kp : (j0+nr)*kp]
		if !trans {
			for p := 0; p < kb; p++ {
				src := b[(pc+p)*ldb+jc+j0 : (pc+p)*ldb+jc+j0+w]
				d := panel[p*nr : (p+1)*nr]
				copy(d, src)
				clear(d[w:])
			}
		} else {
			// op(B)(p, j) = B[j][p]: read rows of the stored B.
			for j := 0; j < w; j++ {
				src := b[(jc+j0+j)*ldb+pc : (jc+j0+j)*ldb+pc+kb]
				for p, v := range src {
					panel[p*nr+j] = v
				}
			}
			if w < nr {
				for p := 0; p < kb; p++ {
					clear(panel[p*nr+w : (p+1)*nr])
				}
			}
		}
		clear(panel[kb*nr:])
	}
}
