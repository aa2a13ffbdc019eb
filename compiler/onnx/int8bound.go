package onnx

import (
	"fmt"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
)

// Limits of the integer sums inside onnxruntime's uint8 × int8 CPU kernels.
const (
	// int16PairMax is the largest pair sum a₀w₀ + a₁w₁ that the saturating
	// int16 step of the AVX2 / AVX-512BW kernels (no VNNI) holds exactly.
	int16PairMax = 1<<15 - 1
	// int32SumMax is the largest row sum Σₖ aₖwₖ an int32 accumulator holds.
	int32SumMax = 1<<31 - 1
	// uint8Max is the largest quantized activation.
	uint8Max = 255
)

// Int8Product is the bound proven for one MatMulIntegerToFloat node.
type Int8Product struct {
	Node string
	// K is the reduction length, WeightMax the largest |w| of its int8
	// weights and ActMax the largest quantized activation it can read.
	K, WeightMax, ActMax int
	// PairMax = 2·ActMax·WeightMax bounds the int16 pair sum; RowMax =
	// K·ActMax·WeightMax bounds the int32 row sum.
	PairMax, RowMax int64
}

// CheckInt8Bound proves, for every integer product of an exported graph,
// that no onnxruntime CPU kernel can overflow an intermediate sum: the
// int16 pair sum of the kernels without VNNI (2·a·|w| ≤ 32,767 for every
// activation a ≤ 255 and weight w of the initializer), and the int32 row
// sum of every kernel (K·255·max|w| < 2³¹). Kernels that first move the
// activations to int8 (a − 128) have smaller products still. It reads the
// weights themselves, not the exporter's settings, so a graph from any
// writer can be checked. It returns one entry per product, or an error
// naming the first node that could overflow or whose weights are not a
// constant int8 initializer.
func CheckInt8Bound(m *onnxpb.ModelProto) ([]Int8Product, error) {
	inits := map[string]*onnxpb.TensorProto{}
	for _, t := range m.GetGraph().GetInitializer() {
		inits[t.Name] = t
	}
	var out []Int8Product
	for _, n := range m.GetGraph().GetNode() {
		if n.OpType != "MatMulIntegerToFloat" && n.OpType != "MatMulInteger" {
			continue
		}
		p, err := int8Product(n, inits)
		if err != nil {
			return out, fmt.Errorf("onnx: integer product %s: %w", n.Name, err)
		}
		if p.PairMax > int16PairMax {
			return out, fmt.Errorf("onnx: integer product %s: weights up to ±%d against activations up to %d give pair sums up to %d, past int16 (%d): onnxruntime's kernels without VNNI saturate; quantize the weights to ±%d",
				n.Name, p.WeightMax, p.ActMax, p.PairMax, int16PairMax, Int8WeightMax)
		}
		if p.RowMax > int32SumMax {
			return out, fmt.Errorf("onnx: integer product %s: K=%d gives row sums up to %d, past int32", n.Name, p.K, p.RowMax)
		}
		out = append(out, p)
	}
	return out, nil
}

// int8Product reads the weight range and reduction length of one product.
func int8Product(n *onnxpb.NodeProto, inits map[string]*onnxpb.TensorProto) (Int8Product, error) {
	p := Int8Product{Node: n.Name, ActMax: uint8Max}
	if len(n.Input) < 2 {
		return p, fmt.Errorf("%d inputs", len(n.Input))
	}
	w, ok := inits[n.Input[1]]
	if !ok {
		return p, fmt.Errorf("weights %q are not an initializer", n.Input[1])
	}
	if onnxpb.TensorProto_DataType(w.DataType) != onnxpb.TensorProto_INT8 {
		return p, fmt.Errorf("weights %q are %s, not int8", w.Name, ElemTypeName(w.DataType))
	}
	if len(w.Dims) != 2 {
		return p, fmt.Errorf("weights %q have shape %v, want [K, N]", w.Name, w.Dims)
	}
	raw := w.RawData
	if int64(len(raw)) != w.Dims[0]*w.Dims[1] {
		if len(w.Int32Data) == 0 {
			return p, fmt.Errorf("weights %q hold %d bytes for shape %v", w.Name, len(raw), w.Dims)
		}
		raw = nil // int8 stored widened in int32_data
	}
	for _, b := range raw {
		p.WeightMax = max(p.WeightMax, absInt(int(int8(b))))
	}
	for _, v := range w.Int32Data {
		p.WeightMax = max(p.WeightMax, absInt(int(int8(v))))
	}
	// The weights' zero point: input 5 of MatMulIntegerToFloat, 3 of
	// MatMulInteger.
	zpIn := 5
	if n.OpType == "MatMulInteger" {
		zpIn = 3
	}
	if len(n.Input) > zpIn && n.Input[zpIn] != "" {
		zp, ok := inits[n.Input[zpIn]]
		if !ok || weightZeroPointNonZero(zp) {
			return p, fmt.Errorf("weights %q have a zero point other than a constant 0: the bound assumes symmetric weights", w.Name)
		}
	}
	p.K = int(w.Dims[0])
	p.PairMax = 2 * int64(p.ActMax) * int64(p.WeightMax)
	p.RowMax = int64(p.K) * int64(p.ActMax) * int64(p.WeightMax)
	return p, nil
}

// weightZeroPointNonZero reports whether an int8 zero-point initializer
// holds any nonzero value.
func weightZeroPointNonZero(t *onnxpb.TensorProto) bool {
	for _, b := range t.RawData {
		if b != 0 {
			return true
		}
	}
	for _, v := range t.Int32Data {
		if v != 0 {
			return true
		}
	}
	return false
}

func absInt(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
