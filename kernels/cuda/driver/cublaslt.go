package driver

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
	descEpilogue         = 7  // CUBLASLT_MATMUL_DESC_EPILOGUE (uint32)
	descBiasPointer      = 8  // CUBLASLT_MATMUL_DESC_BIAS_POINTER (void*)
	descBiasDataType     = 26 // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE (int32)
	epilogueBias         = 4  // CUBLASLT_EPILOGUE_BIAS: D += bias, one value per row of D
	layoutBatchCount     = 5  // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT (int32)
	layoutBatchStride    = 6  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET (int64, elements)
	prefMaxWorkspace     = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64)
	prefMinAlignmentA    = 5  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (uint32); B, C, D follow
	cublasOpN, cublasOpT = int32(0), int32(1)
)

// DType is the element type of a GEMM operand.
type DType int32

const (
	F32  DType = cudaR32F
	BF16 DType = cudaR16BF
)

// Size is the bytes of one element.
func (t DType) Size() int64 {
	if t == BF16 {
		return 2
	}
	return 4
}

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
	prefNew func(p *uintptr) int32
	prefSet func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	prefDel func(p uintptr) int32
	heur    func(h, desc, A, B, C, D, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	matmul  func(h, desc uintptr, alpha unsafe.Pointer, A uint64, Ad uintptr, B uint64, Bd uintptr, beta unsafe.Pointer,
		C uint64, Cd uintptr, D uint64, Dd uintptr, algo unsafe.Pointer, ws, wsSize uint64, stream uintptr) int32
}

// LoadBLAS binds cuBLASLt and creates its handle (after the driver has a
// current context).
func LoadBLAS() (*BLAS, error) { return loadBLAS() }

var loadBLAS = sync.OnceValues(func() (*BLAS, error) {
	b := &BLAS{}
	var err error
	if b.handle, err = bind(LibCublasLt, []symbol{
		{&b.create, "cublasLtCreate"}, {&b.descNew, "cublasLtMatmulDescCreate"}, {&b.descSet, "cublasLtMatmulDescSetAttribute"},
		{&b.descDel, "cublasLtMatmulDescDestroy"}, {&b.layNew, "cublasLtMatrixLayoutCreate"},
		{&b.layDel, "cublasLtMatrixLayoutDestroy"}, {&b.laySet, "cublasLtMatrixLayoutSetAttribute"},
		{&b.prefNew, "cublasLtMatmulPreferenceCreate"}, {&b.prefSet, "cublasLtMatmulPreferenceSetAttribute"},
		{&b.prefDel, "cublasLtMatmulPreferenceDestroy"}, {&b.heur, "cublasLtMatmulAlgoGetHeuristic"},
		{&b.matmul, "cublasLtMatmul"},
	}); err != nil {
		return nil, err
	}
	if r := b.create(&b.lt); r != 0 {
		return nil, fmt.Errorf("cublasLtCreate: status %d", r)
	}
	return b, nil
})

// GemmShape describes a strided batch of row-major GEMMs C = op(A)·op(B):
// op(A) is [M,K] (A is stored [K,M] when TransA), op(B) is [K,N] (B is
// stored [N,K] when TransB), C is [M,N] in fp32. LDA, LDB and LDC are
// the leading dimensions of A, B and C as stored (elements between rows; 0:
// dense, the stored row length). Matrix i of the batch starts StrideA,
// StrideB, StrideC elements after matrix i-1 (0 for a matrix shared by the
// whole batch).
type GemmShape struct {
	TransA, TransB            bool
	M, N, K                   int
	Batch                     int
	StrideA, StrideB, StrideC int64
	LDA, LDB, LDC             int
}

// StoredA is A's shape as stored (rows, columns), row-major.
func (s GemmShape) StoredA() (int, int) {
	if s.TransA {
		return s.K, s.M
	}
	return s.M, s.K
}

// StoredB is B's shape as stored (rows, columns), row-major.
func (s GemmShape) StoredB() (int, int) {
	if s.TransB {
		return s.N, s.K
	}
	return s.K, s.N
}

// LeadingA is A's leading dimension (elements).
func (s GemmShape) LeadingA() int {
	if s.LDA > 0 {
		return s.LDA
	}
	_, c := s.StoredA()
	return c
}

// LeadingB is B's leading dimension (elements).
func (s GemmShape) LeadingB() int {
	if s.LDB > 0 {
		return s.LDB
	}
	_, c := s.StoredB()
	return c
}

// LeadingC is C's leading dimension (elements).
func (s GemmShape) LeadingC() int {
	if s.LDC > 0 {
		return s.LDC
	}
	return s.N
}

