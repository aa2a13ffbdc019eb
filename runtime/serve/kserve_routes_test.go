package serve

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestKServeRoutes: the server metadata, Triton's model configuration and
// the versioned forms of the model routes; a version the model lacks is a
// 404 in the protocol's error shape.
func TestKServeRoutes(t *testing.T) {
	_, ts := newTest(t, &countModel{maxLen: 8}, Config{Name: "tiny", MaxInferValues: 1000})
	code, v := get(t, ts.URL+"/v2")
	if code != http.StatusOK || v["name"] != "rpac" || v["version"] == "" || v["extensions"] == nil {
		t.Errorf("GET /v2: %d %v", code, v)
	}
	for _, path := range []string{"/v2/models/tiny/versions/1", "/v2/models/tiny"} {
		if code, v := get(t, ts.URL+path); code != http.StatusOK || v["name"] != "tiny" || fmt.Sprint(v["versions"]) != "[1]" {
			t.Errorf("%s: %d %v", path, code, v)
		}
	}
	if code, v := get(t, ts.URL+"/v2/models/tiny/versions/1/ready"); code != http.StatusOK || v["ready"] != true {
		t.Errorf("versioned ready: %d %v", code, v)
	}
	code, v = post(t, ts.URL+"/v2/models/tiny/versions/1/infer", `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]}`)
	if code != http.StatusOK || v["model_version"] != "1" {
		t.Errorf("versioned infer: %d %v", code, v)
	}
	for _, path := range []string{"/v2/models/tiny/config", "/v2/models/tiny/versions/1/config"} {
		code, v := get(t, ts.URL+path)
		if code != http.StatusOK || v["name"] != "tiny" || v["backend"] != "onnxruntime" || v["max_batch_size"] != float64(0) ||
			fmt.Sprint(v["input"]) != "[map[data_type:TYPE_INT64 dims:[-1 -1] name:input_ids] map[data_type:TYPE_INT64 dims:[-1 -1] name:target_ids]]" ||
			!strings.HasPrefix(fmt.Sprint(v["output"]), "[map[data_type:TYPE_FP32 dims:[-1 -1 16] name:logits]") {
			t.Errorf("%s: %d %v", path, code, v)
		}
	}
	for _, path := range []string{"/v2/models/tiny/versions/2", "/v2/models/tiny/versions/2/ready", "/v2/models/tiny/versions/0/config"} {
		if code, v := get(t, ts.URL+path); code != http.StatusNotFound || !strings.Contains(errorMessage(v), `no version`) {
			t.Errorf("%s: %d %v, want 404 naming the version", path, code, v)
		}
	}
	if code, v := post(t, ts.URL+"/v2/models/tiny/versions/2/infer", `{}`); code != http.StatusNotFound || !strings.Contains(errorMessage(v), `no version "2"`) {
		t.Errorf("infer of version 2: %d %v", code, v)
	}
}
