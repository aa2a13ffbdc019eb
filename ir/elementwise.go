package ir

import (
	"fmt"
	"math"
)

// Elementwise ops are stated once, each by an EwSpec in the table below
// (Elementwise): its attributes and their defaults, its formula in Go
// (the CPU kernels, float64 and float32) and in CUDA C (the prelude's
// ew_unary/ew_grad/ew_binary cases and op codes, which kernels/cuda
// generates from this table), its gradient rule (autodiff), its ONNX
// lowering and the test cases every backend runs. Adding one is an entry
// here; a backend adds a kernel of its own only for speed (kernels/cpu's
// float32 fast paths).

// EwKind is the arity and role of an elementwise op.
type EwKind uint8

const (
	// EwUnary: y = f(x; a, b, c).
	EwUnary EwKind = iota
	// EwGrad: dx = f(dy, v; a, b), v the forward's input or output as
	// the forward's gradient rule passes it; a gradient op.
	EwGrad
	// EwBinary: y = f(x, y) with numpy broadcasting.
	EwBinary
)

// EwParams are an op's attributes in the order of its spec's Attrs, the
// defaults filled in: the kernels' parameters a, b, c.
type EwParams[T Float] [3]T

// Float is the element type of a CPU formula.
type Float interface{ ~float32 | ~float64 }

// EwAttr is one float attribute of an elementwise op.
type EwAttr struct {
	Name    string
	Default float64
	// Finite: an infinite default stands for the largest finite value of
	// the precision computed in (torch.nan_to_num's defaults).
	Finite bool
}

// EwCase is one test case of an op, run by every backend's tests: the
// CPU's gradient check (the spec's gradient rule against finite
// differences), the CUDA parity test and, for exported ops, onnxruntime
// against the float64 formula.
type EwCase struct {
	Attrs Attrs
	// Positive inputs only (Log); else standard normal ones.
	Positive bool
	// Kinks the gradient check keeps its inputs away from (ReLU: 0).
	Kinks []float64
}

// ONNXEmitter is what an ONNX lowering (EwSpec.Lower) writes through:
// compiler/onnx's graph builder.
type ONNXEmitter interface {
	// Emit adds a node of ONNX operator op over in whose output gets a
	// fresh name made from hint, and returns that name.
	Emit(hint, op string, in []string, attrs ...ONNXAttr) string
	// EmitTo adds a node that writes the output out (the lowering's last).
	EmitTo(out, op string, in []string, attrs ...ONNXAttr) string
	// Scalar names a float32 scalar constant.
	Scalar(v float32) string
}

// ONNXAttr is an integer attribute of an ONNX node.
type ONNXAttr struct {
	Name  string
	Value int64
}

// GradRule emits the gradients of a node's inputs (nil: none) from the
// gradients of its outputs (nil where an output has none).
type GradRule func(g *Graph, n *Node, dys []*Value) []*Value

// EwSpec is everything about one elementwise op.
type EwSpec struct {
	Name OpName
	Kind EwKind
	Doc  string
	// Attrs are the op's float attributes (at most 3 for EwUnary, 2 for
	// EwGrad, none for EwBinary), the kernels' a, b, c in order.
	Attrs []EwAttr
	// F64 and F32 are the formula in Go (x, and y for EwGrad (v) and
	// EwBinary): the CPU kernels.
	F64 func(x, y float64, p EwParams[float64]) float64
	F32 func(x, y float32, p EwParams[float32]) float32
	// CUDA is the formula in CUDA C over float x, y and a, b, c: an
	// expression, or a statement block in braces that returns.
	CUDA string
	// Costly formulas (exp, log, erf) make the CPU cut work finer.
	Costly bool
	// Grad is the gradient rule (nil for EwGrad ops, which have none).
	Grad GradRule
	// ONNX names the ONNX operator of a one-to-one lowering; Lower is a
	// lowering of its own (it writes out last). Neither: compiler/onnx
	// has one (GELU's depends on its options), or the op is not exported.
	ONNX  string
	Lower func(e ONNXEmitter, n *Node, in []string, out string) string
	// Cases are the op's test cases (at least one).
	Cases []EwCase
}