// GemmKey is everything a cuBLASLt plan depends on: the problem, the
// operand type, and the alignment (bytes, at most 256) of the A, B and C
// pointers and of the bias (0: no bias epilogue; else every row of C gets
// the fp32 bias added, one value per column), for which its algorithm is
// chosen.
type GemmKey struct {
	Shape     GemmShape
	AB        DType
	Align     [3]uint16
	BiasAlign uint16
	C         DType // C and D: F32 (the zero value), or BF16 after a bf16 GEMM (rounded in the epilogue)
}

// GemmCall is one run of a plan: C = Alpha·op(A)·op(B) + Beta·C (+ Bias
// when the plan has the bias epilogue), WS the algorithm's workspace.
type GemmCall struct {
	Alpha, Beta       float32
	A, B, C, Bias, WS Buffer
	CType             DType // C's elements: F32, or BF16 (bf16 GEMMs with β = 0 only)
}

// NewGemmKey makes the key of a GEMM call.
func NewGemmKey(s GemmShape, ab DType, c GemmCall) GemmKey {
	k := GemmKey{Shape: s, AB: ab, Align: [3]uint16{ptrAlign(c.A.Ptr), ptrAlign(c.B.Ptr), ptrAlign(c.C.Ptr)}, C: c.CType}
	if c.Bias.Ptr != 0 {
		k.BiasAlign = ptrAlign(c.Bias.Ptr)
	}
	return k
}

// ptrAlign is the largest power of two up to 256 that divides p.
func ptrAlign(p uint64) uint16 {
	if p == 0 {
		return 256
	}
	return uint16(min(256, p&-p))
}

// GemmPlan is one GEMM's cuBLASLt state, made once and reused: the matmul
// descriptor, the three layouts and the algorithm the heuristic chose.
type GemmPlan struct {
	Key              GemmKey
	desc, la, lb, lc uintptr
	res              heuristicResult
}

// heuristicResult is cublasLtMatmulHeuristicResult_t (cublasLt.h).
type heuristicResult struct {
	algo      [8]uint64 // cublasLtMatmulAlgo_t
	workspace uint64    // bytes the algorithm needs
	state     int32
	waves     float32
	reserved  [4]int32
}

// Workspace is the workspace the plan's algorithm needs, in bytes.
func (p *GemmPlan) Workspace() uint64 { return p.res.workspace }

// Waves is the heuristic's estimate of the waves of tiles the plan's
// algorithm runs on the device's SMs.
func (p *GemmPlan) Waves() float32 { return p.res.waves }

// NewPlan creates the descriptor and layouts of a GEMM and takes the
// algorithm of the given rank (0: the best) in the heuristic's list of
// those that need at most maxWorkspace bytes of workspace and work with the
// key's pointer alignments.
func (b *BLAS) NewPlan(k GemmKey, maxWorkspace uint64, rank int) (*GemmPlan, error) {
	p := &GemmPlan{Key: k}
	if err := b.describe(p); err != nil {
		b.DestroyPlan(p)
		return nil, err
	}
	if err := b.chooseAlgo(p, maxWorkspace, rank); err != nil {
		b.DestroyPlan(p)
		return nil, err
	}
	return p, nil
}

// describe creates the plan's matmul descriptor and layouts. Row-major
// C = op(A)op(B) is column-major Cᵀ = op(B)ᵀop(A)ᵀ: B's buffer is
// cuBLASLt's first operand, A's the second.
func (b *BLAS) describe(p *GemmPlan) error {
	s := p.Key.Shape
	if r := b.descNew(&p.desc, cublasCompute32F, cudaR32F); r != 0 {
		return fmt.Errorf("cublasLtMatmulDescCreate: status %d", r)
	}
	opA, opB := cublasOpN, cublasOpN
	if s.TransB {
		opA = cublasOpT
	}
	if s.TransA {
		opB = cublasOpT
	}
	if r := b.descSet(p.desc, descTransA, unsafe.Pointer(&opA), 4); r != 0 {
		return fmt.Errorf("cuBLASLt TRANSA: status %d", r)
	}
	if r := b.descSet(p.desc, descTransB, unsafe.Pointer(&opB), 4); r != 0 {
		return fmt.Errorf("cuBLASLt TRANSB: status %d", r)
	}
	if p.Key.BiasAlign != 0 {
		if err := b.describeBias(p); err != nil {
			return err
		}
	}
	rb, cb := s.StoredB()
	ra, ca := s.StoredA()
	var err error
	if p.la, err = b.layout(p.Key.AB, cb, rb, s.LeadingB(), s.Batch, s.StrideB); err != nil {
		return err
	}
	if p.lb, err = b.layout(p.Key.AB, ca, ra, s.LeadingA(), s.Batch, s.StrideA); err != nil {
		return err
	}
	p.lc, err = b.layout(p.Key.C, s.N, s.M, s.LeadingC(), s.Batch, s.StrideC)
	return err
}

