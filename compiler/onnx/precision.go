package onnx

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// elemType is the ONNX element type of p (float32 unless p is reduced).
func elemType(p ir.Precision) onnxpb.TensorProto_DataType {
	switch p {
	case ir.FP16:
		return onnxpb.TensorProto_FLOAT16
	case ir.BF16:
		return onnxpb.TensorProto_BFLOAT16
	}
	return onnxpb.TensorProto_FLOAT
}

// Ops of a reduced-precision graph by how they compute.
var (
	// lowOps run in the reduced type: the products, the attention core
	// and the elementwise activations between them.
	lowOps = map[string]bool{"MatMul": true, "Gemm": true, "Attention": true, "Gelu": true, "Relu": true, "Gather": true}
	// followOps run in the type of their activation inputs: reduced when
	// one of them is, float32 otherwise (data movement, and elementwise
	// arithmetic whose result goes where its input came from).
	followOps = map[string]bool{"Add": true, "Sub": true, "Mul": true, "Div": true, "Max": true, "Min": true,
		"Where": true, "Clip": true, "Neg": true, "Abs": true, "Reshape": true, "Transpose": true, "Slice": true,
		"Expand": true, "Concat": true, "Identity": true, "Unsqueeze": true, "Squeeze": true}
	// Every other op (LayerNormalization, Softmax, reductions, Exp, Log,
	// Sigmoid, Sqrt, Erf, TopK, the membership and Sinkhorn arithmetic)
	// reads float32.
)

// LowPrecisionNote is the manifest's description of a reduced-precision
// export's inputs, outputs and float32 islands.
const LowPrecisionNote = "input_ids int64 [B,T]; logits float32 [B,T,V] (cast from the reduced type at the end); " +
	"MatMul, Attention (its float mask included), Gather, Gelu/Relu and the elementwise ops between them in the reduced type; " +
	"LayerNormalization, Softmax, reductions, Exp/Log/Sigmoid/Sqrt/Erf (the membership, gates and router) in float32"

// ConvertPrecision rewrites a float32 model (as Lower writes it) to run
// in p: initializers that reduced-precision ops read are stored in p (a
// float32 copy stays when float32 ops read them too), Cast nodes are put
// where a value crosses between float32 and p, and the output "logits"
// stays float32. ir.FP32 (or ir.PrecisionDefault) leaves m as it is. A model with int8 products is
// refused.
func ConvertPrecision(m *onnxpb.ModelProto, p ir.Precision) error {
	if p.Or(ir.FP32) == ir.FP32 {
		return nil
	}
	if !p.Reduced() {
		return fmt.Errorf("onnx: precision %s: want fp16 or bf16", p)
	}
	g := m.Graph
	low := elemType(p)
	fl := onnxpb.TensorProto_FLOAT
	types := map[string]onnxpb.TensorProto_DataType{}
	inits := map[string]*onnxpb.TensorProto{}
	for _, in := range g.Input {
		types[in.Name] = onnxpb.TensorProto_INT64
	}
	for _, t := range g.Initializer {
		inits[t.Name] = t
		types[t.Name] = onnxpb.TensorProto_DataType(t.DataType)
	}
	isFloat := func(t onnxpb.TensorProto_DataType) bool { return t == fl || t == low }
	used := map[string]bool{}
	for name := range types {
		used[name] = true
	}
	for _, n := range g.Node {
		for _, o := range n.Output {
			used[o] = true
		}
	}
	fresh := func(base string) string {
		for i := 0; ; i++ {
			s := base
			if i > 0 {
				s = fmt.Sprintf("%s_%d", base, i)
			}
			if !used[s] {
				used[s] = true
				return s
			}
		}
	}
	lowInit := map[string]string{} // float32 initializer -> its copy in p
	casts := map[[2]string]string{}
	var nodes []*onnxpb.NodeProto
	// as returns a name holding tensor name in type want.
	as := func(name string, want onnxpb.TensorProto_DataType) string {
		if types[name] == want || !isFloat(types[name]) {
			return name
		}
		if t := inits[name]; t != nil && want == low {
			if c, ok := lowInit[name]; ok {
				return c
			}
			c := fresh(name + "." + p.String())
			inits[c] = &onnxpb.TensorProto{Name: c, DataType: int32(low), Dims: t.Dims, RawData: encodeHalf(floatsOf(t), p)}
			types[c] = low
			lowInit[name] = c
			return c
		}
		key := [2]string{name, fmt.Sprint(want)}
		if c, ok := casts[key]; ok {
			return c
		}
		c := fresh(name + ".cast")
		nodes = append(nodes, &onnxpb.NodeProto{Name: "Cast_" + c, OpType: "Cast", Input: []string{name}, Output: []string{c},
			Attribute: []*onnxpb.AttributeProto{attrInt("to", int64(want))}})
		types[c] = want
		casts[key] = c
		return c
	}
	readers := map[string][]*onnxpb.NodeProto{}
	for _, n := range g.Node {
		for _, in := range n.Input {
			readers[in] = append(readers[in], n)
		}
	}
	// A data-movement op on initializers only (the transposed weight of a
	// tied head) runs in the reduced type when only reduced ops read it,
	// so the file stores the weight once, reduced.
	feedsLowOnly := func(n *onnxpb.NodeProto) bool {
		for _, o := range n.Output {
			if len(readers[o]) == 0 {
				return false
			}
			for _, r := range readers[o] {
				if !lowOps[r.OpType] {
					return false
				}
			}
		}
		return true
	}
	for _, n := range g.Node {
		switch n.OpType {
		case "MatMulInteger", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear":
			return fmt.Errorf("onnx: a model with int8 products (%s) cannot also be converted to %s", n.OpType, p)
		}
		want := fl
		switch {
		case lowOps[n.OpType]:
			want = low
		case followOps[n.OpType]:
			onlyInits := true
			for _, in := range n.Input {
				if inits[in] == nil && isFloat(types[in]) {
					onlyInits = false
				}
				if inits[in] == nil && types[in] == low {
					want = low
				}
			}
			if onlyInits && feedsLowOnly(n) {
				want = low
			}
		}
		for i, in := range n.Input {
			if in == "" || (n.OpType == "Gather" && i == 1) {
				continue
			}
			n.Input[i] = as(in, want)
		}
		nodes = append(nodes, n)
		for i, o := range n.Output {
			types[o] = outType(n, i, types, want)
		}
	}
	if types[OutputName] != fl {
		for _, n := range nodes {
			for i, o := range n.Output {
				if o == OutputName {
					n.Output[i] = fresh(OutputName + "." + p.String())
					types[n.Output[i]] = types[OutputName]
					nodes = append(nodes, &onnxpb.NodeProto{Name: "Cast_" + OutputName, OpType: "Cast", Input: []string{n.Output[i]},
						Output: []string{OutputName}, Attribute: []*onnxpb.AttributeProto{attrInt("to", int64(fl))}})
				}
			}
		}
	}
	g.Node = nodes
	// Initializers: the reduced copies join; a float32 one that no node
	// reads any more goes, unless its reduced copy replaced it.
	reads := map[string]bool{}
	for _, n := range nodes {
		for _, in := range n.Input {
			reads[in] = true
		}
	}
	var out []*onnxpb.TensorProto
	for _, t := range g.Initializer {
		if reads[t.Name] {
			out = append(out, t)
		}
	}
	for _, t := range g.Initializer {
		if c, ok := lowInit[t.Name]; ok && reads[c] {
			out = append(out, inits[c])
		}
	}
	g.Initializer = out
	return nil
}

