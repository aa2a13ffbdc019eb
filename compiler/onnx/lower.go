// Package onnx lowers an inference ir.Graph to an ONNX model (the protobuf
// types of compiler/onnx/onnxpb), writes and reads model files, and
// summarises them for `rpac inspect`.
//
// The exported graph has one input, "input_ids" int64 [B,T], and one output,
// "logits" float [B,T,V]. Params, Buffers and Consts become initializers;
// weights used as the W of a Linear are stored pre-transposed ([K,N]) so that
// onnxruntime's MatMul reads them without a transpose at run time. Every
// forward op of ir.Ops that is not training-only has a lowering here (see
// lowerings in ops.go); each one follows the op's Doc string.
package onnx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/internal/enum"
	"github.com/rpac-dev/rpac/ir"
)

// Defaults of Options.
const (
	DefaultOpset = 23
	// MinOpset is the oldest opset the lowering targets: ReduceMean takes its
	// axes as an input from opset 18 on, LayerNormalization exists from 17.
	MinOpset = 18
	// MaxOpset is the newest opset onnxruntime 1.30 loads.
	MaxOpset = 26
	// MaxIRVersion is the newest IR version onnxruntime 1.30 loads.
	MaxIRVersion = 13

	InputName  = "input_ids"
	OutputName = "logits"
)

// GELU lowering modes.
const (
	GELUAuto = ""    // Gelu op when the opset has it (20+), else the Erf form
	GELUOp   = "op"  // ONNX Gelu (opset 20+), approximate="none"
	GELUErf  = "erf" // 0.5·x·(1+Erf(x/√2)); onnxruntime fuses it into its own Gelu kernel
)

// Options control the lowering.
type Options struct {
	// Opset is the ai.onnx opset version (default 23, range 18..26).
	Opset int64
	// IRVersion is the ONNX IR version (default: the one that shipped with
	// the opset, at most 13).
	IRVersion int64
	// Metadata becomes the model's metadata_props.
	Metadata map[string]string
	// ProducerName and ProducerVersion fill the model's producer fields
	// (default "rpac" and "").
	ProducerName    string
	ProducerVersion string
	// GraphName names the ONNX graph (default: the ir graph's name).
	GraphName string
	// GELU selects the GELU lowering (GELUAuto, GELUOp, GELUErf).
	GELU string
	// GuardSoftmax makes Softmax exact for rows that are entirely -Inf (the
	// ir op gives zeros there, ONNX Softmax gives NaN) at the cost of a
	// ReduceMax, Equal and Where per Softmax. Rows of the exported models are
	// never all -Inf (CausalMask keeps the diagonal), so it is off by default.
	GuardSoftmax bool
	// Quantize selects the precision of the Linear layers' products:
	// QuantizeNone (fp32) or QuantizeInt8 (int8 weights per output column,
	// int8 activations per token, int32 accumulation: MatMulInteger, which
	// onnxruntime's CPU provider runs on its integer GEMM).
	Quantize Quantize
	// Precision is the type of weights and activations (ir.FP32 by default,
	// ir.FP16, ir.BF16; see ConvertPrecision).
	Precision ir.Precision
}

// Quantize is the precision of the Linear layers' products (rpac export
// --quantize; "quantize" in metadata and provenance).
type Quantize uint8

// Quantization modes.
const (
	QuantizeNone Quantize = iota // fp32 products
	QuantizeInt8                 // int8 products, int32 accumulation
)

var quantizeNames = enum.Names[Quantize]{"none", "int8"}

func (q Quantize) String() string { return quantizeNames.String("quantize", q) }

// ParseQuantize reads --quantize: none or int8.
func ParseQuantize(s string) (Quantize, error) { return quantizeNames.Parse("--quantize", s) }

// MarshalText writes the mode's spelling.
func (q Quantize) MarshalText() ([]byte, error) { return quantizeNames.Marshal("quantize", q) }

// UnmarshalText reads the mode's spelling.
func (q *Quantize) UnmarshalText(b []byte) error { return quantizeNames.Unmarshal("quantize", q, b) }

