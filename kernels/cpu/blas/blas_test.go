package blas

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

type gemmCase struct {
	name           string
	m, n, k        int
	pad            int // extra elements per row of A, B and C beyond the row length
	alpha, beta    float64
	nanC           bool // fill C with NaN (only meaningful with beta 0)
	transA, transB bool
}

func gemmCases() []gemmCase {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {3, 5, 7}, {7, 3, 5}, {1, 13, 9}, {13, 1, 17}, {12, 12, 8},
		{33, 31, 1}, {65, 33, 129}, {40, 40, 40}, {17, 100, 300},
		{256, 300, 200}, {129, 1600, 40}, {300, 7, 260}, {400, 9, 700},
	}
	scalars := []struct {
		alpha, beta float64
		nanC        bool
	}{
		{1, 0, true}, {1, 1, false}, {0.5, -1.5, false}, {-2, 0, true}, {0, 0.25, false}, {0, 0, true},
	}
	var cases []gemmCase
	for si, s := range shapes {
		for ti := 0; ti < 4; ti++ {
			tA, tB := ti&1 != 0, ti&2 != 0
			for ai, sc := range scalars {
				// Every shape and transposition gets beta=0 over NaN and
				// beta=1; the other scalar pairs rotate through the shapes.
				if ai >= 2 && (si+ti+ai)%3 != 0 {
					continue
				}
				pad := (si + ti + ai) % 3 * 5
				cases = append(cases, gemmCase{
					name: fmt.Sprintf("%dx%dx%d/tA=%t,tB=%t/alpha=%g,beta=%g/pad=%d",
						s.m, s.n, s.k, tA, tB, sc.alpha, sc.beta, pad),
					m: s.m, n: s.n, k: s.k, pad: pad,
					alpha: sc.alpha, beta: sc.beta, nanC: sc.nanC,
					transA: tA, transB: tB,
				})
			}
		}
	}
	// k == 0: C = beta·C only.
	cases = append(cases,
		gemmCase{name: "k=0/beta=0", m: 4, n: 5, k: 0, alpha: 1, beta: 0, nanC: true},
		gemmCase{name: "k=0/beta=2", m: 4, n: 5, k: 0, alpha: 1, beta: 2, transA: true, transB: true},
	)
	return cases
}

type gemmOperands struct {
	a, b, c       []float64
	lda, ldb, ldc int
	rowsA, rowsB  int
	colsA, colsB  int
}

// operands builds stored A, B, C with the case's strides; padding elements
// hold a large sentinel that must never reach the result.
func (tc gemmCase) operands(rng *rand.Rand) gemmOperands {
	var o gemmOperands
	o.rowsA, o.colsA = tc.m, tc.k
	if tc.transA {
		o.rowsA, o.colsA = tc.k, tc.m
	}
	o.rowsB, o.colsB = tc.k, tc.n
	if tc.transB {
		o.rowsB, o.colsB = tc.n, tc.k
	}
	o.lda, o.ldb, o.ldc = max(1, o.colsA+tc.pad), max(1, o.colsB+tc.pad), max(1, tc.n+tc.pad)
	fill := func(rows, cols, ld int, nan bool) []float64 {
		s := make([]float64, rows*ld)
		for i := range s {
			switch {
			case i%ld >= cols:
				s[i] = 1e30
			case nan:
				s[i] = math.NaN()
			default:
				s[i] = rng.Float64()*2 - 1
			}
		}
		return s
	}
	o.a = fill(o.rowsA, o.colsA, o.lda, false)
	o.b = fill(o.rowsB, o.colsB, o.ldb, false)
	o.c = fill(tc.m, tc.n, o.ldc, tc.nanC)
	return o
}

// naive is the float64 reference: C = alpha·op(A)·op(B) + beta·C, C not
// read when beta is 0.
func naive(tc gemmCase, o gemmOperands) []float64 {
	c := append([]float64(nil), o.c...)
	for i := 0; i < tc.m; i++ {
		for j := 0; j < tc.n; j++ {
			var s float64
			for p := 0; p < tc.k; p++ {
				var x, y float64
				if tc.transA {
					x = o.a[p*o.lda+i]
				} else {
					x = o.a[i*o.lda+p]
				}
				if tc.transB {
					y = o.b[j*o.ldb+p]
				} else {
					y = o.b[p*o.ldb+j]
				}
				s += x * y
			}
			if tc.beta == 0 {
				c[i*o.ldc+j] = tc.alpha * s
			} else {
				c[i*o.ldc+j] = tc.alpha*s + tc.beta*c[i*o.ldc+j]
			}
		}
	}
	return c
}

