package training

import (
	"encoding/json"
	"testing"
)

// FuzzRunState: any state.json decodes to an error or a state whose model
// config validates or is refused, never a panic.
func FuzzRunState(f *testing.F) {
	f.Add([]byte(`{"format":2,"step":3,"config":{"model":"fuzzy","vocab":512,"d_model":16,"layers":1,"heads":2,"R":4,"experts":2,"top_k":1,"ff_mult":2,"max_len":32}}`))
	f.Add([]byte(`{"format":2,"config":{"model":"fuzzy","R":100000000,"d_model":-1}}`))
	f.Add([]byte(`{"lengths":[{"T":-5,"batch":0,"micro_batch":7}],"data_rngs":[{}]}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var st RunState
		if json.Unmarshal(b, &st) != nil {
			return
		}
		st.Config.Validate()
	})
}
