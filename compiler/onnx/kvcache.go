package onnx

import (
	"errors"
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/runtime/manifest"
)

// KV-cached decoding. LowerKV lowers the same export graph as Lower (built
// for length T, attention fused into FusedAttention nodes) into one of two
// graphs whose batch and sequence dimensions are dynamic and whose
// attention reads and writes rpac's fixed-slot key/value cache (or into the
// Hugging Face / Optimum decoder, KVGrowing, kvgrowing.go). The cache
// tensors are named cache.{i}.* and cache_out.{i}.*, not Optimum's
// past_key_values.{i}.* / present.{i}.*: Optimum's cache grows by a
// position a step under an attention_mask, this one does not, and a driver
// written for Optimum's graphs must fail on a missing input here instead of
// computing wrong logits.
//
//	prefill  in:  input_ids           int64 [batch, sequence]      (positions 0..sequence-1, sequence <= T)
//	         out: logits              float [batch, 1, V]           (after the prompt's last token)
//	              cache_out.{i}.key   float [batch, heads, sequence, head_size]
//	              cache_out.{i}.value float [batch, heads, sequence, head_size]
//	decode   in:  input_ids           int64 [batch, 1]              (one new token per sequence)
//	              position_ids        int64 [batch, 1]              (its position p_b, 0 <= p_b < past_sequence)
//	              cache.{i}.key|value float [batch, heads, past_sequence, head_size]
//	         out: logits              float [batch, 1, V]
//	              cache_out.{i}.key|value float [batch, heads, past_sequence, head_size]
//
// The decode cache has fixed slots: slot j of a sequence holds the key and
// value of its position j (past_sequence <= T slots). The step writes the
// new token's key and value into slot p_b (cache_out equals cache elsewhere:
// the cache is updated in place, as onnxruntime-genai's shared past/present
// buffer is) and attends to slots 0..p_b only, so each sequence of a batch
// can be at its own position and slots beyond it may hold anything. The
// folded RPA prior of length T enters as row p_b of the layer's [T,T]
// bias (a Gather from the constant); a position table, a weight or constant
// whose first axis runs over the T positions and that an elementwise node
// applies along the sequence axis (the position embedding, the rotary
// tables), enters as its row p_b (decode) or its rows 0..sequence-1
// (prefill). Every other part of the graph is per position; LowerKV checks
// that (positionAxes) and refuses a graph that mixes positions anywhere but
// in attention, because a cache would then not be exact.
//
// The prefill graph applies the LM head to the last prompt position only: a
// generation needs no other logits, and the head over every position would
// be most of a prefill's work at a small width (the head is V×D per token)
// and a [sequence, V] output. Scoring a text uses the full graph.

// KVGraph selects the graph LowerKV writes.
type KVGraph int

const (
	KVPrefill KVGraph = iota + 1 // the prompt: no past, keys and values out
	KVDecode                     // one token per sequence against the cache
	// KVGrowing is the Hugging Face / Optimum decoder (kvgrowing.go): any
	// number of new tokens per call against a cache that grows by them,
	// under an attention_mask, logits at every new position.
	KVGrowing
)

func (k KVGraph) String() string {
	switch k {
	case KVPrefill:
		return "prefill"
	case KVDecode:
		return "decode"
	case KVGrowing:
		return "growing"
	}
	return fmt.Sprintf("KVGraph(%d)", int(k))
}

// Names of the KV-cache graphs' inputs, outputs and dynamic dimensions.
const (
	PositionIDsName = "position_ids"
	DimBatch        = "batch"
	DimSequence     = "sequence"
	DimPastSequence = "past_sequence"
)

// PastKeyName and the other three name layer i's cache tensors.
// (the manifest's names: runtime/manifest.KVPastKey and the others).
func PastKeyName(layer int) string      { return fmt.Sprintf(manifest.KVPastKey, layer) }
func PastValueName(layer int) string    { return fmt.Sprintf(manifest.KVPastValue, layer) }
func PresentKeyName(layer int) string   { return fmt.Sprintf(manifest.KVPresentKey, layer) }
func PresentValueName(layer int) string { return fmt.Sprintf(manifest.KVPresentValue, layer) }

