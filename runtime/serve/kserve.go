package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

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

	// headerLength is the binary tensor data extension's header: the
	// length of the JSON that begins a body with binary tensor data.
	headerLength = "Inference-Header-Content-Length"

	// maxIDBytes bounds a request's id, which the answer echoes.
	maxIDBytes = 256
)

// extensions are the protocol extensions this server implements, listed
// in its server metadata.
var extensions = []string{"binary_tensor_data"}

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

	// bin holds the tensor's values in the binary form when isBinary (its
	// parameter binary_data_size): little-endian, row-major.
	bin      []byte
	isBinary bool
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
	binary        []bool // per output: written as binary tensor data
	idBytes       int64  // the request's id in JSON, which the answer echoes
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
	n := int64(jsonOverhead) + p.idBytes
	for i, o := range p.outs {
		if p.binary[i] {
			n += p.binaryBytes(o) + 128
			continue
		}
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
	raw, bin, hasBinary, err := s.readInfer(w, r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req, err := parseInferRequest(raw)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := s.inferPlan(req, bin, hasBinary)
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

// writeInfer writes the answer. Without binary outputs its JSON is
// rendered straight into the connection's buffer; with them the JSON
// header is rendered first (its length goes in the header
// Inference-Header-Content-Length), then the binary outputs' bytes follow
// in the order of the outputs.
func (s *Server) writeInfer(w http.ResponseWriter, req *inferRequest, p *inferPlan, res *inferResult) {
	if !p.anyBinary() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		bw := bufio.NewWriterSize(w, 64<<10)
		s.renderInfer(bw, req, p, res)
		_ = bw.Flush()
		return
	}
	var head bytes.Buffer
	s.renderInfer(&head, req, p, res)
	n := int64(head.Len())
	for i, o := range p.outs {
		if p.binary[i] {
			n += p.binaryBytes(o)
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(headerLength, strconv.Itoa(head.Len()))
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	_, _ = bw.Write(head.Bytes())
	var b [8]byte
	for i, o := range p.outs {
		switch {
		case !p.binary[i]:
		case o == outTopKIDs:
			for _, id := range res.ids {
				binary.LittleEndian.PutUint64(b[:], uint64(int64(id)))
				_, _ = bw.Write(b[:8])
			}
		default:
			for _, x := range res.floats[o] {
				binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
				_, _ = bw.Write(b[:4])
			}
		}
	}
	_ = bw.Flush()
}

// renderInfer renders the answer's JSON: the values of the JSON outputs,
// the size of the binary ones.
func (s *Server) renderInfer(bw io.Writer, req *inferRequest, p *inferPlan, res *inferResult) {
	head, _ := json.Marshal(map[string]string{"model_name": s.cfg.Name, "model_version": modelVersion, "id": req.ID})
	bw.Write(head[:len(head)-1])
	io.WriteString(bw, `,"outputs":[`)
	var num []byte
	for i, o := range p.outs {
		if i > 0 {
			io.WriteString(bw, ",")
		}
		meta, _ := json.Marshal(tensorMeta{o, datatypeOf(o), p.shape(o)})
		bw.Write(meta[:len(meta)-1])
		if p.binary[i] {
			fmt.Fprintf(bw, `,"parameters":{"binary_data_size":%d}}`, p.binaryBytes(o))
			continue
		}
		io.WriteString(bw, `,"data":[`)
		if o == outTopKIDs {
			for j, id := range res.ids {
				num = num[:0]
				if j > 0 {
					num = append(num, ',')
				}
				num = strconv.AppendInt(num, int64(id), 10)
				bw.Write(num)
			}
		} else {
			for j, x := range res.floats[o] {
				num = num[:0]
				if j > 0 {
					num = append(num, ',')
				}
				num = strconv.AppendFloat(num, float64(x), 'g', -1, 32)
				bw.Write(num)
			}
		}
		io.WriteString(bw, "]}")
	}
	io.WriteString(bw, "]}\n")
}

func datatypeOf(out string) string {
	if out == outTopKIDs {
		return "INT64"
	}
	return "FP32"
}

// binaryBytes is the size of output name in the binary form: 8 bytes per
// INT64 value, 4 per FP32 one.
func (p *inferPlan) binaryBytes(name string) int64 {
	if name == outTopKIDs {
		return 8 * p.values(name)
	}
	return 4 * p.values(name)
}

func (p *inferPlan) anyBinary() bool {
	for _, b := range p.binary {
		if b {
			return true
		}
	}
	return false
}

// inferPlan validates the request: its inputs (bin is the body's binary
// tensor data, after its JSON), the outputs it asks for, and the
// server's limits.
func (s *Server) inferPlan(req *inferRequest, bin []byte, hasBinary bool) (*inferPlan, error) {
	input, target, err := pickInputs(req, bin, hasBinary)
	if err != nil {
		return nil, err
	}
	id, _ := json.Marshal(req.ID)
	p := &inferPlan{V: s.m.VocabSize(), idBytes: int64(len(id))}
	if err := p.planOutputs(req); err != nil {
		return nil, err
	}
	if slicesContains(p.outs, outTargetLogprobs) != (target != nil) {
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

func slicesContains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// pickInputs finds input_ids and target_ids and hands each binary input
// its bytes of bin, in the order of the inputs; the declared sizes must
// add up to bin's length exactly. hasBinary says whether the request
// declared binary data (the header Inference-Header-Content-Length).
func pickInputs(req *inferRequest, bin []byte, hasBinary bool) (input, target *inferTensor, err error) {
	off := int64(0)
	for i := range req.Inputs {
		in := &req.Inputs[i]
		switch {
		case in.Name == inInputIDs && input == nil:
			input = in
		case in.Name == inTargetIDs && target == nil:
			target = in
		case in.Name == inInputIDs || in.Name == inTargetIDs:
			return nil, nil, badRequest("the input %s is given twice", in.Name)
		default:
			return nil, nil, badRequest("unknown input %q; the model takes input_ids (INT64 [B,T]) and, for the output target_logprobs, target_ids (INT64 [B,T])", in.Name)
		}
		raw, ok := in.Parameters["binary_data_size"]
		if !ok {
			continue
		}
		var n int64
		switch {
		case json.Unmarshal(raw, &n) != nil || n < 0:
			return nil, nil, badRequest("%s: binary_data_size %s: want a byte count (an integer >= 0)", in.Name, raw)
		case !hasBinary:
			return nil, nil, badRequest("%s has binary_data_size but the request has no header %s giving the length of its JSON; binary tensor data follows the JSON in the body", in.Name, headerLength)
		case len(in.Data) > 0:
			return nil, nil, badRequest("%s has both data and binary_data_size: send its values in one form", in.Name)
		case n > int64(len(bin))-off:
			return nil, nil, badRequest("%s: binary_data_size %d is more than the %d bytes left in the body after the JSON and the inputs before it", in.Name, n, int64(len(bin))-off)
		}
		in.bin, in.isBinary = bin[off:off+n], true
		off += n
	}
	if hasBinary && off != int64(len(bin)) {
		return nil, nil, badRequest("the body holds %d bytes after its JSON (header %s), but the inputs' binary_data_size add up to %d", len(bin), headerLength, off)
	}
	if input == nil {
		return nil, nil, badRequest("want the input input_ids (INT64 [B,T])")
	}
	return input, target, nil
}

// boolParam reads the boolean parameter key of params (def when absent).
func boolParam(params map[string]json.RawMessage, key, what string, def bool) (bool, error) {
	raw, ok := params[key]
	if !ok {
		return def, nil
	}
	var on bool
	if err := json.Unmarshal(raw, &on); err != nil || string(bytes.TrimSpace(raw)) == "null" {
		return false, badRequest("%s: %s %s: want true or false", what, key, raw)
	}
	return on, nil
}

// planOutputs reads the outputs asked for, their top_k and whether each
// is binary (its binary_data, else the request's binary_data_output).
func (p *inferPlan) planOutputs(req *inferRequest) error {
	allBinary, err := boolParam(req.Parameters, "binary_data_output", "the request's parameters", false)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, o := range req.Outputs {
		if !known(o.Name) {
			return badRequest("unknown output %q; the outputs are %v", o.Name, outputNames)
		}
		if seen[o.Name] {
			return badRequest("the output %s is asked for twice", o.Name)
		}
		seen[o.Name] = true
		bin, err := boolParam(o.Parameters, "binary_data", o.Name, allBinary)
		if err != nil {
			return err
		}
		if raw, ok := o.Parameters["top_k"]; ok {
			if o.Name != outTopKIDs && o.Name != outTopKLogits {
				return badRequest("the parameter top_k belongs to the outputs top_k_ids and top_k_logits, not %s", o.Name)
			}
			var k int
			if err := json.Unmarshal(raw, &k); err != nil || k < 1 || k > min(maxTopK, p.V) {
				return badRequest("%s: top_k %s: want an integer in 1..%d", o.Name, raw, min(maxTopK, p.V))
			}
			if p.k != 0 && p.k != k {
				return badRequest("top_k_ids and top_k_logits ask for different top_k (%d and %d)", p.k, k)
			}
			p.k = k
		}
		p.outs = append(p.outs, o.Name)
		p.binary = append(p.binary, bin)
	}
	if len(p.outs) == 0 {
		p.outs, p.binary = []string{outLogits}, []bool{allBinary}
	}
	if p.k == 0 {
		p.k = min(defaultTopK, p.V)
	}
	return nil
}

func known(name string) bool { return slicesContains(outputNames, name) }

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
	flat, err := tensorInts(in)
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

// tensorInts reads the values of an INT64 or INT32 tensor whose shape is
// valid: its binary data, whose size must be the shape's, or its JSON
// data.
func tensorInts(in *inferTensor) ([]int64, error) {
	if !in.isBinary {
		return flatInts(in.Data, in.Shape)
	}
	n, size := in.Shape[0]*in.Shape[1], int64(8)
	if in.Datatype == "INT32" {
		size = 4
	}
	if int64(len(in.bin)) != n*size {
		return nil, fmt.Errorf("binary_data_size %d: the shape %v of %s needs %d bytes", len(in.bin), in.Shape, in.Datatype, n*size)
	}
	out := make([]int64, n)
	for i := range out {
		if size == 4 {
			out[i] = int64(int32(binary.LittleEndian.Uint32(in.bin[4*i:])))
		} else {
			out[i] = int64(binary.LittleEndian.Uint64(in.bin[8*i:]))
		}
	}
	return out, nil
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

// readInfer reads an inference body of at most MaxBodyBytes: its JSON,
// and with the header Inference-Header-Content-Length the binary tensor
// data after it. The header's length is checked against the server's
// limit and the body before the body is read.
func (s *Server) readInfer(w http.ResponseWriter, r *http.Request) (raw json.RawMessage, bin []byte, hasBinary bool, err error) {
	n := int64(-1)
	if h := r.Header.Get(headerLength); h != "" {
		if n, err = strconv.ParseInt(h, 10, 64); err != nil || n < 0 {
			return nil, nil, false, badRequest("header %s %q: want the length in bytes of the JSON that begins the body", headerLength, h)
		}
		if n > s.cfg.MaxBodyBytes || (r.ContentLength >= 0 && n > r.ContentLength) {
			return nil, nil, false, badRequest("header %s %d is longer than the body (%d bytes; this server accepts at most %d)", headerLength, n, r.ContentLength, s.cfg.MaxBodyBytes)
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return nil, nil, false, err
	}
	if n > int64(len(body)) {
		return nil, nil, false, badRequest("header %s %d is longer than the body's %d bytes", headerLength, n, len(body))
	}
	if n >= 0 {
		body, bin = body[:n], body[n:]
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, false, badRequest("the request body is empty; send a JSON object")
		}
		return nil, nil, false, badRequest("the request's JSON is not valid: %v", err)
	}
	if rest := bytes.TrimSpace(body[dec.InputOffset():]); len(rest) > 0 {
		if n >= 0 {
			return nil, nil, false, badRequest("the first %d bytes of the body (header %s) hold more than one JSON value", n, headerLength)
		}
		return nil, nil, false, badRequest("the request body holds %d bytes after its JSON object; a body with binary tensor data needs the header %s giving the length of the JSON, and binary_data_size on each binary input", len(rest), headerLength)
	}
	return raw, bin, n >= 0, nil
}

// readBody reads the whole body, of at most MaxBodyBytes, and then lifts
// the connection's read deadline (as decodeJSON does).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is %d bytes, more than the %d bytes this server accepts (rpac serve --max-body); send a smaller body", r.ContentLength, s.cfg.MaxBodyBytes)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, &apiError{http.StatusRequestTimeout, fmt.Sprintf("the request body did not arrive within the server's read timeout of %v", s.cfg.ReadTimeout)}
	}
	if err != nil {
		return nil, err
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	return body, nil
}

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