// NumIn is the op's number of inputs.
func (s *EwSpec) NumIn() int {
	if s.Kind == EwUnary {
		return 1
	}
	return 2
}

// Params64 are the node attributes' values (defaults filled in) for
// float64 kernels.
func (s *EwSpec) Params64(a Attrs) EwParams[float64] {
	var p EwParams[float64]
	for i, at := range s.Attrs {
		p[i] = at.value(a, math.MaxFloat64)
	}
	return p
}

// Params32 are the node attributes' values for float32 kernels.
func (s *EwSpec) Params32(a Attrs) EwParams[float32] {
	var p EwParams[float32]
	for i, at := range s.Attrs {
		p[i] = float32(at.value(a, math.MaxFloat32))
	}
	return p
}

func (at EwAttr) value(a Attrs, maxFinite float64) float64 {
	v := a.Float(at.Name, at.Default)
	if _, set := a[at.Name]; !set && at.Finite && math.IsInf(v, 0) {
		return math.Copysign(maxFinite, v)
	}
	return v
}

// Elementwise lists the elementwise ops in a fixed order (their CUDA op
// codes follow it, per kind); ElementwiseOf finds one by name.
var Elementwise []*EwSpec

var ewByName = map[OpName]*EwSpec{}

// ElementwiseOf returns op's spec, or nil when op is not in the table.
func ElementwiseOf(op OpName) *EwSpec { return ewByName[op] }

// RegisterElementwise adds a spec to the table and its OpDef to Ops.
func RegisterElementwise(s *EwSpec) {
	if err := s.check(); err != nil {
		panic("ir: elementwise op " + string(s.Name) + ": " + err.Error())
	}
	d := &OpDef{Name: s.Name, NumIn: s.NumIn(), Doc: s.Doc, Elementwise: true, Gradient: s.Kind == EwGrad,
		ONNX: s.ONNX, Grad: s.Grad, Spec: s}
	switch s.Kind {
	case EwBinary:
		d.Infer = binary
	case EwGrad:
		d.Infer = same(1)
	default:
		d.Infer = same(0)
	}
	reg(d)
	Elementwise = append(Elementwise, s)
	ewByName[s.Name] = s
}

func (s *EwSpec) check() error {
	most := map[EwKind]int{EwUnary: 3, EwGrad: 2, EwBinary: 0}[s.Kind]
	switch {
	case len(s.Attrs) > most:
		return fmt.Errorf("%d attributes, at most %d", len(s.Attrs), most)
	case s.F64 == nil || s.F32 == nil:
		return fmt.Errorf("no Go formula")
	case s.CUDA == "":
		return fmt.Errorf("no CUDA formula")
	case (s.Grad == nil) != (s.Kind == EwGrad):
		return fmt.Errorf("a gradient rule exactly unless a gradient op")
	case len(s.Cases) == 0:
		return fmt.Errorf("no test case")
	}
	return nil
}

// sumTo reduces a broadcast gradient back to shape s.
func sumTo(g *Graph, d *Value, s Shape) *Value {
	if d.Shape.Equal(s) {
		return d
	}
	return g.Op1("SumTo", Attrs{"shape": []int(s.Clone())}, d)
}

// GradWith is the rule dx = op(dy, x) (useOut: the output y instead of x),
// the node's attributes passed on.
func GradWith(op OpName, useOut bool) GradRule {
	return func(g *Graph, n *Node, d []*Value) []*Value {
		ref := n.Inputs[0]
		if useOut {
			ref = n.Outputs[0]
		}
		return []*Value{g.Op1(op, n.Attrs.Clone(), d[0], ref)}
	}
}