// KVLayout is the cache geometry of a lowered KV-cache graph.
type KVLayout struct {
	Layers, Heads, HeadSize int
	// Length is T: the prior's length, the most positions a cache holds.
	Length int
}

// kvState is the builder's state while lowering a KV-cache graph.
type kvState struct {
	which  KVGraph
	axes   map[*ir.Value]posAxes
	tables map[*ir.Node]int // elementwise nodes that read a position table: the table's input index
	head   *ir.Node         // the LM head (prefill: last position only)
	plain  bool             // MatMul, Add, Softmax, MatMul instead of Attention
	layout KVLayout
	// decode: shared by every layer, built at the first attention
	slot, valid, zeroMask, pastLen string
	// growing: shared by every layer, built at the first attention
	allowed, keyCols string
}

// KVOptions select the KV-cache graph.
type KVOptions struct {
	Graph KVGraph
	// PlainAttention spells attention out as MatMul, Add, Softmax and
	// MatMul instead of the ONNX Attention op (always so below opset 23).
	PlainAttention bool
}

// LowerKV lowers g (the export graph of length T with fused attention,
// input "input_ids" [B,T] and output "logits" [B,T,V]) to the prefill or
// decode graph described above, or the growing-cache decoder. The batch
// size of g does not matter: every graph takes any batch. int8 quantization is not supported here.
func LowerKV(g *ir.Graph, weights WeightFunc, ko KVOptions, opts Options) (*onnxpb.ModelProto, KVLayout, error) {
	which := ko.Graph
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, KVLayout{}, err
	}
	if which != KVPrefill && which != KVDecode && which != KVGrowing {
		return nil, KVLayout{}, fmt.Errorf("onnx: unknown KV-cache graph %v", which)
	}
	if opts.Quantize != QuantizeNone {
		return nil, KVLayout{}, fmt.Errorf("onnx: the KV-cache graphs do not support quantization %v yet; export them without it", opts.Quantize)
	}
	if opts.Precision.Reduced() {
		return nil, KVLayout{}, fmt.Errorf("onnx: the KV-cache graphs are written in fp32, not %s; export them without --dtype", opts.Precision)
	}
	if g == nil {
		return nil, KVLayout{}, errors.New("onnx: nil graph")
	}
	if err := ir.Verify(g, true); err != nil {
		return nil, KVLayout{}, fmt.Errorf("onnx: %w", err)
	}
	ids := g.Lookup(InputName)
	if ids == nil || ids.Kind != ir.Input || ids.DType != ir.I32 || len(ids.Shape) != 2 {
		return nil, KVLayout{}, fmt.Errorf("onnx: graph %s has no input %q i32 [B,T]", g.Name, InputName)
	}
	out := g.Outputs[OutputName]
	if out == nil || out.DType != ir.F32 || len(out.Shape) != 3 || out.Shape[0] != ids.Shape[0] || out.Shape[1] != ids.Shape[1] {
		return nil, KVLayout{}, fmt.Errorf("onnx: graph %s has no output %q f32 [B,T,V]", g.Name, OutputName)
	}
	T, V := ids.Shape[1], out.Shape[2]
	axes, tables, err := positionAxes(g, ids, out)
	if err != nil {
		return nil, KVLayout{}, fmt.Errorf("onnx: %s graph: %w", which, err)
	}

	if out.Def == nil || out.Def.Op != ir.OpLinear {
		return nil, KVLayout{}, fmt.Errorf("onnx: graph %s: %q is not computed by the LM head (a Linear)", g.Name, OutputName)
	}
	b := newBuilder(g, weights, opts)
	b.kv = &kvState{which: which, axes: axes, tables: tables, head: out.Def, plain: ko.PlainAttention, layout: KVLayout{Length: T}}
	b.reserve(InputName)
	b.reserve(OutputName)
	b.reserve(PositionIDsName)
	b.reserve(AttentionMaskName)
	nLayers := 0
	for _, n := range g.Nodes {
		if n.Op == ir.OpFusedAttention {
			nLayers++
		}
	}
	if nLayers == 0 {
		return nil, KVLayout{}, fmt.Errorf("onnx: graph %s has no FusedAttention node: run the export pipeline with attention %q before LowerKV", g.Name, "op")
	}
	for i := 0; i < nLayers; i++ {
		for _, name := range which.cacheNames(i) {
			b.reserve(name)
		}
	}
	b.names[ids] = InputName
	b.gp.Input = append(b.gp.Input, which.tokenInputs()...)
	if out.Kind == ir.Intermediate && out.Def.Op != ir.OpStopGradient {
		b.final = out
	}
	name, err := b.lowerLive(g, out, fmt.Sprintf("onnx: %s graph: ", which))
	if err != nil {
		return nil, KVLayout{}, err
	}
	if name != OutputName {
		b.emitTo(OutputName, "Identity", []string{name})
	}
	lay := b.kv.layout
	if lay.Layers != nLayers {
		return nil, KVLayout{}, fmt.Errorf("onnx: %d of %d attention layers were lowered", lay.Layers, nLayers)
	}
	which.declareCache(b, lay, V)
	return b.model(), lay, nil
}

