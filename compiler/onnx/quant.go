package onnx

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// lowerLinearInt8 lowers y = x·Wᵀ (+ b) with int8 products:
//
//	W → Wq int8 [K,N] with one symmetric scale per output column, ws[n] = max|W[n,:]|/127;
//	x → xq uint8 per token (row): s = max(max|x_row|, 1e-12)/127, xq = clip(round(x/s)+128, 0, 255);
//	y = MatMulInteger(xq, Wq, a_zero_point 128) · s · ws (+ b).
//
// The activation scale is per token, so a position's output depends on its
// own row only and the exported graph stays causal.
func lowerLinearInt8(b *builder, n *ir.Node, in []string, out string) (string, error) {
	wq, ws, err := b.int8Weight(n.Inputs[1])
	if err != nil {
		return "", err
	}
	x := in[0]
	absmax := b.emit(out+".absmax", "ReduceMax", []string{b.emit(out+".abs", "Abs", []string{x}), b.constI64(-1)}, attrInt("keepdims", 1))
	scale := b.emit(out+".xs", "Div", []string{b.emit(out+".amax", "Max", []string{absmax, b.scalar(1e-12)}), b.scalar(127)})
	shifted := b.emit(out+".xsh", "Add", []string{b.emit(out+".xr", "Round", []string{b.emit(out+".xd", "Div", []string{x, scale})}), b.scalar(128)})
	clipped := b.emit(out+".xc", "Clip", []string{shifted, b.scalar(0), b.scalar(255)})
	xq := b.emit(out+".xq", "Cast", []string{clipped}, attrInt("to", int64(onnxpb.TensorProto_UINT8)))
	acc := b.emit(out+".acc", "MatMulInteger", []string{xq, wq, b.uint8Scalar(128)})
	y := b.emit(out+".yf", "Cast", []string{acc}, attrInt("to", int64(onnxpb.TensorProto_FLOAT)))
	y = b.emit(out+".ys", "Mul", []string{y, scale})
	if len(n.Inputs) == 2 {
		return b.emitTo(out, "Mul", []string{y, ws}), nil
	}
	y = b.emit(out+".yw", "Mul", []string{y, ws})
	return b.emitTo(out, "Add", []string{y, in[2]}), nil
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
	q := make([]byte, N*K)
	scales := make([]float32, N)
	for r := 0; r < N; r++ {
		row := data[r*K : (r+1)*K]
		var m float64
		for _, x := range row {
			m = math.Max(m, math.Abs(float64(x)))
		}
		s := m / 127
		if s == 0 {
			s = 1
		}
		scales[r] = float32(s)
		for k, x := range row {
			v := math.RoundToEven(float64(x) / s)
			q[k*N+r] = byte(int8(max(-127, min(127, v))))
		}
	}
	wq = b.fresh(initName(w) + ".int8")
	b.addInit(wq, onnxpb.TensorProto_INT8, []int64{int64(K), int64(N)}, q)
	ws = b.fresh(initName(w) + ".scale")
	b.addInit(ws, onnxpb.TensorProto_FLOAT, []int64{int64(N)}, f32Bytes(scales))
	b.initsQ[w] = [2]string{wq, ws}
	return wq, ws, nil
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
