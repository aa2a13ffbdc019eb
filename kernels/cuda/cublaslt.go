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
	layoutBatchCount     = 5  // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT (int32)
	layoutBatchStride    = 6  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET (int64, elements)
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
	laySet  func(l uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
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
			{&b.layDel, "cublasLtMatrixLayoutDestroy"}, {&b.laySet, "cublasLtMatrixLayoutSetAttribute"},
			{&b.matmul, "cublasLtMatmul"},
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
	return b.GemmBatched(GemmShape{TransA: transA, TransB: transB, M: M, N: N, K: K, Batch: 1}, alpha, A, B, ab, beta, C)
}

// GemmShape describes a strided batch of row-major GEMMs: matrix i of the
// batch starts StrideA, StrideB, StrideC elements after matrix i-1 (0 for
// a matrix shared by the whole batch).
type GemmShape struct {
	TransA, TransB            bool
	M, N, K                   int
	Batch                     int
	StrideA, StrideB, StrideC int64
}

// GemmBatched computes C_i = alpha·op(A_i)·op(B_i) + beta·C_i for every
// matrix of the batch (see Gemm for the layouts).
func (b *BLAS) GemmBatched(s GemmShape, alpha float32, A, B Buffer, ab DType, beta float32, C Buffer) error {
	// Row-major C = op(A)op(B) is column-major Cᵀ = op(B)ᵀop(A)ᵀ: B's buffer
	// is the first operand, A's the second.
	M, N, K := s.M, s.N, s.K
	var desc uintptr
	if r := b.descNew(&desc, cublasCompute32F, cudaR32F); r != 0 {
		return fmt.Errorf("cublasLtMatmulDescCreate: status %d", r)
	}
	defer b.descDel(desc)
	opA, opB := cublasOpN, cublasOpN
	rowsA, colsA := N, K // B's buffer seen column-major
	if s.TransB {
		opA, rowsA, colsA = cublasOpT, K, N
	}
	rowsB, colsB := K, M // A's buffer seen column-major
	if s.TransA {
		opB, rowsB, colsB = cublasOpT, M, K
	}
	if r := b.descSet(desc, descTransA, unsafe.Pointer(&opA), 4); r != 0 {
		return fmt.Errorf("cuBLASLt TRANSA: status %d", r)
	}
	if r := b.descSet(desc, descTransB, unsafe.Pointer(&opB), 4); r != 0 {
		return fmt.Errorf("cuBLASLt TRANSB: status %d", r)
	}
	la, err := b.layout(ab, rowsA, colsA, s.Batch, s.StrideB)
	if err != nil {
		return err
	}
	defer b.layDel(la)
	lb, err := b.layout(ab, rowsB, colsB, s.Batch, s.StrideA)
	if err != nil {
		return err
	}
	defer b.layDel(lb)
	lc, err := b.layout(F32, N, M, s.Batch, s.StrideC)
	if err != nil {
		return err
	}
	defer b.layDel(lc)
	r := b.matmul(b.lt, desc, unsafe.Pointer(&alpha), B.Ptr, la, A.Ptr, lb, unsafe.Pointer(&beta), C.Ptr, lc, C.Ptr, lc, nil, 0, 0, 0)
	runtime.KeepAlive(&alpha)
	runtime.KeepAlive(&beta)
	if r != 0 {
		return fmt.Errorf("cublasLtMatmul %dx%dx%d (batch %d): status %d", M, N, K, s.Batch, r)
	}
	return nil
}

// layout creates a column-major layout of rows×cols (leading dimension
// rows) repeated batch times stride elements apart.
func (b *BLAS) layout(dt DType, rows, cols, batch int, stride int64) (uintptr, error) {
	var l uintptr
	if r := b.layNew(&l, int32(dt), uint64(rows), uint64(cols), int64(rows)); r != 0 {
		return 0, fmt.Errorf("cuBLASLt layout %dx%d: status %d", rows, cols, r)
	}
	if batch > 1 {
		n := int32(batch)
		if r := b.laySet(l, layoutBatchCount, unsafe.Pointer(&n), 4); r != 0 {
			b.layDel(l)
			return 0, fmt.Errorf("cuBLASLt batch count %d: status %d", batch, r)
		}
		if r := b.laySet(l, layoutBatchStride, unsafe.Pointer(&stride), 8); r != 0 {
			b.layDel(l)
			return 0, fmt.Errorf("cuBLASLt batch stride %d: status %d", stride, r)
		}
	}
	return l, nil
}
