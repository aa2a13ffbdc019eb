package serve

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
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

// TestKServeBinaryBounds: a body that mixes up the JSON and binary forms,
// and declared sizes that disagree with the body or exceed the server's
// limits, are 400s before anything is allocated; an answer is sized in
// its own form (4 bytes per binary FP32 value).
func TestKServeBinaryBounds(t *testing.T) {
	_, ts := newTest(t, &countModel{maxLen: 8}, Config{Name: "tiny", MaxInferValues: 1000, MaxBodyBytes: 4096, MaxResponseBytes: 1500})
	url := ts.URL + "/v2/models/tiny/infer"
	ids := specInt64s([]int64{1, 2, 3, 4, 5, 6})
	input := func(size int) string {
		return `{"name": "input_ids", "shape": [2, 3], "datatype": "INT64", "parameters": {"binary_data_size": ` + strconv.Itoa(size) + `}}`
	}
	head := func(in, rest string) string { return `{"inputs": [` + in + `]` + rest + `}` }
	for _, c := range []struct {
		name, json string
		bin        []byte
		header     string // Inference-Header-Content-Length; "" for none, "len" for the JSON's
		want       string
	}{
		{"binary without the header", head(input(48), ""), ids, "", "needs the header Inference-Header-Content-Length"},
		{"binary_data_size without the header", head(input(48), ""), nil, "", "no header Inference-Header-Content-Length"},
		{"header past the body", head(input(48), ""), ids, "100000", "longer than the body"},
		{"header past the server's limit", head(input(48), ""), ids, "1073741824", "longer than the body"},
		{"header not a length", head(input(48), ""), ids, "-1", "want the length in bytes"},
		{"size past the body", head(input(4800), ""), ids, "len", "more than the 48 bytes left"},
		{"size off the shape", head(input(40), ""), ids[:40], "len", "needs 48 bytes"},
		{"sizes short of the body", head(input(40), ""), append(ids, 0, 0), "len", "add up to 40"},
		{"negative size", head(input(-8), ""), ids, "len", "want a byte count"},
		{"data and size", head(`{"name": "input_ids", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6], "parameters": {"binary_data_size": 48}}`, ""), ids, "len", "both data and binary_data_size"},
		{"bytes after JSON data", head(`{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}`, ""), ids, "len", "add up to 0"},
		{"two JSON values in the header", head(input(48), "") + " {}", ids, "len", "more than one JSON value"},
	} {
		body := append([]byte(c.json), c.bin...)
		hr, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		switch c.header {
		case "":
		case "len":
			hr.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(c.json)))
		default:
			hr.Header.Set("Inference-Header-Content-Length", c.header)
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		v := decodeBody(t, resp)
		resp.Body.Close()
		if msg := errorMessage(v); resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %d %q, want 400 with %q", c.name, resp.StatusCode, msg, c.want)
		}
	}
	// INT32 binary input: 4 bytes per value.
	var ids32 []byte
	for _, x := range []int32{1, 2, 3, 4, 5, 6} {
		ids32 = binary.LittleEndian.AppendUint32(ids32, uint32(x))
	}
	j := `{"inputs": [{"name": "input_ids", "shape": [2, 3], "datatype": "INT32", "parameters": {"binary_data_size": 24}}], "outputs": [{"name": "last_logits"}]}`
	resp, b := specPost(t, url, append([]byte(j), ids32...), len(j))
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"shape":[2,16]`) {
		t.Errorf("INT32 binary input: %d %s", resp.StatusCode, b)
	}
	// logits [2,3,16] take 2,080 bytes of JSON at most, past the limit of
	// 1,500, and 384 bytes in binary.
	j = head(input(48), "")
	if resp, b := specPost(t, url, append([]byte(j), ids...), len(j)); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("JSON logits past MaxResponseBytes: %d %s", resp.StatusCode, b)
	}
	j = head(input(48), `, "parameters": {"binary_data_output": true}`)
	if resp, b := specPost(t, url, append([]byte(j), ids...), len(j)); resp.StatusCode != 200 || len(b) < 384 {
		t.Errorf("binary logits within MaxResponseBytes: %d %q", resp.StatusCode, b)
	}
	// The echoed id counts: 256 control bytes take 1,536 bytes escaped.
	j = head(input(48), `, "id": "`+strings.Repeat(`\u0001`, maxIDBytes)+`", "parameters": {"binary_data_output": true}`)
	if resp, b := specPost(t, url, append([]byte(j), ids...), len(j)); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("binary logits with a long escaped id: %d %q, want 413", resp.StatusCode, b)
	}
}

// FuzzKServeBinary: whatever body and Inference-Header-Content-Length a
// client sends, the answer is a 2xx or 4xx, never a panic; a 2xx with the
// header splits into a JSON object and the binary outputs it declares,
// and any other answer is a JSON object (an error with its message).
func FuzzKServeBinary(f *testing.F) {
	j := `{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}}], "outputs": [{"name": "top_k_ids", "parameters": {"binary_data": true, "top_k": 2}}, {"name": "last_logits"}]}`
	ids := string(specInt64s([]int64{1, 2}))
	f.Add(int64(len(j)), j+ids)
	f.Add(int64(len(j)), j+ids+"x")
	f.Add(int64(-1), j+ids)
	f.Add(int64(3), j)
	s, err := New(&countModel{maxLen: 8}, Config{MaxBodyBytes: 4096, MaxResponseBytes: 8192, Timeout: 2 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, n int64, body string) {
		req := httptest.NewRequest(http.MethodPost, "/v2/models/rpac/infer", strings.NewReader(body))
		if n >= 0 {
			req.Header.Set("Inference-Header-Content-Length", strconv.FormatInt(n, 10))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%d %q: %d %s", n, body, rec.Code, rec.Body)
		}
		b := rec.Body.Bytes()
		if hl := rec.Header().Get("Inference-Header-Content-Length"); hl != "" {
			k, err := strconv.Atoi(hl)
			if rec.Code != 200 || err != nil || k > len(b) {
				t.Fatalf("%d %q: %d with header %q and %d bytes", n, body, rec.Code, hl, len(b))
			}
			b = b[:k]
		}
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%d %q: %d, %q is not a JSON object", n, body, rec.Code, b)
		}
		if rec.Code >= 400 && errorMessage(v) == "" {
			t.Fatalf("%d %q: %d without an error message", n, body, rec.Code)
		}
	})
}
