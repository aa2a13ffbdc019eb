package export

import (
	"github.com/rpac-dev/rpac/ir"
	"math"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx"
)

// KL against a closed form: two logits [0, 0] against [0, log 3], i.e.
// p = (1/2, 1/2) and q = (1/4, 3/4): KL = ½·log(2) + ½·log(2/3).
func TestKL(t *testing.T) {
	p := []float32{0, 0}
	q := []float32{0, float32(math.Log(3))}
	want := 0.5*math.Log(2) + 0.5*math.Log(2.0/3)
	if got := KL(p, q); math.Abs(got-want) > 1e-7 {
		t.Errorf("KL = %.9f, want %.9f", got, want)
	}
	if got := KL(q, q); got != 0 {
		t.Errorf("KL(q, q) = %g", got)
	}
	// A shift of every logit leaves the distribution alone.
	if got := KL(p, []float32{5, 5}); got > 1e-12 {
		t.Errorf("KL under a shift = %g", got)
	}
}

// Check names the first limit exceeded, and a NaN exceeds every limit.
func TestVerifyCheck(t *testing.T) {
	l := DefaultVerifyLimits(ir.FP32, onnx.QuantizeInt8)
	ok := VerifyResult{T: 128, MeanKL: 5e-5, CEExport: 7.1, CEEval: 7.0999, MaxAbsDiff: 0.6}
	if err := ok.Check(l); err != nil {
		t.Fatalf("a correct int8 graph's figures: %v", err)
	}
	for _, tc := range []struct {
		edit func(*VerifyResult)
		want string
	}{
		{func(r *VerifyResult) { r.MeanKL = 7e-3 }, "mean KL"}, // a saturated int8 graph
		{func(r *VerifyResult) { r.MeanKL = math.NaN() }, "mean KL"},
		{func(r *VerifyResult) { r.CEExport = 7.2 }, "CE cost"},
		{func(r *VerifyResult) { r.MaxAbsDiff = 3 }, "max |Δlogit|"},
		{func(r *VerifyResult) { r.KVMaxAbsDiff = math.NaN() }, "KV cache"},
	} {
		r := ok
		tc.edit(&r)
		if err := r.Check(l); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "length 128") {
			t.Errorf("%+v: %v, want an error naming %q", r, err, tc.want)
		}
	}
	if f := DefaultVerifyLimits(ir.FP32, onnx.QuantizeNone); !(f.MaxKL < l.MaxKL && f.MaxAbsDiff < l.MaxAbsDiff) {
		t.Errorf("fp32 limits %+v are not tighter than int8's %+v", f, l)
	}
}
