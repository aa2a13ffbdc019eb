package training

import (
	"testing"

	"github.com/rpac-dev/rpac/compiler/model"
)

// benchFlops is the dense and routed GEMM work of a step of the small
// bench model with experts and topK.
func benchFlops(t *testing.T, kind model.Kind, experts, topK int) (dense, routed int64, tokens int) {
	t.Helper()
	o := devBenchOptions(DeviceCPU)
	cfg := *o.Config
	cfg.Model, cfg.Experts, cfg.TopK = kind, experts, topK
	o.Config = &cfg
	b, err := NewBench(o)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	return b.DenseFlops(), b.RoutedFlops(), b.Length().Batch * b.Length().T
}

// TestRoutedFlops: the routed work of top-2 of 4 experts is the dense work
// of a model with 2 experts, less the gate's two columns fewer (three GEMMs
// of 2·R flops a token and layer each); a model keeping every expert, and the
// baseline, do their dense work.
func TestRoutedFlops(t *testing.T) {
	dense4, routed4, tokens := benchFlops(t, model.Fuzzy, 4, 2)
	dense2, routed2, _ := benchFlops(t, model.Fuzzy, 2, 2)
	c := devBenchOptions(DeviceCPU).Config
	if want := dense2 + int64(c.Layers*tokens*3*2*c.R*2); routed4 != want || routed4 >= dense4 {
		t.Errorf("top-2 of 4: routed %d, want %d (dense %d)", routed4, want, dense4)
	}
	if routed2 != dense2 {
		t.Errorf("top-2 of 2: routed %d, dense %d", routed2, dense2)
	}
	if d, r, _ := benchFlops(t, model.Baseline, 4, 2); r != d {
		t.Errorf("baseline: routed %d, dense %d", r, d)
	}
}
