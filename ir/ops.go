package ir

import (
	"errors"
	"fmt"
)

// OpDef is one entry of the op table.
type OpDef struct {
	Name OpName
	// TrainingOnly ops (Dropout, GumbelNoise) must not survive StripTraining;
	// the verifier rejects them in an export graph.
	TrainingOnly bool
	// Random ops draw fresh randomness per executed step.
	Random bool
	// NumIn is the number of inputs (-1: checked by Infer).
	NumIn int
	// Infer returns output shapes and dtypes.
	Infer func(in []*Value, a Attrs) ([]Shape, []DType, error)
	// Doc states the exact semantics; kernels follow it.
	Doc string
	// Scratch, when set, is the number of float elements a node's kernel
	// allocates for itself outside the memory plan (row chunks,
	// accumulators), so that a compiled program needs the plan's slots plus
	// the scratch of its nodes plus the stored tensors.
	Scratch func(n *Node) int
	// SharedScratch ops take their Scratch from one buffer of the program
	// that every node of such ops shares (the nodes run one at a time):
	// a program needs the largest of their scratch, not the sum.
	SharedScratch bool
	// InPlace ops compute each output element from the input elements at
	// the same index only, so a backend may write an output over an input
	// of the same shape (a plan slot shared between them). Elementwise ops
	// are InPlace without saying so.
	InPlace bool
	// ElementDraws ops are Random ops whose draw for output element i
	// depends only on the run's seed, the node's stream ("stream", else the
	// node's id) and i (Dropout, DropoutGrad): they are elementwise and
	// join FusedElementwise chains, the stream kept in the step's attrs.
	ElementDraws bool
	// Alias ops give their one input's elements in the same order
	// (Reshape, StopGradient): the memory plan may give the output its
	// input's slot, and then the op has nothing to do.
	Alias bool
	// Elementwise ops compute each output element from the input elements
	// at the same (numpy-broadcast) index: a backend may run them in place,
	// and a KV cache may run them on the new positions only.
	Elementwise bool
	// RowWise ops act along the last axis only: each output row is a
	// function of the same row of the inputs (Softmax, LayerNorm).
	RowWise bool
	// Gradient ops are emitted by passes.Autodiff only: they have no
	// gradient rule of their own and no place in an export graph.
	Gradient bool
	// Loss ops end training and evaluation graphs; an export graph computes
	// logits instead, so they have no ONNX lowering.
	Loss bool
	// IDInputs are the inputs that take i32 ids; every other input takes
	// float data, unless the op is AnyDType.
	IDInputs []int
	// AnyDType ops (Reshape) move data of either dtype.
	AnyDType bool
	// Fused ops are made by a backend's fusion pass after autodiff from
	// other ops of the table: no gradient rule, no place in an export
	// graph.
	Fused bool
	// ONNX names the ONNX operator of the same semantics for an op that is
	// lowered one to one ("Relu"); ops with a lowering of their own leave it
	// empty.
	ONNX string
	// Grad is the op's gradient rule where its definition states it (the
	// elementwise ops); passes/autodiff.go has the others.
	Grad GradRule
	// Spec is an elementwise op's whole definition (elementwise.go).
	Spec *EwSpec
}

// TakesIDs reports whether input i of the op may hold i32 data.
func (d *OpDef) TakesIDs(i int) bool {
	if d.AnyDType {
		return true
	}
	for _, j := range d.IDInputs {
		if i == j {
			return true
		}
	}
	return false
}

// Exported reports whether the op may appear in an export graph: a forward
// op that is neither training-only nor a loss. Every exported op has an
// ONNX lowering.
func (d *OpDef) Exported() bool { return !d.TrainingOnly && !d.Gradient && !d.Loss && !d.Fused }

// Ops is the op table. Every forward op has a gradient rule in passes/autodiff.go
// and a kernel in every backend.
var Ops = map[OpName]*OpDef{}

func reg(d *OpDef) {
	if _, dup := Ops[d.Name]; dup {
		panic("ir: op " + d.Name + " registered twice")
	}
	if d.Elementwise {
		d.InPlace = true
	}
	Ops[d.Name] = d
}

func same(i int) func(in []*Value, a Attrs) ([]Shape, []DType, error) {
	return func(in []*Value, a Attrs) ([]Shape, []DType, error) {
		return []Shape{in[i].Shape}, []DType{F32}, nil
	}
}

func one(s Shape) ([]Shape, []DType, error) { return []Shape{s}, []DType{F32}, nil }

