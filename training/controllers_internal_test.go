package training

import (
	"math"
	"slices"
	"testing"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/training/control"
)

// TestGuardianObservesTypedDiagnostics: Guardian's observation is the
// interval's typed diagnostics and the evaluation's CE, whatever the metrics
// record holds under their names.
func TestGuardianObservesTypedDiagnostics(t *testing.T) {
	g, err := control.NewGuardian(control.DefaultGuardianConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	tau := kernels.NewTensor(kernels.F32, ir.Shape{1})
	tau.Set(0, 1)
	c := &controllers{cs: &ControlState{Guardian: g}, plan: &Plan{}, taus: []*kernels.Tensor{tau}}
	st := intervalStats{Usage: [][]float64{{0.5, 0.5}}, MuEntropy: 0.7, SatFrac: 0.1, GateDelta: 0.03}
	// Stale values under the old names must not reach Guardian.
	rec := map[string]any{"mu_entropy": 9.0, "sat_frac": 9.0, "gate_delta": 9.0}
	c.endOfInterval(10, 2.5, false, st, rec)
	want := []float64{0.03, 0.1, 0.7, 2.5}
	if got, _ := rec["guardian_state"].([]float64); !slices.Equal(got, want) {
		t.Fatalf("guardian_state %v, want %v", rec["guardian_state"], want)
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