// describeBias sets the bias epilogue: fp32 bias, and for the heuristic,
// which reads the bias pointer only for its alignment (cublasLt.h), an
// address of the key's alignment; every call sets the real pointer.
func (b *BLAS) describeBias(p *GemmPlan) error {
	ep, dt, ptr := uint32(epilogueBias), int32(cudaR32F), uint64(p.Key.BiasAlign)
	if r := b.descSet(p.desc, descEpilogue, unsafe.Pointer(&ep), 4); r != 0 {
		return fmt.Errorf("cuBLASLt EPILOGUE_BIAS: status %d", r)
	}
	if r := b.descSet(p.desc, descBiasDataType, unsafe.Pointer(&dt), 4); r != 0 {
		return fmt.Errorf("cuBLASLt BIAS_DATA_TYPE: status %d", r)
	}
	if r := b.descSet(p.desc, descBiasPointer, unsafe.Pointer(&ptr), 8); r != 0 {
		return fmt.Errorf("cuBLASLt BIAS_POINTER: status %d", r)
	}
	return nil
}

// chooseAlgo asks cublasLtMatmulAlgoGetHeuristic for the plan's algorithm,
// the one of the given rank in its list.
func (b *BLAS) chooseAlgo(p *GemmPlan, maxWorkspace uint64, rank int) error {
	res, err := b.heuristics(p, maxWorkspace, rank+1)
	if err != nil {
		return err
	}
	if rank >= len(res) {
		return fmt.Errorf("cuBLASLt lists %d algorithms for GEMM %s, not the one of rank %d asked for", len(res), p.Key, rank)
	}
	p.res = res[rank]
	return nil
}