// Broadcast returns the numpy broadcast of two shapes.
func Broadcast(a, b Shape) (Shape, error) {
	n := max(len(a), len(b))
	out := make(Shape, n)
	for i := 0; i < n; i++ {
		da, db := 1, 1
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db:
			out[i] = da
		case da == 1:
			out[i] = db
		case db == 1:
			out[i] = da
		default:
			return nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
	}
	return out, nil
}

// CanSumTo reports whether x can be reduced to s by summing broadcast axes.
func CanSumTo(x, s Shape) bool {
	b, err := Broadcast(x, s)
	return err == nil && b.Equal(x)
}

func binary(in []*Value, a Attrs) ([]Shape, []DType, error) {
	s, err := Broadcast(in[0].Shape, in[1].Shape)
	if err != nil {
		return nil, nil, err
	}
	return one(s)
}

func normAxes(axes []int, rank int) ([]int, error) {
	out := make([]int, len(axes))
	for i, ax := range axes {
		if ax < 0 {
			ax += rank
		}
		if ax < 0 || ax >= rank {
			return nil, fmt.Errorf("axis %d out of range for rank %d", axes[i], rank)
		}
		out[i] = ax
	}
	return out, nil
}

// ReduceShape is the result shape of reducing axes of s.
func ReduceShape(s Shape, axes []int, keep bool) (Shape, error) {
	ax, err := normAxes(axes, len(s))
	if err != nil {
		return nil, err
	}
	red := map[int]bool{}
	for _, a := range ax {
		red[a] = true
	}
	if len(axes) == 0 { // all axes
		for i := range s {
			red[i] = true
		}
	}
	var out Shape
	for i, d := range s {
		if red[i] {
			if keep {
				out = append(out, 1)
			}
			continue
		}
		out = append(out, d)
	}
	if out == nil {
		out = Shape{}
	}
	return out, nil
}

