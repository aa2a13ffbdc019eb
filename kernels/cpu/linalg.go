package cpu

import (
	"fmt"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels/cpu/blas"
)

// batchParallelMNK: batched MatMul runs its batch entries in parallel
// (one single-threaded GEMM each) when m·n·k of one entry is at most this;
// larger entries are left to the GEMM's own threading.
var batchParallelMNK = 1 << 21

// gemm is C = alpha·op(A)·op(B) + beta·C through the blas seam (row-major).
func gemm[T float](tA, tB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		for i := 0; i < m; i++ {
			row := c[i*ldc : i*ldc+n]
			for j := range row {
				row[j] *= beta
			}
			if beta == 0 {
				clear(row)
			}
		}
		return
	}
	if c32, ok := any(c).([]float32); ok {
		blas.Sgemm(tA, tB, m, n, k, float32(alpha), any(a).([]float32), lda, any(b).([]float32), ldb, float32(beta), c32, ldc)
		return
	}
	blas.Dgemm(tA, tB, m, n, k, float64(alpha), any(a).([]float64), lda, any(b).([]float64), ldb, float64(beta), any(c).([]float64), ldc)
}

func lastDim(s ir.Shape) int {
	if len(s) == 0 {
		return 1
	}
	return s[len(s)-1]
}

// Linear: y[M,N] = x[M,K]·W[N,K]ᵀ + b.
func (p *program[T]) buildLinear(in, out []*tensor[T]) (func() error, error) {
	x, w, o := in[0], in[1], out[0]
	if len(w.shape) != 2 {
		return nil, fmt.Errorf("W must be [N,K], got %v", w.shape)
	}
	N, K := w.shape[0], w.shape[1]
	if lastDim(x.shape) != K || lastDim(o.shape) != N {
		return nil, fmt.Errorf("x%v with W%v", x.shape, w.shape)
	}
	M := x.numel() / max(K, 1)
	if K == 0 {
		M = o.numel() / max(N, 1)
	}
	var bias *tensor[T]
	if len(in) == 3 {
		bias = in[2]
		if bias.numel() != N {
			return nil, fmt.Errorf("bias%v for W%v", bias.shape, w.shape)
		}
	}
	return func() error {
		y := o.f
		beta := T(0)
		if bias != nil {
			b := bias.f
			parallelFor(M, max(1, grainCheap/max(N, 1)), func(lo, hi int) {
				for r := lo; r < hi; r++ {
					copy(y[r*N:(r+1)*N], b)
				}
			})
			beta = 1
		}
		gemm(false, true, M, N, K, 1, x.f, K, w.f, K, beta, y, N)
		return nil
	}, nil
}

// LinearGradX: dx[M,K] = dy[M,N]·W[N,K].
func (p *program[T]) buildLinearGradX(in, out []*tensor[T]) (func() error, error) {
	dy, w, o := in[0], in[1], out[0]
	if len(w.shape) != 2 {
		return nil, fmt.Errorf("W must be [N,K], got %v", w.shape)
	}
	N, K := w.shape[0], w.shape[1]
	if lastDim(dy.shape) != N {
		return nil, fmt.Errorf("dy%v with W%v", dy.shape, w.shape)
	}
	M := o.numel() / max(K, 1)
	if K == 0 {
		M = dy.numel() / max(N, 1)
	}
	return func() error {
		gemm(false, false, M, K, N, 1, dy.f, N, w.f, K, 0, o.f, K)
		return nil
	}, nil
}

// LinearGradW: dW[N,K] = dy[M,N]ᵀ·x[M,K].
func (p *program[T]) buildLinearGradW(in, out []*tensor[T]) (func() error, error) {
	dy, x, o := in[0], in[1], out[0]
	N, K := lastDim(dy.shape), lastDim(x.shape)
	if N == 0 || K == 0 {
		return func() error { clear(o.f); return nil }, nil
	}
	M := dy.numel() / N
	if x.numel()/K != M {
		return nil, fmt.Errorf("dy%v and x%v have different row counts", dy.shape, x.shape)
	}
	return func() error {
		gemm(true, false, N, K, M, 1, dy.f, N, x.f, K, 0, o.f, K)
		return nil
	}, nil
}

// MatMul: batched op(a)·op(b).
func (p *program[T]) buildMatMul(n *ir.Node, in, out []*tensor[T]) (func() error, error) {
	a, b, o := in[0], in[1], out[0]
	r := len(a.shape)
	if r < 2 || len(b.shape) != r {
		return nil, fmt.Errorf("want equal ranks >= 2, got %v and %v", a.shape, b.shape)
	}
	tA, tB := n.Attrs.Bool("transA", false), n.Attrs.Bool("transB", false)
	ar, ac := a.shape[r-2], a.shape[r-1]
	br, bc := b.shape[r-2], b.shape[r-1]
	M, K := blas.OpDims(tA, ar, ac)
	K2, N := blas.OpDims(tB, br, bc)
	if K != K2 {
		return nil, fmt.Errorf("inner dims %d vs %d", K, K2)
	}
	batch := 1
	for i := 0; i < r-2; i++ {
		if a.shape[i] != b.shape[i] {
			return nil, fmt.Errorf("batch dims of %v and %v differ", a.shape, b.shape)
		}
		batch *= a.shape[i]
	}
	sa, sb, sc := ar*ac, br*bc, M*N
	one := func(A, B, C []T, i int) {
		gemm(tA, tB, M, N, K, 1, A[i*sa:(i+1)*sa], ac, B[i*sb:(i+1)*sb], bc, 0, C[i*sc:(i+1)*sc], N)
	}
	small := M*N*K <= batchParallelMNK
	return func() error {
		A, B, C := a.f, b.f, o.f
		if batch > 1 && small {
			parallelFor(batch, 1, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					one(A, B, C, i)
				}
			})
			return nil
		}
		for i := 0; i < batch; i++ {
			one(A, B, C, i)
		}
		return nil
	}, nil
}

func linalgKernels[T float](k kernelTable[T]) {
	k.add("Linear", withoutNode((*program[T]).buildLinear))
	k.add("LinearGradX", withoutNode((*program[T]).buildLinearGradX))
	k.add("LinearGradW", withoutNode((*program[T]).buildLinearGradW))
	k.add("MatMul", (*program[T]).buildMatMul)
}