// dynValueInfo declares a tensor whose dims are sizes (int) or names of
// dynamic dimensions (string).
func dynValueInfo(name string, dt onnxpb.TensorProto_DataType, dims ...any) *onnxpb.ValueInfoProto {
	vi := valueInfo(name, dt, nil)
	shape := vi.GetType().GetTensorType().GetShape()
	for _, d := range dims {
		switch d := d.(type) {
		case int:
			shape.Dim = append(shape.Dim, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
		case string:
			shape.Dim = append(shape.Dim, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: d}})
		default:
			panic(fmt.Sprintf("dynValueInfo: dim %v of type %T", d, d))
		}
	}
	return vi
}

// posAxes are the batch and sequence axes of a per-position value.
type posAxes struct{ batch, seq int }

// positionAxes finds, for every value that depends on the token ids, its
// batch and sequence axes, and checks that no node combines different
// positions except FusedAttention (causal) and the elementwise nodes that
// apply a position table (isPositionTable), which it returns with the
// table's input index. A graph that fails this check cannot be decoded
// with a cache exactly.
func positionAxes(g *ir.Graph, ids, out *ir.Value) (map[*ir.Value]posAxes, map[*ir.Node]int, error) {
	T := ids.Shape[1]
	ax := map[*ir.Value]posAxes{ids: {0, 1}}
	tables := map[*ir.Node]int{}
	live := liveNodes(g, out)
	for _, n := range g.Nodes {
		if !live[n] {
			continue
		}
		var dyn []int // inputs that depend on the ids
		for i, v := range n.Inputs {
			if _, ok := ax[v]; ok {
				dyn = append(dyn, i)
			}
		}
		if len(dyn) == 0 {
			continue
		}
		o := n.Outputs[0]
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s node %d (%s) %s: a KV cache would not be exact", n.Op, n.ID, o, fmt.Sprintf(format, args...))
		}
		in0 := n.Inputs[dyn[0]]
		a := ax[in0]
		last := len(in0.Shape) - 1
		def := ir.Ops[n.Op]
		if def == nil {
			def = &ir.OpDef{}
		}
		switch {
		case n.Op == ir.OpGather:
			if dyn[0] != 1 || len(dyn) != 1 || n.Inputs[1] != ids {
				return nil, nil, bad("gathers from per-position values")
			}
			ax[o] = posAxes{0, 1}
		case def.Elementwise:
			r := len(o.Shape)
			var got *posAxes
			for _, v := range n.Inputs {
				if va, ok := ax[v]; ok {
					shift := r - len(v.Shape)
					s := posAxes{va.batch + shift, va.seq + shift}
					if got != nil && *got != s {
						return nil, nil, bad("combines values whose sequence axes differ")
					}
					got = &s
				}
			}
			for i, v := range n.Inputs {
				if _, ok := ax[v]; ok {
					continue
				}
				shift := r - len(v.Shape)
				if isPositionTable(v, *got, shift, T) {
					if _, two := tables[n]; two {
						return nil, nil, bad("reads two position tables")
					}
					tables[n] = i
					continue
				}
				for _, axis := range []int{got.batch, got.seq} {
					if j := axis - shift; j >= 0 && v.Shape[j] != 1 {
						return nil, nil, bad("combines per-position values with %s%v along the batch or sequence axis", v, v.Shape)
					}
				}
			}
			ax[o] = *got
		case n.Op == ir.OpLinear || n.Op == ir.OpMatMul:
			if len(dyn) != 1 {
				return nil, nil, bad("multiplies two per-position values")
			}
			if dyn[0] != 0 || n.Attrs.Bool("transA", false) || a.batch == last || a.seq == last {
				return nil, nil, bad("contracts the batch or sequence axis")
			}
			if w := n.Inputs[1].Shape; n.Op == ir.OpMatMul {
				for _, d := range w[:len(w)-2] {
					if d != 1 {
						return nil, nil, bad("multiplies by a weight %v that differs along the leading axes", w)
					}
				}
			}
			ax[o] = a
		case n.Op == ir.OpReshape:
			if a != (posAxes{0, 1}) || len(o.Shape) < 2 || o.Shape[0] != in0.Shape[0] || o.Shape[1] != in0.Shape[1] {
				return nil, nil, bad("reshapes across the batch or sequence axis (%v to %v)", in0.Shape, o.Shape)
			}
			ax[o] = a
		case n.Op == ir.OpTranspose:
			p := n.Attrs.Ints("perm")
			var na posAxes
			for i, src := range p {
				if src == a.batch {
					na.batch = i
				}
				if src == a.seq {
					na.seq = i
				}
			}
			ax[o] = na
		case n.Op == ir.OpSlice:
			axis, err := normAxis(n.Attrs.Int("axis", 0), len(in0.Shape))
			if err != nil || axis == a.batch || axis == a.seq {
				return nil, nil, bad("slices the batch or sequence axis")
			}
			ax[o] = a
		case def.RowWise:
			if len(dyn) != 1 || dyn[0] != 0 || a.batch == last || a.seq == last {
				return nil, nil, bad("normalizes along the batch or sequence axis")
			}
			ax[o] = a
		case n.Op == ir.OpReduceSum || n.Op == ir.OpReduceMean:
			axes := n.Attrs.Ints("axes")
			if len(axes) == 0 {
				return nil, nil, bad("reduces over every axis")
			}
			na := a
			for _, x := range axes {
				x, err := normAxis(x, len(in0.Shape))
				if err != nil || x == a.batch || x == a.seq {
					return nil, nil, bad("reduces over the batch or sequence axis")
				}
				if !n.Attrs.Bool("keepdims", false) {
					if x < a.batch {
						na.batch--
					}
					if x < a.seq {
						na.seq--
					}
				}
			}
			ax[o] = na
		case n.Op == ir.OpFusedAttention:
			for i, v := range n.Inputs[:3] {
				if va, ok := ax[v]; !ok || va != (posAxes{0, 2}) {
					return nil, nil, bad("input %d is not a per-position [B,H,T,Hd] tensor", i)
				}
			}
			if len(n.Inputs) == 4 {
				if _, ok := ax[n.Inputs[3]]; ok {
					return nil, nil, bad("has a mask computed from the tokens")
				}
			}
			if !n.Attrs.Bool("causal", false) {
				return nil, nil, bad("is not causal")
			}
			ax[o] = posAxes{0, 2}
		default:
			return nil, nil, bad("has no KV-cache lowering for per-position inputs")
		}
	}
	if _, ok := ax[out]; !ok {
		return nil, nil, errors.New("the logits do not depend on the token ids")
	}
	return ax, tables, nil
}

