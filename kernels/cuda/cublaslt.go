package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// cuBLASLt constants (cublasLt.h, library_types.h, cublas_api.h).
const (
	cublasCompute32F     = 68 // CUBLAS_COMPUTE_32F
	cudaR32F             = 0  // CUDA_R_32F
	cudaR16BF            = 14 // CUDA_R_16BF
	descTransA           = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	descTransB           = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	cublasOpN, cublasOpT = int32(0), int32(1)
)

// DType is the element type of a GEMM operand.
type DType int32

const (
	F32  DType = cudaR32F
	BF16 DType = cudaR16BF
)

// BLAS is cuBLASLt, bound at run time.
type BLAS struct {
	handle  uintptr
	lt      uintptr
	create  func(h *uintptr) int32
	descNew func(d *uintptr, compute, scale int32) int32
	descSet func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	descDel func(d uintptr) int32
	layNew  func(l *uintptr, dtype int32, rows, cols uint64, ld int64) int32
	layDel  func(l uintptr) int32
	matmul  func(h, desc uintptr, alpha unsafe.Pointer, A uint64, Ad uintptr, B uint64, Bd uintptr, beta unsafe.Pointer,
		C uint64, Cd uintptr, D uint64, Dd uintptr, algo unsafe.Pointer, ws, wsSize uint64, stream uintptr) int32
}

var (
	blasOnce sync.Once
	blasLib  *BLAS
	blasErr  error
)

// LoadBLAS binds cuBLASLt and creates its handle (after the driver has a
// current context).
func LoadBLAS() (*BLAS, error) {
	blasOnce.Do(func() {
		b := &BLAS{}
		var err error
		if b.handle, err = bind(LibCublasLt, []symbol{
			{&b.create, "cublasLtCreate"}, {&b.descNew, "cublasLtMatmulDescCreate"}, {&b.descSet, "cublasLtMatmulDescSetAttribute"},
			{&b.descDel, "cublasLtMatmulDescDestroy"}, {&b.layNew, "cublasLtMatrixLayoutCreate"},
			{&b.layDel, "cublasLtMatrixLayoutDestroy"}, {&b.matmul, "cublasLtMatmul"},
		}); err != nil {
			blasErr = err
			return
		}
		if r := b.create(&b.lt); r != 0 {
			blasErr = fmt.Errorf("cublasLtCreate: status %d", r)
			return
		}
		blasLib = b
	})
	return blasLib, blasErr
}

// Gemm computes C = alpha·op(A)·op(B) + beta·C on row-major matrices with
// fp32 accumulation: op(A) is [M,K] (A is [K,M] when transA), op(B) is
// [K,N] (B is [N,K] when transB), C is [M,N] in fp32. A and B are of dtype
// ab (F32, or BF16 for the mixed-precision path).
func (b *BLAS) Gemm(transA, transB bool, M, N, K int, alpha float32, A, B Buffer, ab DType, beta float32, C Buffer) error {
	// Row-major C = op(A)op(B) is column-major Cᵀ = op(B)ᵀop(A)ᵀ: B's buffer
	// is the first operand, A's the second.
	var desc uintptr
	if r := b.descNew(&desc, cublasCompute32F, cudaR32F); r != 0 {
		return fmt.Errorf("cublasLtMatmulDescCreate: status %d", r)
	}
	defer b.descDel(desc)
	opA, opB := cublasOpN, cublasOpN
	rowsA, colsA := N, K // B's buffer seen column-major
	if transB {
		opA, rowsA, colsA = cublasOpT, K, N
	}
	rowsB, colsB := K, M // A's buffer seen column-major
	if transA {
		opB, rowsB, colsB = cublasOpT, M, K
	}
	if r := b.descSet(desc, descTransA, unsafe.Pointer(&opA), 4); r != 0 {
		return fmt.Errorf("cuBLASLt TRANSA: status %d", r)
	}
	if r := b.descSet(desc, descTransB, unsafe.Pointer(&opB), 4); r != 0 {
		return fmt.Errorf("cuBLASLt TRANSB: status %d", r)
	}
	var la, lb, lc uintptr
	if r := b.layNew(&la, int32(ab), uint64(rowsA), uint64(colsA), int64(rowsA)); r != 0 {
		return fmt.Errorf("cuBLASLt layout: status %d", r)
	}
	defer b.layDel(la)
	if r := b.layNew(&lb, int32(ab), uint64(rowsB), uint64(colsB), int64(rowsB)); r != 0 {
		return fmt.Errorf("cuBLASLt layout: status %d", r)
	}
	defer b.layDel(lb)
	if r := b.layNew(&lc, cudaR32F, uint64(N), uint64(M), int64(N)); r != 0 {
		return fmt.Errorf("cuBLASLt layout: status %d", r)
	}
	defer b.layDel(lc)
	r := b.matmul(b.lt, desc, unsafe.Pointer(&alpha), B.Ptr, la, A.Ptr, lb, unsafe.Pointer(&beta), C.Ptr, lc, C.Ptr, lc, nil, 0, 0, 0)
	runtime.KeepAlive(&alpha)
	runtime.KeepAlive(&beta)
	if r != 0 {
		return fmt.Errorf("cublasLtMatmul %dx%dx%d: status %d", M, N, K, r)
	}
	return nil
}
