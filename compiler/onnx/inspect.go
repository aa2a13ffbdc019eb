package onnx

import (
	"fmt"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
)

// Summary describes an ONNX model for `rpac inspect`.
type Summary struct {
	Graph           string
	IRVersion       int64
	Opsets          map[string]int64 // domain ("" = ai.onnx) -> version
	Producer        string
	Inputs, Outputs []TensorInfo
	Ops             map[string]int // node count per op type
	Nodes           int
	Initializers    int
	// Parameters counts the elements of the float initializers (weights,
	// folded constants); each stored tensor once, so a tied embedding
	// counts once.
	Parameters int64
	// InitializerBytes is the size of all initializer data, in the model
	// file or in external data.
	InitializerBytes int64
	ExternalData     bool
	Metadata         map[string]string
}

// TensorInfo is a graph input or output.
type TensorInfo struct {
	Name  string
	Type  string   // element type, e.g. "int64", "float"
	Shape []string // dims: a number or a symbolic name ("?" when unknown)
}

func (t TensorInfo) String() string {
	return fmt.Sprintf("%s %s[%s]", t.Name, t.Type, strings.Join(t.Shape, ","))
}

var elemNames = map[int32]string{
	int32(onnxpb.TensorProto_FLOAT): "float", int32(onnxpb.TensorProto_UINT8): "uint8",
	int32(onnxpb.TensorProto_INT8): "int8", int32(onnxpb.TensorProto_UINT16): "uint16",
	int32(onnxpb.TensorProto_INT16): "int16", int32(onnxpb.TensorProto_INT32): "int32",
	int32(onnxpb.TensorProto_INT64): "int64", int32(onnxpb.TensorProto_STRING): "string",
	int32(onnxpb.TensorProto_BOOL): "bool", int32(onnxpb.TensorProto_FLOAT16): "float16",
	int32(onnxpb.TensorProto_DOUBLE): "double", int32(onnxpb.TensorProto_UINT32): "uint32",
	int32(onnxpb.TensorProto_UINT64): "uint64", int32(onnxpb.TensorProto_BFLOAT16): "bfloat16",
}

var elemSizes = map[int32]int64{
	int32(onnxpb.TensorProto_FLOAT): 4, int32(onnxpb.TensorProto_UINT8): 1,
	int32(onnxpb.TensorProto_INT8): 1, int32(onnxpb.TensorProto_UINT16): 2,
	int32(onnxpb.TensorProto_INT16): 2, int32(onnxpb.TensorProto_INT32): 4,
	int32(onnxpb.TensorProto_INT64): 8, int32(onnxpb.TensorProto_BOOL): 1,
	int32(onnxpb.TensorProto_FLOAT16): 2, int32(onnxpb.TensorProto_DOUBLE): 8,
	int32(onnxpb.TensorProto_UINT32): 4, int32(onnxpb.TensorProto_UINT64): 8,
	int32(onnxpb.TensorProto_BFLOAT16): 2,
}

// ElemTypeName names an ONNX element type.
func ElemTypeName(t int32) string {
	if n, ok := elemNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type%d", t)
}

func tensorInfo(v *onnxpb.ValueInfoProto) TensorInfo {
	ti := TensorInfo{Name: v.GetName(), Type: "?"}
	tt := v.GetType().GetTensorType()
	if tt == nil {
		return ti
	}
	ti.Type = ElemTypeName(tt.GetElemType())
	for _, d := range tt.GetShape().GetDim() {
		switch x := d.GetValue().(type) {
		case *onnxpb.TensorShapeProto_Dimension_DimValue:
			ti.Shape = append(ti.Shape, fmt.Sprint(x.DimValue))
		case *onnxpb.TensorShapeProto_Dimension_DimParam:
			ti.Shape = append(ti.Shape, x.DimParam)
		default:
			ti.Shape = append(ti.Shape, "?")
		}
	}
	return ti
}

// Inspect summarises m.
func Inspect(m *onnxpb.ModelProto) Summary {
	s := Summary{
		Graph:     m.GetGraph().GetName(),
		IRVersion: m.GetIrVersion(),
		Opsets:    map[string]int64{},
		Producer:  strings.TrimSpace(m.GetProducerName() + " " + m.GetProducerVersion()),
		Ops:       map[string]int{},
		Metadata:  map[string]string{},
	}
	for _, o := range m.GetOpsetImport() {
		s.Opsets[o.GetDomain()] = o.GetVersion()
	}
	for _, e := range m.GetMetadataProps() {
		s.Metadata[e.GetKey()] = e.GetValue()
	}
	g := m.GetGraph()
	inits := map[string]bool{}
	for _, t := range g.GetInitializer() {
		inits[t.GetName()] = true
		s.Initializers++
		n := int64(1)
		for _, d := range t.GetDims() {
			n *= d
		}
		if t.GetDataType() == int32(onnxpb.TensorProto_FLOAT) {
			s.Parameters += n
		}
		s.InitializerBytes += n * elemSizes[t.GetDataType()]
		if t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
			s.ExternalData = true
		}
	}
	for _, v := range g.GetInput() {
		if !inits[v.GetName()] { // IR < 4 lists initializers as inputs
			s.Inputs = append(s.Inputs, tensorInfo(v))
		}
	}
	for _, v := range g.GetOutput() {
		s.Outputs = append(s.Outputs, tensorInfo(v))
	}
	for _, n := range g.GetNode() {
		op := n.GetOpType()
		if d := n.GetDomain(); d != "" && d != "ai.onnx" {
			op = d + "." + op
		}
		s.Ops[op]++
		s.Nodes++
	}
	return s
}

// String renders the summary as text (ops by decreasing count).
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "graph      %s\n", s.Graph)
	fmt.Fprintf(&b, "ir_version %d\n", s.IRVersion)
	domains := make([]string, 0, len(s.Opsets))
	for d := range s.Opsets {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	for _, d := range domains {
		name := d
		if name == "" {
			name = "ai.onnx"
		}
		fmt.Fprintf(&b, "opset      %s %d\n", name, s.Opsets[d])
	}
	if s.Producer != "" {
		fmt.Fprintf(&b, "producer   %s\n", s.Producer)
	}
	for _, t := range s.Inputs {
		fmt.Fprintf(&b, "input      %s\n", t)
	}
	for _, t := range s.Outputs {
		fmt.Fprintf(&b, "output     %s\n", t)
	}
	ext := ""
	if s.ExternalData {
		ext = ", external data"
	}
	fmt.Fprintf(&b, "parameters %d (%d initializers, %.1f MiB%s)\n", s.Parameters, s.Initializers, float64(s.InitializerBytes)/(1<<20), ext)
	fmt.Fprintf(&b, "nodes      %d\n", s.Nodes)
	ops := make([]string, 0, len(s.Ops))
	for op := range s.Ops {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool {
		if s.Ops[ops[i]] != s.Ops[ops[j]] {
			return s.Ops[ops[i]] > s.Ops[ops[j]]
		}
		return ops[i] < ops[j]
	})
	for _, op := range ops {
		fmt.Fprintf(&b, "  %-24s %d\n", op, s.Ops[op])
	}
	keys := make([]string, 0, len(s.Metadata))
	for k := range s.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := s.Metadata[k]
		if len(v) > 120 {
			v = v[:117] + "..."
		}
		fmt.Fprintf(&b, "meta       %s = %s\n", k, v)
	}
	return b.String()
}