// isPositionTable says whether v, a value that does not depend on the
// tokens, broadcast against a per-position value with axes a (v's axes
// shifted right by shift), is a table of the T positions: its first axis
// meets the sequence axis with length T, right after the batch axis, so
// that its rows 0..sequence-1 (a Slice) or the rows position_ids [batch,1]
// (a Gather, which puts [batch,1] where that axis was) line up with the
// batch and sequence axes.
func isPositionTable(v *ir.Value, a posAxes, shift, T int) bool {
	return len(v.Shape) > 0 && a.seq-shift == 0 && a.batch == a.seq-1 && v.Shape[0] == T
}

// override returns the KV-cache lowering of n, or nil for the default one.
func (k *kvState) override(n *ir.Node) lowering {
	if k == nil {
		return nil
	}
	if _, ok := k.tables[n]; ok {
		return lowerKVPosition
	}
	if k.which == KVPrefill && n == k.head {
		return lowerKVLastHead
	}
	if _, dyn := k.axes[n.Inputs[0]]; !dyn {
		return nil
	}
	switch n.Op {
	case ir.OpReshape:
		return lowerKVReshape
	case ir.OpTopKMask:
		return lowerKVTopKMask
	case ir.OpFusedAttention:
		return lowerKVAttention
	}
	return nil
}