func init() {
	// ---- data movement ----
	reg(&OpDef{Name: OpGather, NumIn: 2, IDInputs: []int{1}, Doc: "Gather(W[V,D], ids[...] i32) -> [...,D]: rows of W. Ids outside [0,V) are an error.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if len(in[0].Shape) != 2 || in[1].DType != I32 {
				return nil, nil, errors.New("want W[V,D] and i32 ids")
			}
			s := append(in[1].Shape.Clone(), in[0].Shape[1])
			return one(s)
		}})
	reg(&OpDef{Name: OpGatherGrad, NumIn: 2, IDInputs: []int{1}, Gradient: true, Doc: "GatherGrad(dy[...,D], ids[...]; vocab V) -> dW[V,D]: scatter-add of dy rows into zeros.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			d := in[0].Shape[len(in[0].Shape)-1]
			return one(Shape{a.Int("vocab", 0), d})
		}})
	reg(&OpDef{Name: OpSlice, NumIn: 1, Doc: "Slice(x; axis, start, end) -> x with axis restricted to [start,end).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := in[0].Shape.Clone()
			ax := a.Int("axis", 0)
			if ax < 0 {
				ax += len(s)
			}
			st, en := a.Int("start", 0), a.Int("end", 0)
			if ax < 0 || ax >= len(s) || st < 0 || en > s[ax] || st >= en {
				return nil, nil, fmt.Errorf("bad slice axis %d [%d,%d) of %v", ax, st, en, s)
			}
			s[ax] = en - st
			return one(s)
		}})
	reg(&OpDef{Name: OpSliceGrad, NumIn: 1, Gradient: true, Doc: "SliceGrad(dy; axis, start, end, shape) -> zeros(shape) with dy written at [start,end) of axis.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) { return one(Shape(a.Ints("shape"))) }})
	reg(&OpDef{Name: OpReshape, NumIn: 1, InPlace: true, Alias: true, AnyDType: true, Doc: "Reshape(x; shape) -> same data, new shape (row-major).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := Shape(a.Ints("shape")).Clone()
			if s.Numel() != in[0].Shape.Numel() {
				return nil, nil, fmt.Errorf("reshape %v to %v", in[0].Shape, s)
			}
			return []Shape{s}, []DType{in[0].DType}, nil
		}})
	reg(&OpDef{Name: OpTranspose, NumIn: 1, Doc: "Transpose(x; perm) -> y with y.shape[i] = x.shape[perm[i]].",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			p := a.Ints("perm")
			if len(p) != len(in[0].Shape) {
				return nil, nil, errors.New("perm rank mismatch")
			}
			s := make(Shape, len(p))
			for i, j := range p {
				s[i] = in[0].Shape[j]
			}
			return one(s)
		}})
	reg(&OpDef{Name: OpBroadcastTo, NumIn: 1, Doc: "BroadcastTo(x; shape) -> x broadcast (numpy rules) to shape.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := Shape(a.Ints("shape"))
			if !CanSumTo(s, in[0].Shape) {
				return nil, nil, fmt.Errorf("cannot broadcast %v to %v", in[0].Shape, s)
			}
			return one(s.Clone())
		}})
	reg(&OpDef{Name: OpSumTo, NumIn: 1, Doc: "SumTo(x; shape) -> sum of x over the axes that broadcasting shape to x.shape expanded.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := Shape(a.Ints("shape"))
			if !CanSumTo(in[0].Shape, s) {
				return nil, nil, fmt.Errorf("cannot sum %v to %v", in[0].Shape, s)
			}
			return one(s.Clone())
		}})
	reg(&OpDef{Name: OpSumToProduct, NumIn: 2, Fused: true,
		Doc: "SumToProduct(x, y; shape) -> SumTo(x·y; shape) for x and y of one shape, each product rounded as Mul " +
			"rounds it: the product never written. Made by passes.FuseProductSums after autodiff.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := Shape(a.Ints("shape"))
			if !in[0].Shape.Equal(in[1].Shape) {
				return nil, nil, fmt.Errorf("x %v and y %v differ", in[0].Shape, in[1].Shape)
			}
			if !CanSumTo(in[0].Shape, s) {
				return nil, nil, fmt.Errorf("cannot sum %v to %v", in[0].Shape, s)
			}
			return one(s.Clone())
		}})

	// ---- linear algebra ----
	reg(&OpDef{Name: OpLinear, NumIn: -1, Doc: "Linear(x[...,K], W[N,K], b[N]?) -> x·Wᵀ + b, [...,N] (PyTorch nn.Linear layout).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if len(in) != 2 && len(in) != 3 {
				return nil, nil, errors.New("want 2 or 3 inputs")
			}
			x, w := in[0].Shape, in[1].Shape
			if len(w) != 2 || len(x) < 1 || x[len(x)-1] != w[1] {
				return nil, nil, fmt.Errorf("x %v with W %v", x, w)
			}
			if len(in) == 3 && !(len(in[2].Shape) == 1 && in[2].Shape[0] == w[0]) {
				return nil, nil, fmt.Errorf("bias %v for W %v", in[2].Shape, w)
			}
			s := x.Clone()
			s[len(s)-1] = w[0]
			return one(s)
		}})
	reg(&OpDef{Name: OpLinearGradX, NumIn: 2, Gradient: true, Doc: "LinearGradX(dy[...,N], W[N,K]) -> dy·W, [...,K].",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := in[0].Shape.Clone()
			s[len(s)-1] = in[1].Shape[1]
			return one(s)
		}})
	reg(&OpDef{Name: OpLinearGradW, NumIn: 2, Gradient: true, Doc: "LinearGradW(dy[...,N], x[...,K]) -> dyᵀ·x over all leading rows, [N,K].",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			return one(Shape{in[0].Shape[len(in[0].Shape)-1], in[1].Shape[len(in[1].Shape)-1]})
		}})
	reg(&OpDef{Name: OpMatMul, NumIn: 2, Doc: "MatMul(a, b; transA, transB) batched over equal leading dims: op(a)[...,M,K]·op(b)[...,K,N] -> [...,M,N].",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			x, y := in[0].Shape, in[1].Shape
			if len(x) < 2 || len(x) != len(y) {
				return nil, nil, errors.New("want equal ranks >= 2")
			}
			r := len(x)
			for i := 0; i < r-2; i++ {
				if x[i] != y[i] {
					return nil, nil, errors.New("batch dims differ")
				}
			}
			m, k := x[r-2], x[r-1]
			if a.Bool("transA", false) {
				m, k = k, m
			}
			k2, n := y[r-2], y[r-1]
			if a.Bool("transB", false) {
				k2, n = n, k2
			}
			if k != k2 {
				return nil, nil, fmt.Errorf("inner dims %d vs %d", k, k2)
			}
			s := x.Clone()
			s[r-2], s[r-1] = m, n
			return one(s)
		}})

	// ---- elementwise: elementwise.go, and StopGradient ----
	reg(&OpDef{Name: OpStopGradient, NumIn: 1, Infer: same(0), Elementwise: true, Alias: true,
		Doc: "StopGradient(x) -> x; no gradient flows through (PyTorch .detach())."})

	// ---- reductions ----
	for _, op := range []OpName{OpReduceSum, OpReduceMean} {
		reg(&OpDef{Name: op, NumIn: 1, Doc: string(op) + "(x; axes, keepdims) over the listed axes (none listed: all).",
			Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
				s, err := ReduceShape(in[0].Shape, a.Ints("axes"), a.Bool("keepdims", false))
				if err != nil {
					return nil, nil, err
				}
				return one(s)
			}})
	}

	// ---- neural network ----
	reg(&OpDef{Name: OpSoftmax, NumIn: 1, Infer: same(0), InPlace: true, RowWise: true, Doc: "Softmax(x) over the last axis (max-subtracted). A row of all -Inf gives zeros."})
	reg(&OpDef{Name: OpSoftmaxGrad, NumIn: 2, Infer: same(1), InPlace: true, Gradient: true, Doc: "SoftmaxGrad(dy, y) -> y·(dy - Σ dy·y) over the last axis."})
	reg(&OpDef{Name: OpCausalMask, NumIn: 1, InPlace: true, Doc: "CausalMask(x[...,T,T]; fill) -> x with entries j > i of the last two axes set to fill (default -Inf).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			s := in[0].Shape
			if len(s) < 2 || s[len(s)-1] != s[len(s)-2] {
				return nil, nil, errors.New("want [...,T,T]")
			}
			return one(s)
		}})
	reg(&OpDef{Name: OpLayerNorm, NumIn: 3, RowWise: true, Doc: "LayerNorm(x[...,D], g[W], b[W]; eps, width W (default D)) -> (x-mean)/sqrt(var+eps)·g + b, biased variance over the last axis; with W < D the statistics and g, b cover the first W entries and the entries from W on are padding: output 0.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if err := layerNormWidth(in[0].Shape, a, in[1], in[2]); err != nil {
				return nil, nil, err
			}
			return same(0)(in, a)
		}})
	reg(&OpDef{Name: OpLayerNormGrad, NumIn: 3, Gradient: true, Doc: "LayerNormGrad(dy, x, g; eps, width) -> (dx, dg, db); with width W < D the entries of x from W on get gradient 0.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if err := layerNormWidth(in[1].Shape, a, in[2]); err != nil {
				return nil, nil, err
			}
			return []Shape{in[1].Shape, in[2].Shape, in[2].Shape}, []DType{F32, F32, F32}, nil
		}})
	reg(&OpDef{Name: OpDropout, NumIn: 1, TrainingOnly: true, Random: true, ElementDraws: true, Infer: same(0),
		Doc: "Dropout(x; p) -> x·mask with mask = Bernoulli(1-p)/(1-p), fresh per step: element i keeps when the 32-bit half (i&1) " +
			"of draw i>>1 of the node's stream (attribute stream, else the node's id) is below (1-p)·2³²."})
	reg(&OpDef{Name: OpDropoutGrad, NumIn: 1, TrainingOnly: true, Random: true, ElementDraws: true, Gradient: true, Infer: same(0),
		Doc: "DropoutGrad(dy; p, stream) -> dy·mask, mask the one the Dropout node whose id is stream drew in the same run " +
			"(drawn again from its stream: no mask is kept between the forward and the backward)."})
	reg(&OpDef{Name: OpGumbelNoise, NumIn: 1, TrainingOnly: true, Random: true, Infer: same(0),
		Doc: "GumbelNoise(x) -> x - log(-log(u)), u ~ U(0,1) clamped to [1e-6, 1-1e-6], fresh per step; gradient is identity."})
	reg(&OpDef{Name: OpTopKMask, NumIn: 1, Infer: same(0), RowWise: true, Doc: "TopKMask(x; k) -> 1 at the k largest entries of each last-axis row (ties: lower index), else 0. No gradient."})
	reg(&OpDef{Name: OpCrossEntropy, NumIn: 2, IDInputs: []int{1}, Loss: true, Doc: "CrossEntropy(logits[N,V], targets[N] i32; label_smoothing ls) -> (smoothed CE sum, pure CE sum), PyTorch semantics; " +
		"a target IgnoreTarget (-1) adds nothing to either sum and gets a zero gradient row (ignore_index).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			l, t := in[0].Shape, in[1].Shape
			if len(l) != 2 || len(t) != 1 || t[0] != l[0] || in[1].DType != I32 {
				return nil, nil, errors.New("want logits[N,V], targets[N] i32")
			}
			return []Shape{{}, {}}, []DType{F32, F32}, nil
		}})
	reg(&OpDef{Name: OpLMHeadCrossEntropy, NumIn: 3, IDInputs: []int{2}, Loss: true,
		Doc: "LMHeadCrossEntropy(x[N,D], W[V,D], targets[N] i32; label_smoothing ls, chunk) -> (sm_sum[], ce_sum[], pred[N] i32): " +
			"the two sums of CrossEntropy(x·Wᵀ, targets; ls) (rows with target IgnoreTarget left out) and pred, the argmax of each row of x·Wᵀ " +
			"(ties: lower index; NaN ranks last; every row). " +
			"The [N,V] logits are never held at once: rows are processed chunk at a time (chunk <= 0: LMHeadChunk).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			n, err := lmHeadRows(in)
			if err != nil {
				return nil, nil, err
			}
			return []Shape{{}, {}, {n}}, []DType{F32, F32, I32}, nil
		},
		// a chunk of logits and two float64 per chunk row
		Scratch: func(n *Node) int { return LMHeadChunkRows(n) * (n.Inputs[1].Shape[0] + 4) }})
	reg(&OpDef{Name: OpLMHeadCrossEntropyGrad, NumIn: 4, IDInputs: []int{3}, Gradient: true,
		Doc: "LMHeadCrossEntropyGrad(dsm[], x[N,D], W[V,D], targets[N] i32; label_smoothing ls, chunk) -> (dx[N,D], dW[V,D]): " +
			"the gradient of dsm·sm_sum of LMHeadCrossEntropy: with dlogits = dsm·(softmax(x·Wᵀ) - ((1-ls)·onehot + ls/V)), " +
			"dx = dlogits·W and dW = dlogitsᵀ·x, dlogits zero on rows with target IgnoreTarget. " +
			"A backend may compute it during the LMHeadCrossEntropy on the same inputs.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if len(in[0].Shape) != 0 {
				return nil, nil, fmt.Errorf("dsm %v, want a scalar", in[0].Shape)
			}
			if _, err := lmHeadRows(in[1:]); err != nil {
				return nil, nil, err
			}
			return []Shape{in[1].Shape, in[2].Shape}, []DType{F32, F32}, nil
		},
		// the unscaled dx and dW, accumulated while the forward runs, a chunk
		// of x rows scaled for the dW product, two column sums and one
		// float64 per row
		Scratch: func(n *Node) int {
			x, w := n.Inputs[1].Shape, n.Inputs[2].Shape
			return x.Numel() + w.Numel() + (LMHeadChunkRows(n)+2)*x[1] + 2*x[0]
		}})
	reg(&OpDef{Name: OpCrossEntropyGrad, NumIn: 3, IDInputs: []int{2}, Gradient: true, Doc: "CrossEntropyGrad(dloss[], logits[N,V], targets[N]; label_smoothing) -> dlogits = dloss·(softmax - ((1-ls)·onehot + ls/V)); " +
		"zero on rows with target IgnoreTarget.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) { return one(in[1].Shape) }})

	// ---- the paper's ops ----
	reg(&OpDef{Name: OpGaussianMembership, NumIn: 3, RowWise: true, Doc: "GaussianMembership(z[...,D], centers[R,D], log_sigma[R]) -> μ[...,R] = nan_to_num(softmax(clamp(-0.5·‖z-c_r‖²·clamp(exp(-2·log_sigma),1e-3,1e3), -30, 30)), 1/R).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			z, c, ls := in[0].Shape, in[1].Shape, in[2].Shape
			if len(c) != 2 || len(ls) != 1 || ls[0] != c[0] || z[len(z)-1] != c[1] {
				return nil, nil, errors.New("want z[...,D], centers[R,D], log_sigma[R]")
			}
			s := z.Clone()
			s[len(s)-1] = c[0]
			return one(s)
		}})
	reg(&OpDef{Name: OpGaussianMembershipGrad, NumIn: 5, Gradient: true, Doc: "GaussianMembershipGrad(dμ, z, centers, log_sigma, μ) -> (dz, dcenters, dlog_sigma); clamps pass gradient only inside their range.",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			return []Shape{in[1].Shape, in[2].Shape, in[3].Shape}, []DType{F32, F32, F32}, nil
		}})
	reg(&OpDef{Name: OpSinkhorn, NumIn: 1, Doc: "Sinkhorn(X[R,K]; iters) -> X after iters rounds of row then column normalisation (each divides by sum + 1e-9).",
		Infer: func(in []*Value, a Attrs) ([]Shape, []DType, error) {
			if len(in[0].Shape) != 2 {
				return nil, nil, errors.New("want [R,K]")
			}
			return one(in[0].Shape)
		}})
	reg(&OpDef{Name: OpSinkhornGrad, NumIn: 2, Gradient: true, Infer: same(1), Doc: "SinkhornGrad(dP, X; iters) -> dX through the unrolled iterations."})
	reg(&OpDef{Name: OpZScore, NumIn: 1, Infer: same(0), Doc: "ZScore(x) -> (x - mean(x)) / (std(x) + 1e-6) over all elements, std unbiased (N-1) as torch.std."})
	reg(&OpDef{Name: OpZScoreGrad, NumIn: 2, Gradient: true, Infer: same(1), Doc: "ZScoreGrad(dy, x) -> dx."})

	// ---- attention fusions (passes.FuseAttention, passes.FuseTrainingAttention) ----
	reg(&OpDef{Name: OpFusedAttention, NumIn: -1, Infer: inferAttention(false),
		Doc: "FusedAttention(q[B,H,T,Hd], k[B,H,S,Hd], v[B,H,S,Hv], mask[T,S]?; scale, causal, dropout, stream) -> " +
			"(softmax(scale·q·kᵀ + mask) ∘ D)·v, [B,H,T,Hv]. mask is an additive float mask (-Inf entries are masked out); " +
			"causal sets entries j > i to -Inf before the softmax. A row that is entirely -Inf gives zeros. " +
			"D is 1 without dropout (export graphs); with dropout p > 0 (training graphs) it is the mask a Dropout node " +
			"with ID stream draws over the [B,H,T,S] weights (element ((b·H+h)·T+i)·S+j of that node's stream), so the " +
			"fused core equals the unfused one draw for draw (stream absent: this node's own ID). With layout bthd, q, k, v " +
			"and the output are [B,T,H,·] instead (the same attention, heads not moved before the sequence)."})
	reg(&OpDef{Name: OpFusedAttentionGrad, NumIn: -1, Gradient: true, Infer: inferAttention(true),
		Doc: "FusedAttentionGrad(dO[B,H,T,Hv], q, k, v, mask?, out?; scale, causal, dropout, stream, with_out) -> (dq, dk, dv, dmask?): " +
			"the gradient of Σ dO·FusedAttention(q, k, v, mask) (same attributes); dmask [T,S] sums over B and H. " +
			"The weights are recomputed, never stored. With with_out the last input is the forward's output, " +
			"which a backend may use (with the forward's row statistics) instead of running the forward again."})
}

