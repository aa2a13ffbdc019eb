package onnx

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// The integer sums of onnxruntime's uint8 × int8 CPU kernels, simulated
// exactly: each returns Σₖ a[k]·w[k] as that kernel family computes it.

// dotExact accumulates every product in int64 (the true sum).
func dotExact(a []uint8, w []int8) int64 {
	var s int64
	for k := range a {
		s += int64(a[k]) * int64(w[k])
	}
	return s
}

// sat16 clamps to int16 as a saturating add does.
func sat16(x int32) int32 { return max(-1<<15, min(1<<15-1, x)) }

// dotPairInt16 is the AVX2 / AVX-512BW kernel without VNNI: adjacent
// u8×s8 products summed in a saturating int16, then widened and summed in
// int32.
func dotPairInt16(a []uint8, w []int8) int64 {
	var s int32
	for k := 0; k < len(a); k += 2 {
		p := int32(a[k]) * int32(w[k])
		if k+1 < len(a) {
			p += int32(a[k+1]) * int32(w[k+1])
		}
		s += sat16(p)
	}
	return int64(s)
}

// dotSignedPairInt16 moves the activations to int8 (a − 128) first, sums
// adjacent s8×s8 products in int16 and adds back 128·Σw: the shape of
// kernels that only have a signed product.
func dotSignedPairInt16(a []uint8, w []int8) int64 {
	var s, sw int32
	for k := 0; k < len(a); k += 2 {
		p := (int32(a[k]) - 128) * int32(w[k])
		sw += int32(w[k])
		if k+1 < len(a) {
			p += (int32(a[k+1]) - 128) * int32(w[k+1])
			sw += int32(w[k+1])
		}
		s += sat16(p)
	}
	return int64(s) + 128*int64(sw)
}

// dotInt32 is the VNNI / dot-product kernel: four products at a time into
// int32.
func dotInt32(a []uint8, w []int8) int64 {
	var s int32
	for k := range a {
		s += int32(a[k]) * int32(w[k])
	}
	return int64(s)
}

var kernelSums = map[string]func([]uint8, []int8) int64{
	"pair-int16": dotPairInt16, "signed-pair-int16": dotSignedPairInt16, "int32": dotInt32,
}

// Every pair of weights within ±Int8WeightMax against the extreme
// activations gives the exact sum in every kernel; one more level of
// weight (the full-range scheme's ±127 included) breaks the int16 kernel,
// so the bound is tight and the simulation can tell.
func TestInt8PairBoundExhaustive(t *testing.T) {
	check := func(wmax int) (bad int, example string) {
		for w0 := -wmax; w0 <= wmax; w0++ {
			for w1 := -wmax; w1 <= wmax; w1++ {
				for _, a := range [][]uint8{{255, 255}, {255, 0}, {0, 255}, {0, 0}, {128, 255}, {1, 255}} {
					w := []int8{int8(w0), int8(w1)}
					want := dotExact(a, w)
					for name, f := range kernelSums {
						if got := f(a, w); got != want {
							bad++
							example = name
						}
					}
				}
			}
		}
		return bad, example
	}
	if bad, k := check(Int8WeightMax); bad != 0 {
		t.Fatalf("|w| ≤ %d: %d pair sums differ from the exact sum (kernel %s)", Int8WeightMax, bad, k)
	}
	if 2*uint8Max*Int8WeightMax > int16PairMax {
		t.Fatalf("the bound 2·255·%d exceeds int16", Int8WeightMax)
	}
	for _, wmax := range []int{Int8WeightMax + 1, 127} {
		if bad, _ := check(wmax); bad == 0 {
			t.Errorf("|w| ≤ %d: no pair saturates; the simulation cannot tell", wmax)
		}
	}
}

// quantizeRow quantizes activations as the exported graph does: symmetric
// per row, s = max|x|/127, zero point 128.
func quantizeRow(x []float32) []uint8 {
	var m float64
	for _, v := range x {
		m = math.Max(m, math.Abs(float64(v)))
	}
	s := math.Max(m, 1e-12) / 127
	q := make([]uint8, len(x))
	for i, v := range x {
		q[i] = uint8(max(0, min(255, math.RoundToEven(float64(v)/s)+128)))
	}
	return q
}