// lowerKVLastHead is the LM head (Linear over the last axis) applied to
// the last position of its [batch, sequence, D] input only.
func lowerKVLastHead(b *builder, n *ir.Node, in []string, out string) (string, error) {
	last := b.emit(out+".last", "Slice", []string{in[0], b.constI64(-1), b.constI64(math.MaxInt64), b.constI64(1)})
	args := append([]string{last}, in[1:]...)
	return lowerLinear(b, n, args, out)
}

// shapeOf returns Shape(x)[start:end] (int64 [end-start]).
func (b *builder) shapeOf(x string, start, end int64) string {
	return b.emit(x+".shape", "Shape", []string{x}, attrInt("start", start), attrInt("end", end))
}

func (b *builder) scalarI64(v int64) string { return b.constI64Shaped([]int64{}, []int64{v}) }

// lowerKVPosition applies a position table (positionAxes) to the
// per-position operand: rows 0..sequence-1 of the table (prefill) or rows
// position_ids (decode).
func lowerKVPosition(b *builder, n *ir.Node, in []string, out string) (string, error) {
	ti := b.kv.tables[n]
	var rows string
	if b.kv.which == KVPrefill {
		rows = b.emit(out+".pos", "Slice", []string{in[ti], b.constI64(0), b.shapeOf(InputName, 1, 2), b.constI64(0)})
	} else {
		rows = b.emit(out+".pos", "Gather", []string{in[ti], PositionIDsName}, attrInt("axis", 0))
	}
	args := append([]string(nil), in...)
	args[ti] = rows
	f, ok := lowererOf(n.Op)
	if !ok {
		return "", fmt.Errorf("op %s has no ONNX lowering", n.Op)
	}
	return f(b, n, args, out)
}

// lowerKVReshape keeps the (dynamic) batch and sequence dims: 0 copies them.
func lowerKVReshape(b *builder, n *ir.Node, in []string, out string) (string, error) {
	s := dims64(n.Outputs[0].Shape)
	s[0], s[1] = 0, 0
	for _, d := range s[2:] {
		if d == 0 {
			return "", fmt.Errorf("a zero-sized dim in %v", n.Outputs[0].Shape)
		}
	}
	return b.emitTo(out, "Reshape", []string{in[0], b.constI64(s...)}), nil
}

