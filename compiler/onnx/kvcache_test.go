package onnx

import (
	"strconv"
	"strings"
	"testing"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// kvGraph is a one-layer attention model of length T (batch 1, 2 heads of
// 2) as the export pipeline leaves it; mix, when set, is applied to the
// residual stream before the LM head.
func kvGraph(T int, mix func(g *ir.Graph, x *ir.Value) *ir.Value) *ir.Graph {
	const V, D, H = 7, 4, 2
	g := ir.New("kv")
	ids := g.Input("input_ids", ir.Shape{1, T}, ir.I32)
	emb := g.Param("tok_emb.weight", ir.Shape{V, D})
	x := g.Op1("Add", nil, g.Op1("Gather", nil, emb, ids), g.Param("pos_emb.weight", ir.Shape{T, D}))
	heads := func(name string) *ir.Value {
		v := g.Op1("Linear", nil, x, g.Param(name, ir.Shape{D, D}))
		v = g.Op1("Reshape", ir.Attrs{"shape": []int{1, T, H, D / H}}, v)
		return g.Op1("Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, v)
	}
	bias := g.Const("bias", ir.Shape{T, T}, make([]float64, T*T))
	a := g.Op1("FusedAttention", ir.Attrs{"scale": 0.5, "causal": true}, heads("Wq"), heads("Wk"), heads("Wv"), bias)
	a = g.Op1("Reshape", ir.Attrs{"shape": []int{1, T, D}}, g.Op1("Transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, a))
	x = g.Op1("Add", nil, x, a)
	if mix != nil {
		x = mix(g, x)
	}
	g.SetOutput("logits", g.Op1("Linear", nil, x, emb))
	return g
}

// dims renders a declared shape, dynamic dims by name.
func dims(vi *onnxpb.ValueInfoProto) string {
	var parts []string
	for _, d := range vi.GetType().GetTensorType().GetShape().GetDim() {
		if p := d.GetDimParam(); p != "" {
			parts = append(parts, p)
		} else {
			parts = append(parts, strconv.FormatInt(d.GetDimValue(), 10))
		}
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func ioList(vs []*onnxpb.ValueInfoProto) string {
	var parts []string
	for _, v := range vs {
		parts = append(parts, v.Name+dims(v))
	}
	return strings.Join(parts, " ")
}

func TestLowerKVInputsOutputs(t *testing.T) {
	for _, c := range []struct {
		graph   KVGraph
		in, out string
	}{
		{KVPrefill, "input_ids[batch,sequence]",
			"logits[batch,1,7] cache_out.0.key[batch,2,sequence,2] cache_out.0.value[batch,2,sequence,2]"},
		{KVDecode, "input_ids[batch,1] position_ids[batch,1] cache.0.key[batch,2,past_sequence,2] cache.0.value[batch,2,past_sequence,2]",
			"logits[batch,1,7] cache_out.0.key[batch,2,past_sequence,2] cache_out.0.value[batch,2,past_sequence,2]"},
		{KVGrowing, "input_ids[batch_size,sequence_length] attention_mask[batch_size,total_sequence_length] position_ids[batch_size,sequence_length] " +
			"past_key_values.0.key[batch_size,2,past_sequence_length,2] past_key_values.0.value[batch_size,2,past_sequence_length,2]",
			"logits[batch_size,sequence_length,7] present.0.key[batch_size,2,total_sequence_length,2] present.0.value[batch_size,2,total_sequence_length,2]"},
	} {
		m, lay, err := LowerKV(kvGraph(6, nil), seqWeights, KVOptions{Graph: c.graph}, Options{})
		if err != nil {
			t.Fatalf("%v: %v", c.graph, err)
		}
		if lay != (KVLayout{Layers: 1, Heads: 2, HeadSize: 2, Length: 6}) {
			t.Fatalf("%v: layout %+v", c.graph, lay)
		}
		if got := ioList(m.Graph.Input); got != c.in {
			t.Errorf("%v inputs %s, want %s", c.graph, got, c.in)
		}
		if got := ioList(m.Graph.Output); got != c.out {
			t.Errorf("%v outputs %s, want %s", c.graph, got, c.out)
		}
		ops := map[string]int{}
		for _, n := range m.Graph.Node {
			ops[n.OpType]++
		}
		if ops["Attention"] != 1 {
			t.Errorf("%v: %d Attention nodes, want 1", c.graph, ops["Attention"])
		}
		m, _, err = LowerKV(kvGraph(6, nil), seqWeights, KVOptions{Graph: c.graph, PlainAttention: true}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range m.Graph.Node {
			if n.OpType == "Attention" {
				t.Errorf("%v with plain attention has an Attention node", c.graph)
			}
		}
	}
}

// TestLowerKVPositionTables: a constant whose first axis runs over the
// positions, applied elementwise to the stream (as the rotary tables are),
// is read at the rows of the positions: a Slice of rows 0..sequence-1 in
// prefill, a Gather of position_ids in decode, besides the position
// embedding's.
func TestLowerKVPositionTables(t *testing.T) {
	gain := func(g *ir.Graph, x *ir.Value) *ir.Value {
		return g.Op1("Mul", nil, x, g.Const("gain", ir.Shape{6, 1}, make([]float64, 6)))
	}
	for _, c := range []struct {
		graph KVGraph
		op    string
	}{{KVPrefill, "Slice"}, {KVDecode, "Gather"}} {
		count := func(mix func(g *ir.Graph, x *ir.Value) *ir.Value) int {
			m, _, err := LowerKV(kvGraph(6, mix), seqWeights, KVOptions{Graph: c.graph}, Options{})
			if err != nil {
				t.Fatalf("%v: %v", c.graph, err)
			}
			n := 0
			for _, nd := range m.Graph.Node {
				for _, in := range nd.Input {
					if nd.OpType == c.op && (in == "gain" || in == "pos_emb.weight") {
						n++
					}
				}
			}
			return n
		}
		if without, with := count(nil), count(gain); without != 1 || with != 2 {
			t.Errorf("%v: %d %s nodes read a position table without the gain, %d with it (want 1 and 2)", c.graph, without, c.op, with)
		}
	}
}

// TestLowerKVRefusesPositionMixing: a graph that combines positions other
// than in causal attention cannot be decoded with a cache; LowerKV says
// which node does it.
func TestLowerKVRefusesPositionMixing(t *testing.T) {
	for _, c := range []struct {
		name string
		mix  func(g *ir.Graph, x *ir.Value) *ir.Value
		want string
	}{
		{"mean over positions", func(g *ir.Graph, x *ir.Value) *ir.Value {
			return g.Op1("Add", nil, x, g.Op1("ReduceMean", ir.Attrs{"axes": []int{1}, "keepdims": true}, x))
		}, "reduces over the batch or sequence axis"},
		{"per-position constant with a leading axis", func(g *ir.Graph, x *ir.Value) *ir.Value {
			return g.Op1("Mul", nil, x, g.Const("gain", ir.Shape{1, 6, 1}, make([]float64, 6)))
		}, "along the batch or sequence axis"},
		{"z-score of the stream", func(g *ir.Graph, x *ir.Value) *ir.Value { return g.Op1("ZScore", nil, x) }, "no KV-cache lowering"},
		{"token mixing matmul", func(g *ir.Graph, x *ir.Value) *ir.Value {
			return g.Op1("MatMul", nil, g.Const("w", ir.Shape{1, 6, 6}, make([]float64, 36)), x)
		}, "contracts the batch or sequence axis"},
	} {
		_, _, err := LowerKV(kvGraph(6, c.mix), seqWeights, KVOptions{Graph: KVDecode}, Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "would not be exact") {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
	_, _, err := LowerKV(kvGraph(6, nil), seqWeights, KVOptions{Graph: KVDecode}, Options{Quantize: QuantizeInt8})
	if err == nil || !strings.Contains(err.Error(), "quantization") {
		t.Errorf("int8: %v", err)
	}
	_, _, err = LowerKV(embedHead(1, 4, 5, 3, true), seqWeights, KVOptions{Graph: KVPrefill}, Options{})
	if err == nil || !strings.Contains(err.Error(), "no FusedAttention") {
		t.Errorf("no attention: %v", err)
	}
	_, _, err = LowerKV(kvGraph(6, nil), seqWeights, KVOptions{}, Options{})
	if err == nil || !strings.Contains(err.Error(), "unknown KV-cache graph") {
		t.Errorf("no graph kind: %v", err)
	}
}
