package onnx

import (
	"fmt"
	"math"
	"sort"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// lowerLinearInt8 lowers y = x·Wᵀ (+ b) with int8 products:
//
//	W → Wq int8 [K,N] with one symmetric scale per output column,
//	    ws[n] = max|W[n,:]|/Int8WeightMax, so |Wq| ≤ Int8WeightMax (64);
//	x → rows [M,K]; per row s = max(max|x_row|, 1e-12)/127 and
//	    xq = QuantizeLinear(x, s, zero point 128, axis 0) (uint8);
//	y = MatMulIntegerToFloat(xq, Wq, 1, ws, a_zero_point 128) (int32
//	    accumulation, the column scales applied as it writes floats;
//	    onnxruntime's com.microsoft domain), reshaped back without a copy,
//	    times s per row (+ b).
//
// The activation scale is per token (row), so a position's output depends
// on its own row only and the exported graph stays causal. The fused op
// saves the int32 result's Cast and one Mul over the output, and the last
// Mul writes the output in its final shape (no Reshape copy): on the LM
// head, whose output is [B·T, V], those passes cost more than the integer
// product saves.
func lowerLinearInt8(b *builder, n *ir.Node, in []string, out string) (string, error) {
	wq, ws, err := b.int8Weight(n.Inputs[1])
	if err != nil {
		return "", err
	}
	xs := n.Inputs[0].Shape
	K := xs[len(xs)-1]
	M := xs.Numel() / max(K, 1)
	x := b.emit(out+".rows", "Reshape", []string{in[0], b.constI64(int64(M), int64(K))})
	absmax := b.emit(out+".absmax", "ReduceMax", []string{b.emit(out+".abs", "Abs", []string{x}), b.constI64(1)}, attrInt("keepdims", 0))
	scale := b.emit(out+".xs", "Div", []string{b.emit(out+".amax", "Max", []string{absmax, b.scalar(1e-12)}), b.scalar(127)})
	xq := b.emit(out+".xq", "QuantizeLinear", []string{x, scale, b.uint8Fill(M, 128)}, attrInt("axis", 0))
	b.useDomain(MSDomain, 1)
	y := b.emitDomain(out+".yw", MSDomain, "MatMulIntegerToFloat", []string{xq, wq, b.scalar(1), ws, b.uint8Scalar(128)})
	os := dims64(n.Outputs[0].Shape)
	rowScale := append(append([]int64(nil), os[:len(os)-1]...), 1)
	y = b.emit(out+".y", "Reshape", []string{y, b.constI64(os...)})
	s3 := b.emit(out+".xs1", "Reshape", []string{scale, b.constI64(rowScale...)})
	if len(n.Inputs) == 3 {
		y = b.emit(out+".ys", "Mul", []string{y, s3})
		return b.emitTo(out, "Add", []string{y, in[2]}), nil
	}
	return b.emitTo(out, "Mul", []string{y, s3}), nil
}

// Int8WeightMax bounds the quantized weights: |Wq| ≤ 64 (7 bits and a
// sign), while activations use all 8 bits (uint8, zero point 128).
//
// onnxruntime's CPU kernels for uint8 × int8 differ by CPU. With AVX2 and
// no VNNI (and with AVX-512BW without VNNI) the product instruction
// multiplies adjacent pairs a₀w₀ + a₁w₁ into a *saturating* int16 before
// widening to int32, so full-range weights (|w| ≤ 127) against
// activations up to 255 overflow it (2·255·127 = 64,770 > 32,767) and give
// wrong sums with no error; VNNI (4 products into int32), arm64's dot
// product and widening kernels accumulate in int32 and cannot overflow.
// With |w| ≤ 64 a pair is at most 2·255·64 = 32,640, so every kernel
// computes the same exact integer sum (CheckInt8Bound proves it for an
// exported graph). The price is one bit of weight resolution, which the
// per-column scales make small (see docs/EXPORT.md for the measured CE).
const Int8WeightMax = 64

// MSDomain is onnxruntime's contrib operator domain.
const MSDomain = "com.microsoft"

// useDomain records that the model uses an operator set besides ai.onnx.
func (b *builder) useDomain(domain string, version int64) {
	if b.domains == nil {
		b.domains = map[string]int64{}
	}
	b.domains[domain] = max(b.domains[domain], version)
}

// emitDomain adds a node of another operator domain.
func (b *builder) emitDomain(hint, domain, op string, in []string, attrs ...*onnxpb.AttributeProto) string {
	out := b.emit(hint, op, in, attrs...)
	b.gp.Node[len(b.gp.Node)-1].Domain = domain
	return out
}

// int8Weight stores W [N,K] as Wq int8 [K,N] and its per-column scales
// [N] (once per weight).
func (b *builder) int8Weight(w *ir.Value) (wq, ws string, err error) {
	if q, ok := b.initsQ[w]; ok {
		return q[0], q[1], nil
	}
	data, err := b.data(w)
	if err != nil {
		return "", "", err
	}
	N, K := w.Shape[0], w.Shape[1]
	q, scales := QuantizeColumns(data, N, K)
	wq = b.fresh(initName(w) + ".int8")
	b.addInit(wq, onnxpb.TensorProto_INT8, []int64{int64(K), int64(N)}, q)
	ws = b.fresh(initName(w) + ".scale")
	b.addInit(ws, onnxpb.TensorProto_FLOAT, []int64{int64(N)}, f32Bytes(scales))
	b.initsQ[w] = [2]string{wq, ws}
	return wq, ws, nil
}

// QuantizeColumns quantizes W [N,K] (row-major, one row per output column
// of the product) to Wq [K,N] int8 with one symmetric scale per column:
// scale[n] = max|W[n,:]|/Int8WeightMax (1 for an all-zero row) and
// Wq[k,n] = round-half-even(W[n,k]/scale[n]) ∈ [-Int8WeightMax, Int8WeightMax].
func QuantizeColumns(w []float32, N, K int) (q []byte, scales []float32) {
	q = make([]byte, N*K)
	scales = make([]float32, N)
	for r := 0; r < N; r++ {
		row := w[r*K : (r+1)*K]
		var m float64
		for _, x := range row {
			m = math.Max(m, math.Abs(float64(x)))
		}
		s := m / Int8WeightMax
		if s == 0 {
			s = 1
		}
		scales[r] = float32(s)
		for k, x := range row {
			v := math.RoundToEven(float64(x) / s)
			q[k*N+r] = byte(int8(max(-Int8WeightMax, min(Int8WeightMax, v))))
		}
	}
	return q, scales
}

// uint8Fill adds a uint8 vector of n copies of v.
func (b *builder) uint8Fill(n int, v byte) string {
	key := fmt.Sprintf("u8x%d:%d", n, v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = v
	}
	name := b.fresh(fmt.Sprintf("u8_%dx%d", v, n))
	b.addInit(name, onnxpb.TensorProto_UINT8, []int64{int64(n)}, data)
	b.consts[key] = name
	return name
}

// uint8Scalar adds a uint8 scalar initializer.
func (b *builder) uint8Scalar(v byte) string {
	key := fmt.Sprintf("u8:%d", v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := b.fresh(fmt.Sprintf("u8_%d", v))
	b.addInit(name, onnxpb.TensorProto_UINT8, nil, []byte{v})
	b.consts[key] = name
	return name
}

// extraOpsets lists the operator sets besides ai.onnx, sorted by domain.
func (b *builder) extraOpsets() []*onnxpb.OperatorSetIdProto {
	names := make([]string, 0, len(b.domains))
	for d := range b.domains {
		names = append(names, d)
	}
	sort.Strings(names)
	out := make([]*onnxpb.OperatorSetIdProto, len(names))
	for i, d := range names {
		out[i] = &onnxpb.OperatorSetIdProto{Domain: d, Version: b.domains[d]}
	}
	return out
}