func to32(s []float64) []float32 {
	r := make([]float32, len(s))
	for i, v := range s {
		r[i] = float32(v)
	}
	return r
}

func to64[T float32 | float64](s []T) []float64 {
	r := make([]float64, len(s))
	for i, v := range s {
		r[i] = float64(v)
	}
	return r
}

// compare checks every element of C, including the padding between rows,
// which must be left untouched.
func compare(t *testing.T, tc gemmCase, o gemmOperands, want, got []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("len(c) = %d, want %d", len(got), len(want))
	}
	bad := 0
	for idx := range want {
		i, j := idx/o.ldc, idx%o.ldc
		w, g := want[idx], got[idx]
		if j >= tc.n {
			if g != w {
				t.Errorf("padding c[%d] (row %d, col %d) = %g, want untouched %g", idx, i, j, g, w)
				bad++
			}
		} else {
			// Scale by the magnitude of the terms, not of the result.
			scale := math.Abs(tc.alpha)*float64(tc.k) + math.Abs(tc.beta) + 1
			if math.IsNaN(g) || math.Abs(g-w) > tol*scale {
				t.Errorf("c[%d][%d] = %g, want %g (diff %g, tol %g)", i, j, g, w, g-w, tol*scale)
				bad++
			}
		}
		if bad >= 10 {
			t.Fatalf("too many mismatches")
		}
	}
}

type sgemmFunc func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
type dgemmFunc func(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int)

func testS(t *testing.T, cases []gemmCase, f sgemmFunc) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.operands(rng)
			// The reference runs on the float32-rounded inputs.
			a32, b32, c32 := to32(o.a), to32(o.b), to32(o.c)
			o.a, o.b, o.c = to64(a32), to64(b32), to64(c32)
			want := naive(tc, o)
			f(tc.transA, tc.transB, tc.m, tc.n, tc.k, float32(tc.alpha), a32, o.lda, b32, o.ldb, float32(tc.beta), c32, o.ldc)
			compare(t, tc, o, to64ish(want), to64(c32), 2e-6)
		})
	}
}

// to64ish rounds the padding sentinels of a float64 reference the way a
// float32 round trip does, so untouched padding compares equal.
func to64ish(s []float64) []float64 { return to64(to32(s)) }

func testD(t *testing.T, cases []gemmCase, f dgemmFunc) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.operands(rng)
			want := naive(tc, o)
			c := append([]float64(nil), o.c...)
			f(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, o.a, o.lda, o.b, o.ldb, tc.beta, c, o.ldc)
			compare(t, tc, o, want, c, 1e-13)
		})
	}
}

func TestSgemm(t *testing.T)   { testS(t, gemmCases(), Sgemm) }
func TestDgemm(t *testing.T)   { testD(t, gemmCases(), Dgemm) }
func TestSgemmGo(t *testing.T) { testS(t, gemmCases(), SgemmGo) }
func TestDgemmGo(t *testing.T) { testD(t, gemmCases(), DgemmGo) }

