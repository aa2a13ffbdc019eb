package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/rpac-dev/rpac/runtime"
)

// The outputs of a KServe inference. logits is the graph's output; the
// others are computed from it on request, so that a client that needs a
// little of it does not receive T·V numbers per row.
const (
	outLogits         = "logits"          // FP32 [B,T,V]
	outLastLogits     = "last_logits"     // FP32 [B,V]: the logits after each row's last token
	outTopKIDs        = "top_k_ids"       // INT64 [B,T,k]: each position's k most likely ids, most likely first
	outTopKLogits     = "top_k_logits"    // FP32 [B,T,k]: their logits
	outTargetLogprobs = "target_logprobs" // FP32 [B,T]: log p(target_ids[b,t] | input_ids[b,..t])

	inInputIDs  = "input_ids"
	inTargetIDs = "target_ids"

	defaultTopK = 10
	maxTopK     = 1000

	// modelVersion is the one version of the served model.
	modelVersion = "1"

	// maxIDBytes bounds a request's id, which the answer echoes.
	maxIDBytes = 256
)

// extensions are the protocol extensions this server implements, listed
// in its server metadata.
var extensions = []string{}

// outputNames lists the outputs in the order of the model's metadata.
var outputNames = []string{outLogits, outLastLogits, outTopKIDs, outTopKLogits, outTargetLogprobs}

// Bytes of JSON counted per value when a response is sized before the
// model runs: the longest FP32 value strconv writes ("-1.2345678e-38")
// and its comma, an id of the vocabulary and its comma, and room for the
// fields around the values.
const (
	floatJSONBytes   = 15
	float64JSONBytes = 25 // a score's log-probabilities
	jsonOverhead     = 512
)

func idJSONBytes(V int) int64 { return int64(len(strconv.Itoa(max(V-1, 0)))) + 1 }

// inferTensor is a KServe v2 input tensor.
type inferTensor struct {
	Name       string                     `json:"name"`
	Shape      []int64                    `json:"shape"`
	Datatype   string                     `json:"datatype"`
	Data       json.RawMessage            `json:"data,omitempty"`
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
}

// requestedOutput is a KServe v2 $request_output.
type requestedOutput struct {
	Name       string                     `json:"name"`
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
}

type inferRequest struct {
	ID         string                     `json:"id,omitempty"`
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
	Inputs     []inferTensor              `json:"inputs"`
	Outputs    []requestedOutput          `json:"outputs,omitempty"`
}

// inferPlan is a validated inference: the rows, the targets (with
// target_logprobs), the outputs in the order asked for, and k.
type inferPlan struct {
	seqs, targets [][]int32
	outs          []string
	k             int
	B, T, V       int
}

// values is the number of values of output name.
func (p *inferPlan) values(name string) int64 {
	B, T, V, k := int64(p.B), int64(p.T), int64(p.V), int64(p.k)
	switch name {
	case outLogits:
		return B * T * V
	case outLastLogits:
		return B * V
	case outTopKIDs, outTopKLogits:
		return B * T * k
	}
	return B * T // target_logprobs
}

func (p *inferPlan) shape(name string) []int64 {
	B, T, V, k := int64(p.B), int64(p.T), int64(p.V), int64(p.k)
	switch name {
	case outLogits:
		return []int64{B, T, V}
	case outLastLogits:
		return []int64{B, V}
	case outTopKIDs, outTopKLogits:
		return []int64{B, T, k}
	}
	return []int64{B, T}
}

// responseBytes is the most JSON the answer can take.
func (p *inferPlan) responseBytes() int64 {
	n := int64(jsonOverhead)
	for _, o := range p.outs {
		per := int64(floatJSONBytes)
		if o == outTopKIDs {
			per = idJSONBytes(p.V)
		}
		n += p.values(o)*per + 128
	}
	return n
}

