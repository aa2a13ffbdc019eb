package onnx

import (
	"fmt"
	"math"

	"github.com/rpac-dev/rpac/compiler/onnx/onnxpb"
	"github.com/rpac-dev/rpac/ir"
)

// lowering emits the ONNX nodes of one ir node. in holds the ONNX names of
// the node's inputs (Linear's weight is resolved by the lowering itself);
// the last node emitted must write out, the name of the ir node's output.
// A lowering that produces no node (StopGradient) returns the name its
// output aliases; otherwise it returns out.
type lowering func(b *builder, n *ir.Node, in []string, out string) (string, error)

// lowerings maps ir op names to their lowering, for ops that are not
// lowered one to one (an op whose ir.OpDef names its ONNX operator needs no
// entry). Ops that are not ir.OpDef.Exported (gradient, loss and
// training-only ops) have no place in an inference graph.
var lowerings = map[ir.OpName]lowering{
	"Gather":      lowerGather,
	"Slice":       lowerSlice,
	"Reshape":     lowerReshape,
	"Transpose":   lowerTranspose,
	"BroadcastTo": lowerBroadcastTo,
	"SumTo":       lowerSumTo,
	"Linear":      lowerLinear,
	"MatMul":      lowerMatMul,
	"GELU":        lowerGELU,
	"StopGradient": func(b *builder, n *ir.Node, in []string, out string) (string, error) {
		return in[0], nil
	},
	"ReduceSum":          reduce("ReduceSum"),
	"ReduceMean":         reduce("ReduceMean"),
	"Softmax":            lowerSoftmax,
	"CausalMask":         lowerCausalMask,
	"LayerNorm":          lowerLayerNorm,
	"TopKMask":           lowerTopKMask,
	"GaussianMembership": lowerGaussianMembership,
	"Sinkhorn":           lowerSinkhorn,
	"ZScore":             lowerZScore,
}

// lowererOf returns the lowering of op: its entry in lowerings, the
// lowering its elementwise spec states (ir.EwSpec.Lower), or the one ONNX
// operator its definition names.
func lowererOf(op ir.OpName) (lowering, bool) {
	if f, ok := lowerings[op]; ok {
		return f, true
	}
	if s := ir.ElementwiseOf(op); s != nil && s.Lower != nil {
		return func(b *builder, n *ir.Node, in []string, out string) (string, error) {
			return s.Lower(emitter{b}, n, in, out), nil
		}, true
	}
	if def := ir.Ops[op]; def != nil && def.ONNX != "" {
		return elementwise(def.ONNX), true
	}
	return nil, false
}

// emitter is the builder as the specs' lowerings see it (ir.ONNXEmitter).
type emitter struct{ b *builder }

func (e emitter) Emit(hint, op string, in []string, attrs ...ir.ONNXAttr) string {
	return e.b.emit(hint, op, in, onnxAttrs(attrs)...)
}

func (e emitter) EmitTo(out, op string, in []string, attrs ...ir.ONNXAttr) string {
	return e.b.emitTo(out, op, in, onnxAttrs(attrs)...)
}

func (e emitter) Scalar(v float32) string { return e.b.scalar(v) }

func onnxAttrs(attrs []ir.ONNXAttr) []*onnxpb.AttributeProto {
	out := make([]*onnxpb.AttributeProto, len(attrs))
	for i, a := range attrs {
		out[i] = attrInt(a.Name, a.Value)
	}
	return out
}

// Lowered reports whether op has an ONNX lowering.
func Lowered(op ir.OpName) bool { _, ok := lowererOf(op); return ok }

