package onnx

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// seqWeights fills a value with 0, 1, 2, ... (row-major).
func seqWeights(v *ir.Value) ([]float32, error) {
	d := make([]float32, v.Shape.Numel())
	for i := range d {
		d[i] = float32(i)
	}
	return d, nil
}

// embedHead is input_ids[B,T] -> Gather(E[V,D]) -> Linear(W[V,D], b) with
// E tied to W when tied is set.
func embedHead(B, T, V, D int, tied bool) *ir.Graph {
	g := ir.New("embed_head")
	ids := g.Input("input_ids", ir.Shape{B, T}, ir.I32)
	E := g.Param("tok_emb.weight", ir.Shape{V, D})
	h := g.Op1("Gather", nil, E, ids)
	W := E
	if !tied {
		W = g.Param("head.weight", ir.Shape{V, D})
	}
	g.SetOutput("logits", g.Op1("Linear", nil, h, W, g.Param("head.bias", ir.Shape{V})))
	return g
}

func initializer(m *onnxpb.ModelProto, name string) *onnxpb.TensorProto {
	for _, t := range m.Graph.Initializer {
		if t.Name == name {
			return t
		}
	}
	return nil
}

func float32s(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

func TestLowerStructure(t *testing.T) {
	m, err := Lower(embedHead(2, 3, 5, 4, false), seqWeights, Options{
		Metadata:        map[string]string{"rpac.length": "3", "a.first": "x"},
		ProducerVersion: "test",
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.IrVersion != 11 || len(m.OpsetImport) != 1 || m.OpsetImport[0].Version != 23 || m.OpsetImport[0].Domain != "" {
		t.Fatalf("ir %d opsets %v", m.IrVersion, m.OpsetImport)
	}
	if m.ProducerName != "rpac" || m.ProducerVersion != "test" {
		t.Fatalf("producer %q %q", m.ProducerName, m.ProducerVersion)
	}
	if len(m.MetadataProps) != 2 || m.MetadataProps[0].Key != "a.first" || m.MetadataProps[1].Value != "3" {
		t.Fatalf("metadata %v", m.MetadataProps)
	}
	s := Inspect(m)
	if len(s.Inputs) != 1 || s.Inputs[0].String() != "input_ids int64[2,3]" {
		t.Fatalf("inputs %v", s.Inputs)
	}
	if len(s.Outputs) != 1 || s.Outputs[0].String() != "logits float[2,3,5]" {
		t.Fatalf("outputs %v", s.Outputs)
	}
	if s.Ops["Gather"] != 1 || s.Ops["MatMul"] != 1 || s.Ops["Add"] != 1 || s.Nodes != 3 {
		t.Fatalf("ops %v", s.Ops)
	}
	if s.Parameters != 5*4+5*4+5 {
		t.Fatalf("parameters %d", s.Parameters)
	}
	text := s.String()
	for _, want := range []string{"opset      ai.onnx 23", "input      input_ids int64[2,3]", "meta       rpac.length = 3", "parameters 45"} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q:\n%s", want, text)
		}
	}
}

// A Param read only as a Linear weight is stored once, pre-transposed.
func TestLinearWeightPreTransposed(t *testing.T) {
	m, err := Lower(embedHead(1, 2, 3, 4, false), seqWeights, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := initializer(m, "head.weight.T")
	if w == nil || initializer(m, "head.weight") != nil {
		t.Fatalf("initializers: %v", names(m))
	}
	if len(w.Dims) != 2 || w.Dims[0] != 4 || w.Dims[1] != 3 {
		t.Fatalf("dims %v", w.Dims)
	}
	got := float32s(w.RawData)
	for k := 0; k < 4; k++ {
		for n := 0; n < 3; n++ {
			if got[k*3+n] != float32(n*4+k) {
				t.Fatalf("Wᵀ[%d,%d] = %v, want W[%d,%d] = %d", k, n, got[k*3+n], n, k, n*4+k)
			}
		}
	}
	for _, n := range m.Graph.Node {
		if n.OpType == "Transpose" {
			t.Fatal("unexpected Transpose node")
		}
	}
}

func names(m *onnxpb.ModelProto) []string {
	var out []string
	for _, t := range m.Graph.Initializer {
		out = append(out, t.Name)
	}
	return out
}

// A tied embedding is stored once ([V,D]) and transposed by a node.
func TestTiedEmbeddingStoredOnce(t *testing.T) {
	m, err := Lower(embedHead(1, 2, 6, 4, true), seqWeights, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := Inspect(m)
	if s.Parameters != 6*4+6 || s.Ops["Transpose"] != 1 {
		t.Fatalf("parameters %d ops %v initializers %v", s.Parameters, s.Ops, names(m))
	}
	if initializer(m, "tok_emb.weight") == nil {
		t.Fatalf("initializers %v", names(m))
	}
}

func TestSharedLinearWeight(t *testing.T) {
	g := ir.New("shared")
	ids := g.Input("input_ids", ir.Shape{1, 2}, ir.I32)
	h := g.Op1("Gather", nil, g.Param("emb", ir.Shape{4, 4}), ids)
	w := g.Param("w", ir.Shape{4, 4})
	h = g.Op1("Linear", nil, g.Op1("Linear", nil, h, w), w)
	g.SetOutput("logits", h)
	m, err := Lower(g, seqWeights, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Graph.Initializer) != 2 || initializer(m, "w.T") == nil {
		t.Fatalf("initializers %v", names(m))
	}
}

func TestLowerOptions(t *testing.T) {
	g := embedHead(1, 2, 3, 4, false)
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Opset: 17}, "opset 17"},
		{Options{Opset: 27}, "opset 27"},
		{Options{IRVersion: 14}, "IR version 14"},
		{Options{Opset: 18, GELU: GELUOp}, "opset 20"},
		{Options{GELU: "tanh"}, `unknown GELU mode "tanh"`},
	} {
		if _, err := Lower(g, seqWeights, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.opts, err, c.want)
		}
	}
	for opset, ir := range map[int64]int64{18: 8, 20: 9, 21: 10, 23: 11, 26: 11} {
		m, err := Lower(g, seqWeights, Options{Opset: opset})
		if err != nil || m.IrVersion != ir {
			t.Errorf("opset %d: IR %d (%v), want %d", opset, m.GetIrVersion(), err, ir)
		}
	}
}