// lowerKVTopKMask is TopKMask with shapes taken at run time.
func lowerKVTopKMask(b *builder, n *ir.Node, in []string, out string) (string, error) {
	s := n.Inputs[0].Shape
	k := n.Attrs.Int("k", 1)
	full := b.emit(out+".shape", "Shape", []string{in[0]})
	switch {
	case k <= 0:
		return b.emitTo(out, "ConstantOfShape", []string{full}, attrTensor("value", floatTensor(0))), nil
	case k >= s[len(s)-1]:
		return b.emitTo(out, "ConstantOfShape", []string{full}, attrTensor("value", floatTensor(1))), nil
	}
	top := b.emitN(out+".topk", "TopK", []string{in[0], b.constI64(int64(k))}, 2,
		attrInt("axis", -1), attrInt("largest", 1), attrInt("sorted", 1))
	zeros := b.emit(out+".zeros", "ConstantOfShape", []string{full}, attrTensor("value", floatTensor(0)))
	ones := b.emit(out+".ones", "ConstantOfShape", []string{b.emit(out+".kshape", "Shape", []string{top[1]})}, attrTensor("value", floatTensor(1)))
	return b.emitTo(out, "ScatterElements", []string{zeros, top[1], ones}, attrInt("axis", -1)), nil
}

// lowerKVAttention lowers layer i's FusedAttention(q, k, v, bias?) of the
// prefill or decode graph.
func lowerKVAttention(b *builder, n *ir.Node, in []string, out string) (string, error) {
	k := b.kv
	i := k.layout.Layers
	k.layout.Layers++
	q := n.Inputs[0].Shape
	if k.layout.Heads == 0 {
		k.layout.Heads, k.layout.HeadSize = q[1], q[3]
	}
	if q[1] != k.layout.Heads || q[3] != k.layout.HeadSize {
		return "", fmt.Errorf("layer %d has %d heads of %d, layer 0 %d of %d; one cache layout needs equal layers", i, q[1], q[3], k.layout.Heads, k.layout.HeadSize)
	}
	scale := float32(n.Attrs.Float("scale", 1/math.Sqrt(float64(q[3]))))
	bias := ""
	if len(in) == 4 {
		bias = in[3]
	}
	if k.which == KVGrowing {
		return b.kvGrowingAttention(i, in[0], in[1], in[2], bias, scale, out), nil
	}
	if k.which == KVPrefill {
		b.emitTo(PresentKeyName(i), "Identity", []string{in[1]})
		b.emitTo(PresentValueName(i), "Identity", []string{in[2]})
		return b.kvPrefillAttention(in[0], in[1], in[2], bias, scale, out), nil
	}
	return b.kvDecodeAttention(i, in[0], in[1], in[2], bias, scale, out), nil
}

// useAttentionOp says whether to emit ONNX Attention (opset 23+) rather
// than MatMul, Add, Softmax and MatMul.
func (b *builder) useAttentionOp() bool { return b.opts.Opset >= AttentionOpset && !b.kv.plain }

// kvPrefillAttention is causal attention over the prompt with the bias's
// leading [N,N] block as mask.
func (b *builder) kvPrefillAttention(q, key, val, bias string, scale float32, out string) string {
	var mask string
	if bias != "" {
		nn := b.shapeOf(q, 2, 3)
		ends := b.emit(out+".ends", "Concat", []string{nn, nn}, attrInt("axis", 0))
		mask = b.emit(out+".bias", "Slice", []string{bias, b.constI64(0, 0), ends, b.constI64(0, 1)})
	}
	if b.useAttentionOp() {
		args := []string{q, key, val}
		if mask != "" {
			args = append(args, mask)
		}
		return b.emitTo(out, "Attention", args, attrFloat("scale", scale), attrInt("is_causal", 1))
	}
	s := b.emit(out+".scores", "MatMul", []string{q, b.swapLast(key, 4)})
	s = b.emit(out+".scaled", "Mul", []string{s, b.scalar(scale)})
	if mask != "" {
		s = b.emit(out+".biased", "Add", []string{s, mask})
	}
	ar := b.emit(out+".range", "Range", []string{b.scalarI64(0), b.emit(out+".n", "Squeeze", []string{b.shapeOf(q, 2, 3)}), b.scalarI64(1)})
	rows := b.emit(out+".rows", "Unsqueeze", []string{ar, b.constI64(1)})
	keep := b.emit(out+".keep", "LessOrEqual", []string{ar, rows})
	s = b.emit(out+".causal", "Where", []string{keep, s, b.scalar(float32(math.Inf(-1)))})
	return b.emitTo(out, "MatMul", []string{b.softmax(s, b.fresh(out+".probs")), val})
}

