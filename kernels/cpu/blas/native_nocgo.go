//go:build !cgo || noopenblas

package blas

const (
	haveNative = false
	implName   = "pure-go"
)

func nativeSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	panic("blas: built without OpenBLAS")
}

func nativeDgemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	panic("blas: built without OpenBLAS")
}

func coreName() string { return "" }