// AttnLayout is the layout of a FusedAttention(Grad) node's q, k, v,
// output, dO and gradients (attribute "layout").
type AttnLayout uint8

const (
	// AttnBHTD: [B,H,T,D], each head's rows together (the default).
	AttnBHTD AttnLayout = iota
	// AttnBTHD: [B,T,H,D], a projection's [B,T,H·D] rows as they are
	// (passes.AttentionLayout): no Transpose on either side.
	AttnBTHD
)

// attnLayoutBTHD is AttnBTHD's spelling in the layout attribute.
const attnLayoutBTHD = "bthd"

// AttnLayoutOf reads a node's layout attribute.
func AttnLayoutOf(a Attrs) AttnLayout {
	if s, _ := a["layout"].(string); s == attnLayoutBTHD {
		return AttnBTHD
	}
	return AttnBHTD
}

// Set writes the layout into a (the default: no attribute).
func (l AttnLayout) Set(a Attrs) {
	delete(a, "layout")
	if l == AttnBTHD {
		a["layout"] = attnLayoutBTHD
	}
}

// Dims reads batch, heads, length and head size off a q, k or v shape.
func (l AttnLayout) Dims(s Shape) (B, H, T, D int) {
	if l == AttnBTHD {
		return s[0], s[2], s[1], s[3]
	}
	return s[0], s[1], s[2], s[3]
}