func (b *builder) lowerNode(n *ir.Node) error {
	def := ir.Ops[n.Op]
	if def != nil && def.TrainingOnly {
		return fmt.Errorf("training-only op %s cannot be exported (run passes.StripTraining first)", n.Op)
	}
	if def != nil && def.Loss {
		return fmt.Errorf("op %s is the loss of training and evaluation graphs; "+
			"an export graph computes logits (model.Build with Logits and NoLoss)", n.Op)
	}
	f, ok := lowererOf(n.Op)
	if kf := b.kv.override(n); kf != nil {
		f, ok = kf, true
	}
	if !ok {
		return fmt.Errorf("op %s has no ONNX lowering (only forward inference ops are exported)", n.Op)
	}
	if len(n.Outputs) != 1 {
		return fmt.Errorf("op %s has %d outputs; lowered ops have one", n.Op, len(n.Outputs))
	}
	in := make([]string, len(n.Inputs))
	for i, v := range n.Inputs {
		if n.Op == ir.OpLinear && i == 1 {
			continue // resolved by lowerLinear
		}
		name, err := b.value(v)
		if err != nil {
			return err
		}
		in[i] = name
	}
	outV := n.Outputs[0]
	out := ""
	if n.Op != ir.OpStopGradient {
		out = b.outName(outV)
	}
	name, err := f(b, n, in, out)
	if err != nil {
		return err
	}
	b.names[outV] = name
	return nil
}

func elementwise(op string) lowering {
	return func(b *builder, n *ir.Node, in []string, out string) (string, error) {
		return b.emitTo(out, op, in), nil
	}
}

func normAxis(ax, rank int) (int, error) {
	if ax < 0 {
		ax += rank
	}
	if ax < 0 || ax >= rank {
		return 0, fmt.Errorf("axis %d out of range for rank %d", ax, rank)
	}
	return ax, nil
}

// Gather(W[V,D], ids) -> Gather(W, ids, axis=0). ids are int64 in the
// exported graph (Gather takes int64 indices directly).
func lowerGather(b *builder, n *ir.Node, in []string, out string) (string, error) {
	return b.emitTo(out, "Gather", in, attrInt("axis", 0)), nil
}

// Slice(x; axis, start, end) -> Slice(x, [start], [end], [axis]).
func lowerSlice(b *builder, n *ir.Node, in []string, out string) (string, error) {
	ax, err := normAxis(n.Attrs.Int("axis", 0), len(n.Inputs[0].Shape))
	if err != nil {
		return "", err
	}
	st, en := n.Attrs.Int("start", 0), n.Attrs.Int("end", 0)
	return b.emitTo(out, "Slice", []string{in[0], b.constI64(int64(st)), b.constI64(int64(en)), b.constI64(int64(ax))}), nil
}

// Reshape(x; shape) -> Reshape(x, shape). allowzero keeps a literal 0 dim.
func lowerReshape(b *builder, n *ir.Node, in []string, out string) (string, error) {
	s := n.Outputs[0].Shape
	var attrs []*onnxpb.AttributeProto
	for _, d := range s {
		if d == 0 {
			attrs = append(attrs, attrInt("allowzero", 1))
			break
		}
	}
	return b.emitTo(out, "Reshape", []string{in[0], b.constI64(dims64(s)...)}, attrs...), nil
}

// Transpose(x; perm) -> Transpose(x, perm).
func lowerTranspose(b *builder, n *ir.Node, in []string, out string) (string, error) {
	p := n.Attrs.Ints("perm")
	perm := make([]int64, len(p))
	for i, x := range p {
		perm[i] = int64(x)
	}
	return b.emitTo(out, "Transpose", in, attrInts("perm", perm...)), nil
}

// BroadcastTo(x; shape) -> Expand(x, shape).
func lowerBroadcastTo(b *builder, n *ir.Node, in []string, out string) (string, error) {
	return b.emitTo(out, "Expand", []string{in[0], b.constI64(dims64(n.Outputs[0].Shape)...)}), nil
}

// SumTo(x; shape) -> ReduceSum over the expanded axes (keepdims) and a
// Reshape to shape.
func lowerSumTo(b *builder, n *ir.Node, in []string, out string) (string, error) {
	x, s := n.Inputs[0].Shape, n.Outputs[0].Shape
	off := len(x) - len(s)
	var axes []int64
	for i := range x {
		if j := i - off; j < 0 || (s[j] == 1 && x[i] != 1) {
			axes = append(axes, int64(i))
		}
	}
	if len(axes) == 0 {
		return b.emitTo(out, "Reshape", []string{in[0], b.constI64(dims64(s)...)}), nil
	}
	r := b.emit(out+".sum", "ReduceSum", []string{in[0], b.constI64(axes...)}, attrInt("keepdims", 1))
	return b.emitTo(out, "Reshape", []string{r, b.constI64(dims64(s)...)}), nil
}