// infer answers a KServe v2 inference: input_ids [B,T] (INT64 or INT32,
// flat or nested row-major data) gives the outputs asked for (logits
// [B,T,V] when the request names none). An answer that could be larger
// than MaxResponseBytes is refused (413) before the model runs; the
// answer is written as it is rendered, without a copy of its JSON.
func (s *Server) infer(w http.ResponseWriter, r *http.Request) {
	if !s.checkName(w, r) {
		return
	}
	var raw json.RawMessage
	if err := s.decodeJSON(w, r, &raw); err != nil {
		s.fail(w, r, err)
		return
	}
	req, err := parseInferRequest(raw)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := s.inferPlan(req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	release, err := s.reserve(p.responseBytes(), fmt.Sprintf("the answer (%s)", p.describe()))
	if err != nil {
		if ae, ok := err.(*apiError); ok && ae.code == http.StatusRequestEntityTooLarge {
			ae.msg += "; ask for less with \"outputs\": last_logits, top_k_logits and top_k_ids (parameter top_k), or target_logprobs (with the input target_ids)"
		}
		s.fail(w, r, err)
		return
	}
	defer release()
	ctx, cancel := s.requestContext(r)
	defer cancel()
	res, err := s.runInfer(ctx, p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.writeInfer(w, req, p, res)
}

// describe names the outputs and their shapes, for messages.
func (p *inferPlan) describe() string {
	var b bytes.Buffer
	for i, o := range p.outs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %v: %d values", o, p.shape(o), p.values(o))
	}
	return b.String()
}

// inferResult holds the outputs' values.
type inferResult struct {
	floats map[string][]float32
	ids    []int32 // top_k_ids
}

func (s *Server) runInfer(ctx context.Context, p *inferPlan) (*inferResult, error) {
	res := &inferResult{floats: map[string][]float32{}}
	for _, o := range p.outs {
		if o == outTopKIDs {
			res.ids = make([]int32, p.values(o))
		} else {
			res.floats[o] = make([]float32, p.values(o))
		}
	}
	T, V, k := p.T, p.V, p.k
	var top topK
	err := s.sc.run(ctx, p.seqs, func(i int, l runtime.Logits) error {
		if out := res.floats[outLogits]; out != nil {
			copy(out[i*T*V:(i+1)*T*V], l.Data)
		}
		if out := res.floats[outLastLogits]; out != nil {
			copy(out[i*V:(i+1)*V], l.Row(T-1))
		}
		ids, vals := res.ids, res.floats[outTopKLogits]
		if ids != nil || vals != nil {
			for t := range T {
				if top.of(l.Row(t), k); len(top.c) < k {
					return fmt.Errorf("the model's logits at [%d,%d] hold NaN", i, t)
				}
				for j, c := range top.c {
					if ids != nil {
						ids[(i*T+t)*k+j] = int32(c.i)
					}
					if vals != nil {
						vals[(i*T+t)*k+j] = c.x
					}
				}
			}
		}
		if out := res.floats[outTargetLogprobs]; out != nil {
			for t := range T {
				out[i*T+t] = float32(runtime.LogProb(l.Row(t), int(p.targets[i][t])))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for name, xs := range res.floats {
		for i, x := range xs {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("%s value %d is %v, which JSON cannot carry", name, i, x)
			}
		}
	}
	return res, nil
}

// writeInfer writes the answer, rendering the values straight into the
// connection's buffer.
func (s *Server) writeInfer(w http.ResponseWriter, req *inferRequest, p *inferPlan, res *inferResult) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	head, _ := json.Marshal(map[string]string{"model_name": s.cfg.Name, "model_version": modelVersion, "id": req.ID})
	bw.Write(head[:len(head)-1])
	bw.WriteString(`,"outputs":[`)
	var num []byte
	for i, o := range p.outs {
		if i > 0 {
			bw.WriteByte(',')
		}
		dt := "FP32"
		if o == outTopKIDs {
			dt = "INT64"
		}
		meta, _ := json.Marshal(struct {
			Name     string  `json:"name"`
			Datatype string  `json:"datatype"`
			Shape    []int64 `json:"shape"`
		}{o, dt, p.shape(o)})
		bw.Write(meta[:len(meta)-1])
		bw.WriteString(`,"data":[`)
		if o == outTopKIDs {
			for j, id := range res.ids {
				if j > 0 {
					bw.WriteByte(',')
				}
				num = strconv.AppendInt(num[:0], int64(id), 10)
				bw.Write(num)
			}
		} else {
			for j, x := range res.floats[o] {
				if j > 0 {
					bw.WriteByte(',')
				}
				num = strconv.AppendFloat(num[:0], float64(x), 'g', -1, 32)
				bw.Write(num)
			}
		}
		bw.WriteString("]}")
	}
	bw.WriteString("]}\n")
	_ = bw.Flush()
}

// inferPlan validates the request: its inputs, the outputs it asks for,
// and the server's limits.
func (s *Server) inferPlan(req *inferRequest) (*inferPlan, error) {
	if err := noBinary(req.Parameters, "binary_data_output"); err != nil {
		return nil, err
	}
	var input, target *inferTensor
	for i := range req.Inputs {
		in := &req.Inputs[i]
		switch {
		case in.Name == inInputIDs && input == nil:
			input = in
		case in.Name == inTargetIDs && target == nil:
			target = in
		case in.Name == inInputIDs || in.Name == inTargetIDs:
			return nil, badRequest("the input %s is given twice", in.Name)
		default:
			return nil, badRequest("unknown input %q; the model takes input_ids (INT64 [B,T]) and, for the output target_logprobs, target_ids (INT64 [B,T])", in.Name)
		}
		if err := noBinary(in.Parameters, "binary_data_size"); err != nil {
			return nil, err
		}
	}
	if input == nil {
		return nil, badRequest("want the input input_ids (INT64 [B,T])")
	}
	p := &inferPlan{V: s.m.VocabSize(), k: 0}
	seen := map[string]bool{}
	for _, o := range req.Outputs {
		if !known(o.Name) {
			return nil, badRequest("unknown output %q; the outputs are %v", o.Name, outputNames)
		}
		if seen[o.Name] {
			return nil, badRequest("the output %s is asked for twice", o.Name)
		}
		seen[o.Name] = true
		if err := noBinary(o.Parameters, "binary_data"); err != nil {
			return nil, err
		}
		if raw, ok := o.Parameters["top_k"]; ok {
			if o.Name != outTopKIDs && o.Name != outTopKLogits {
				return nil, badRequest("the parameter top_k belongs to the outputs top_k_ids and top_k_logits, not %s", o.Name)
			}
			var k int
			if err := json.Unmarshal(raw, &k); err != nil || k < 1 || k > min(maxTopK, p.V) {
				return nil, badRequest("%s: top_k %s: want an integer in 1..%d", o.Name, raw, min(maxTopK, p.V))
			}
			if p.k != 0 && p.k != k {
				return nil, badRequest("top_k_ids and top_k_logits ask for different top_k (%d and %d)", p.k, k)
			}
			p.k = k
		}
		p.outs = append(p.outs, o.Name)
	}
	if len(p.outs) == 0 {
		p.outs = []string{outLogits}
	}
	if p.k == 0 {
		p.k = min(defaultTopK, p.V)
	}
	if seen[outTargetLogprobs] != (target != nil) {
		return nil, badRequest("the output target_logprobs and the input target_ids go together: give both or neither")
	}
	if sh := input.Shape; len(sh) == 2 && sh[0] > 0 && sh[1] > 0 && sh[1] <= int64(s.m.MaxLength()) && sh[0] <= int64(s.cfg.Queue) {
		if B, T, V := sh[0], sh[1], int64(p.V); B*T*V > int64(s.cfg.MaxInferValues) {
			return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("input_ids [%d,%d] makes the model compute %d logits, more than the server's limit of %d per request (B·T·V logits are computed whichever outputs are asked for); send fewer rows", B, T, B*T*V, s.cfg.MaxInferValues)}
		}
	}
	seqs, err := s.inferIDs(input, "")
	if err != nil {
		return nil, err
	}
	p.seqs, p.B, p.T = seqs, len(seqs), len(seqs[0])
	if target != nil {
		if p.targets, err = s.inferIDs(target, fmt.Sprint([]int{p.B, p.T})); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func known(name string) bool {
	for _, n := range outputNames {
		if n == name {
			return true
		}
	}
	return false
}

// noBinary refuses the binary tensor data extension's parameter key when
// it asks for binary data: this server reads and writes JSON only.
func noBinary(params map[string]json.RawMessage, key string) error {
	raw, ok := params[key]
	if !ok {
		return nil
	}
	var on bool
	if key == "binary_data_size" || json.Unmarshal(raw, &on) != nil || on {
		return badRequest("%s: this server supports no binary tensor data; send and receive JSON", key)
	}
	return nil
}

// inferIDs validates an INT64 (or INT32) [B,T] input of token ids and
// returns its rows; want, when set, is the shape it must have.
func (s *Server) inferIDs(in *inferTensor, want string) ([][]int32, error) {
	if in.Datatype != "INT64" && in.Datatype != "INT32" {
		return nil, badRequest("%s datatype %q: want INT64 (or INT32)", in.Name, in.Datatype)
	}
	if len(in.Shape) != 2 || in.Shape[0] < 1 || in.Shape[1] < 1 {
		return nil, badRequest("%s shape %v: want [B,T] with B, T >= 1", in.Name, in.Shape)
	}
	B, T, V := in.Shape[0], in.Shape[1], int64(s.m.VocabSize())
	if want != "" && fmt.Sprint(in.Shape) != want {
		return nil, badRequest("%s shape %v: want input_ids' shape %s", in.Name, in.Shape, want)
	}
	if T > int64(s.m.MaxLength()) {
		return nil, badRequest("%s has T=%d; the longest exported length is %d", in.Name, T, s.m.MaxLength())
	}
	if B > int64(s.cfg.Queue) {
		return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("%s has %d rows; the server's queue holds %d per request", in.Name, B, s.cfg.Queue)}
	}
	flat, err := flatInts(in.Data, in.Shape)
	if err != nil {
		return nil, badRequest("%s data: %v", in.Name, err)
	}
	if int64(len(flat)) != B*T {
		return nil, badRequest("%s data holds %d values, the shape [%d,%d] needs %d", in.Name, len(flat), B, T, B*T)
	}
	seqs := make([][]int32, B)
	for b := range seqs {
		seqs[b] = make([]int32, T)
		for t := range seqs[b] {
			id := flat[int64(b)*T+int64(t)]
			if id < 0 || id >= V {
				return nil, badRequest("%s[%d,%d] = %d is outside the vocabulary [0,%d)", in.Name, b, t, id, V)
			}
			seqs[b][t] = int32(id)
		}
	}
	return seqs, nil
}

// flatInts reads the data of a tensor of the given shape: a JSON array
// of integers, either flat (row-major, at most the shape's count of
// values) or nested exactly as the shape (ragged rows, nulls and mixed
// forms are errors).
func flatInts(raw json.RawMessage, shape []int64) ([]int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, fmt.Errorf("missing")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("want an array: %v", err)
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	var out []int64
	if len(items) > 0 && isArray(items[0]) {
		return out, nestedInts(items, shape, "", &out)
	}
	for i, it := range items {
		if int64(len(out)) >= n {
			return nil, fmt.Errorf("more values than the shape holds")
		}
		x, err := oneInt(it, fmt.Sprintf("[%d]", i))
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

func isArray(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '['
}

// nestedInts appends the values of items, the array at index path of
// nested data, which must hold shape[0] elements, each nested as
// shape[1:].
func nestedInts(items []json.RawMessage, shape []int64, path string, out *[]int64) error {
	if int64(len(items)) != shape[0] {
		return fmt.Errorf("data%s holds %d elements, the shape wants %d there (ragged or misshapen nested data)", path, len(items), shape[0])
	}
	for i, it := range items {
		at := fmt.Sprintf("%s[%d]", path, i)
		if len(shape) == 1 {
			if isArray(it) {
				return fmt.Errorf("data%s is an array where the shape wants a value (ragged or misshapen nested data)", at)
			}
			x, err := oneInt(it, at)
			if err != nil {
				return err
			}
			*out = append(*out, x)
			continue
		}
		if !isArray(it) {
			return fmt.Errorf("data%s is a value where the shape wants an array (ragged or misshapen nested data)", at)
		}
		var sub []json.RawMessage
		if err := json.Unmarshal(it, &sub); err != nil {
			return fmt.Errorf("data%s: %v", at, err)
		}
		if err := nestedInts(sub, shape[1:], at, out); err != nil {
			return err
		}
	}
	return nil
}

// oneInt reads one integer; null (which encoding/json reads as 0) is an
// error.
func oneInt(b json.RawMessage, at string) (int64, error) {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		return 0, fmt.Errorf("data%s is null; want an integer", at)
	}
	if isArray(b) {
		return 0, fmt.Errorf("data%s is an array among values (ragged data)", at)
	}
	var x int64
	if err := json.Unmarshal(b, &x); err != nil {
		return 0, fmt.Errorf("data%s: %s is not an integer", at, b)
	}
	return x, nil
}

// The keys of the protocol's objects. encoding/json matches keys without
// regard to case ("INPUTS" would fill inputs, and override it); a key
// that differs from one of these only in case is refused instead.
var (
	requestKeys = []string{"id", "parameters", "inputs", "outputs"}
	inputKeys   = []string{"name", "shape", "datatype", "parameters", "data"}
	outputKeys  = []string{"name", "parameters"}
)

// parseInferRequest decodes an inference request with exact key matching
// and checks the length of its id.
func parseInferRequest(raw json.RawMessage) (*inferRequest, error) {
	obj, err := exactKeys(raw, "the request", requestKeys)
	if err != nil {
		return nil, err
	}
	for _, part := range []struct {
		key  string
		keys []string
	}{{"inputs", inputKeys}, {"outputs", outputKeys}} {
		var list []json.RawMessage
		if r, ok := obj[part.key]; ok && json.Unmarshal(r, &list) == nil {
			for i, it := range list {
				if _, err := exactKeys(it, fmt.Sprintf("%s[%d]", part.key, i), part.keys); err != nil {
					return nil, err
				}
			}
		}
	}
	var req inferRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return nil, badRequest("the request body is not valid JSON for this route: %v", err)
	}
	if len(req.ID) > maxIDBytes {
		return nil, badRequest("the request's id is %d bytes; the most this server echoes is %d", len(req.ID), maxIDBytes)
	}
	return &req, nil
}

// exactKeys decodes a JSON object and refuses a key that matches one of
// keys only without regard to case.
func exactKeys(raw json.RawMessage, what string, keys []string) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, badRequest("%s is not a JSON object: %v", what, err)
	}
	for k := range obj {
		for _, want := range keys {
			if k != want && strings.EqualFold(k, want) {
				return nil, badRequest("%s has the key %q; the protocol's key is %q (keys are case-sensitive)", what, k, want)
			}
		}
	}
	return obj, nil
}

// topK selects the k largest logits of a row, most likely first (lower
// index first on ties), with a min-heap of the k best so far.
type topK struct {
	c []logitIdx
}

type logitIdx struct {
	x float32
	i int
}

// worse orders candidates from least to most likely.
func worse(a, b logitIdx) bool { return a.x < b.x || a.x == b.x && a.i > b.i }

func (h *topK) of(row []float32, k int) {
	c := h.c[:0]
	down := func(j int) {
		for {
			l := 2*j + 1
			if l >= len(c) {
				return
			}
			if r := l + 1; r < len(c) && worse(c[r], c[l]) {
				l = r
			}
			if !worse(c[l], c[j]) {
				return
			}
			c[j], c[l] = c[l], c[j]
			j = l
		}
	}
	for i, x := range row {
		e := logitIdx{x, i}
		if x != x { // NaN: never selected (runInfer refuses a NaN logit anyway)
			continue
		}
		switch {
		case len(c) < k:
			c = append(c, e)
			for j := len(c) - 1; j > 0; {
				p := (j - 1) / 2
				if !worse(c[j], c[p]) {
					break
				}
				c[j], c[p] = c[p], c[j]
				j = p
			}
		case worse(c[0], e):
			c[0] = e
			down(0)
		}
	}
	// Pop the heap from the back: least likely last.
	for n := len(c) - 1; n > 0; n-- {
		c[0], c[n] = c[n], c[0]
		sub := c[:n]
		j := 0
		for {
			l := 2*j + 1
			if l >= len(sub) {
				break
			}
			if r := l + 1; r < len(sub) && worse(sub[r], sub[l]) {
				l = r
			}
			if !worse(sub[l], sub[j]) {
				break
			}
			sub[j], sub[l] = sub[l], sub[j]
			j = l
		}
	}
	h.c = c
}

type tensorMeta struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

// tensors lists the model's inputs and outputs; -1 is a dimension of any
// size.
func (s *Server) tensors() (inputs, outputs []tensorMeta) {
	V := int64(s.m.VocabSize())
	inputs = []tensorMeta{{Name: inInputIDs, Datatype: "INT64", Shape: []int64{-1, -1}},
		{Name: inTargetIDs, Datatype: "INT64", Shape: []int64{-1, -1}}}
	outputs = []tensorMeta{{Name: outLogits, Datatype: "FP32", Shape: []int64{-1, -1, V}},
		{Name: outLastLogits, Datatype: "FP32", Shape: []int64{-1, V}},
		{Name: outTopKIDs, Datatype: "INT64", Shape: []int64{-1, -1, -1}},
		{Name: outTopKLogits, Datatype: "FP32", Shape: []int64{-1, -1, -1}},
		{Name: outTargetLogprobs, Datatype: "FP32", Shape: []int64{-1, -1}}}
	return inputs, outputs
}

// serverMetadata answers GET /v2: the server's name, version and the
// protocol extensions it implements.
func (s *Server) serverMetadata(w http.ResponseWriter, r *http.Request) {
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": "rpac", "version": version, "extensions": extensions})
}

func (s *Server) modelMetadata(w http.ResponseWriter, r *http.Request) {
	if !s.checkName(w, r) {
		return
	}
	inputs, outputs := s.tensors()
	writeJSON(w, http.StatusOK, map[string]any{
		"name": s.cfg.Name, "versions": []string{modelVersion}, "platform": "onnxruntime_onnx",
		"inputs": inputs, "outputs": outputs,
	})
}

// configTensor is a tensor of Triton's model configuration.
type configTensor struct {
	Name     string  `json:"name"`
	DataType string  `json:"data_type"`
	Dims     []int64 `json:"dims"`
}

// modelConfig answers Triton's model configuration route: the tensors as
// the model's metadata lists them, with Triton's type names; the batch
// dimension is explicit in dims (max_batch_size 0).
func (s *Server) modelConfig(w http.ResponseWriter, r *http.Request) {
	if !s.checkName(w, r) {
		return
	}
	conv := func(ts []tensorMeta) []configTensor {
		out := make([]configTensor, len(ts))
		for i, t := range ts {
			out[i] = configTensor{t.Name, "TYPE_" + t.Datatype, t.Shape}
		}
		return out
	}
	inputs, outputs := s.tensors()
	writeJSON(w, http.StatusOK, map[string]any{
		"name": s.cfg.Name, "platform": "onnxruntime_onnx", "backend": "onnxruntime",
		"max_batch_size": 0, "input": conv(inputs), "output": conv(outputs),
	})
}
