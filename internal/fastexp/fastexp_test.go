package fastexp

import (
	"math"
	"testing"
)

func TestExp32(t *testing.T) {
	var worst float64
	for x := -103.0; x < 88.7; x += 0.00731 {
		got := float64(Exp32(float32(x)))
		want := math.Exp(float64(float32(x)))
		if want < 1e-37 {
			if math.Abs(got-want) > 1e-44 {
				t.Fatalf("Exp32(%g) = %g, want %g", x, got, want)
			}
			continue
		}
		worst = math.Max(worst, math.Abs(got-want)/want)
	}
	if worst > 3e-7 {
		t.Errorf("Exp32: worst relative error %.3g", worst)
	}
	for _, x := range []float32{float32(math.Inf(-1)), -200, 89, float32(math.Inf(1))} {
		if got, want := Exp32(x), float32(math.Exp(float64(x))); got != want {
			t.Errorf("Exp32(%g) = %g, want %g", x, got, want)
		}
	}
	if v := Exp32(float32(math.NaN())); v == v {
		t.Errorf("Exp32(NaN) = %g", v)
	}
}

// TestSubSum32: Σ exp(x-m) over a row agrees with float64 to float32
// rounding, on both sides of the fast path's range.
func TestSubSum32(t *testing.T) {
	x := make([]float32, 5001)
	var want float64
	for i := range x {
		x[i] = float32(math.Sin(float64(i))*40 - 30)
		want += math.Exp(float64(x[i]) - 5)
	}
	if got := SubSum32(x, 5); math.Abs(got-want) > 1e-6*want {
		t.Errorf("SubSum32 = %g, want %g", got, want)
	}
}
