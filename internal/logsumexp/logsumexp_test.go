package logsumexp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// ulps is |got - want| in units of the last place of want as a float32.
func ulps(got float32, want float64) float64 {
	w := float32(want)
	ulp := float64(math.Nextafter32(float32(math.Abs(float64(w))), float32(math.Inf(1))) - float32(math.Abs(float64(w))))
	return math.Abs(float64(got)-want) / ulp
}

// expCases are arguments across the normal range: a fine grid, random
// values, the ends, and the range reduction's half-way points.
func expCases() []float32 {
	var x []float32
	for v := Lo; v <= Hi; v += 0.000731 {
		x = append(x, float32(v))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		x = append(x, float32(Lo+(Hi-Lo)*r.Float64()))
	}
	for n := -124; n <= 127; n++ {
		x = append(x, float32((float64(n)+0.5)*math.Ln2), float32(float64(n)*math.Ln2))
	}
	return append(x, float32(Lo), float32(Hi)-0.001, 0, -0.0, 1e-30, -1e-30)
}

// maxExpULP is the bound on Exp's error where the result is a normal
// float32.
const maxExpULP = 3

// TestExp: Exp (and the Go path's exp, fastexp's) within maxExpULP of float64
// math.Exp over the normal range, on slices of every length up to a few
// vectors (the tails).
func TestExp(t *testing.T) {
	x := expCases()
	got := make([]float32, len(x))
	for _, path := range []struct {
		name string
		exp  func(dst, src []float32)
	}{{"Exp (" + Path + ")", Exp}, {"go", expGo}} {
		path.exp(got, x)
		var worst float64 // measured: 0.90 ulp (C, FMA), 1.17 (C, SSE2), 0.88 (C, NEON), 2.08 (Go)
		for i, v := range x {
			u := ulps(got[i], math.Exp(float64(v)))
			if u > worst {
				worst = u
			}
			if u > maxExpULP {
				t.Errorf("%s: exp(%g) = %g, want %g (%.2f ulp)", path.name, v, got[i], math.Exp(float64(v)), u)
				break
			}
		}
		t.Logf("%s: worst %.3f ulp over %d arguments", path.name, worst, len(x))
		for n := range 50 {
			dst := make([]float32, n)
			path.exp(dst, x[1000:1000+n])
			for i := range dst {
				if u := ulps(dst[i], math.Exp(float64(x[1000+i]))); u > maxExpULP {
					t.Fatalf("%s: length %d, element %d: %.2f ulp", path.name, n, i, u)
				}
			}
		}
	}
}

// TestExpSpecial: -Inf and arguments far below Lo give 0 (the C path
// gives 0 from Lo down), +Inf and above Hi give +Inf, NaN gives NaN, in
// the vector body and the tail alike.
func TestExpSpecial(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	in := []float32{-inf, -1e30, -104.5, inf, 1e30, 89, Hi + 0.001, nan}
	want := []float32{0, 0, 0, inf, inf, inf, inf, nan}
	for _, path := range []struct {
		name string
		exp  func(dst, src []float32)
	}{{"Exp (" + Path + ")", Exp}, {"go", expGo}} {
		for _, pad := range []int{0, 7, 16, 23} { // the special value lands in the tail or a vector
			for i, x := range in {
				src := make([]float32, pad+1)
				src[pad] = x
				dst := make([]float32, len(src))
				path.exp(dst, src)
				if g := dst[pad]; !(g == want[i] || g != g && want[i] != want[i]) {
					t.Errorf("%s: exp(%g) at %d = %g, want %g", path.name, x, pad, g, want[i])
				}
			}
		}
	}
	if Path == "c" { // no subnormal results
		got := make([]float32, 2)
		if Exp(got, []float32{Lo - 0.001, -100}); got[0] != 0 || got[1] != 0 {
			t.Errorf("C: exp below Lo = %v, want 0", got)
		}
	}
}

// lse64 is log Σ exp(row) in float64 from the maximum (NaN when the
// maximum is not finite, or a logit is NaN).
func lse64(row []float32) float64 {
	m := math.Inf(-1)
	for _, x := range row {
		if x != x {
			return math.NaN()
		}
		m = math.Max(m, float64(x))
	}
	var s float64
	for _, x := range row {
		s += math.Exp(float64(x) - m)
	}
	return math.Log(s) + m
}

// testRow is a row of n logits of spread scale around center, with some
// entries set to special values.
func testRow(r *rand.Rand, n int, center, scale float64, special map[int]float32) []float32 {
	row := make([]float32, n)
	for i := range row {
		row[i] = float32(center + scale*r.NormFloat64())
	}
	for i, v := range special {
		if i < n {
			row[i] = v
		}
	}
	return row
}