// kvDecodeAttention writes the new key and value into slot position_ids of
// the cache and attends to slots 0..position_ids.
func (b *builder) kvDecodeAttention(i int, q, key, val, bias string, scale float32, out string) string {
	k := b.kv
	if k.slot == "" {
		// [S] slot indices; slot [B,1,S,1] marks the new token's slot,
		// valid [B,1,S] the slots it attends to.
		s := b.shapeOf(PastKeyName(0), 2, 3)
		k.pastLen = s
		ar := b.emit("cache.slots", "Range", []string{b.scalarI64(0), b.emit("cache.len", "Squeeze", []string{s}), b.scalarI64(1)})
		k.slot = b.emit("cache.write", "Unsqueeze", []string{b.emit("cache.is_new", "Equal", []string{ar, PositionIDsName}), b.constI64(1, 3)})
		k.valid = b.emit("cache.valid", "Unsqueeze", []string{b.emit("cache.le", "LessOrEqual", []string{ar, PositionIDsName}), b.constI64(1)})
	}
	pk := b.emitTo(PresentKeyName(i), "Where", []string{k.slot, key, PastKeyName(i)})
	pv := b.emitTo(PresentValueName(i), "Where", []string{k.slot, val, PastValueName(i)})
	ninf := b.scalar(float32(math.Inf(-1)))
	var mask string
	if bias != "" {
		rows := b.emit(out+".bias_row", "Gather", []string{bias, PositionIDsName}, attrInt("axis", 0)) // [B,1,T]
		rows = b.emit(out+".bias_cols", "Slice", []string{rows, b.constI64(0), k.pastLen, b.constI64(2)})
		mask = b.emit(out+".mask3", "Where", []string{k.valid, rows, ninf})
		mask = b.emit(out+".mask", "Unsqueeze", []string{mask, b.constI64(1)})
	} else {
		if k.zeroMask == "" {
			m := b.emit("cache.mask3", "Where", []string{k.valid, b.scalar(0), ninf})
			k.zeroMask = b.emit("cache.mask", "Unsqueeze", []string{m, b.constI64(1)})
		}
		mask = k.zeroMask
	}
	return b.maskedAttention(q, pk, pv, mask, scale, out)
}

// maskedAttention is softmax(scale·q·kᵀ + mask)·v, the additive mask
// broadcast over the heads.
func (b *builder) maskedAttention(q, key, val, mask string, scale float32, out string) string {
	if b.useAttentionOp() {
		return b.emitTo(out, "Attention", []string{q, key, val, mask}, attrFloat("scale", scale), attrInt("is_causal", 0))
	}
	s := b.emit(out+".scores", "MatMul", []string{q, b.swapLast(key, 4)})
	s = b.emit(out+".scaled", "Mul", []string{s, b.scalar(scale)})
	s = b.emit(out+".masked", "Add", []string{s, mask})
	return b.emitTo(out, "MatMul", []string{b.softmax(s, b.fresh(out+".probs")), val})
}

// lowerLive lowers the nodes of g that out depends on, in graph order, and
// returns out's name; prefix starts the error of a node that fails.
func (b *builder) lowerLive(g *ir.Graph, out *ir.Value, prefix string) (string, error) {
	live := liveNodes(g, out)
	for _, n := range g.Nodes {
		if !live[n] {
			continue
		}
		if err := b.lowerNode(n); err != nil {
			return "", fmt.Errorf("%s%s node %d: %w", prefix, n.Op, n.ID, err)
		}
	}
	name, err := b.value(out)
	if err != nil {
		return "", fmt.Errorf("onnx: output: %w", err)
	}
	return name, nil
}