// irVersionFor is the IR version released together with an opset.
func irVersionFor(opset int64) int64 {
	switch {
	case opset <= 18:
		return 8
	case opset <= 20:
		return 9
	case opset <= 22:
		return 10
	default:
		return 11
	}
}

func (o Options) withDefaults() (Options, error) {
	if o.Opset == 0 {
		o.Opset = DefaultOpset
	}
	if o.Opset < MinOpset || o.Opset > MaxOpset {
		return o, fmt.Errorf("onnx: opset %d is outside the supported range %d..%d", o.Opset, MinOpset, MaxOpset)
	}
	if o.IRVersion == 0 {
		o.IRVersion = irVersionFor(o.Opset)
	}
	if o.IRVersion < 8 || o.IRVersion > MaxIRVersion {
		return o, fmt.Errorf("onnx: IR version %d is outside the supported range 8..%d", o.IRVersion, MaxIRVersion)
	}
	if o.ProducerName == "" {
		o.ProducerName = "rpac"
	}
	switch o.GELU {
	case GELUAuto:
		if o.Opset >= 20 {
			o.GELU = GELUOp
		} else {
			o.GELU = GELUErf
		}
	case GELUOp:
		if o.Opset < 20 {
			return o, fmt.Errorf("onnx: the Gelu op needs opset 20 or newer (have %d); use GELU %q", o.Opset, GELUErf)
		}
	case GELUErf:
	default:
		return o, fmt.Errorf("onnx: unknown GELU mode %q (want %q or %q)", o.GELU, GELUOp, GELUErf)
	}
	if o.Quantize > QuantizeInt8 {
		return o, fmt.Errorf("onnx: quantization %v: want %s", o.Quantize, quantizeNames.List())
	}
	return o, nil
}

// WeightFunc supplies the data of a Param, Buffer or Const (row-major, the
// value's shape). Consts that carry their own Data do not call it.
type WeightFunc func(v *ir.Value) ([]float32, error)

// Lower converts an inference graph to an ONNX model. The graph must have an
// Input "input_ids" (i32 [B,T]) and an output "logits" ([B,T,V], or [B·T,V]
// which is reshaped); it must pass ir.Verify in export mode, so a graph that
// still holds Dropout, GumbelNoise or a training-only buffer is rejected.
// Only the nodes that logits depends on are lowered.
func Lower(g *ir.Graph, weights WeightFunc, opts Options) (*onnxpb.ModelProto, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, errors.New("onnx: nil graph")
	}
	if err := ir.Verify(g, true); err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	ids := g.Lookup(InputName)
	if ids == nil || ids.Kind != ir.Input {
		return nil, fmt.Errorf("onnx: graph %s has no input %q", g.Name, InputName)
	}
	if ids.DType != ir.I32 || len(ids.Shape) != 2 {
		return nil, fmt.Errorf("onnx: input %q is %s%v, want i32 [B,T]", InputName, ids.DType, ids.Shape)
	}
	out := g.Outputs[OutputName]
	if out == nil {
		return nil, fmt.Errorf("onnx: graph %s has no output %q", g.Name, OutputName)
	}
	B, T := ids.Shape[0], ids.Shape[1]
	var V int
	switch {
	case len(out.Shape) == 3 && out.Shape[0] == B && out.Shape[1] == T:
		V = out.Shape[2]
	case len(out.Shape) == 2 && out.Shape[0] == B*T:
		V = out.Shape[1]
	default:
		return nil, fmt.Errorf("onnx: output %q has shape %v, want [%d,%d,V] or [%d,V]", OutputName, out.Shape, B, T, B*T)
	}
	if out.DType != ir.F32 {
		return nil, fmt.Errorf("onnx: output %q is %s, want f32", OutputName, out.DType)
	}

	b := newBuilder(g, weights, opts)
	b.reserve(InputName)
	b.reserve(OutputName)
	b.names[ids] = InputName
	b.gp.Input = append(b.gp.Input, valueInfo(InputName, onnxpb.TensorProto_INT64, []int64{int64(B), int64(T)}))

	// The node producing logits writes "logits" directly when the shapes
	// agree and the value is not an alias (StopGradient) of another one.
	reshapeOut := len(out.Shape) == 2
	if !reshapeOut && out.Kind == ir.Intermediate && out.Def.Op != ir.OpStopGradient {
		b.final = out
	}

	name, err := b.lowerLive(g, out, "onnx: ")
	if err != nil {
		return nil, err
	}
	switch {
	case reshapeOut:
		b.emitTo(OutputName, "Reshape", []string{name, b.constI64(int64(B), int64(T), int64(V))})
	case name != OutputName:
		b.emitTo(OutputName, "Identity", []string{name})
	}
	b.gp.Output = append(b.gp.Output, valueInfo(OutputName, onnxpb.TensorProto_FLOAT, []int64{int64(B), int64(T), int64(V)}))

	m := b.model()
	if err := ConvertPrecision(m, opts.Precision); err != nil {
		return nil, err
	}
	return m, nil
}