// gradOf is a rule dx = f(dy, x, y) built of other ops.
func gradOf(f func(g *Graph, dy, x, y *Value) *Value) GradRule {
	return func(g *Graph, n *Node, d []*Value) []*Value {
		return []*Value{f(g, d[0], n.Inputs[0], n.Outputs[0])}
	}
}

// ---- the formulas in Go ----

func add[T Float](x, y T, _ EwParams[T]) T { return x + y }
func sub[T Float](x, y T, _ EwParams[T]) T { return x - y }
func mul[T Float](x, y T, _ EwParams[T]) T { return x * y }
func div[T Float](x, y T, _ EwParams[T]) T { return x / y }

func scale[T Float](x, _ T, p EwParams[T]) T {
	if p[1] == 0 {
		return p[0] * x
	}
	return p[0]*x + p[1]
}

func neg[T Float](x, _ T, _ EwParams[T]) T { return -x }
func exp[T Float](x, _ T, _ EwParams[T]) T { return T(math.Exp(float64(x))) }
func log[T Float](x, _ T, _ EwParams[T]) T { return T(math.Log(float64(x))) }
func sigmoid[T Float](x, _ T, _ EwParams[T]) T {
	return T(1 / (1 + math.Exp(-float64(x))))
}
func tanh[T Float](x, _ T, _ EwParams[T]) T { return T(math.Tanh(float64(x))) }

const invSqrt2, invSqrt2Pi = 0.70710678118654752440, 0.39894228040143267794

func gelu[T Float](x, _ T, _ EwParams[T]) T {
	v := float64(x)
	return T(v * (0.5 * math.Erfc(-v*invSqrt2)))
}

func relu[T Float](x, _ T, _ EwParams[T]) T {
	if x > 0 {
		return x
	}
	return 0
}

func clamp[T Float](x, _ T, p EwParams[T]) T {
	if x < p[0] {
		x = p[0]
	}
	if x > p[1] {
		x = p[1]
	}
	return x
}

func nanToNum[T Float](x, _ T, p EwParams[T]) T {
	switch {
	case x != x:
		return p[0]
	case math.IsInf(float64(x), 1):
		return p[1]
	case math.IsInf(float64(x), -1):
		return p[2]
	}
	return x
}

func softsign[T Float](x, _ T, _ EwParams[T]) T { return x / (1 + T(math.Abs(float64(x)))) }
func softsignGrad[T Float](dy, x T, _ EwParams[T]) T {
	d := 1 + T(math.Abs(float64(x)))
	return dy / (d * d)
}

func sigmoidGrad[T Float](dy, y T, _ EwParams[T]) T { return dy * y * (1 - y) }
func tanhGrad[T Float](dy, y T, _ EwParams[T]) T    { return dy * (1 - y*y) }
func geluGrad[T Float](dy, x T, _ EwParams[T]) T {
	v := float64(x)
	return dy * T(0.5*math.Erfc(-v*invSqrt2)+v*invSqrt2Pi*math.Exp(-0.5*v*v))
}

func reluGrad[T Float](dy, x T, _ EwParams[T]) T {
	if x > 0 {
		return dy
	}
	return 0
}

func clampGrad[T Float](dy, x T, p EwParams[T]) T {
	if p[0] <= x && x <= p[1] {
		return dy
	}
	return 0
}

func nanToNumGrad[T Float](dy, x T, _ EwParams[T]) T {
	if x-x == 0 { // finite
		return dy
	}
	return 0
}

// ---- ONNX lowerings of their own ----

// lowerScale: alpha·x + beta as Mul and Add, or Identity.
func lowerScale(e ONNXEmitter, n *Node, in []string, out string) string {
	alpha, beta := float32(n.Attrs.Float("alpha", 1)), float32(n.Attrs.Float("beta", 0))
	switch {
	case alpha == 1 && beta == 0:
		return e.EmitTo(out, "Identity", in)
	case beta == 0:
		return e.EmitTo(out, "Mul", []string{in[0], e.Scalar(alpha)})
	case alpha == 1:
		return e.EmitTo(out, "Add", []string{in[0], e.Scalar(beta)})
	}
	m := e.Emit(out+".mul", "Mul", []string{in[0], e.Scalar(alpha)})
	return e.EmitTo(out, "Add", []string{m, e.Scalar(beta)})
}