// lseRows are the rows the LogSumExp tests use: lengths around the vector
// width and the block, up to GPT-2's vocabulary; spreads small and large;
// masked (-Inf) entries; huge and tiny centres.
func lseRows() map[string][]float32 {
	r := rand.New(rand.NewPCG(3, 4))
	ninf := float32(math.Inf(-1))
	rows := map[string][]float32{}
	for _, n := range []int{1, 2, 15, 16, 17, 31, 33, 1023, 1024, 1025, 4099, 50257} {
		rows[fmt.Sprintf("n=%d", n)] = testRow(r, n, -2, 3, nil)
		rows[fmt.Sprintf("n=%d wide", n)] = testRow(r, n, 0, 40, nil)
		rows[fmt.Sprintf("n=%d masked", n)] = testRow(r, n, 1, 2, map[int]float32{0: ninf, n / 2: ninf, n - 1: ninf, n / 3: 5})
	}
	rows["huge"] = testRow(r, 50257, 1e4, 3, nil)
	rows["tiny"] = testRow(r, 50257, -1e4, 3, nil)
	rows["extreme"] = []float32{3e38, -3e38, 0, 1}
	rows["certain"] = []float32{-1e4, 0, 50}
	half := testRow(r, 50257, 0, 1, nil)
	for i := range half {
		if i%2 == 1 {
			half[i] = ninf
		}
	}
	rows["half masked"] = half
	return rows
}

// maxLSEError bounds |LogSumExp - float64| (nats) on these rows: the lane
// sums are float32, flushed to float64 every Block logits.
const maxLSEError = 2e-6

// TestLogSumExp: LogSumExp (and the Go path) agree with the float64
// reference within maxLSEError (relative to the result past 1), -Inf
// entries included.
func TestLogSumExp(t *testing.T) {
	for name, row := range lseRows() {
		want := lse64(row)
		for _, path := range []struct {
			name string
			lse  func([]float32) float64
		}{{"LogSumExp (" + Path + ")", LogSumExp}, {"go", logSumExpGo}} {
			got := path.lse(row)
			if math.Abs(got-want) > maxLSEError*math.Max(1, math.Abs(want)) {
				t.Errorf("%s: %s: %.9g, float64 %.9g", path.name, name, got, want)
			}
		}
	}
}

// TestLogSumExpNonFinite: a NaN or +Inf logit makes the result NaN
// (whatever its position: vector body, tail, first); a row of -Inf
// only is NaN too (the scorer's checks report it); an empty row is -Inf.
func TestLogSumExpNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, n := range []int{1, 5, 16, 40, 1030} {
		for _, pos := range []int{0, n / 2, n - 1} {
			for _, bad := range []float32{nan, inf} {
				row := testRow(rand.New(rand.NewPCG(uint64(n), uint64(pos))), n, 0, 3, map[int]float32{pos: bad})
				for _, lse := range []func([]float32) float64{LogSumExp, logSumExpGo} {
					if got := lse(row); !math.IsNaN(got) {
						t.Errorf("n=%d, %g at %d: %g, want NaN", n, bad, pos, got)
					}
				}
			}
		}
		masked := make([]float32, n)
		for i := range masked {
			masked[i] = float32(math.Inf(-1))
		}
		if got := LogSumExp(masked); !math.IsNaN(got) {
			t.Errorf("n=%d, all -Inf: %g, want NaN", n, got)
		}
	}
	if got := LogSumExp(nil); !math.IsInf(got, -1) {
		t.Errorf("empty row: %g, want -Inf", got)
	}
}

// BenchmarkLogSumExp: one row of GPT-2's vocabulary (50,257 logits) by
// LogSumExp (the C path with cgo) and by the Go path.
//
//	go test ./internal/logsumexp -run '^$' -bench LogSumExp
func BenchmarkLogSumExp(b *testing.B) {
	row := testRow(rand.New(rand.NewPCG(5, 6)), 50257, -2, 3, nil)
	for _, c := range []struct {
		name string
		lse  func([]float32) float64
	}{{Path, LogSumExp}, {"go", logSumExpGo}} {
		b.Run("path="+c.name, func(b *testing.B) {
			b.SetBytes(4 * int64(len(row)))
			var s float64
			for b.Loop() {
				s += c.lse(row)
			}
			if math.IsNaN(s) {
				b.Fatal("NaN")
			}
		})
	}
}