// SplitAttentionGrad separates a FusedAttentionGrad node's inputs (or
// anything standing for them) into dO, q, k, v, mask? and, with the
// with_out attribute, the forward's output (has reports it).
func SplitAttentionGrad[T any](a Attrs, in []T) (main []T, out T, has bool) {
	if a.Bool("with_out", false) && len(in) > 0 {
		return in[:len(in)-1], in[len(in)-1], true
	}
	return in, out, false
}

// inferAttention checks FusedAttention's inputs (grad: after a leading
// dO) and gives its output, or the gradient's outputs (one per input).
func inferAttention(grad bool) func(in []*Value, a Attrs) ([]Shape, []DType, error) {
	return func(in []*Value, a Attrs) ([]Shape, []DType, error) {
		var dO *Value
		if grad {
			var o *Value
			var has bool
			in, o, has = SplitAttentionGrad(a, in)
			if len(in) < 1 {
				return nil, nil, errors.New("want dO, q, k, v and an optional mask")
			}
			dO, in = in[0], in[1:]
			if has && !o.Shape.Equal(dO.Shape) {
				return nil, nil, fmt.Errorf("the forward's output %v, want dO's shape %v", o.Shape, dO.Shape)
			}
		}
		if len(in) != 3 && len(in) != 4 {
			return nil, nil, errors.New("want q, k, v and an optional mask")
		}
		q, k, v := in[0].Shape, in[1].Shape, in[2].Shape
		if len(q) != 4 || len(k) != 4 || len(v) != 4 {
			return nil, nil, errors.New("want rank-4 q, k, v ([B,H,T,Hd], or [B,T,H,Hd] with layout bthd)")
		}
		if l, ok := a["layout"]; ok && l != attnLayoutBTHD {
			return nil, nil, fmt.Errorf("layout %v, want %q or none", l, attnLayoutBTHD)
		}
		lay := AttnLayoutOf(a)
		qB, qH, T, qD := lay.Dims(q)
		kB, kH, S, kD := lay.Dims(k)
		if qB != kB || qH != kH || qD != kD || !k[:3].Equal(v[:3]) {
			return nil, nil, fmt.Errorf("q %v, k %v, v %v do not agree", q, k, v)
		}
		if len(in) == 4 {
			if m := in[3].Shape; len(m) != 2 || m[0] != T || m[1] != S {
				return nil, nil, fmt.Errorf("mask %v, want [%d,%d]", m, T, S)
			}
		}
		if a.Bool("causal", false) && T != S {
			return nil, nil, errors.New("causal attention wants T == S")
		}
		if p := a.Float("dropout", 0); p < 0 || p >= 1 {
			return nil, nil, fmt.Errorf("dropout %g, want [0, 1)", p)
		} else if p > 0 && grad && a.Int("stream", -1) < 0 {
			return nil, nil, errors.New("with dropout the gradient needs the forward's stream attribute (the node ID whose draws it repeats)")
		}
		out := Shape{q[0], q[1], q[2], v[3]}
		if !grad {
			return one(out)
		}
		if !dO.Shape.Equal(out) {
			return nil, nil, fmt.Errorf("dO %v, want %v", dO.Shape, out)
		}
		shapes, dts := []Shape{q.Clone(), k.Clone(), v.Clone()}, []DType{F32, F32, F32}
		if len(in) == 4 {
			shapes, dts = append(shapes, in[3].Shape.Clone()), append(dts, F32)
		}
		return shapes, dts, nil
	}
}