// On weights quantized by QuantizeColumns (heavy-tailed, with outliers)
// and activations quantized as the graph does (including rows whose
// values sit at the extremes), every kernel family gives the exact sum;
// the full-range scheme gives wrong sums in the int16 kernel on the same
// data.
func TestQuantizedProductsExactOnEveryKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const N, K, M = 48, 256, 24
	w := make([]float32, N*K)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.02)
		if r.IntN(50) == 0 {
			w[i] *= 8 // outliers set the column scales
		}
	}
	rows := make([][]uint8, M)
	for i := range rows {
		x := make([]float32, K)
		for k := range x {
			switch i % 3 {
			case 0:
				x[k] = float32(r.NormFloat64())
			case 1: // saturated rows: every value at ±max
				x[k] = float32(1 - 2*r.IntN(2))
			default: // one large value
				x[k] = float32(r.NormFloat64() * 0.1)
			}
		}
		rows[i] = quantizeRow(x)
	}
	column := func(q []byte, n int) []int8 {
		c := make([]int8, K)
		for k := range c {
			c[k] = int8(q[k*N+n])
		}
		return c
	}
	// Rows whose activations line up with the column's signs (the worst
	// case for a pair sum).
	aligned := func(c []int8) []uint8 {
		a := make([]uint8, K)
		for k, v := range c {
			if v >= 0 {
				a[k] = 255
			}
		}
		return a
	}
	q, scales := QuantizeColumns(w, N, K)
	if len(scales) != N {
		t.Fatalf("%d scales for %d columns", len(scales), N)
	}
	for n := 0; n < N; n++ {
		c := column(q, n)
		for _, a := range append(rows, aligned(c)) {
			want := dotExact(a, c)
			for name, f := range kernelSums {
				if got := f(a, c); got != want {
					t.Fatalf("column %d, kernel %s: sum %d, exact %d", n, name, got, want)
				}
			}
		}
	}
	// The same weights at full range (±127) saturate the int16 kernel.
	full := fullRangeColumns(w, N, K)
	wrong := 0
	for n := 0; n < N; n++ {
		c := column(full, n)
		for _, a := range append(rows, aligned(c)) {
			if dotPairInt16(a, c) != dotExact(a, c) {
				wrong++
			}
		}
	}
	if wrong == 0 {
		t.Error("full-range weights: no sum saturates; the test cannot tell")
	}
	t.Logf("full-range (±127) weights: %d of %d sums wrong in the int16 kernel; ±%d: none", wrong, N*(M+1), Int8WeightMax)
}

// fullRangeColumns is the earlier scheme (|Wq| ≤ 127), kept here to show
// what the bound prevents.
func fullRangeColumns(w []float32, N, K int) []byte {
	q := make([]byte, N*K)
	for n := 0; n < N; n++ {
		var m float64
		for _, x := range w[n*K : (n+1)*K] {
			m = math.Max(m, math.Abs(float64(x)))
		}
		for k, x := range w[n*K : (n+1)*K] {
			q[k*N+n] = byte(int8(math.RoundToEven(float64(x) / (m / 127))))
		}
	}
	return q
}

// A lowered int8 graph passes CheckInt8Bound with the bound it claims; a
// weight pushed past ±64 (as a full-range export has) is refused with the
// node named.
func TestCheckInt8Bound(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	weights := func(v *ir.Value) ([]float32, error) {
		d := make([]float32, v.Shape.Numel())
		for i := range d {
			d[i] = float32(r.NormFloat64())
		}
		return d, nil
	}
	m, err := Lower(embedHead(2, 3, 24, 40, false), weights, Options{Quantize: QuantizeInt8})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := CheckInt8Bound(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("%d integer products, want 1", len(ps))
	}
	p := ps[0]
	if p.K != 40 || p.WeightMax != Int8WeightMax || p.ActMax != 255 || p.PairMax > int16PairMax {
		t.Errorf("bound %+v", p)
	}
	for _, in := range m.Graph.Initializer {
		if onnxpb.TensorProto_DataType(in.DataType) == onnxpb.TensorProto_INT8 {
			in.RawData[0] = byte(int8(100))
		}
	}
	if _, err := CheckInt8Bound(m); err == nil || !strings.Contains(err.Error(), "int16") || !strings.Contains(err.Error(), p.Node) {
		t.Errorf("weights up to 100: %v", err)
	}
}
