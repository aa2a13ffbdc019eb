package training

import (
	"math"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/control"
	"github.com/rpac-dev/rpac/training/metrics"
)

// TestGuardianObservesTypedDiagnostics: Guardian's observation is the
// interval's typed diagnostics and the evaluation's CE, whatever the metrics
// record holds under their names.
func TestGuardianObservesTypedDiagnostics(t *testing.T) {
	g, err := control.NewGuardian(control.DefaultGuardianConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	tau := kernels.NewTensor(ir.FP32, ir.Shape{1})
	tau.Set(0, 1)
	c := &controllers{cs: &ControlState{Guardian: g}, plan: &Plan{}, taus: []*kernels.Tensor{tau}}
	st := intervalStats{Usage: [][]float64{{0.5, 0.5}}, MuEntropy: 0.7, SatFrac: 0.1, GateDelta: 0.03}
	// Stale values under the old names must not reach Guardian.
	rec := &metrics.Record{MuEntropy: metrics.N(9), SatFrac: metrics.N(9), GateDelta: metrics.N(9)}
	c.endOfInterval(10, 2.5, false, st, rec)
	want := []float64{0.03, 0.1, 0.7, 2.5}
	if got := rec.GuardianState; !slices.Equal(got, want) {
		t.Fatalf("guardian_state %v, want %v", got, want)
	}
	if !slices.Equal(g.Pending.State, want) {
		t.Fatalf("pending state %v, want %v", g.Pending.State, want)
	}
	if !slices.Equal(c.cs.PrevUsage[0], st.Usage[0]) || c.cs.Epoch != 1 {
		t.Fatalf("prev usage %v epoch %d", c.cs.PrevUsage, c.cs.Epoch)
	}
	// No diagnostics (a baseline model): zeros besides the CE.
	if o := (intervalStats{}).observation(3); o.GateDelta != 0 || o.SatFrac != 0 || o.MuEntropy != 0 || o.ValCE != 3 || math.IsNaN(o.ValCE) {
		t.Fatalf("observation %+v", o)
	}
}
