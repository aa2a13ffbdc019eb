package model_test

import (
	"math"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
)

// TestPosInitSinusoid: pos_init "sinusoid" fills the position embedding
// with the sinusoid table at RMS 0.02; an unknown pos_init is refused.
func TestPosInitSinusoid(t *testing.T) {
	c := tinyConfig(t)
	c.Vocab, c.MaxLen, c.PosInit = 64, 32, "sinusoid"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	mg, err := model.Build(&c, model.Opts{T: 32, B: 1, Mode: model.Eval, NoLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	st := kernels.NewStore(ir.FP64)
	if err := model.InitStore(mg.Specs, st, 1); err != nil {
		t.Fatal(err)
	}
	pe := st.Get("pos_emb.weight")
	D := c.DModel
	a := 0.02 * math.Sqrt2
	var ss float64
	for p := range c.MaxLen {
		for j := range D {
			f := math.Pow(10000, -float64(j-j%2)/float64(D))
			want := a * math.Sin(float64(p)*f)
			if j%2 == 1 {
				want = a * math.Cos(float64(p)*f)
			}
			got := pe.At(p*D + j)
			if math.Abs(got-want) > 1e-6 {
				t.Fatalf("pos_emb[%d,%d] = %g, want %g", p, j, got, want)
			}
			ss += got * got
		}
	}
	if rms := math.Sqrt(ss / float64(c.MaxLen*D)); math.Abs(rms-0.02) > 0.002 {
		t.Fatalf("RMS %g, want about 0.02", rms)
	}
	c.PosInit = "rope"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pos_init") {
		t.Fatalf("pos_init rope: %v", err)
	}
}
