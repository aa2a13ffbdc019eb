package training

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/training/checkpoint"
)

// TestCheckpointSchemasDerived: the schema derived from graphs built at
// two short lengths equals the one of graphs built at every length of the
// run (fuzzy with RPA, fuzzy without, baseline; one length and a context
// game), and a deep model's schema is built in time linear in its depth
// (a few seconds for 1,024 layers on a busy 2-core machine, not minutes).
func TestCheckpointSchemasDerived(t *testing.T) {
	p, _ := model.LookupPreset("tiny")
	base := p.Config
	base.DModel, base.Layers, base.Heads, base.MaxLen = 16, 2, 2, 64
	noRPA := base
	noRPA.UseRPA = false
	bl := base
	bl.Model = model.Baseline
	for _, c := range []model.Config{base, noRPA, bl} {
		for _, st := range []RunState{{Config: c, Context: 32}, {Config: c, Context: 48, Contexts: []int{16, 48}, Lengths: []LengthPlan{{T: 16, Batch: 2}, {T: 48, Batch: 1}}}} {
			w, m, err := checkpointSchemas(&st)
			if err != nil {
				t.Fatal(err)
			}
			fw, fm := checkpoint.Schema{}, checkpoint.Schema{}
			for _, T := range st.runLengths() {
				for _, mode := range []model.Mode{model.Train, model.Eval} {
					mg, err := model.Build(&st.Config, model.Opts{T: T, B: 1, Mode: mode})
					if err != nil {
						t.Fatal(err)
					}
					addSpecs(mg.Specs, fw, fm)
				}
			}
			if !maps.EqualFunc(w, fw, slices.Equal) || !maps.EqualFunc(m, fm, slices.Equal) {
				t.Fatalf("%s at %v: derived schema (%d, %d tensors) differs from the built one (%d, %d)", c.Model, st.runLengths(), len(w), len(m), len(fw), len(fm))
			}
		}
	}
	deep := base
	deep.Layers, deep.DModel, deep.Heads, deep.MaxLen = 1024, 8, 1, 4096
	st := RunState{Config: deep, Context: 4096}
	for i := 1; i <= MaxLengths; i++ {
		st.Contexts = append(st.Contexts, 256*i)
	}
	start := time.Now()
	if _, _, err := checkpointSchemas(&st); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the schema of a 1024-layer run at 16 lengths took %v", d)
	}
	t.Logf("1024 layers, 16 lengths: %v", time.Since(start))
}