// lowerClamp: Clip(x, lo, hi), an absent bound passed as ±Inf (an omitted
// Clip input means the largest finite float in onnxruntime, which would
// turn ±Inf into ±MaxFloat32). NaN stays NaN.
func lowerClamp(e ONNXEmitter, n *Node, in []string, out string) string {
	_, hasLo := n.Attrs["lo"]
	_, hasHi := n.Attrs["hi"]
	if !hasLo && !hasHi {
		return e.EmitTo(out, "Identity", in)
	}
	p := ElementwiseOf("Clamp").Params32(n.Attrs)
	return e.EmitTo(out, "Clip", []string{in[0], e.Scalar(p[0]), e.Scalar(p[1])})
}

// lowerNanToNum: Where(IsNaN(x), nan, Where(IsInf-(x), neginf,
// Where(IsInf+(x), posinf, x))).
func lowerNanToNum(e ONNXEmitter, n *Node, in []string, out string) string {
	p := ElementwiseOf("NanToNum").Params32(n.Attrs)
	x, nan, pos, neg := in[0], p[0], p[1], p[2]
	isPos := e.Emit(out+".isposinf", "IsInf", []string{x}, ONNXAttr{"detect_negative", 0})
	y := e.Emit(out+".posinf", "Where", []string{isPos, e.Scalar(pos), x})
	isNeg := e.Emit(out+".isneginf", "IsInf", []string{x}, ONNXAttr{"detect_positive", 0})
	y = e.Emit(out+".neginf", "Where", []string{isNeg, e.Scalar(neg), y})
	isNaN := e.Emit(out+".isnan", "IsNaN", []string{x})
	return e.EmitTo(out, "Where", []string{isNaN, e.Scalar(nan), y})
}

// clampBounds are Clamp's and ClampGrad's attributes: absent, unbounded.
var clampBounds = []EwAttr{{Name: "lo", Default: math.Inf(-1)}, {Name: "hi", Default: math.Inf(1)}}