// newBuilder returns a builder for lowering g.
func newBuilder(g *ir.Graph, weights WeightFunc, opts Options) *builder {
	b := &builder{
		g:       g,
		opts:    opts,
		weights: weights,
		gp:      &onnxpb.GraphProto{Name: opts.GraphName},
		used:    map[string]bool{},
		names:   map[*ir.Value]string{},
		inits:   map[*ir.Value]string{},
		initsT:  map[*ir.Value]string{},
		initsQ:  map[*ir.Value][2]string{},
		consts:  map[string]string{},
		uses:    g.Uses(),
	}
	if b.gp.Name == "" {
		b.gp.Name = g.Name
	}
	if b.gp.Name == "" {
		b.gp.Name = "rpac"
	}
	return b
}

// model wraps the lowered graph in a ModelProto with the options' opset,
// producer and metadata.
func (b *builder) model() *onnxpb.ModelProto {
	opts := b.opts
	m := &onnxpb.ModelProto{
		IrVersion:       opts.IRVersion,
		OpsetImport:     append([]*onnxpb.OperatorSetIdProto{{Domain: "", Version: opts.Opset}}, b.extraOpsets()...),
		ProducerName:    opts.ProducerName,
		ProducerVersion: opts.ProducerVersion,
		Graph:           b.gp,
	}
	keys := make([]string, 0, len(opts.Metadata))
	for k := range opts.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		m.MetadataProps = append(m.MetadataProps, &onnxpb.StringStringEntryProto{Key: k, Value: opts.Metadata[k]})
	}
	return m
}

// liveNodes marks the nodes that out depends on.
func liveNodes(g *ir.Graph, out *ir.Value) map[*ir.Node]bool {
	live := map[*ir.Node]bool{}
	stack := []*ir.Value{out}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if v.Def == nil || live[v.Def] {
			continue
		}
		live[v.Def] = true
		stack = append(stack, v.Def.Inputs...)
	}
	return live
}

type builder struct {
	g       *ir.Graph
	opts    Options
	weights WeightFunc
	gp      *onnxpb.GraphProto

	used   map[string]bool         // ONNX names taken
	names  map[*ir.Value]string    // lowered name of each ir value
	inits  map[*ir.Value]string    // initializer holding a Param/Buffer/Const as is
	initsT map[*ir.Value]string    // [K,N] form of a Linear weight
	initsQ map[*ir.Value][2]string // int8 [K,N] form and per-column scales
	consts map[string]string       // small constants by content
	uses   map[*ir.Value][]*ir.Node
	final  *ir.Value // the value that is written as "logits" directly
	nodeID int
	kv     *kvState // set by LowerKV: the KV-cache graphs' lowerings
	// domains are the operator sets besides ai.onnx the nodes use.
	domains map[string]int64
}

func (b *builder) reserve(name string) { b.used[name] = true }

// fresh returns an unused ONNX name based on base.
func (b *builder) fresh(base string) string {
	if base == "" {
		base = "t"
	}
	if !b.used[base] {
		b.used[base] = true
		return base
	}
	for i := 1; ; i++ {
		n := fmt.Sprintf("%s_%d", base, i)
		if !b.used[n] {
			b.used[n] = true
			return n
		}
	}
}

// outName is the ONNX name for an ir node output.
func (b *builder) outName(v *ir.Value) string {
	if v == b.final {
		return OutputName
	}
	if v.Name != "" {
		return b.fresh(v.Name)
	}
	return b.fresh(fmt.Sprintf("v%d", v.ID))
}