// Linear(x[...,K], W[N,K], b[N]?) -> MatMul(x, Wᵀ[K,N]) (+ Add b).
func lowerLinear(b *builder, n *ir.Node, in []string, out string) (string, error) {
	if w := n.Inputs[1]; b.opts.Quantize == QuantizeInt8 && w.Kind != ir.Intermediate && w.Kind != ir.Input {
		return lowerLinearInt8(b, n, in, out)
	}
	wt, err := b.linearWeight(n.Inputs[1])
	if err != nil {
		return "", err
	}
	if len(n.Inputs) == 2 {
		return b.emitTo(out, "MatMul", []string{in[0], wt}), nil
	}
	mm := b.emit(out+".mm", "MatMul", []string{in[0], wt})
	return b.emitTo(out, "Add", []string{mm, in[2]}), nil
}

// swapLast transposes the last two axes.
func (b *builder) swapLast(x string, rank int) string {
	perm := make([]int64, rank)
	for i := range perm {
		perm[i] = int64(i)
	}
	perm[rank-2], perm[rank-1] = perm[rank-1], perm[rank-2]
	return b.emit(x+".T", "Transpose", []string{x}, attrInts("perm", perm...))
}

// MatMul(a, b; transA, transB) -> Transpose of the flagged operands, MatMul.
// A transposed initializer is folded by onnxruntime at session load.
func lowerMatMul(b *builder, n *ir.Node, in []string, out string) (string, error) {
	x, y := in[0], in[1]
	if n.Attrs.Bool("transA", false) {
		x = b.swapLast(x, len(n.Inputs[0].Shape))
	}
	if n.Attrs.Bool("transB", false) {
		y = b.swapLast(y, len(n.Inputs[1].Shape))
	}
	return b.emitTo(out, "MatMul", []string{x, y}), nil
}

// GELU (exact erf form): the Gelu op (opset 20+) or
// Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5), the pattern onnxruntime fuses
// into its own Gelu kernel.
func lowerGELU(b *builder, n *ir.Node, in []string, out string) (string, error) {
	if b.opts.GELU == GELUOp {
		return b.emitTo(out, "Gelu", in, attrString("approximate", "none")), nil
	}
	d := b.emit(out+".div", "Div", []string{in[0], b.scalar(float32(math.Sqrt2))})
	e := b.emit(out+".erf", "Erf", []string{d})
	a := b.emit(out+".add", "Add", []string{e, b.scalar(1)})
	m := b.emit(out+".mul", "Mul", []string{in[0], a})
	return b.emitTo(out, "Mul", []string{m, b.scalar(0.5)}), nil
}

// ReduceSum/ReduceMean(x; axes, keepdims) -> the ONNX reduction with axes
// as an input (none: all axes).
func reduce(op string) lowering {
	return func(b *builder, n *ir.Node, in []string, out string) (string, error) {
		keep := int64(0)
		if n.Attrs.Bool("keepdims", false) {
			keep = 1
		}
		args := []string{in[0]}
		if axes := n.Attrs.Ints("axes"); len(axes) > 0 {
			a := make([]int64, len(axes))
			for i, x := range axes {
				ax, err := normAxis(x, len(n.Inputs[0].Shape))
				if err != nil {
					return "", err
				}
				a[i] = int64(ax)
			}
			args = append(args, b.constI64(a...))
		}
		return b.emitTo(out, op, args, attrInt("keepdims", keep)), nil
	}
}

// Softmax(x) over the last axis. With Options.GuardSoftmax a row of all
// -Inf gives zeros (as the ir op) instead of NaN.
func lowerSoftmax(b *builder, n *ir.Node, in []string, out string) (string, error) {
	return b.softmax(in[0], out), nil
}

