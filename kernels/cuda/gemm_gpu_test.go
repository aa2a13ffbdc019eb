package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

// TestGPUGemm: cuBLASLt GEMM in fp32 for every transpose combination and
// odd sizes, against float64 row-major products (C = 0.5·op(A)op(B) + 2·C).
func TestGPUGemm(t *testing.T) {
	c := gpuContext(t)
	b, err := driver.LoadBLAS()
	if err != nil {
		t.Fatalf("a GPU is present but cuBLASLt is not: %v", err)
	}
	r := rand.New(rand.NewPCG(23, 24))
	const M, N, K = 37, 85, 510
	for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		a, bb, c0 := randF32(r, M*K, 1), randF32(r, K*N, 1), randF32(r, M*N, 1)
		at := func(i, k int) float64 { // op(A)[i,k]
			if tr[0] {
				return float64(a[k*M+i])
			}
			return float64(a[i*K+k])
		}
		bt := func(k, j int) float64 { // op(B)[k,j]
			if tr[1] {
				return float64(bb[j*K+k])
			}
			return float64(bb[k*N+j])
		}
		want := make([]float64, M*N)
		for i := 0; i < M; i++ {
			for j := 0; j < N; j++ {
				var s float64
				for k := 0; k < K; k++ {
					s += at(i, k) * bt(k, j)
				}
				want[i*N+j] = 0.5*s + 2*float64(c0[i*N+j])
			}
		}
		dA, dB, dC := devF32(t, c, a), devF32(t, c, bb), devF32(t, c, c0)
		if err := b.Gemm(tr[0], tr[1], M, N, K, 0.5, dA, dB, F32, 2, dC); err != nil {
			t.Fatal(err)
		}
		closeTo(t, "gemm", hostF32(t, c, dC, M*N), want, 1e-4)
	}
}
