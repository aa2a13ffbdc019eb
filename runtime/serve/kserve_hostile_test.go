package serve

import (
	"net/http"
	"strings"
	"testing"
)

// TestKServeHostileInputs: an id longer than the cap, null elements,
// ragged nesting and keys that differ from the protocol's only in case
// are 400s (encoding/json would read null as 0, flatten ragged rows and
// match "INPUTS" to "inputs").
func TestKServeHostileInputs(t *testing.T) {
	_, ts := newTest(t, &countModel{maxLen: 8}, Config{Name: "tiny", MaxInferValues: 1000})
	url := ts.URL + "/v2/models/tiny/infer"
	in := func(shape, data string) string {
		return `{"name": "input_ids", "shape": ` + shape + `, "datatype": "INT64", "data": ` + data + `}`
	}
	ok := in("[2, 2]", "[[1, 2], [3, 4]]")
	long := strings.Repeat("x", maxIDBytes+1)
	for _, c := range []struct{ body, want string }{
		{`{"id": "` + long + `", "inputs": [` + ok + `]}`, "id is"},
		{`{"inputs": [` + in("[1, 2]", "[null, 1]") + `]}`, "null"},
		{`{"inputs": [` + in("[1, 1]", "[null]") + `]}`, "null"},
		{`{"inputs": [` + in("[2, 2]", "[[1, 2], [3]]") + `]}`, "ragged"},
		{`{"inputs": [` + in("[2, 2]", "[[1, 2, 3], [4]]") + `]}`, "ragged"},
		{`{"inputs": [` + in("[2, 2]", "[[1, 2], 3, 4]") + `]}`, "ragged"},
		{`{"inputs": [` + in("[2, 2]", "[[[1], [2]], [[3], [4]]]") + `]}`, "ragged"},
		{`{"INPUTS": [` + ok + `]}`, `"INPUTS"`},
		{`{"inputs": [` + in("[1, 1]", "[1]") + `], "INPUTS": [` + ok + `]}`, `"INPUTS"`},
		{`{"inputs": [{"name": "input_ids", "shape": [1, 1], "DataType": "INT64", "data": [1]}]}`, `"DataType"`},
		{`{"inputs": [` + ok + `], "outputs": [{"Name": "logits"}]}`, `"Name"`},
	} {
		code, v := post(t, url, c.body)
		if msg := errorMessage(v); code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%.100s: %d %q, want 400 with %q", c.body, code, msg, c.want)
		}
	}
	// The longest id is echoed.
	id := strings.Repeat("x", maxIDBytes)
	if code, v := post(t, url, `{"id": "`+id+`", "inputs": [`+ok+`]}`); code != http.StatusOK || v["id"] != id {
		t.Errorf("id of %d bytes: %d %v", len(id), code, errorMessage(v))
	}
}