func init() {
	for _, s := range []*EwSpec{
		{Name: OpAdd, Kind: EwBinary, F64: add[float64], F32: add[float32], CUDA: "x + y", ONNX: "Add",
			Grad: func(g *Graph, n *Node, d []*Value) []*Value {
				return []*Value{sumTo(g, d[0], n.Inputs[0].Shape), sumTo(g, d[0], n.Inputs[1].Shape)}
			}},
		{Name: OpSub, Kind: EwBinary, F64: sub[float64], F32: sub[float32], CUDA: "x - y", ONNX: "Sub",
			Grad: func(g *Graph, n *Node, d []*Value) []*Value {
				return []*Value{sumTo(g, d[0], n.Inputs[0].Shape), sumTo(g, g.Op1("Neg", nil, d[0]), n.Inputs[1].Shape)}
			}},
		{Name: OpMul, Kind: EwBinary, F64: mul[float64], F32: mul[float32], CUDA: "x * y", ONNX: "Mul",
			Grad: func(g *Graph, n *Node, d []*Value) []*Value {
				a, b := n.Inputs[0], n.Inputs[1]
				return []*Value{sumTo(g, g.Op1("Mul", nil, d[0], b), a.Shape), sumTo(g, g.Op1("Mul", nil, d[0], a), b.Shape)}
			}},
		{Name: OpDiv, Kind: EwBinary, F64: div[float64], F32: div[float32], CUDA: "x / y", ONNX: "Div",
			Cases: []EwCase{{Positive: true}},
			Grad: func(g *Graph, n *Node, d []*Value) []*Value {
				a, b, y := n.Inputs[0], n.Inputs[1], n.Outputs[0]
				da := g.Op1("Div", nil, d[0], b)
				db := g.Op1("Neg", nil, g.Op1("Mul", nil, da, y)) // -dy·a/b² = -(dy/b)·y
				return []*Value{sumTo(g, da, a.Shape), sumTo(g, db, b.Shape)}
			}},
		{Name: OpScale, Doc: "Scale(x; alpha, beta) -> alpha·x + beta.",
			Attrs: []EwAttr{{Name: "alpha", Default: 1}, {Name: "beta"}},
			F64:   scale[float64], F32: scale[float32], CUDA: "a * x + b", Lower: lowerScale,
			Cases: []EwCase{{Attrs: Attrs{"alpha": 2.5, "beta": -0.75}}, {}},
			Grad: func(g *Graph, n *Node, d []*Value) []*Value {
				return []*Value{g.Op1("Scale", Attrs{"alpha": n.Attrs.Float("alpha", 1)}, d[0])}
			}},
		{Name: OpNeg, Doc: "Neg(x) -> -x.", F64: neg[float64], F32: neg[float32], CUDA: "-x", ONNX: "Neg",
			Grad: gradOf(func(g *Graph, dy, x, y *Value) *Value { return g.Op1("Neg", nil, dy) })},
		{Name: OpExp, Doc: "Exp(x) -> exp(x).", F64: exp[float64], F32: exp[float32], CUDA: "expf(x)", ONNX: "Exp", Costly: true,
			Grad: gradOf(func(g *Graph, dy, x, y *Value) *Value { return g.Op1("Mul", nil, dy, y) })},
		{Name: OpLog, Doc: "Log(x) -> log(x).", F64: log[float64], F32: log[float32], CUDA: "logf(x)", ONNX: "Log", Costly: true,
			Cases: []EwCase{{Positive: true}},
			Grad:  gradOf(func(g *Graph, dy, x, y *Value) *Value { return g.Op1("Div", nil, dy, x) })},
		{Name: OpSigmoid, Doc: "Sigmoid(x) -> 1/(1+exp(-x)).", F64: sigmoid[float64], F32: sigmoid[float32],
			CUDA: "1.0f / (1.0f + expf(-x))", ONNX: "Sigmoid", Costly: true, Grad: GradWith("SigmoidGrad", true)},
		{Name: OpTanh, Doc: "Tanh(x) -> tanh(x).", F64: tanh[float64], F32: tanh[float32], CUDA: "tanhf(x)", ONNX: "Tanh",
			Costly: true, Grad: GradWith("TanhGrad", true)},
		{Name: OpGELU, Doc: "GELU(x) -> x·Φ(x) with the exact erf form (PyTorch nn.GELU default).",
			F64: gelu[float64], F32: gelu[float32], CUDA: "0.5f * x * (1.0f + erff(x * 0.70710678118654752f))",
			Costly: true, Grad: GradWith("GELUGrad", false)},
		{Name: OpReLU, Doc: "ReLU(x) -> max(x, 0).", F64: relu[float64], F32: relu[float32], CUDA: "x > 0.0f ? x : 0.0f",
			ONNX: "Relu", Grad: GradWith("ReLUGrad", false), Cases: []EwCase{{Kinks: []float64{0}}}},
		{Name: OpClamp, Doc: "Clamp(x; lo, hi) -> min(max(x,lo),hi); absent bound = unbounded. NaN stays NaN.",
			Attrs: clampBounds,
			F64:   clamp[float64], F32: clamp[float32], Lower: lowerClamp, Grad: GradWith("ClampGrad", false),
			CUDA: "{ float r = x; if (r < a) r = a; if (r > b) r = b; return r; }",
			Cases: []EwCase{{Attrs: Attrs{"lo": -0.5, "hi": 1.0}, Kinks: []float64{-0.5, 1}},
				{Attrs: Attrs{"lo": 0.25}, Kinks: []float64{0.25}}, {Attrs: Attrs{"hi": -0.3}, Kinks: []float64{-0.3}}, {}}},
		{Name: OpNanToNum, Doc: "NanToNum(x; nan, posinf, neginf) -> x with NaN/±Inf replaced.",
			Attrs: []EwAttr{{Name: "nan"}, {Name: "posinf", Default: math.Inf(1), Finite: true},
				{Name: "neginf", Default: math.Inf(-1), Finite: true}},
			F64: nanToNum[float64], F32: nanToNum[float32], Lower: lowerNanToNum, Grad: GradWith("NanToNumGrad", false),
			CUDA:  "{ if (x != x) return a; if ((__float_as_uint(x) & 0x7fffffffu) == 0x7f800000u) return x > 0.0f ? b : c; return x; }",
			Cases: []EwCase{{Attrs: Attrs{"nan": 0.0, "posinf": 4.0, "neginf": -4.0}}, {}}},
		{Name: OpSoftsign, Doc: "Softsign(x) -> x/(1+|x|).", F64: softsign[float64], F32: softsign[float32],
			CUDA: "x / (1.0f + fabsf(x))", ONNX: "Softsign", Grad: GradWith("SoftsignGrad", false)},

		{Name: OpSigmoidGrad, Kind: EwGrad, Doc: "SigmoidGrad(dy, y) -> dy·y·(1-y).",
			F64: sigmoidGrad[float64], F32: sigmoidGrad[float32], CUDA: "x * y * (1.0f - y)"},
		{Name: OpTanhGrad, Kind: EwGrad, Doc: "TanhGrad(dy, y) -> dy·(1-y²).",
			F64: tanhGrad[float64], F32: tanhGrad[float32], CUDA: "x * (1.0f - y * y)"},
		{Name: OpGELUGrad, Kind: EwGrad, Doc: "GELUGrad(dy, x) -> dy·(Φ(x) + x·φ(x)).",
			F64: geluGrad[float64], F32: geluGrad[float32], Costly: true,
			CUDA: "{ float cdf = 0.5f * (1.0f + erff(y * 0.70710678118654752f)); " +
				"float pdf = 0.39894228040143268f * expf(-0.5f * y * y); return x * (cdf + y * pdf); }"},
		{Name: OpReLUGrad, Kind: EwGrad, Doc: "ReLUGrad(dy, x) -> dy where x > 0, else 0.",
			F64: reluGrad[float64], F32: reluGrad[float32], CUDA: "y > 0.0f ? x : 0.0f"},
		{Name: OpClampGrad, Kind: EwGrad, Doc: "ClampGrad(dy, x; lo, hi) -> dy where lo <= x <= hi, else 0 (PyTorch convention).",
			Attrs: clampBounds,
			F64:   clampGrad[float64], F32: clampGrad[float32], CUDA: "(a <= y && y <= b) ? x : 0.0f",
			Cases: []EwCase{{Attrs: Attrs{"lo": -0.5, "hi": 0.7}}}},
		{Name: OpSoftsignGrad, Kind: EwGrad, Doc: "SoftsignGrad(dy, x) -> dy/(1+|x|)².",
			F64: softsignGrad[float64], F32: softsignGrad[float32], CUDA: "x / ((1.0f + fabsf(y)) * (1.0f + fabsf(y)))"},
		{Name: OpNanToNumGrad, Kind: EwGrad, Doc: "NanToNumGrad(dy, x) -> dy where x is finite, else 0.",
			F64: nanToNumGrad[float64], F32: nanToNumGrad[float32], CUDA: "(y - y == 0.0f) ? x : 0.0f"},
	} {
		if s.Kind == EwBinary && s.Doc == "" {
			s.Doc = string(s.Name) + "(a, b) elementwise with numpy broadcasting."
		}
		if len(s.Cases) == 0 {
			s.Cases = []EwCase{{}}
		}
		RegisterElementwise(s)
	}
}