func (b *builder) softmax(x, out string) string {
	if !b.opts.GuardSoftmax {
		return b.emitTo(out, "Softmax", []string{x}, attrInt("axis", -1))
	}
	s := b.emit(out+".softmax", "Softmax", []string{x}, attrInt("axis", -1))
	m := b.emit(out+".max", "ReduceMax", []string{x, b.constI64(-1)}, attrInt("keepdims", 1))
	dead := b.emit(out+".allneginf", "Equal", []string{m, b.scalar(float32(math.Inf(-1)))})
	return b.emitTo(out, "Where", []string{dead, b.scalar(0), s})
}

// CausalMask(x[...,T,T]; fill) -> Where(keep[T,T], x, fill) with a constant
// boolean lower-triangular keep mask: entries j > i are replaced by fill
// whatever x holds there (an Add of -Inf would turn +Inf or NaN into NaN).
func lowerCausalMask(b *builder, n *ir.Node, in []string, out string) (string, error) {
	s := n.Inputs[0].Shape
	T := s[len(s)-1]
	fill := float32(n.Attrs.Float("fill", math.Inf(-1)))
	keep := make([]bool, T*T)
	for i := 0; i < T; i++ {
		for j := 0; j <= i; j++ {
			keep[i*T+j] = true
		}
	}
	mask := b.boolConst(fmt.Sprintf("causal_mask_%d", T), []int64{int64(T), int64(T)}, keep)
	return b.emitTo(out, "Where", []string{mask, in[0], b.scalar(fill)}), nil
}

// LayerNorm(x, g, b; eps) -> LayerNormalization(axis=-1, epsilon=eps).
func lowerLayerNorm(b *builder, n *ir.Node, in []string, out string) (string, error) {
	eps := float32(n.Attrs.Float("eps", 1e-5))
	if s := n.Inputs[0].Shape; ir.LayerNormWidth(s, n.Attrs) != s[len(s)-1] {
		return "", fmt.Errorf("LayerNorm over the first %d of %d entries (padded widths are a training layout, not exported)", ir.LayerNormWidth(s, n.Attrs), s[len(s)-1])
	}
	return b.emitTo(out, "LayerNormalization", in, attrInt("axis", -1), attrFloat("epsilon", eps)), nil
}

// TopKMask(x; k) -> ScatterElements(zeros, TopK(x, k).indices, ones,
// axis=-1). ONNX TopK breaks ties by the lower index, as the ir op does.
func lowerTopKMask(b *builder, n *ir.Node, in []string, out string) (string, error) {
	s := n.Inputs[0].Shape
	k := n.Attrs.Int("k", 1)
	D := s[len(s)-1]
	full := b.constI64(dims64(s)...)
	switch {
	case k <= 0:
		return b.emitTo(out, "ConstantOfShape", []string{full}, attrTensor("value", floatTensor(0))), nil
	case k >= D:
		return b.emitTo(out, "ConstantOfShape", []string{full}, attrTensor("value", floatTensor(1))), nil
	}
	top := b.emitN(out+".topk", "TopK", []string{in[0], b.constI64(int64(k))}, 2,
		attrInt("axis", -1), attrInt("largest", 1), attrInt("sorted", 1))
	zeros := b.emit(out+".zeros", "ConstantOfShape", []string{full}, attrTensor("value", floatTensor(0)))
	ks := s.Clone()
	ks[len(ks)-1] = k
	ones := b.emit(out+".ones", "ConstantOfShape", []string{b.constI64(dims64(ks)...)}, attrTensor("value", floatTensor(1)))
	return b.emitTo(out, "ScatterElements", []string{zeros, top[1], ones}, attrInt("axis", -1)), nil
}

func floatTensor(x float32) *onnxpb.TensorProto {
	return &onnxpb.TensorProto{DataType: int32(onnxpb.TensorProto_FLOAT), Dims: []int64{1}, RawData: f32Bytes([]float32{x})}
}