// IgnoreTarget is the target id that the cross-entropy ops (CrossEntropy,
// LMHeadCrossEntropy and their gradients) leave out: such a row adds nothing
// to the loss sums and gets a zero gradient (PyTorch's ignore_index).
const IgnoreTarget int32 = -1

// LMHeadChunk is the default largest number of rows LMHeadCrossEntropy
// computes at once. With a 50,257-token vocabulary one chunk of float32
// logits is 196 MiB, where Linear and CrossEntropy hold N·V floats of
// logits and as many of their gradient (1.5 GiB each at the small preset's
// 8,192 tokens). Measured on
// the tiny preset's head (2,048 rows, D = 128, 2 cores, OpenBLAS): smaller
// chunks cost time at every switch between a GEMM and the row work (at
// 256 rows the head is about 15% slower than unfused); at 1,024 rows it is
// about as fast as the unfused head.
const LMHeadChunk = 1024

// LMHeadChunkRows is the number of rows an LMHeadCrossEntropy or
// LMHeadCrossEntropyGrad node computes at once: N split into the fewest
// chunks of at most its chunk attribute (LMHeadChunk when absent or not
// positive), all of nearly equal size; at least 1.
func LMHeadChunkRows(n *Node) int {
	c := n.Attrs.Int("chunk", 0)
	if c <= 0 {
		c = LMHeadChunk
	}
	x := n.Inputs[0]
	if n.Op == OpLMHeadCrossEntropyGrad {
		x = n.Inputs[1]
	}
	N := x.Shape[0]
	if N <= c {
		return max(1, N)
	}
	k := (N + c - 1) / c
	return (N + k - 1) / k
}

