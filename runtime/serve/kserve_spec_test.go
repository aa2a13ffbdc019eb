package serve

// A client of the Open Inference Protocol (KServe v2) REST API and of the
// binary tensor data extension, written from the protocol's text: its own
// messages, and its own encoder and decoder of binary bodies (the JSON
// header, then each binary tensor's little-endian bytes in order; the
// header Inference-Header-Content-Length gives the JSON's length).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
)

type specServerMetadata struct {
	Name       string   `json:"name"`
	Version    string   `json:"version"`
	Extensions []string `json:"extensions"`
}

type specMetadataTensor struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

type specModelMetadata struct {
	Name     string               `json:"name"`
	Versions []string             `json:"versions"`
	Platform string               `json:"platform"`
	Inputs   []specMetadataTensor `json:"inputs"`
	Outputs  []specMetadataTensor `json:"outputs"`
}

// specTensor is a $request_input and a $response_output.
type specTensor struct {
	Name       string         `json:"name"`
	Shape      []int64        `json:"shape"`
	Datatype   string         `json:"datatype"`
	Parameters map[string]any `json:"parameters,omitempty"`
	Data       any            `json:"data,omitempty"`
	raw        []byte         // the binary form's bytes
}

type specRequestOutput struct {
	Name       string         `json:"name"`
	Parameters map[string]any `json:"parameters,omitempty"`
}

type specInferRequest struct {
	ID         string              `json:"id,omitempty"`
	Parameters map[string]any      `json:"parameters,omitempty"`
	Inputs     []specTensor        `json:"inputs"`
	Outputs    []specRequestOutput `json:"outputs,omitempty"`
}

type specInferResponse struct {
	ModelName    string       `json:"model_name"`
	ModelVersion string       `json:"model_version"`
	ID           string       `json:"id"`
	Outputs      []specTensor `json:"outputs"`
}

type specError struct {
	Error string `json:"error"`
}

// specEncode writes a request: its JSON, then the binary inputs' bytes in
// the order of the inputs. It returns the body and the JSON's length.
func specEncode(t *testing.T, req specInferRequest, bins [][]byte) ([]byte, int) {
	t.Helper()
	head, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte{}, head...)
	for _, b := range bins {
		body = append(body, b...)
	}
	return body, len(head)
}

// specInt64s is the binary form of INT64 values: 8 bytes each,
// little-endian.
func specInt64s(xs []int64) []byte {
	out := make([]byte, 0, 8*len(xs))
	for _, x := range xs {
		out = binary.LittleEndian.AppendUint64(out, uint64(x))
	}
	return out
}

// specPost sends a request, binary when headerLen >= 0, and returns the
// status and body (with the header Inference-Header-Content-Length).
func specPost(t *testing.T, url string, body []byte, headerLen int) (*http.Response, []byte) {
	t.Helper()
	hr, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if headerLen >= 0 {
		hr.Header.Set("Content-Type", "application/octet-stream")
		hr.Header.Set("Inference-Header-Content-Length", strconv.Itoa(headerLen))
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// specDecode reads an answer: without the header, the body is the JSON;
// with it, the JSON is its first bytes and each output whose parameters
// hold binary_data_size takes that many of the bytes after it, in order.
func specDecode(t *testing.T, resp *http.Response, body []byte) specInferResponse {
	t.Helper()
	head, rest := body, []byte(nil)
	if h := resp.Header.Get("Inference-Header-Content-Length"); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || n > len(body) {
			t.Fatalf("header Inference-Header-Content-Length %q with a body of %d bytes", h, len(body))
		}
		head, rest = body[:n], body[n:]
	}
	var out specInferResponse
	dec := json.NewDecoder(bytes.NewReader(head))
	dec.UseNumber() // FP32 values read back exactly
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("answer JSON %q: %v", head, err)
	}
	for i := range out.Outputs {
		o := &out.Outputs[i]
		num, ok := o.Parameters["binary_data_size"].(json.Number)
		if !ok {
			continue
		}
		size, err := num.Int64()
		if err != nil || size < 0 || size > int64(len(rest)) {
			t.Fatalf("%s: binary_data_size %v, %d bytes left", o.Name, num, len(rest))
		}
		o.raw, rest = rest[:size], rest[size:]
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes after the binary outputs", len(rest))
	}
	return out
}