// emit adds a node with a fresh output name derived from hint.
func (b *builder) emit(hint, op string, in []string, attrs ...*onnxpb.AttributeProto) string {
	return b.emitTo(b.fresh(hint), op, in, attrs...)
}

// emitTo adds a node writing the given (already reserved) output name.
func (b *builder) emitTo(out, op string, in []string, attrs ...*onnxpb.AttributeProto) string {
	b.nodeID++
	b.gp.Node = append(b.gp.Node, &onnxpb.NodeProto{
		Name:      fmt.Sprintf("%s_%d", op, b.nodeID),
		OpType:    op,
		Input:     in,
		Output:    []string{out},
		Attribute: attrs,
	})
	return out
}

// emitN adds a node with several outputs.
func (b *builder) emitN(hint, op string, in []string, nout int, attrs ...*onnxpb.AttributeProto) []string {
	outs := make([]string, nout)
	for i := range outs {
		outs[i] = b.fresh(fmt.Sprintf("%s_%d", hint, i))
	}
	b.nodeID++
	b.gp.Node = append(b.gp.Node, &onnxpb.NodeProto{
		Name:      fmt.Sprintf("%s_%d", op, b.nodeID),
		OpType:    op,
		Input:     in,
		Output:    outs,
		Attribute: attrs,
	})
	return outs
}

// value returns the ONNX name of an ir value, materialising initializers
// for Params, Buffers and Consts on first use.
func (b *builder) value(v *ir.Value) (string, error) {
	if n, ok := b.names[v]; ok {
		return n, nil
	}
	switch v.Kind {
	case ir.Param, ir.Buffer, ir.Const:
		data, err := b.data(v)
		if err != nil {
			return "", err
		}
		name := b.fresh(initName(v))
		b.addInit(name, onnxpb.TensorProto_FLOAT, dims64(v.Shape), f32Bytes(data))
		b.names[v] = name
		b.inits[v] = name
		return name, nil
	case ir.Input:
		return "", fmt.Errorf("graph input %s is not %q; an inference graph reads only token ids", v, InputName)
	default:
		return "", fmt.Errorf("value %s is used before it is defined", v)
	}
}

func initName(v *ir.Value) string {
	if v.Name != "" {
		return v.Name
	}
	return fmt.Sprintf("const%d", v.ID)
}

// data fetches the float32 data of a Param, Buffer or Const.
func (b *builder) data(v *ir.Value) ([]float32, error) {
	if v.Kind == ir.Const && v.Data != nil {
		out := make([]float32, len(v.Data))
		for i, x := range v.Data {
			out[i] = float32(x)
		}
		return out, nil
	}
	if b.weights == nil {
		return nil, fmt.Errorf("no weight data for %s %s (nil weights callback)", v.Kind, v)
	}
	d, err := b.weights(v)
	if err != nil {
		return nil, fmt.Errorf("weights for %s: %w", v, err)
	}
	if len(d) != v.Shape.Numel() {
		return nil, fmt.Errorf("weights for %s: %d values for shape %v", v, len(d), v.Shape)
	}
	return d, nil
}

// linearWeight returns the ONNX name of W[N,K] in [K,N] layout. A Param,
// Buffer or Const read only as a Linear weight is stored transposed; one
// that is read elsewhere too (a tied embedding) is stored once as [N,K] and
// transposed by a Transpose node, which onnxruntime folds into a constant
// when it loads the session, so the file holds the weight once.
func (b *builder) linearWeight(w *ir.Value) (string, error) {
	if n, ok := b.initsT[w]; ok {
		return n, nil
	}
	if w.Kind != ir.Intermediate && w.Kind != ir.Input && b.onlyLinearWeight(w) {
		data, err := b.data(w)
		if err != nil {
			return "", err
		}
		N, K := w.Shape[0], w.Shape[1]
		t := make([]float32, len(data))
		for n := 0; n < N; n++ {
			row := data[n*K : (n+1)*K]
			for k, x := range row {
				t[k*N+n] = x
			}
		}
		name := b.fresh(initName(w) + ".T")
		b.addInit(name, onnxpb.TensorProto_FLOAT, []int64{int64(K), int64(N)}, f32Bytes(t))
		b.initsT[w] = name
		return name, nil
	}
	x, err := b.value(w)
	if err != nil {
		return "", err
	}
	name := b.emit(x+".T", "Transpose", []string{x}, attrInts("perm", 1, 0))
	b.initsT[w] = name
	return name, nil
}