// heuristics asks cublasLtMatmulAlgoGetHeuristic for up to n algorithms
// for the plan's descriptor and layouts that need at most maxWorkspace
// bytes of workspace and work with the key's pointer alignments, best
// first; at least one, or an error.
func (b *BLAS) heuristics(p *GemmPlan, maxWorkspace uint64, n int) ([]heuristicResult, error) {
	var pref uintptr
	if r := b.prefNew(&pref); r != 0 {
		return nil, fmt.Errorf("cublasLtMatmulPreferenceCreate: status %d", r)
	}
	defer b.prefDel(pref)
	if r := b.prefSet(pref, prefMaxWorkspace, unsafe.Pointer(&maxWorkspace), 8); r != 0 {
		return nil, fmt.Errorf("cuBLASLt MAX_WORKSPACE_BYTES: status %d", r)
	}
	// cuBLASLt's A is our B, its B our A; C and D are our C.
	al := p.Key.Align
	for i, a := range []uint16{al[1], al[0], al[2], al[2]} {
		v := uint32(a)
		if r := b.prefSet(pref, prefMinAlignmentA+int32(i), unsafe.Pointer(&v), 4); r != 0 {
			return nil, fmt.Errorf("cuBLASLt MIN_ALIGNMENT %d: status %d", i, r)
		}
	}
	res := make([]heuristicResult, n)
	var got int32
	if r := b.heur(b.lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, int32(n), unsafe.Pointer(&res[0]), &got); r != 0 {
		return nil, fmt.Errorf("cublasLtMatmulAlgoGetHeuristic %+v: status %d", p.Key, r)
	}
	res = res[:min(int(got), n)]
	for i, x := range res {
		if x.state != 0 {
			res = res[:i]
			break
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("cublasLtMatmulAlgoGetHeuristic %+v: no algorithm (%d results)", p.Key, got)
	}
	return res, nil
}

// CandidatePlans makes one plan per algorithm of the heuristic's first n
// for key (TimeGemmAlgos), rank 0 first: the algorithm NewPlan takes.
func (b *BLAS) CandidatePlans(k GemmKey, maxWorkspace uint64, n int) ([]*GemmPlan, error) {
	first := &GemmPlan{Key: k}
	if err := b.describe(first); err != nil {
		b.DestroyPlan(first)
		return nil, err
	}
	res, err := b.heuristics(first, maxWorkspace, n)
	if err != nil {
		b.DestroyPlan(first)
		return nil, err
	}
	first.res = res[0]
	plans := []*GemmPlan{first}
	for _, r := range res[1:] {
		p := &GemmPlan{Key: k, res: r}
		if err := b.describe(p); err != nil {
			b.DestroyPlan(p)
			for _, q := range plans {
				b.DestroyPlan(q)
			}
			return nil, err
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// DestroyPlan frees a plan's descriptor and layouts.
func (b *BLAS) DestroyPlan(p *GemmPlan) {
	for _, l := range []uintptr{p.la, p.lb, p.lc} {
		if l != 0 {
			b.layDel(l)
		}
	}
	if p.desc != 0 {
		b.descDel(p.desc)
	}
	p.desc, p.la, p.lb, p.lc = 0, 0, 0, 0
}

// Matmul runs a plan: C_i = alpha·op(A_i)·op(B_i) + beta·C_i for every
// matrix of the batch (plus the bias), with c.WS as the workspace.
func (b *BLAS) Matmul(p *GemmPlan, c GemmCall) error {
	if c.WS.Bytes < p.res.workspace {
		return fmt.Errorf("cublasLtMatmul: the plan needs %d bytes of workspace, got %d", p.res.workspace, c.WS.Bytes)
	}
	if k := NewGemmKey(p.Key.Shape, p.Key.AB, c); k != p.Key {
		return fmt.Errorf("cublasLtMatmul: operands aligned to %v bytes (bias %d), the plan was made for %v (bias %d)",
			k.Align, k.BiasAlign, p.Key.Align, p.Key.BiasAlign)
	}
	if p.Key.BiasAlign != 0 {
		if r := b.descSet(p.desc, descBiasPointer, unsafe.Pointer(&c.Bias.Ptr), 8); r != 0 {
			return fmt.Errorf("cuBLASLt BIAS_POINTER: status %d", r)
		}
	}
	alpha, beta := c.Alpha, c.Beta
	r := b.matmul(b.lt, p.desc, unsafe.Pointer(&alpha), c.B.Ptr, p.la, c.A.Ptr, p.lb, unsafe.Pointer(&beta), c.C.Ptr, p.lc, c.C.Ptr,
		p.lc, unsafe.Pointer(&p.res.algo), c.WS.Ptr, p.res.workspace, 0)
	runtime.KeepAlive(&alpha)
	runtime.KeepAlive(&beta)
	runtime.KeepAlive(p)
	if r != 0 {
		s := p.Key.Shape
		return fmt.Errorf("cublasLtMatmul %dx%dx%d (batch %d): status %d", s.M, s.N, s.K, s.Batch, r)
	}
	return nil
}

// Gemm computes C = alpha·op(A)·op(B) + beta·C on dense row-major
// matrices with fp32 accumulation (see GemmShape): A and B of dtype ab.
// It makes a plan for the one call (no workspace).
func (b *BLAS) Gemm(transA, transB bool, M, N, K int, alpha float32, A, B Buffer, ab DType, beta float32, C Buffer) error {
	s := GemmShape{TransA: transA, TransB: transB, M: M, N: N, K: K, Batch: 1}
	c := GemmCall{Alpha: alpha, Beta: beta, A: A, B: B, C: C}
	p, err := b.NewPlan(NewGemmKey(s, ab, c), 0, 0)
	if err != nil {
		return err
	}
	defer b.DestroyPlan(p)
	return b.Matmul(p, c)
}

// layout creates a column-major layout of rows×cols with leading dimension
// ld, repeated batch times stride elements apart.
func (b *BLAS) layout(dt DType, rows, cols, ld, batch int, stride int64) (uintptr, error) {
	var l uintptr
	if r := b.layNew(&l, int32(dt), uint64(rows), uint64(cols), int64(ld)); r != 0 {
		return 0, fmt.Errorf("cuBLASLt layout %dx%d (ld %d): status %d", rows, cols, ld, r)
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

// Name groups GEMMs by precision and transposes ("gemm bf16 NT").
func (s GemmShape) Name(ab DType) string {
	t := func(b bool) byte {
		if b {
			return 'T'
		}
		return 'N'
	}
	p := "fp32"
	if ab == BF16 {
		p = "bf16"
	}
	return fmt.Sprintf("gemm %s %c%c", p, t(s.TransA), t(s.TransB))
}

// String names a GEMM key in full, as choices files do: the layout and
// problem, the leading dimensions, the batch and its strides, the
// pointers' alignments and the bias epilogue's.
func (k GemmKey) String() string {
	s := k.Shape
	c := ""
	if k.C == BF16 {
		c = " c bf16"
	}
	return fmt.Sprintf("%s %dx%dx%d ld %d/%d/%d batch %d stride %d/%d/%d align %d/%d/%d bias %d%s",
		s.Name(k.AB), s.M, s.N, s.K, s.LeadingA(), s.LeadingB(), s.LeadingC(), max(1, s.Batch), s.StrideA, s.StrideB, s.StrideC,
		k.Align[0], k.Align[1], k.Align[2], k.BiasAlign, c)
}

// OperandsAligned reports whether the leading dimensions and batch strides
// of the operands A and B are multiples of 8 elements (16 bytes of bf16).
func (s GemmShape) OperandsAligned() bool {
	ok := s.LeadingA()%8 == 0 && s.LeadingB()%8 == 0
	if s.Batch > 1 {
		ok = ok && s.StrideA%8 == 0 && s.StrideB%8 == 0
	}
	return ok
}
