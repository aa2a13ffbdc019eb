//go:build cgo && !noopenblas

package blas

/*
#cgo linux,amd64 CFLAGS: -I/usr/include/x86_64-linux-gnu/openblas-pthread
#cgo linux,arm64 CFLAGS: -I/usr/include/aarch64-linux-gnu/openblas-pthread
#cgo LDFLAGS: -lopenblas
#include <cblas.h>

static void rpac_sgemm(int ta, int tb, int m, int n, int k, float alpha,
		const float *a, int lda, const float *b, int ldb,
		float beta, float *c, int ldc) {
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void rpac_dgemm(int ta, int tb, int m, int n, int k, double alpha,
		const double *a, int lda, const double *b, int ldb,
		double beta, double *c, int ldc) {
	cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
*/
import "C"

// OpenBLAS computes each call on the calling thread; splitGemm spreads
// large products over goroutines.
func init() { C.openblas_set_num_threads(1) }

// coreName is the kernel family OpenBLAS chose for this CPU (or the one
// OPENBLAS_CORETYPE forced), e.g. "Haswell", "SkylakeX", "Zen",
// "NeoverseV2".
func coreName() string { return C.GoString(C.openblas_get_corename()) }

const (
	haveNative = true
	implName   = "openblas"
)

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

// nativeSgemm calls OpenBLAS. Arguments are already checked, m, n > 0 and
// k > 0 (so a and b are not empty), and every size fits in a C int.
// OpenBLAS runs on the calling thread (init).
func nativeSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	C.rpac_sgemm(cbool(transA), cbool(transB), C.int(m), C.int(n), C.int(k), C.float(alpha),
		(*C.float)(&a[0]), C.int(lda), (*C.float)(&b[0]), C.int(ldb),
		C.float(beta), (*C.float)(&c[0]), C.int(ldc))
}

// nativeDgemm is nativeSgemm for float64.
func nativeDgemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	C.rpac_dgemm(cbool(transA), cbool(transB), C.int(m), C.int(n), C.int(k), C.double(alpha),
		(*C.double)(&a[0]), C.int(lda), (*C.double)(&b[0]), C.int(ldb),
		C.double(beta), (*C.double)(&c[0]), C.int(ldc))
}
