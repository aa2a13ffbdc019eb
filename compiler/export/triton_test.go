//go:build cgo

package export_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/model"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/passes"
	"github.com/rpac-dev/rpac/runtime"
	ort "github.com/yalue/onnxruntime_go"
)

// pbNode is a parsed protobuf text message: each field name maps to its
// values, a scalar (string, number or enum name, as written) or a message.
type pbNode map[string][]any

// parsePbtxt parses the subset of the protobuf text format a Triton
// config uses (scalars, nested messages, repeated fields in [...]),
// strictly: anything else is an error.
func parsePbtxt(s string) (pbNode, error) {
	p := &pbParser{s: s}
	n, err := p.message(true)
	if err != nil {
		return nil, fmt.Errorf("offset %d: %w", p.i, err)
	}
	return n, nil
}

type pbParser struct {
	s string
	i int
}

func (p *pbParser) skip() {
	for p.i < len(p.s) && unicode.IsSpace(rune(p.s[p.i])) {
		p.i++
	}
}

func (p *pbParser) peek() byte {
	p.skip()
	if p.i >= len(p.s) {
		return 0
	}
	return p.s[p.i]
}

func (p *pbParser) ident() (string, error) {
	p.skip()
	j := p.i
	for p.i < len(p.s) && (p.s[p.i] == '_' || unicode.IsLetter(rune(p.s[p.i])) || unicode.IsDigit(rune(p.s[p.i]))) {
		p.i++
	}
	if j == p.i {
		return "", fmt.Errorf("want a field name")
	}
	return p.s[j:p.i], nil
}

func (p *pbParser) message(top bool) (pbNode, error) {
	n := pbNode{}
	for {
		c := p.peek()
		if c == 0 && top || c == '}' && !top {
			if !top {
				p.i++
			}
			return n, nil
		}
		if c == 0 {
			return nil, fmt.Errorf("unclosed message")
		}
		name, err := p.ident()
		if err != nil {
			return nil, err
		}
		colon := p.peek() == ':'
		if colon {
			p.i++
		}
		if p.peek() == '[' {
			p.i++
			for p.peek() != ']' {
				v, err := p.value(colon)
				if err != nil {
					return nil, err
				}
				n[name] = append(n[name], v)
				if p.peek() == ',' {
					p.i++
				} else if p.peek() != ']' {
					return nil, fmt.Errorf("want , or ] in %s", name)
				}
			}
			p.i++
			continue
		}
		v, err := p.value(colon)
		if err != nil {
			return nil, err
		}
		n[name] = append(n[name], v)
	}
}