func TestLowerRejects(t *testing.T) {
	base := func() (*ir.Graph, *ir.Value) {
		g := ir.New("bad")
		ids := g.Input("input_ids", ir.Shape{1, 2}, ir.I32)
		return g, g.Op1("Gather", nil, g.Param("emb", ir.Shape{4, 4}), ids)
	}
	cases := []struct {
		name  string
		build func() *ir.Graph
		w     WeightFunc
		want  string
	}{
		{"dropout", func() *ir.Graph {
			g, h := base()
			g.SetOutput("logits", g.Apply("Dropout", ir.Attrs{"p": 0.1}, h)[0])
			return g
		}, seqWeights, "training-only op Dropout"},
		{"gumbel", func() *ir.Graph {
			g, h := base()
			g.SetOutput("logits", g.Op1("GumbelNoise", nil, h))
			return g
		}, seqWeights, "training-only op GumbelNoise"},
		{"training-only buffer", func() *ir.Graph {
			g, h := base()
			s := g.Buffer("bias_scale", ir.Shape{})
			s.TrainingOnly = true
			g.SetOutput("logits", g.Op1("Mul", nil, h, s))
			return g
		}, seqWeights, "training-only buffer"},
		{"no input_ids", func() *ir.Graph {
			g := ir.New("bad")
			ids := g.Input("tokens", ir.Shape{1, 2}, ir.I32)
			g.SetOutput("logits", g.Op1("Gather", nil, g.Param("emb", ir.Shape{4, 4}), ids))
			return g
		}, seqWeights, `no input "input_ids"`},
		{"no logits", func() *ir.Graph {
			g, h := base()
			g.SetOutput("hidden", h)
			return g
		}, seqWeights, `no output "logits"`},
		{"logits shape", func() *ir.Graph {
			g, h := base()
			g.SetOutput("logits", g.Op1("ReduceSum", ir.Attrs{"axes": []int{1}}, h))
			return g
		}, seqWeights, "want [1,2,V]"},
		{"second input", func() *ir.Graph {
			g, h := base()
			x := g.Input("targets", ir.Shape{1, 2, 4}, ir.F32)
			g.SetOutput("logits", g.Op1("Add", nil, h, x))
			return g
		}, seqWeights, `graph input %targets is not "input_ids"`},
		{"gradient op", func() *ir.Graph {
			g, h := base()
			g.SetOutput("logits", g.Op1("LinearGradX", nil, h, g.Param("w", ir.Shape{4, 4})))
			return g
		}, seqWeights, "op LinearGradX has no ONNX lowering"},
		{"weights error", func() *ir.Graph { g, h := base(); g.SetOutput("logits", h); return g },
			func(*ir.Value) ([]float32, error) { return nil, errors.New("checkpoint lacks it") }, "weights for %emb: checkpoint lacks it"},
		{"weights size", func() *ir.Graph { g, h := base(); g.SetOutput("logits", h); return g },
			func(*ir.Value) ([]float32, error) { return make([]float32, 3), nil }, "3 values for shape [4,4]"},
		{"nil weights", func() *ir.Graph { g, h := base(); g.SetOutput("logits", h); return g }, nil, "nil weights callback"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Lower(c.build(), c.w, Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// Nodes that logits does not depend on are not lowered.
func TestDeadNodesSkipped(t *testing.T) {
	g := ir.New("dead")
	ids := g.Input("input_ids", ir.Shape{1, 2}, ir.I32)
	h := g.Op1("Gather", nil, g.Param("emb", ir.Shape{4, 4}), ids)
	g.Op1("LinearGradW", nil, h, h)
	g.SetOutput("logits", h)
	m, err := Lower(g, seqWeights, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Graph.Node) != 1 {
		t.Fatalf("%d nodes", len(m.Graph.Node))
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	m, err := Lower(embedHead(2, 3, 5, 4, true), seqWeights, Options{Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	if err := Write(path, m); err != nil {
		t.Fatal(err)
	}
	r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m, r) {
		t.Fatal("read model differs from written model")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("folder holds %d entries after Write", len(entries))
	}
	os.WriteFile(filepath.Join(dir, "bad.onnx"), []byte("\xff\xff\xff"), 0o644)
	if _, err := Read(filepath.Join(dir, "bad.onnx")); err == nil || !strings.Contains(err.Error(), "not an ONNX model") {
		t.Fatalf("Read of garbage: %v", err)
	}
}

func TestExternalData(t *testing.T) {
	g := embedHead(1, 2, 64, 16, false)
	m, err := Lower(g, seqWeights, Options{})
	if err != nil {
		t.Fatal(err)
	}
	orig := proto.Clone(m)
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	if err := write(path, m, 1000); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m, orig) {
		t.Fatal("write modified the model")
	}
	r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	s := Inspect(r)
	if !s.ExternalData || s.Parameters != Inspect(m).Parameters {
		t.Fatalf("summary %+v", s)
	}
	if w := initializer(r, "head.weight.T"); w.DataLocation != onnxpb.TensorProto_EXTERNAL || len(w.RawData) != 0 {
		t.Fatalf("head weight not external: %v", w.ExternalData)
	}
	if b := initializer(r, "head.bias"); b.DataLocation == onnxpb.TensorProto_EXTERNAL {
		t.Fatal("small tensor stored externally")
	}
	if err := LoadExternal(r, dir); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(r, m) {
		t.Fatal("model with loaded external data differs")
	}
	// Writing the model inline again removes the stale data file.
	if err := Write(path, m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(DataFile(path)); !os.IsNotExist(err) {
		t.Fatalf("stale %s: %v", DataFile(path), err)
	}
}

func TestFusedAttentionLowered(t *testing.T) {
	if _, ok := ir.Ops["FusedAttention"]; !ok {
		t.Skip("the op table has no FusedAttention")
	}
	if !Lowered("FusedAttention") {
		t.Fatal("FusedAttention has no lowering")
	}
}

// The fused LM head and loss belongs to training and evaluation graphs; a
// graph whose logits depend on it is refused with a clear error.
func TestLMHeadCrossEntropyRefused(t *testing.T) {
	const B, T, V, D = 1, 3, 5, 4
	g := ir.New("fused_head")
	ids := g.Input("input_ids", ir.Shape{B, T}, ir.I32)
	E := g.Param("tok_emb.weight", ir.Shape{V, D})
	h := g.Op1("Gather", nil, E, ids)
	hf := g.Op1("Reshape", ir.Attrs{"shape": []int{B * T, D}}, h)
	tg := g.Op1("Reshape", ir.Attrs{"shape": []int{B * T}}, ids)
	ce := g.Apply("LMHeadCrossEntropy", nil, hf, E, tg)
	g.SetOutput("logits", g.Op1("Add", nil, g.Op1("Linear", nil, h, E), ce[0]))
	_, err := Lower(g, seqWeights, Options{})
	if err == nil || !strings.Contains(err.Error(), "LMHeadCrossEntropy") || !strings.Contains(err.Error(), "Logits") {
		t.Fatalf("want an error naming LMHeadCrossEntropy and the logits export graph, got %v", err)
	}
}