// TestGoBlocking runs the serial pure-Go algorithm on shapes that cross
// every block boundary (mcBlock, kcBlock, ncBlock), which the parallel
// split would otherwise cut below.
func TestGoBlocking(t *testing.T) {
	var cases []gemmCase
	for ti, tr := range [][2]bool{{false, false}, {true, true}, {true, false}} {
		cases = append(cases, gemmCase{
			name: fmt.Sprintf("%dx%dx%d/tA=%t,tB=%t", mcBlock+3, ncBlock+5, kcBlock+9, tr[0], tr[1]),
			m:    mcBlock + 3, n: ncBlock + 5, k: kcBlock + 9, pad: 3 * ti,
			alpha: 1.25, beta: 0.5, transA: tr[0], transB: tr[1],
		})
	}
	testS(t, cases, func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
		gemmSerial(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	})
	testD(t, cases, func(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
		gemmSerial(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	})
}

// TestSplits runs both paths (the pure-Go one and, where built, the
// OpenBLAS one, which splitGemm cuts the same way) with several worker
// counts, so that row and column splits into uneven parts are exercised.
func TestSplits(t *testing.T) {
	var cases []gemmCase
	for _, s := range []struct{ m, n, k int }{{401, 130, 50}, {130, 401, 50}, {1000, 13, 200}, {5, 1000, 500}} {
		for ti := 0; ti < 4; ti++ {
			cases = append(cases, gemmCase{
				name: fmt.Sprintf("%dx%dx%d/tA=%t,tB=%t", s.m, s.n, s.k, ti&1 != 0, ti&2 != 0),
				m:    s.m, n: s.n, k: s.k, pad: ti, alpha: -0.75, beta: 0, nanC: true,
				transA: ti&1 != 0, transB: ti&2 != 0,
			})
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 3, 4} {
		runtime.GOMAXPROCS(procs)
		t.Run(fmt.Sprintf("procs=%d", procs), func(t *testing.T) {
			testS(t, cases, SgemmGo)
			testD(t, cases, DgemmGo)
			testS(t, cases, Sgemm)
			testD(t, cases, Dgemm)
		})
	}
}

func TestImpl(t *testing.T) {
	want := "pure-go"
	if haveNative {
		want = "openblas"
	}
	if got := Impl(); got != want {
		t.Errorf("Impl() = %q, want %q", got, want)
	}
}

// OPENBLAS_CORETYPE (CI sets Haswell so an AVX-512 machine also runs the
// AVX2 kernels) is honoured: otherwise that CI stage would test nothing
// new.
func TestCoreType(t *testing.T) {
	if !haveNative {
		if Core() != "" {
			t.Errorf("Core() = %q without OpenBLAS", Core())
		}
		return
	}
	t.Logf("OpenBLAS core: %s", Core())
	want := os.Getenv("OPENBLAS_CORETYPE")
	if want == "" {
		if Core() == "" {
			t.Error("OpenBLAS reports no core name")
		}
		return
	}
	if !strings.EqualFold(Core(), want) {
		t.Errorf("OPENBLAS_CORETYPE=%s but OpenBLAS runs %q kernels", want, Core())
	}
}

func TestBadArgsPanic(t *testing.T) {
	a := make([]float32, 12)
	tests := []struct {
		name string
		call func()
	}{
		{"negative m", func() { Sgemm(false, false, -1, 2, 2, 1, a, 2, a, 2, 0, a, 2) }},
		{"lda short", func() { Sgemm(false, false, 2, 2, 3, 1, a, 2, a, 2, 0, a, 2) }},
		{"ldb short transposed", func() { SgemmGo(false, true, 2, 2, 3, 1, a, 3, a, 2, 0, a, 2) }},
		{"c too short", func() { Sgemm(false, false, 4, 4, 1, 1, a, 1, a, 4, 0, a, 4) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("no panic")
				}
			}()
			tt.call()
		})
	}
}

func TestMeasure(t *testing.T) {
	for _, prec := range []string{"f32", "f64"} {
		g, err := Measure(64, prec, time.Millisecond)
		if err != nil || !(g > 0) {
			t.Errorf("Measure(64, %q) = %g, %v", prec, g, err)
		}
	}
	if _, err := Measure(64, "bf16", time.Millisecond); err == nil {
		t.Errorf("Measure with bad precision: no error")
	}
	if _, err := Measure(0, "f32", time.Millisecond); err == nil {
		t.Errorf("Measure with n=0: no error")
	}
}

func benchSquare(b *testing.B, n int, f sgemmFunc) {
	rng := rand.New(rand.NewPCG(5, 6))
	x, y, z := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range x {
		x[i] = rng.Float32() - 0.5
		y[i] = rng.Float32() - 0.5
	}
	f(false, false, n, n, n, 1, x, n, y, n, 0, z, n)
	b.ResetTimer()
	for b.Loop() {
		f(false, false, n, n, n, 1, x, n, y, n, 0, z, n)
	}
	b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkSgemm512(b *testing.B)    { benchSquare(b, 512, Sgemm) }
func BenchmarkSgemm2048(b *testing.B)   { benchSquare(b, 2048, Sgemm) }
func BenchmarkSgemmGo512(b *testing.B)  { benchSquare(b, 512, SgemmGo) }
func BenchmarkSgemmGo2048(b *testing.B) { benchSquare(b, 2048, SgemmGo) }

// TestGoPaddingNotStale checks that the zero padding of the packed panels is
// rewritten on every use: a product with infinite operands leaves Inf in the
// pooled packing buffers, and a following product whose depth is not a
// multiple of the unroll must not pick it up (0·Inf would give NaN).
func TestGoPaddingNotStale(t *testing.T) {
	for _, tr := range [][2]bool{{false, false}, {true, true}} {
		inf := make([]float64, 40*40)
		for i := range inf {
			inf[i] = math.Inf(1)
		}
		c := make([]float64, 40*40)
		DgemmGo(tr[0], tr[1], 40, 40, 40, 1, inf, 40, inf, 40, 0, c, 40)
		cases := []gemmCase{{name: fmt.Sprintf("tA=%t,tB=%t", tr[0], tr[1]),
			m: 40, n: 40, k: 9, alpha: 1, beta: 0, nanC: true, transA: tr[0], transB: tr[1]}}
		testD(t, cases, DgemmGo)
	}
}