func (p *pbParser) value(colon bool) (any, error) {
	switch c := p.peek(); {
	case c == '{':
		p.i++
		return p.message(false)
	case !colon:
		return nil, fmt.Errorf("a scalar needs ':'")
	case c == '"':
		j := p.i + 1
		for j < len(p.s) && p.s[j] != '"' {
			if p.s[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(p.s) {
			return nil, fmt.Errorf("unterminated string")
		}
		v, err := strconv.Unquote(p.s[p.i : j+1])
		p.i = j + 1
		return v, err
	default:
		j := p.i
		for p.i < len(p.s) && (p.s[p.i] == '-' || p.s[p.i] == '_' || unicode.IsLetter(rune(p.s[p.i])) || unicode.IsDigit(rune(p.s[p.i]))) {
			p.i++
		}
		if j == p.i {
			return nil, fmt.Errorf("want a value")
		}
		return p.s[j:p.i], nil
	}
}

// one returns the single scalar of a field.
func (n pbNode) one(t *testing.T, field string) string {
	t.Helper()
	vs := n[field]
	if len(vs) != 1 {
		t.Fatalf("field %s has %d values, want 1", field, len(vs))
	}
	s, ok := vs[0].(string)
	if !ok {
		t.Fatalf("field %s is a message, want a scalar", field)
	}
	return s
}

func (n pbNode) fields() []string {
	var out []string
	for k := range n {
		out = append(out, k)
	}
	return out
}

func TestPbtxtParserIsStrict(t *testing.T) {
	good := "name: \"a\"\nx [ { y: 1 }, { y: 2 } ]\nd { k: 5 }\nz: [ 1, 2 ]\n"
	n, err := parsePbtxt(good)
	if err != nil || len(n["x"]) != 2 || n["d"][0].(pbNode).one(t, "k") != "5" || fmt.Sprint(n["z"]) != "[1 2]" {
		t.Fatalf("%q: %v %v", good, n, err)
	}
	for _, bad := range []string{"name \"a\"", "x [ { y: 1 } { y: 2 } ]", "d { k: 5", "name: \"a", ": 1", "x: [1, 2"} {
		if _, err := parsePbtxt(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

var tritonTypeOf = map[string]string{"float": "TYPE_FP32", "int64": "TYPE_INT64", "float16": "TYPE_FP16"}

// TestTriton: every model of the repository has a config that matches its
// ONNX graph's inputs and outputs (without the batch dimension), and its
// graph, at batch 1 and 3, gives the logits of the regular export in
// onnxruntime.
func TestTriton(t *testing.T) {
	requireORT(t)
	for _, c := range []struct {
		v     variant
		opset int64
	}{
		{variant{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp, onnx.QuantizeNone, ""}, 0},
		{variant{model.Fuzzy, passes.FoldRPAMode, passes.AttentionOp, onnx.QuantizeNone, ""}, 18},
		{variant{model.Baseline, passes.FoldRPAMode, passes.AttentionPlain, onnx.QuantizeNone, ""}, 0},
		{variant{model.Fuzzy, passes.FoldNoneMode, passes.AttentionPlain, onnx.QuantizeNone, ""}, 0},
		{variant{model.Baseline, passes.FoldRPAMode, passes.AttentionPlain, onnx.QuantizeNone, "rope+smear"}, 0},
	} {
		v := c.v
		t.Run(fmt.Sprintf("%s/opset%d", v, c.opset), func(t *testing.T) {
			ex := doExport(t, v, 1)
			repo := t.TempDir()
			models, err := export.Triton(context.Background(), export.TritonOptions{Options: export.Options{
				Config: ex.cfg, Store: ex.st, Lengths: lengths, Fold: v.fold, Attention: v.attention, Quantize: v.quantize,
				Opset: c.opset, Out: repo, Tokenizer: "test", EOS: 3}, Name: "tiny", MaxBatch: 4, QueueDelay: 250 * time.Microsecond})
			if err != nil {
				t.Fatal(err)
			}
			if len(models) != len(lengths) {
				t.Fatalf("%d models for %d lengths", len(models), len(lengths))
			}
			m, err := runtime.Open(ex.dir, runtime.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for i, tm := range models {
				T := lengths[i]
				if tm.Name != fmt.Sprintf("tiny_L%d", T) || tm.Config != filepath.Join(repo, tm.Name, "config.pbtxt") || tm.Model != filepath.Join(repo, tm.Name, "1", "model.onnx") {
					t.Fatalf("model %+v", tm)
				}
				checkTritonConfig(t, tm, T, ex.cfg.Vocab)
				if c.opset != 0 {
					mm, err := onnx.Read(tm.Model)
					if err != nil || onnx.Inspect(mm).Opsets[""] != c.opset {
						t.Fatalf("%s: opsets %v, %v; want %d", tm.Model, onnx.Inspect(mm).Opsets, err, c.opset)
					}
				}
				checkTritonParity(t, m, tm.Model, T, ex.cfg.Vocab)
			}
		})
	}
}

func checkTritonConfig(t *testing.T, tm export.TritonModel, T, V int) {
	t.Helper()
	b, err := os.ReadFile(tm.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parsePbtxt(string(b))
	if err != nil {
		t.Fatalf("%s does not parse: %v\n%s", tm.Config, err, b)
	}
	if got := strings.Join(sortedStrings(cfg.fields()), " "); got != "dynamic_batching input max_batch_size name output platform" {
		t.Fatalf("config fields %s", got)
	}
	if cfg.one(t, "name") != tm.Name || cfg.one(t, "platform") != "onnxruntime_onnx" || cfg.one(t, "max_batch_size") != "4" {
		t.Fatalf("config %v", cfg)
	}
	if db := cfg["dynamic_batching"][0].(pbNode); db.one(t, "max_queue_delay_microseconds") != "250" {
		t.Fatalf("dynamic_batching %v", db)
	}
	model, err := onnx.Read(tm.Model)
	if err != nil {
		t.Fatal(err)
	}
	s := onnx.Inspect(model)
	for kind, want := range map[string][]onnx.TensorInfo{"input": s.Inputs, "output": s.Outputs} {
		got := cfg[kind]
		if len(got) != len(want) {
			t.Fatalf("%s: config lists %d, the graph has %d", kind, len(got), len(want))
		}
		for j, g := range got {
			e := g.(pbNode)
			w := want[j]
			if len(w.Shape) == 0 || w.Shape[0] != "batch" {
				t.Fatalf("graph %s %s: first dimension %v, want the variable batch", kind, w.Name, w.Shape)
			}
			dims := make([]string, len(e["dims"]))
			for k, d := range e["dims"] {
				dims[k] = d.(string)
			}
			if e.one(t, "name") != w.Name || e.one(t, "data_type") != tritonTypeOf[w.Type] || strings.Join(dims, ",") != strings.Join(w.Shape[1:], ",") {
				t.Errorf("config %s %v, graph %s", kind, e, w)
			}
		}
	}
	if fmt.Sprint(s.Inputs[0].Shape) != fmt.Sprintf("[batch %d]", T) || fmt.Sprint(s.Outputs[0].Shape) != fmt.Sprintf("[batch %d %d]", T, V) {
		t.Errorf("graph inputs %v outputs %v", s.Inputs, s.Outputs)
	}
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// checkTritonParity runs the Triton graph in onnxruntime at batch 1 and 3
// and compares with the regular export's logits (runtime, batch 1 graph).
func checkTritonParity(t *testing.T, m *runtime.Model, path string, T, V int) {
	t.Helper()
	sess, err := ort.NewDynamicAdvancedSession(path, []string{"input_ids"}, []string{"logits"}, nil)
	if err != nil {
		t.Fatalf("onnxruntime cannot load %s: %v", path, err)
	}
	defer sess.Destroy()
	r := rand.New(rand.NewPCG(uint64(T), 3))
	for _, B := range []int{1, 3} {
		seqs := randSeqs(r, B, T, V)
		want, err := m.Logits(context.Background(), seqs)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, 0, B*T)
		for _, s := range seqs {
			for _, id := range s {
				ids = append(ids, int64(id))
			}
		}
		in, err := ort.NewTensor(ort.NewShape(int64(B), int64(T)), ids)
		if err != nil {
			t.Fatal(err)
		}
		out, err := ort.NewEmptyTensor[float32](ort.NewShape(int64(B), int64(T), int64(V)))
		if err != nil {
			t.Fatal(err)
		}
		if err := sess.Run([]ort.Value{in}, []ort.Value{out}); err != nil {
			t.Fatalf("batch %d: %v", B, err)
		}
		got := out.GetData()
		worst := 0.0
		for b := range B {
			for k, w := range want[b].Data {
				worst = math.Max(worst, math.Abs(float64(got[b*T*V+k]-w)))
			}
		}
		in.Destroy()
		out.Destroy()
		if worst > 1e-4 {
			t.Errorf("L=%d batch %d: max |Δlogit| %.2e against the regular export", T, B, worst)
		}
	}
}

func TestTritonErrors(t *testing.T) {
	cfg := smallCfg(model.Baseline)
	st := smallStore(t, &cfg, lengths...)
	base := export.Options{Config: cfg, Store: st, Lengths: lengths, Out: t.TempDir(), Tokenizer: "test", EOS: 3}
	for _, c := range []struct {
		o    export.TritonOptions
		want string
	}{
		{export.TritonOptions{Options: base, Name: "a/b"}, "use letters"},
		{export.TritonOptions{Options: base, MaxBatch: -1}, "max_batch_size -1"},
		{export.TritonOptions{Options: func() export.Options { o := base; o.Quantize = onnx.QuantizeInt8; return o }()}, "not available for Triton"},
	} {
		if _, err := export.Triton(context.Background(), c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o.Name, err, c.want)
		}
	}
}

func TestDynamicBatchRefuses(t *testing.T) {
	model := func(shape []int64, w float32) *onnxpb.ModelProto {
		vi := func(name string, dims ...int64) *onnxpb.ValueInfoProto {
			s := &onnxpb.TensorShapeProto{}
			for _, d := range dims {
				s.Dim = append(s.Dim, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
			}
			return &onnxpb.ValueInfoProto{Name: name, Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{TensorType: &onnxpb.TypeProto_Tensor{ElemType: int32(onnxpb.TensorProto_INT64), Shape: s}}}}
		}
		raw := make([]byte, 8*len(shape))
		for i, d := range shape {
			binary.LittleEndian.PutUint64(raw[8*i:], uint64(d))
		}
		return &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{
			Input:  []*onnxpb.ValueInfoProto{vi("input_ids", 1, 4)},
			Output: []*onnxpb.ValueInfoProto{vi("y", 1, 4)},
			Node:   []*onnxpb.NodeProto{{OpType: "Reshape", Input: []string{"input_ids", "s"}, Output: []string{"y"}}},
			Initializer: []*onnxpb.TensorProto{
				{Name: "s", DataType: int32(onnxpb.TensorProto_INT64), Dims: []int64{int64(len(shape))}, RawData: raw},
				{Name: "w", DataType: int32(onnxpb.TensorProto_FLOAT), Dims: []int64{1}, FloatData: []float32{w}},
			},
		}}
	}
	if m, err := export.DynamicBatch(model([]int64{1, 4}, 1), model([]int64{2, 4}, 1)); err != nil || len(m.Graph.Node) != 3 {
		t.Fatalf("a batch-led shape: %v, %d nodes (want Shape, Concat, Reshape)", err, len(m.GetGraph().GetNode()))
	}
	for _, c := range []struct {
		a, b *onnxpb.ModelProto
		want string
	}{
		{model([]int64{1, 4}, 1), model([]int64{1, 5}, 1), "beyond a leading batch dimension"},
		{model([]int64{4, 1}, 1), model([]int64{4, 2}, 1), "beyond a leading batch dimension"},
		{model([]int64{1, 4}, 1), model([]int64{2, 4}, 2), "constant w differs"},
	} {
		if _, err := export.DynamicBatch(c.a, c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}