// lmHeadRows checks x[N,D], W[V,D], targets[N] i32 and returns N.
func lmHeadRows(in []*Value) (int, error) {
	x, w, t := in[0], in[1], in[2]
	if len(x.Shape) != 2 || len(w.Shape) != 2 || x.Shape[1] != w.Shape[1] || x.DType != F32 || w.DType != F32 {
		return 0, fmt.Errorf("x %v with W %v, want x[N,D] and W[V,D]", x.Shape, w.Shape)
	}
	if len(t.Shape) != 1 || t.Shape[0] != x.Shape[0] || t.DType != I32 {
		return 0, fmt.Errorf("targets %s%v, want i32 [%d]", t.DType, t.Shape, x.Shape[0])
	}
	return x.Shape[0], nil
}

// Verify checks a graph's structural invariants: every node's op exists,
// inputs are defined before use, recorded shapes match the shape rule, and
// Const data sizes match. With export set, training-only ops and
// training-only buffers are rejected.
func Verify(g *Graph, export bool) error {
	defined := map[*Value]bool{}
	for _, v := range g.Values {
		if v.Kind != Intermediate {
			defined[v] = true
			if v.Kind == Const && len(v.Data) != v.Shape.Numel() {
				return fmt.Errorf("verify %s: const %s has %d values for %v", g.Name, v, len(v.Data), v.Shape)
			}
			if export && v.TrainingOnly {
				return fmt.Errorf("verify %s: training-only buffer %s left in export graph", g.Name, v)
			}
		}
	}
	for _, n := range g.Nodes {
		def, ok := Ops[n.Op]
		if !ok {
			return fmt.Errorf("verify %s: node %d: unknown op %q", g.Name, n.ID, n.Op)
		}
		if export && def.TrainingOnly {
			return fmt.Errorf("verify %s: training-only op %s (node %d) left in export graph", g.Name, n.Op, n.ID)
		}
		if def.NumIn >= 0 && len(n.Inputs) != def.NumIn {
			return fmt.Errorf("verify %s: %s node %d has %d inputs, want %d", g.Name, n.Op, n.ID, len(n.Inputs), def.NumIn)
		}
		for _, in := range n.Inputs {
			if !defined[in] {
				return fmt.Errorf("verify %s: %s node %d reads %s before it is defined", g.Name, n.Op, n.ID, in)
			}
		}
		shapes, _, err := def.Infer(n.Inputs, n.Attrs)
		if err != nil {
			return fmt.Errorf("verify %s: %s node %d: %w", g.Name, n.Op, n.ID, err)
		}
		if len(shapes) != len(n.Outputs) {
			return fmt.Errorf("verify %s: %s node %d has %d outputs, want %d", g.Name, n.Op, n.ID, len(n.Outputs), len(shapes))
		}
		for i, o := range n.Outputs {
			if !o.Shape.Equal(shapes[i]) {
				return fmt.Errorf("verify %s: %s node %d output %d shape %v, rule says %v", g.Name, n.Op, n.ID, i, o.Shape, shapes[i])
			}
			if o.Def != n {
				return fmt.Errorf("verify %s: %s node %d output %s has wrong Def", g.Name, n.Op, n.ID, o)
			}
			if defined[o] {
				return fmt.Errorf("verify %s: %s defined twice", g.Name, o)
			}
			defined[o] = true
		}
	}
	for name, v := range g.Outputs {
		if !defined[v] {
			return fmt.Errorf("verify %s: output %q is not defined", g.Name, name)
		}
	}
	return nil
}

// LayerNormWidth is the number of leading entries of x's last axis that a
// LayerNorm(Grad) node normalises (attribute width; all of them without
// it). The entries past it are padding (compiler/model's aligned widths).
func LayerNormWidth(x Shape, a Attrs) int {
	D := 0
	if len(x) > 0 {
		D = x[len(x)-1]
	}
	return a.Int("width", D)
}

// layerNormWidth checks the width attribute against x[...,D] and the
// parameters, each [W].
func layerNormWidth(x Shape, a Attrs, params ...*Value) error {
	if len(x) == 0 {
		return errors.New("want [...,D]")
	}
	w, D := LayerNormWidth(x, a), x[len(x)-1]
	if w < 1 || w > D {
		return fmt.Errorf("width %d outside 1..%d", w, D)
	}
	for _, p := range params {
		if !p.Shape.Equal(Shape{w}) {
			return fmt.Errorf("parameter %v over a width of %d", p.Shape, w)
		}
	}
	return nil
}