// outType is the element type of output i of n, whose float inputs were
// made want.
func outType(n *onnxpb.NodeProto, i int, types map[string]onnxpb.TensorProto_DataType, want onnxpb.TensorProto_DataType) onnxpb.TensorProto_DataType {
	switch n.OpType {
	case "Cast":
		for _, a := range n.Attribute {
			if a.Name == "to" {
				return onnxpb.TensorProto_DataType(a.I)
			}
		}
	case "Equal", "Less", "Greater", "Not", "And", "Or", "IsNaN", "IsInf":
		return onnxpb.TensorProto_BOOL
	case "Shape", "Size":
		return onnxpb.TensorProto_INT64
	case "TopK":
		if i == 1 {
			return onnxpb.TensorProto_INT64
		}
	case "ConstantOfShape":
		for _, a := range n.Attribute {
			if a.Name == "value" && a.T != nil {
				return onnxpb.TensorProto_DataType(a.T.DataType)
			}
		}
		return onnxpb.TensorProto_FLOAT
	}
	for _, in := range n.Input {
		if t := types[in]; t == onnxpb.TensorProto_FLOAT || t == onnxpb.TensorProto_FLOAT16 || t == onnxpb.TensorProto_BFLOAT16 {
			return t
		}
	}
	if len(n.Input) > 0 {
		return types[n.Input[0]]
	}
	return want
}

// floatsOf decodes a float32 initializer.
func floatsOf(t *onnxpb.TensorProto) []float32 {
	if len(t.FloatData) > 0 {
		return t.FloatData
	}
	out := make([]float32, len(t.RawData)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.RawData[4*i:]))
	}
	return out
}

// encodeHalf encodes x in p, little-endian, rounding to nearest even.
func encodeHalf(x []float32, p ir.Precision) []byte {
	out := make([]byte, 2*len(x))
	for i, v := range x {
		var h uint16
		if p == ir.BF16 {
			h = BF16Bits(v)
		} else {
			h = FP16Bits(v)
		}
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
	return out
}

// BF16Bits rounds x to bfloat16 (nearest, ties to even; NaN stays NaN).
func BF16Bits(x float32) uint16 {
	b := math.Float32bits(x)
	if x != x {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// FP16Bits rounds x to IEEE half precision (nearest, ties to even;
// overflow to ±Inf, underflow through the subnormals to ±0).
func FP16Bits(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int((b >> 23) & 0xff)
	man := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf, NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // beyond the largest half
		return sign | 0x7c00
	case exp-127 >= -14: // normal half
		e := uint32(exp-127+15) << 10
		v := e | man>>13
		rest := man & 0x1fff
		if rest > 0x1000 || rest == 0x1000 && v&1 == 1 {
			v++ // may carry into the exponent, up to Inf: still correct
		}
		return sign | uint16(v)
	case exp-127 >= -25: // subnormal half
		m := man | 0x800000
		shift := uint(-(exp - 127) - 14 + 13)
		v := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || rest == half && v&1 == 1 {
			v++
		}
		return sign | uint16(v)
	}
	return sign
}

// FP16Float and BF16Float decode the two half-width types.
func FP16Float(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := int(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		v := float32(man) / 1024 / 16384 // man·2^-24
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | uint32(exp-15+127)<<23 | man<<13)
}

// BF16Float decodes a bfloat16.
func BF16Float(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