// specBits returns an output's values as bit patterns: FP32 as its 32
// bits, INT64 as its 64, from either form.
func specBits(t *testing.T, o specTensor) []uint64 {
	t.Helper()
	var out []uint64
	if o.raw != nil {
		switch o.Datatype {
		case "FP32":
			for i := 0; i+4 <= len(o.raw); i += 4 {
				out = append(out, uint64(binary.LittleEndian.Uint32(o.raw[i:])))
			}
		case "INT64":
			for i := 0; i+8 <= len(o.raw); i += 8 {
				out = append(out, binary.LittleEndian.Uint64(o.raw[i:]))
			}
		}
		return out
	}
	data, _ := o.Data.([]any)
	for _, v := range data {
		n, _ := v.(json.Number)
		switch o.Datatype {
		case "FP32":
			x, err := strconv.ParseFloat(n.String(), 32)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, uint64(math.Float32bits(float32(x))))
		case "INT64":
			x, err := strconv.ParseInt(n.String(), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, uint64(x))
		}
	}
	return out
}

func specGet(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

// TestKServeSpecClient drives the server with the client above: server
// and model metadata, readiness, JSON and binary inference that agree
// bit for bit, and errors in the protocol's shape.
func TestKServeSpecClient(t *testing.T) {
	_, ts := newTest(t, &countModel{maxLen: 8}, Config{Name: "tiny", MaxInferValues: 1000})
	var sm specServerMetadata
	if code := specGet(t, ts.URL+"/v2", &sm); code != 200 || sm.Name == "" || sm.Version == "" || !strings.Contains(strings.Join(sm.Extensions, ","), "binary_tensor_data") {
		t.Errorf("server metadata: %d %+v", code, sm)
	}
	for _, path := range []string{"/v2/models/tiny", "/v2/models/tiny/versions/1"} {
		var mm specModelMetadata
		if code := specGet(t, ts.URL+path, &mm); code != 200 || mm.Name != "tiny" || len(mm.Versions) != 1 || len(mm.Inputs) == 0 || mm.Outputs[0].Name != "logits" || mm.Outputs[0].Datatype != "FP32" {
			t.Errorf("%s: %d %+v", path, code, mm)
		}
	}
	for _, path := range []string{"/v2/health/live", "/v2/health/ready", "/v2/models/tiny/ready", "/v2/models/tiny/versions/1/ready"} {
		if resp, err := http.Get(ts.URL + path); err != nil || resp.StatusCode != 200 {
			t.Errorf("%s: %v %v", path, resp, err)
		}
	}
	ids := []int64{1, 2, 3, 4, 5, 6}
	outputs := []specRequestOutput{{Name: "logits"}, {Name: "last_logits"}, {Name: "top_k_ids", Parameters: map[string]any{"top_k": 3}}, {Name: "top_k_logits", Parameters: map[string]any{"top_k": 3}}}
	jsonReq := specInferRequest{ID: "a", Inputs: []specTensor{{Name: "input_ids", Shape: []int64{2, 3}, Datatype: "INT64", Data: ids}}, Outputs: outputs}
	body, _ := specEncode(t, jsonReq, nil)
	resp, b := specPost(t, ts.URL+"/v2/models/tiny/infer", body, -1)
	if resp.StatusCode != 200 {
		t.Fatalf("JSON inference: %d %s", resp.StatusCode, b)
	}
	jsonAns := specDecode(t, resp, b)

	var binOutputs []specRequestOutput
	for _, o := range outputs {
		p := map[string]any{"binary_data": true}
		for k, v := range o.Parameters {
			p[k] = v
		}
		binOutputs = append(binOutputs, specRequestOutput{Name: o.Name, Parameters: p})
	}
	for _, c := range []struct {
		name string
		req  specInferRequest
	}{
		{"per output", specInferRequest{ID: "a", Outputs: binOutputs}},
		{"binary_data_output", specInferRequest{ID: "a", Outputs: outputs, Parameters: map[string]any{"binary_data_output": true}}},
	} {
		c.req.Inputs = []specTensor{{Name: "input_ids", Shape: []int64{2, 3}, Datatype: "INT64", Parameters: map[string]any{"binary_data_size": 8 * len(ids)}}}
		body, n := specEncode(t, c.req, [][]byte{specInt64s(ids)})
		resp, b := specPost(t, ts.URL+"/v2/models/tiny/versions/1/infer", body, n)
		if resp.StatusCode != 200 || resp.Header.Get("Inference-Header-Content-Length") == "" {
			t.Fatalf("%s: binary inference: %d %q", c.name, resp.StatusCode, b)
		}
		binAns := specDecode(t, resp, b)
		if binAns.ID != "a" || binAns.ModelName != "tiny" || len(binAns.Outputs) != len(jsonAns.Outputs) {
			t.Fatalf("%s: %+v", c.name, binAns)
		}
		for i, o := range binAns.Outputs {
			j := jsonAns.Outputs[i]
			if o.raw == nil || o.Name != j.Name || o.Datatype != j.Datatype || !slices.Equal(o.Shape, j.Shape) {
				t.Fatalf("%s: output %d %+v, JSON %+v", c.name, i, o, j)
			}
			got, want := specBits(t, o), specBits(t, j)
			if len(want) == 0 || len(got) != len(want) {
				t.Fatalf("%s: %s holds %d values, JSON %d", c.name, o.Name, len(got), len(want))
			}
			for k := range got {
				if got[k] != want[k] {
					t.Fatalf("%s: %s[%d] bits %x, JSON %x", c.name, o.Name, k, got[k], want[k])
				}
			}
		}
	}
	// A binary request with a JSON answer.
	req := specInferRequest{Inputs: []specTensor{{Name: "input_ids", Shape: []int64{2, 3}, Datatype: "INT64", Parameters: map[string]any{"binary_data_size": 8 * len(ids)}}}, Outputs: outputs}
	body, n := specEncode(t, req, [][]byte{specInt64s(ids)})
	resp, b = specPost(t, ts.URL+"/v2/models/tiny/infer", body, n)
	if resp.StatusCode != 200 || resp.Header.Get("Inference-Header-Content-Length") != "" {
		t.Fatalf("binary request, JSON answer: %d %q", resp.StatusCode, b)
	}
	if ans := specDecode(t, resp, b); len(ans.Outputs) != 4 || !equalBits(specBits(t, ans.Outputs[0]), specBits(t, jsonAns.Outputs[0])) {
		t.Errorf("binary request, JSON answer: %+v", ans)
	}
	// Errors: {"error": "..."} and nothing else.
	for _, c := range []struct {
		method, path, body string
		code               int
	}{
		{"GET", "/v2/models/other", "", 404},
		{"GET", "/v2/models/tiny/versions/7", "", 404},
		{"POST", "/v2/models/tiny/infer", `{"inputs": []}`, 400},
		{"POST", "/v2/models/tiny/versions/7/infer", `{}`, 404},
	} {
		hr, _ := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		var e specError
		dec := json.NewDecoder(resp.Body)
		dec.DisallowUnknownFields()
		err = dec.Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.code || err != nil || e.Error == "" {
			t.Errorf("%s %s: %d %+v %v, want %d with {\"error\": ...}", c.method, c.path, resp.StatusCode, e, err, c.code)
		}
	}
}

func equalBits(a, b []uint64) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

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