func (b *builder) onlyLinearWeight(w *ir.Value) bool {
	for _, n := range b.uses[w] {
		if n.Op != ir.OpLinear {
			return false
		}
		for i, in := range n.Inputs {
			if in == w && i != 1 {
				return false
			}
		}
	}
	if len(b.uses[w]) == 0 {
		return false
	}
	for _, o := range b.g.Outputs {
		if o == w {
			return false
		}
	}
	return true
}

func (b *builder) addInit(name string, dt onnxpb.TensorProto_DataType, dims []int64, raw []byte) {
	b.gp.Initializer = append(b.gp.Initializer, &onnxpb.TensorProto{
		Name:     name,
		DataType: int32(dt),
		Dims:     dims,
		RawData:  raw,
	})
}

// constI64 returns a 1-D int64 constant (shared by content).
func (b *builder) constI64(vals ...int64) string {
	return b.constI64Shaped([]int64{int64(len(vals))}, vals)
}

func (b *builder) constI64Shaped(dims []int64, vals []int64) string {
	key := fmt.Sprintf("i64%v%v", dims, vals)
	if n, ok := b.consts[key]; ok {
		return n
	}
	raw := make([]byte, 8*len(vals))
	for i, x := range vals {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(x))
	}
	name := b.fresh("const_i64")
	b.addInit(name, onnxpb.TensorProto_INT64, dims, raw)
	b.consts[key] = name
	return name
}

// scalar returns a rank-0 float constant (shared by value).
func (b *builder) scalar(x float32) string {
	key := fmt.Sprintf("f32:%08x", math.Float32bits(x))
	if n, ok := b.consts[key]; ok {
		return n
	}
	name := b.fresh("const_f32")
	b.addInit(name, onnxpb.TensorProto_FLOAT, []int64{}, f32Bytes([]float32{x}))
	b.consts[key] = name
	return name
}

// boolConst returns a bool constant of the given shape.
func (b *builder) boolConst(hint string, dims []int64, vals []bool) string {
	var sb strings.Builder
	for _, v := range vals {
		if v {
			sb.WriteByte('1')
		} else {
			sb.WriteByte('0')
		}
	}
	key := fmt.Sprintf("bool%v:%s", dims, sb.String())
	if n, ok := b.consts[key]; ok {
		return n
	}
	raw := make([]byte, len(vals))
	for i, v := range vals {
		if v {
			raw[i] = 1
		}
	}
	name := b.fresh(hint)
	b.addInit(name, onnxpb.TensorProto_BOOL, dims, raw)
	b.consts[key] = name
	return name
}

func f32Bytes(d []float32) []byte {
	raw := make([]byte, 4*len(d))
	for i, x := range d {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
	}
	return raw
}

func dims64(s ir.Shape) []int64 {
	out := make([]int64, len(s))
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

func valueInfo(name string, dt onnxpb.TensorProto_DataType, dims []int64) *onnxpb.ValueInfoProto {
	shape := &onnxpb.TensorShapeProto{}
	for _, d := range dims {
		shape.Dim = append(shape.Dim, &onnxpb.TensorShapeProto_Dimension{
			Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d},
		})
	}
	return &onnxpb.ValueInfoProto{
		Name: name,
		Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{TensorType: &onnxpb.TypeProto_Tensor{
			ElemType: int32(dt),
			Shape:    shape,
		}}},
	}
}

func attrInt(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INT, I: v}
}

func attrInts(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INTS, Ints: v}
}

func attrFloat(name string, v float32) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_FLOAT, F: v}
}

func attrString(name, v string) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_STRING, S: []byte(v)}
}

func attrTensor(name string, t *onnxpb.TensorProto) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_TENSOR, T: t}
}
