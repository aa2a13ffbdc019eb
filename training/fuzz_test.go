package training

import (
	"encoding/json"
	"github.com/rpac-dev/rpac/internal/fuzzlimit"
	"testing"
)

// FuzzRunState: any state.json decodes to an error or a state that is
// validated or refused, never a panic; the schema of a valid state's
// checkpoint is built quickly (the loop counts and sizes are bounded).
func FuzzRunState(f *testing.F) {
	f.Add([]byte(`{"format":2,"step":3,"context":16,"batch":2,"config":{"model":"fuzzy","vocab":512,"d_model":16,"layers":1,"heads":2,"R":4,"experts":2,"top_k":1,"ff_mult":2,"max_len":32,"tau_align":0.7,"sinkhorn_iters":6,"bias_clip":4,"tau_max":1.6,"tau_att_init":0.68}}`))
	f.Add([]byte(`{"format":2,"context":16,"batch":2,"config":{"model":"fuzzy","vocab":512,"d_model":16,"layers":1,"heads":2,"R":4,"experts":2,"top_k":1,"ff_mult":2,"max_len":32,"tau_align":0.7,"sinkhorn_iters":1000000000,"bias_clip":4,"tau_max":1.6,"tau_att_init":0.68}}`))
	f.Add([]byte(`{"format":2,"config":{"model":"fuzzy","R":100000000,"d_model":-1}}`))
	f.Add([]byte(`{"lengths":[{"T":-5,"batch":0,"micro_batch":7}],"data_rngs":[{}]}`))
	f.Add([]byte(`{"format":2,"context":16,"batch":2,"contexts":[8,16],"control":{"guardian":{"policy":{"in":100000,"hidden":100000,"out":1}},"swa":{"members":[1,2,-3]},"context_game":{"contexts":[8],"log_w":[1,2,3]}},"config":{"model":"baseline","vocab":512,"d_model":16,"layers":1,"heads":2,"ff_mult":2,"max_len":32}}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzzlimit.Start().Check(t) // a slow input fails like a crash
		var st RunState
		if json.Unmarshal(b, &st) != nil {
			return
		}
		if st.Validate() == nil && st.Config.Layers <= 64 {
			if _, _, err := checkpointSchemas(&st); err != nil {
				t.Fatalf("a valid state has no checkpoint schema: %v", err)
			}
		}
	})
}