// GaussianMembership(z[...,D], c[R,D], log_sigma[R]):
//
//	d2  = ReduceSum((Unsqueeze(z,-2) - c)², -1)        [...,R]
//	inv = Clip(Exp(-2·log_sigma), 1e-3, 1e3)          [R]
//	μ   = Softmax(Clip(-0.5·d2·inv, -30, 30))
//	μ   = Where(IsNaN(μ), 1/R, μ)
func lowerGaussianMembership(b *builder, n *ir.Node, in []string, out string) (string, error) {
	z, c, ls := in[0], in[1], in[2]
	R := n.Inputs[1].Shape[0]
	rank := len(n.Inputs[0].Shape)
	zu := b.emit(out+".z", "Unsqueeze", []string{z, b.constI64(int64(rank - 1))})
	diff := b.emit(out+".diff", "Sub", []string{zu, c})
	sq := b.emit(out+".sq", "Mul", []string{diff, diff})
	d2 := b.emit(out+".d2", "ReduceSum", []string{sq, b.constI64(int64(rank))}, attrInt("keepdims", 0))
	m2 := b.emit(out+".m2ls", "Mul", []string{ls, b.scalar(-2)})
	ex := b.emit(out+".prec", "Exp", []string{m2})
	inv := b.emit(out+".precc", "Clip", []string{ex, b.scalar(1e-3), b.scalar(1e3)})
	h := b.emit(out+".half", "Mul", []string{d2, b.scalar(-0.5)})
	t := b.emit(out+".logit", "Mul", []string{h, inv})
	tc := b.emit(out+".logitc", "Clip", []string{t, b.scalar(-30), b.scalar(30)})
	sm := b.emit(out+".softmax", "Softmax", []string{tc}, attrInt("axis", -1))
	isNaN := b.emit(out+".isnan", "IsNaN", []string{sm})
	return b.emitTo(out, "Where", []string{isNaN, b.scalar(float32(1.0 / float64(R))), sm}), nil
}

// Sinkhorn(X[R,K]; iters), unrolled: X /= ReduceSum(X,1)+1e-9, then
// X /= ReduceSum(X,0)+1e-9, iters times. A missing iters is 8, the
// default of the paper's listing.
func lowerSinkhorn(b *builder, n *ir.Node, in []string, out string) (string, error) {
	iters := n.Attrs.Int("iters", 8)
	if iters <= 0 {
		return b.emitTo(out, "Identity", in), nil
	}
	x := in[0]
	eps := b.scalar(1e-9)
	for it := 0; it < iters; it++ {
		for ax := int64(1); ax >= 0; ax-- {
			hint := fmt.Sprintf("%s.it%d.ax%d", out, it, ax)
			s := b.emit(hint+".sum", "ReduceSum", []string{x, b.constI64(ax)}, attrInt("keepdims", 1))
			d := b.emit(hint+".den", "Add", []string{s, eps})
			if it == iters-1 && ax == 0 {
				return b.emitTo(out, "Div", []string{x, d}), nil
			}
			x = b.emit(hint, "Div", []string{x, d})
		}
	}
	panic("unreachable")
}

// ZScore(x) -> (x - mean) / (std + 1e-6) over all elements, std unbiased:
// Sqrt(ReduceSum((x-mean)²) / (N-1)).
func lowerZScore(b *builder, n *ir.Node, in []string, out string) (string, error) {
	N := n.Inputs[0].Shape.Numel()
	mean := b.emit(out+".mean", "ReduceMean", in, attrInt("keepdims", 1))
	d := b.emit(out+".centered", "Sub", []string{in[0], mean})
	sq := b.emit(out+".sq", "Mul", []string{d, d})
	ss := b.emit(out+".ss", "ReduceSum", []string{sq}, attrInt("keepdims", 1))
	v := b.emit(out+".var", "Div", []string{ss, b.scalar(float32(N - 1))})
	sd := b.emit(out+".std", "Sqrt", []string{v})
	den := b.emit(out+".den", "Add", []string{sd, b.scalar(1e-6)})
	return b.emitTo(out, "Div", []string{d, den}), nil
}
