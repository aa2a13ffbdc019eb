package cuda

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/rpac-dev/rpac/ir"
	"github.com/rpac-dev/rpac/kernels"
	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

var errUnsupported = errors.New("no cuda kernel")

const threads = 256

// grid1 is the grid of a grid-stride kernel over n elements.
func grid1(n int) [3]uint32 {
	b := (n + threads - 1) / threads
	return [3]uint32{uint32(min(max(b, 1), 8192)), 1, 1}
}

var block1 = [3]uint32{threads, 1, 1}

func blocks(n int, per int) [3]uint32 { return [3]uint32{uint32(max(1, (n+per-1)/per)), 1, 1} }

func (p *program) launch(name string, grid, block [3]uint32, shared uint32, args ...any) error {
	return p.be.dev.launch(name, grid, block, shared, args...)
}

// each launches a grid-stride kernel over n elements.
func (p *program) each(name string, n int, args ...any) error {
	if n == 0 {
		return nil
	}
	return p.launch(name, grid1(n), block1, 0, args...)
}

// copy copies n 32-bit words from src to dst.
func (p *program) copy(dst, src Buffer, n int) error {
	if dst.Ptr == src.Ptr {
		return nil
	}
	return p.each("copy_words", n, dst.Ptr, src.Ptr, int64(n))
}

func (p *program) zero(b Buffer, n int) error {
	return p.be.dev.zero(b, uint64(4*n))
}

// uploadView puts a view's packed form in device memory for the node.
func (p *program) uploadView(v view) (Buffer, error) {
	packed := v.pack()
	return p.uploadNew(unsafe.Pointer(&packed[0]), 8*len(packed))
}

// build returns the launches of one node: the elementwise ops' from their
// spec (ewgen.go), the others' from builders.
func (p *program) build(n *ir.Node, in, out []*dval) (func() error, error) {
	if err := checkI32Inputs(n, in); err != nil {
		return nil, err
	}
	if s := ir.ElementwiseOf(n.Op); s != nil {
		return p.buildElementwise(n, s, in, out)
	}
	if f, ok := builders[n.Op]; ok {
		return f(p, n, in, out)
	}
	return nil, errUnsupported
}

// builder makes the launches of one node.
type builder func(p *program, n *ir.Node, in, out []*dval) (func() error, error)

// builders is the CUDA registration table: the builder of every op that
// is not elementwise (HasKernel reads it).
var builders map[ir.OpName]builder

// noAttrs adapts a builder that reads no attributes.
func noAttrs(f func(p *program, in, out []*dval) (func() error, error)) builder {
	return func(p *program, _ *ir.Node, in, out []*dval) (func() error, error) { return f(p, in, out) }
}

func init() {
	builders = map[ir.OpName]builder{
		"Reshape":      buildCopy,
		"StopGradient": buildCopy,
		"Gather":       noAttrs((*program).buildGather),
		"GatherGrad":   (*program).buildGatherGrad,
		"Slice": func(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
			a := n.Attrs
			v, err := sliceView(in[0].v.Shape, a.Int("axis", 0), a.Int("start", 0), a.Int("end", 0))
			if err != nil {
				return nil, err
			}
			return p.gatherView(v, in[0], out[0])
		},
		"SliceGrad": (*program).buildSliceGrad,
		"Pad":       (*program).buildPad,
		"PadGrad":   (*program).buildPadGrad,
		"Transpose": func(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
			v, err := transposeView(in[0].v.Shape, n.Attrs.Ints("perm"))
			if err != nil {
				return nil, err
			}
			return p.gatherView(v, in[0], out[0])
		},
		"BroadcastTo": func(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
			v, err := broadcastToView(in[0].v.Shape, out[0].v.Shape)
			if err != nil {
				return nil, err
			}
			return p.gatherView(v, in[0], out[0])
		},
		"SumTo":                  buildReduction,
		"ReduceSum":              buildReduction,
		"ReduceMean":             buildReduction,
		"SumToProduct":           buildSumToProduct,
		"Linear":                 noAttrs((*program).buildLinear),
		"LinearGradX":            noAttrs((*program).buildLinearGradX),
		"LinearGradW":            noAttrs((*program).buildLinearGradW),
		"MatMul":                 (*program).buildMatMul,
		"Softmax":                (*program).buildSoftmax,
		"SoftmaxGrad":            (*program).buildSoftmax,
		"CausalMask":             buildCausalMask,
		"LayerNorm":              (*program).buildLayerNorm,
		"LayerNormGrad":          (*program).buildLayerNormGrad,
		"Dropout":                (*program).buildDropout,
		"DropoutGrad":            (*program).buildDropoutGrad,
		"GumbelNoise":            buildGumbel,
		"TopKMask":               buildTopKMask,
		"CrossEntropy":           (*program).buildCrossEntropy,
		"CrossEntropyGrad":       (*program).buildCrossEntropyGrad,
		"LMHeadCrossEntropy":     (*program).buildLMHead,
		"LMHeadCrossEntropyGrad": (*program).buildLMHeadGrad,
		"GaussianMembership":     (*program).buildMembership,
		"GaussianMembershipGrad": (*program).buildMembership,
		"Sinkhorn":               (*program).buildSinkhorn,
		"SinkhornGrad":           (*program).buildSinkhorn,
		"ZScore":                 (*program).buildZScore,
		"ZScoreGrad":             (*program).buildZScore,
		"FusedAttention":         (*program).buildFusedAttention,
		"FusedAttentionGrad":     (*program).buildFusedAttentionGrad,
		"Concat": func(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
			if step, lazy, err := p.buildLazyConcat(n, in); lazy || err != nil {
				return step, err
			}
			return p.buildConcat(n, in, out)
		},
		"FusedElementwise": (*program).buildFused,
		"ExpertFFN":        (*program).buildExpertFFN,
		"ExpertFFNGrad":    (*program).buildExpertFFNGrad,
	}
}

func buildCopy(p *program, _ *ir.Node, in, out []*dval) (func() error, error) {
	x, o := in[0], out[0]
	return func() error { return p.copy(o.buf, x.buf, o.n) }, nil
}

// buildReduction: SumTo, ReduceSum, ReduceMean.
func buildReduction(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
	if s, ok := p.sums[n.ID]; ok { // the chain making the input summed it (chainsum.go)
		return s.finish(p, out[0]), nil
	}
	red, mean, err := reductionOf(n, in[0].v.Shape)
	if err != nil {
		return nil, err
	}
	return p.reduce(in[0], out[0], red, mean)
}

func buildSumToProduct(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
	if s, ok := p.sums[n.ID]; ok { // the chain making a factor summed the products
		return s.finish(p, out[0]), nil
	}
	red, _, err := reductionOf(n, in[0].v.Shape)
	if err != nil {
		return nil, err
	}
	return p.reduceProduct(in[0], in[1], out[0], red, false)
}

func buildCausalMask(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
	x, o := in[0], out[0]
	s := x.v.Shape
	T := s[len(s)-1]
	fill := float32(n.Attrs.Float("fill", math.Inf(-1)))
	return func() error {
		return p.each("causal_mask_f32", o.n, o.buf.Ptr, x.buf.Ptr, int32(T), fill, int64(o.n))
	}, nil
}

func buildGumbel(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
	x, o, id := in[0], out[0], n.Stream()
	return func() error {
		return p.each("gumbel_f32", o.n, o.buf.Ptr, x.buf.Ptr, kernels.StreamKey(p.seed, id), int64(o.n))
	}, nil
}

func buildTopKMask(p *program, n *ir.Node, in, out []*dval) (func() error, error) {
	x, o := in[0], out[0]
	s := x.v.Shape
	cols := s[len(s)-1]
	rows, k := x.n/max(1, cols), n.Attrs.Int("k", 1)
	return func() error {
		return p.each("topk_mask_f32", rows, o.buf.Ptr, x.buf.Ptr, int32(rows), int32(cols), int32(k))
	}, nil
}

// checkI32Inputs allows i32 data only where the op table takes ids.
func checkI32Inputs(n *ir.Node, in []*dval) error {
	ids := map[ir.OpName]int{"Gather": 1, "GatherGrad": 1, "CrossEntropy": 1, "CrossEntropyGrad": 2,
		"LMHeadCrossEntropy": 2, "LMHeadCrossEntropyGrad": 3}
	for i, x := range in {
		if !x.i32() {
			continue
		}
		if j, ok := ids[n.Op]; (ok && j == i) || n.Op == ir.OpReshape {
			continue
		}
		return fmt.Errorf("input %s is i32; %s takes float data there", x.v, n.Op)
	}
	return nil
}

// oneStepChain is binary node n as a FusedElementwise node of one step
// (same ID, inputs and outputs), which runs as a generated kernel: a
// broadcast input read at offsets whose divisions are by constants
// instead of binary_f32's runtime view.
func oneStepChain(n *ir.Node) *ir.Node {
	c := *n
	c.Op = "FusedElementwise"
	c.Attrs = ir.Attrs{"shape": []int(n.Outputs[0].Shape), "body": ir.FusedBody{{Op: n.Op, Args: []int{0, 1}}}}
	return &c
}

func (p *program) buildBinary(code int32, in, out []*dval) (func() error, error) {
	a, b, o := in[0], in[1], out[0]
	if slices.Equal(a.v.Shape, o.v.Shape) && slices.Equal(b.v.Shape, o.v.Shape) {
		return func() error {
			return p.each("binary_dense_f32", o.n, o.buf.Ptr, a.buf.Ptr, b.buf.Ptr, code, int64(o.n))
		}, nil
	}
	v, err := binaryView(out[0].v.Shape, in[0].v.Shape, in[1].v.Shape)
	if err != nil {
		return nil, err
	}
	meta, err := p.uploadView(v)
	if err != nil {
		return nil, err
	}
	return func() error {
		return p.each("binary_f32", o.n, o.buf.Ptr, a.buf.Ptr, b.buf.Ptr, meta.Ptr, int32(v.rank()), code, int64(o.n))
	}, nil
}

func (p *program) gatherView(v view, x, o *dval) (func() error, error) {
	meta, err := p.uploadView(v)
	if err != nil {
		return nil, err
	}
	return func() error {
		return p.each("gather_view_f32", o.n, o.buf.Ptr, x.buf.Ptr, meta.Ptr, int32(v.rank()), int64(o.n))
	}, nil
}

func (p *program) buildSliceGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	a := n.Attrs
	v, err := sliceView(out[0].v.Shape, a.Int("axis", 0), a.Int("start", 0), a.Int("end", 0))
	if err != nil {
		return nil, err
	}
	meta, err := p.uploadView(v)
	if err != nil {
		return nil, err
	}
	dy, o := in[0], out[0]
	return func() error {
		if err := p.zero(o.buf, o.n); err != nil {
			return err
		}
		return p.each("scatter_view_f32", dy.n, o.buf.Ptr, dy.buf.Ptr, meta.Ptr, int32(v.rank()), int64(dy.n))
	}, nil
}

// reductionOf is what reduction node n (SumTo, SumToProduct, ReduceSum,
// ReduceMean) does to an input of shape x: the axes it sums, and whether
// it takes their mean.
func reductionOf(n *ir.Node, x ir.Shape) (red []bool, mean bool, err error) {
	if n.Op == ir.OpSumTo || n.Op == ir.OpSumToProduct {
		red, err = sumToAxes(x, ir.Shape(n.Attrs.Ints("shape")))
		return red, false, err
	}
	red, err = reduceAxes(x, n.Attrs.Ints("axes"))
	return red, n.Op == ir.OpReduceMean, err
}

// reduceScale is what a reduction of nred terms scales its sums by: 1, or
// a mean's 1/nred.
func reduceScale(nred int, mean bool) float32 {
	if !mean {
		return 1
	}
	return float32(1 / float64(nred))
}

// reduce sums x over the marked axes into o (scaled to a mean when asked):
// a two-pass reduction when the axes are the middle axis of a row-major
// [A, R, C], two of them when they are the outer and inner axes of an
// [X, K, Y] (reduce.go), else reduce_view_f32's thread per output.
func (p *program) reduce(x, o *dval, red []bool, mean bool) (func() error, error) {
	return p.reduceProduct(x, nil, o, red, mean)
}

// reduceProduct is reduce over the products x·y (y of x's shape), each
// product rounded to float as a Mul writes it (SumToProduct); y nil: x.
func (p *program) reduceProduct(x, y, o *dval, red []bool, mean bool) (func() error, error) {
	ov, rv := reduceViews(x.v.Shape, red)
	nred := 1
	for _, d := range rv.dims {
		nred *= int(d)
	}
	if nout := x.n / max(1, nred); nout != o.n {
		return nil, fmt.Errorf("reduction of %v gives %d elements, output %v has %d", x.v.Shape, nout, o.v.Shape, o.n)
	}
	scale := reduceScale(nred, mean)
	yp := func() uint64 {
		if y == nil {
			return 0
		}
		return y.buf.Ptr
	}
	if m, ok := midAxisOf(ov, rv); ok {
		plan := planReduce(m)
		p.needWork(plan.workspace())
		return func() error { return plan.run(p.launch, o.buf.Ptr, p.work.Ptr, x.buf.Ptr, yp(), scale) }, nil
	}
	if m, ok := outerInnerOf(ov, rv); ok {
		plan := planOuterInner(m)
		p.needWork(plan.workspace())
		return func() error { return plan.run(p.launch, o.buf.Ptr, p.work.Ptr, x.buf.Ptr, yp(), scale) }, nil
	}
	packed := append(append(append(append([]int64(nil), ov.dims...), ov.strides[0]...), rv.dims...), rv.strides[0]...)
	meta, err := p.uploadNew(unsafe.Pointer(&packed[0]), 8*len(packed))
	if err != nil {
		return nil, err
	}
	return func() error {
		return p.each("reduce_view_f32", o.n, o.buf.Ptr, x.buf.Ptr, yp(), meta.Ptr, int32(ov.rank()), int32(rv.rank()),
			int64(nred), scale, int64(o.n))
	}, nil
}

// needWork records a node's need of the reductions' workspace (doubles).
func (p *program) needWork(doubles int) {
	p.workNeed = max(p.workNeed, doubles)
	p.workUsers++
}

// stageWork allocates the reductions' workspace once for the program: the
// nodes run one after another, so they share it.
func (p *program) stageWork() error {
	if p.workNeed == 0 {
		return nil
	}
	b, err := p.alloc(2 * p.workNeed)
	if err != nil {
		return err
	}
	p.work = b
	return nil
}

// ---- ids known to the host ----

// feedOf returns the name of the Input an i32 value comes from (through
// Reshapes): its data is on the host before the kernels run.
func (p *program) feedOf(v *ir.Value) (string, error) {
	for {
		if v.Kind == ir.Input {
			return v.Name, nil
		}
		n := p.producer[v.ID]
		if n == nil || n.Op != ir.OpReshape {
			return "", fmt.Errorf("ids %s are computed on the device; this backend takes ids only from inputs", v)
		}
		v = n.Inputs[0]
	}
}

// checkIDs adds a pre-run check that the ids of v lie in [0, V).
func (p *program) checkIDs(v *ir.Value, V int, what string) error {
	return p.checkFeedIDs(v, V, what, false)
}

// checkTargets is checkIDs for cross-entropy targets, which may also be
// ir.IgnoreTarget.
func (p *program) checkTargets(v *ir.Value, V int) error {
	return p.checkFeedIDs(v, V, "target", true)
}

func (p *program) checkFeedIDs(v *ir.Value, V int, what string, ignore bool) error {
	name, err := p.feedOf(v)
	if err != nil {
		return err
	}
	p.pre = append(p.pre, func() error {
		for i, id := range p.feeds[name] {
			if ignore && id == ir.IgnoreTarget {
				continue
			}
			if id < 0 || int(id) >= V {
				return fmt.Errorf("%s %d at position %d is outside [0, %d)", what, id, i, V)
			}
		}
		return nil
	})
	return nil
}

func (p *program) buildGather(in, out []*dval) (func() error, error) {
	W, ids, o := in[0], in[1], out[0]
	V, D := W.v.Shape[0], W.v.Shape[1]
	if err := p.checkIDs(ids.v, V, "id"); err != nil {
		return nil, err
	}
	rows := ids.n
	return func() error {
		if rows == 0 {
			return nil
		}
		return p.launch("gather_rows_f32", blocks(rows, 1), [3]uint32{128, 1, 1}, 0, o.buf.Ptr, W.buf.Ptr, ids.buf.Ptr, int32(rows), int32(D))
	}, nil
}

// csrOf groups the rows of ids by id: packed as [distinct ids ascending |
// starts (len+1) | rows in increasing order within each id].
func csrOf(ids []int32, V int) ([]int32, error) {
	count := make([]int32, V+1)
	for i, id := range ids {
		if id < 0 || int(id) >= V {
			return nil, fmt.Errorf("id %d at position %d is outside [0, %d)", id, i, V)
		}
		count[id+1]++
	}
	var uniq []int32
	for v := 0; v < V; v++ {
		if count[v+1] > 0 {
			uniq = append(uniq, int32(v))
		}
		count[v+1] += count[v]
	}
	U := len(uniq)
	out := make([]int32, 2*U+1+len(ids))
	copy(out, uniq)
	for u, v := range uniq {
		out[U+u] = count[v]
	}
	out[2*U] = int32(len(ids))
	rows := out[2*U+1:]
	next := append([]int32(nil), count[:V]...)
	for r, id := range ids {
		rows[next[id]] = int32(r)
		next[id]++
	}
	return out, nil
}

func (p *program) buildGatherGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	dy, ids, o := in[0], in[1], out[0]
	V, D := o.v.Shape[0], o.v.Shape[1]
	name, err := p.feedOf(ids.v)
	if err != nil {
		return nil, err
	}
	csrBuf, err := p.alloc(3*ids.n + 1)
	if err != nil {
		return nil, err
	}
	var uniq int
	p.pre = append(p.pre, func() error {
		csr, err := csrOf(p.feeds[name], V)
		if err != nil {
			return err
		}
		uniq = (len(csr) - 1 - ids.n) / 2
		return p.be.dev.upload(csrBuf, i32Ptr(csr), uint64(4*len(csr)))
	})
	return func() error {
		if err := p.zero(o.buf, o.n); err != nil {
			return err
		}
		if uniq == 0 {
			return nil
		}
		return p.launch("gather_grad_csr_f32", blocks(uniq, 1), [3]uint32{128, 1, 1}, 0, o.buf.Ptr, dy.buf.Ptr, csrBuf.Ptr, int32(uniq), int32(D))
	}, nil
}

// ---- GEMMs ----

// SmallGEMMDim: under ir.BF16, a GEMM with M, N or K at most this stays
// in fp32. Those are the fuzzy path's products over the R regimes, the K
// soft blocks and the E experts (R = E = 4): [T,R]×[R,K], μ·P·Φᵀ, the gate
// and value_gamma's projections, and their gradients, whose reductions
// over a dimension of 4 give bf16's rounding of every input no chance to
// average out (the RPA prior's parameters, pos_beta and tau_att, were off
// by a relative 3.5 and 0.2 with them in bf16). They are a negligible share
// of the FLOPs, and no tensor core needs them.
const SmallGEMMDim = 8

// gemmWorkspace is the workspace a GEMM plan's algorithm may use: 32 MiB,
// what cuBLAS recommends for Hopper (cublasSetWorkspace).
const gemmWorkspace = 32 << 20

// bf16LD is the leading dimension of a bf16 copy of rows of cols elements:
// the next multiple of 8 elements (16 bytes), which Hopper's fastest
// kernels (TMA loads) need. The padding columns are never read.
func bf16LD(cols int) int { return (cols + 7) &^ 7 }

// operand is one fp32 input of a GEMM.
type operand struct {
	buf Buffer
	// stored: a store tensor (a weight), whose bf16 copy persists until the
	// tensor changes; nil for activations, converted on every call.
	stored *dval
	// staged: the staging buffer of its side already holds buf's padded
	// bf16 copy (converted once for several GEMMs).
	staged bool
	// val: the graph value buf holds, as its ID + 1 (0: none), which a Run
	// writes once, so its bf16 copy stays valid in a staging buffer until
	// another conversion replaces it (a GEMM's gradient pair reads dy
	// twice).
	val int
	// cat: the value is a lazy Concat left unwritten; its bf16 copy is
	// converted from the parts (joincat.go).
	cat *catParts
	// bf16: the value's padded bf16 copy, written by its producer in place
	// of the fp32 value or beside it (packed.go); none when Ptr is 0.
	bf16 Buffer
	// pad: the value is a Pad of the store tensor stored, whose bf16 copy
	// in this layout the GEMMs read (pad.go).
	pad *padding
}

// operandOf is the operand for a value of the graph.
func operandOf(d *dval) operand {
	o := operand{buf: d.buf, val: d.v.ID + 1}
	if d.v.Kind == ir.Param || d.v.Kind == ir.Buffer {
		o.stored = d
	}
	return o
}

// stagedCopy says what a staging buffer holds: the bf16 copy of a graph
// value with rows of cols elements, converted in Run number run.
type stagedCopy struct {
	val, cols int
	run       uint64
}

// act is an operand that is not a store tensor.
func act(b Buffer) operand { return operand{buf: b} }

// gemm runs a strided batch of GEMMs in the backend's GEMM precision:
// under ir.BF16 both inputs go to bf16 copies with 16-byte-aligned rows.
func (p *program) gemm(s GemmShape, a, b operand, beta float32, C Buffer) error {
	return p.gemmBias(s, a, b, beta, C, Buffer{})
}

// gemmBias is gemm with bias (N floats; none when bias.Ptr is 0) added to
// every row of C in the GEMM's epilogue.
func (p *program) gemmBias(s GemmShape, a, b operand, beta float32, C, bias Buffer) error {
	return p.gemmGrown(s, nil, a, b, beta, C, bias)
}

// gemmGrown is gemmBias with grow (when not nil) applied to the shape the
// bf16 GEMM runs, on the padded copies: it may round M, N or K up within
// the copies' padded rows and columns (headPad, padGradW).
func (p *program) gemmGrown(s GemmShape, grow func(*GemmShape), a, b operand, beta float32, C, bias Buffer) error {
	return p.gemmRun(s, grow, a, b, GemmCall{Alpha: 1, Beta: beta, C: C, Bias: bias})
}

// gemmRun is gemmGrown for a call that says C, its type, β and the bias
// (A and B come from a and b).
func (p *program) gemmRun(s GemmShape, grow func(*GemmShape), a, b operand, call GemmCall) error {
	call.A, call.B = a.buf, b.buf
	if !p.bf16GEMM(s) {
		return p.matmul(s, F32, call)
	}
	ps, err := paddedShape(s)
	if err != nil {
		return err
	}
	if grow != nil {
		grow(&ps)
	}
	ra, ca := s.StoredA()
	bufA, err := p.bf16Input(0, a, batchRows(s.Batch, s.StrideA, ra), ca)
	if err != nil {
		return err
	}
	rb, cb := s.StoredB()
	bufB, err := p.bf16Input(1, b, batchRows(s.Batch, s.StrideB, rb), cb)
	if err != nil {
		return err
	}
	call.A, call.B = bufA, bufB
	return p.matmul(ps, BF16, call)
}

// bf16GEMM: the GEMM runs on bf16 inputs (see SmallGEMMDim).
func (p *program) bf16GEMM(s GemmShape) bool {
	return p.be.gemm == ir.BF16 && min(s.M, s.N, s.K) > SmallGEMMDim
}

// paddedShape is s on the padded bf16 copies of dense A and B: leading
// dimensions rounded up to 8 elements, batch strides of whole padded
// matrices.
func paddedShape(s GemmShape) (GemmShape, error) {
	ra, ca := s.StoredA()
	rb, cb := s.StoredB()
	if s.LDA != 0 || s.LDB != 0 || !denseStride(s.Batch, s.StrideA, ra*ca) || !denseStride(s.Batch, s.StrideB, rb*cb) {
		return s, fmt.Errorf("gemm %+v: bf16 inputs must be dense row-major batches", s)
	}
	s.LDA, s.LDB = bf16LD(ca), bf16LD(cb)
	if s.StrideA != 0 {
		s.StrideA = int64(ra * s.LDA)
	}
	if s.StrideB != 0 {
		s.StrideB = int64(rb * s.LDB)
	}
	return s, nil
}

// denseStride: a batch stride of 0 (one matrix for the batch) or of one
// whole matrix.
func denseStride(batch int, stride int64, elems int) bool {
	return batch <= 1 || stride == 0 || stride == int64(elems)
}

// batchRows is the rows an operand of rows rows per matrix has over the
// batch (one matrix when its stride is 0).
func batchRows(batch int, stride int64, rows int) int {
	if batch <= 1 || stride == 0 {
		return rows
	}
	return batch * rows
}

// stageSlots is the number of bf16 staging buffers per GEMM side. Two keep
// an operand that several GEMMs read while other operands are converted in
// between: the fuzzy block's expert FFNs read the same input x in each up
// projection, with each expert's hidden activation converted for its down
// projection after it (and x again, beside each expert's output gradient,
// in the weight gradients).
const stageSlots = 2

// bf16Input returns the padded bf16 copy of an operand of rows×cols fp32
// elements: a store tensor's persistent copy (made again only after the
// tensor changed), or one of this side's staging buffers: the one that
// already holds the value's copy, else the least recently read one,
// converted now.
func (p *program) bf16Input(side int, o operand, rows, cols int) (Buffer, error) {
	switch {
	case o.staged:
		return p.bf16[side][0], nil
	case o.bf16.Ptr != 0:
		return o.bf16, nil
	case o.stored != nil && o.pad != nil:
		return p.storedPaddedBF16(o.stored, *o.pad)
	case o.stored != nil:
		return p.storedBF16(o.stored, rows, cols)
	}
	held := stagedCopy{val: o.val, cols: cols, run: p.runs}
	if o.val != 0 {
		for k, c := range p.staging[side] {
			if c == held {
				p.touchStage(side, k)
				return p.bf16[side][k], nil
			}
		}
	}
	k := p.lruStage(side)
	p.staging[side][k] = stagedCopy{}
	err := p.be.dev.poison(p.bf16[side][k]) // the copy it held is gone
	if err != nil {
		return Buffer{}, err
	}
	if o.cat != nil {
		err = p.catToBF16(p.bf16[side][k], o.cat, rows, cols)
	} else {
		err = p.toBF16(p.bf16[side][k], o.buf, rows, cols)
	}
	if err != nil {
		return Buffer{}, err
	}
	if o.val != 0 {
		p.staging[side][k] = held
	}
	p.touchStage(side, k)
	return p.bf16[side][k], nil
}

// lruStage is the staging buffer of a side read least recently.
func (p *program) lruStage(side int) int {
	k := 0
	for j := range p.stageUse[side] {
		if p.stageUse[side][j] < p.stageUse[side][k] {
			k = j
		}
	}
	return k
}

// touchStage marks a staging buffer as just read.
func (p *program) touchStage(side, k int) {
	p.stageClock++
	p.stageUse[side][k] = p.stageClock
}

// toBF16 converts rows×cols dense fp32 elements into dst with leading
// dimension bf16LD(cols).
func (p *program) toBF16(dst, src Buffer, rows, cols int) error {
	return p.toBF16Strided(dst, src, rows, cols, cols)
}

// toBF16Strided is toBF16 for source rows srcLD elements apart.
func (p *program) toBF16Strided(dst, src Buffer, rows, cols, srcLD int) error {
	ld := bf16LD(cols)
	return p.each("f32_to_bf16_pad_kernel", rows*ld/8, dst.Ptr, src.Ptr, int64(rows), int32(cols), int32(srcLD), int32(ld))
}

// storedBF16 returns the bf16 copy of a store tensor seen as rows×cols,
// converting it when the tensor changed since the copy was made.
func (p *program) storedBF16(d *dval, rows, cols int) (Buffer, error) {
	c, err := p.be.bf16Copy(p.store, d.v.Name, rows, cols)
	if err != nil {
		return Buffer{}, err
	}
	v, stale := p.be.stale(c)
	if !stale {
		return c.buf, nil
	}
	if err := p.toBF16(c.buf, d.buf, rows, cols); err != nil {
		return Buffer{}, err
	}
	p.be.refreshed(c, v)
	return c.buf, nil
}

// matmul runs one GEMM through its cached plan.
func (p *program) matmul(s GemmShape, ab DType, c GemmCall) error {
	pl, err := p.plan(driver.NewGemmKey(s, ab, c))
	if err != nil {
		return err
	}
	c.WS = p.ws
	return p.be.dev.gemm(pl, c)
}

// plan returns the program's plan for a GEMM key, making it (and the
// workspace, once) on first use.
func (p *program) plan(k GemmKey) (gemmPlan, error) {
	if pl, ok := p.plans[k]; ok {
		return pl, nil
	}
	pl, err := p.be.dev.gemmPlan(k, gemmWorkspace)
	if err != nil {
		return nil, err
	}
	if p.plans == nil {
		p.plans = map[GemmKey]gemmPlan{}
	}
	p.plans[k] = pl
	if pl.workspace() > p.ws.Bytes {
		if p.ws.Ptr != 0 {
			return nil, fmt.Errorf("gemm %+v: its algorithm needs %d bytes of workspace, more than the %d allocated", k, pl.workspace(), p.ws.Bytes)
		}
		if p.ws, err = p.be.dev.alloc(gemmWorkspace); err != nil {
			return nil, err
		}
	}
	return pl, nil
}

// freePlans destroys the program's GEMM plans and frees the workspace.
func (p *program) freePlans() {
	for k, pl := range p.plans {
		p.be.dev.freeGemmPlan(pl)
		delete(p.plans, k)
	}
	if p.ws.Ptr != 0 {
		p.be.dev.free(p.ws)
		p.ws = Buffer{}
	}
}

// gemmElems is the element span of A and B over the batch (with their
// leading dimensions).
func gemmElems(s GemmShape) (int, int) {
	span := func(stride int64, rows, cols, ld int) int {
		one := (rows-1)*ld + cols
		if s.Batch <= 1 || stride == 0 {
			return one
		}
		return int(stride)*(s.Batch-1) + one
	}
	ra, ca := s.StoredA()
	rb, cb := s.StoredB()
	return span(s.StrideA, ra, ca, s.LeadingA()), span(s.StrideB, rb, cb, s.LeadingB())
}

// needGEMM records the staging space a GEMM's activation operands need
// (bf16 elements per side).
func (p *program) needGEMM(s GemmShape, a, b operand) {
	if !p.bf16GEMM(s) {
		return
	}
	ra, ca := s.StoredA()
	rb, cb := s.StoredB()
	if a.stored == nil && a.bf16.Ptr == 0 {
		p.bf16Need[0] = max(p.bf16Need[0], batchRows(s.Batch, s.StrideA, ra)*bf16LD(ca))
	}
	if b.stored == nil && b.bf16.Ptr == 0 {
		p.bf16Need[1] = max(p.bf16Need[1], batchRows(s.Batch, s.StrideB, rb)*bf16LD(cb))
	}
}

// stageBF16 allocates the bf16 staging buffers (2 bytes per element).
func (p *program) stageBF16() error {
	if p.be.gemm != ir.BF16 {
		return nil
	}
	for i, n := range p.bf16Need {
		for k := range p.bf16[i] {
			b, err := p.alloc((n + 1) / 2)
			if err != nil {
				return err
			}
			p.bf16[i][k] = b
		}
	}
	return nil
}

func (p *program) gemmStep(s GemmShape, A, B, C *dval) func() error {
	a, b := p.operandOf(A), p.operandOf(B)
	p.needGEMM(s, a, b)
	return func() error { return p.gemm(s, a, b, 0, C.buf) }
}

func lastDim(s ir.Shape) int { return s[len(s)-1] }

// buildLinear: y = x·Wᵀ (+ b, added in the GEMM's epilogue), as bf16
// where only chains read y (halfOutput).
func (p *program) buildLinear(in, out []*dval) (func() error, error) {
	x, W, o := in[0], in[1], out[0]
	s, _ := gemmShapeOf("Linear", []*ir.Value{x.v, W.v})
	a, w := p.operandOf(x), p.operandOf(W)
	p.needGEMM(s, a, w)
	var bias *dval
	if len(in) == 3 {
		bias = in[2]
	}
	ct := p.outputType(s, o, bias != nil)
	return func() error {
		call := GemmCall{Alpha: 1, C: o.buf, CType: ct}
		if bias != nil {
			call.Bias = bias.buf
		}
		return p.gemmRun(s, nil, a, w, call)
	}, nil
}

// buildLinearGradX: dx = dy·W, as bf16 where only chains read dx.
func (p *program) buildLinearGradX(in, out []*dval) (func() error, error) {
	dy, W, o := in[0], in[1], out[0]
	s, _ := gemmShapeOf("LinearGradX", []*ir.Value{dy.v, W.v})
	a, w := p.operandOf(dy), p.operandOf(W)
	p.needGEMM(s, a, w)
	ct := p.outputType(s, o, false)
	return func() error { return p.gemmRun(s, nil, a, w, GemmCall{Alpha: 1, C: o.buf, CType: ct}) }, nil
}

// buildLinearGradW: dW = dyᵀ·x over all rows, as one GEMM: cuBLASLt
// splits it along the rows itself where its tiles would leave SMs idle
// (rpac's own split, a strided batch of slices summed in order, measured
// slower on an H200 and was removed: 136 against 132 ms a paper step).
func (p *program) buildLinearGradW(in, out []*dval) (func() error, error) {
	dy, x, o := in[0], in[1], out[0]
	s, _ := gemmShapeOf("LinearGradW", []*ir.Value{dy.v, x.v})
	N, K := s.M, s.N
	if p.be.padGradW && p.bf16GEMM(s) && (N%8 != 0 || K%8 != 0) {
		return p.gemmPaddedGradW(s, p.operandOf(dy), p.operandOf(x), o), nil
	}
	return p.gemmStep(s, dy, x, o), nil
}

// Padded weight gradients (Options.PadGradW, on by default). A weight
// gradient dW = dyᵀ·x of a Linear of the model's widths (510, 1,020, …)
// has dims that are not multiples of 8, so cuBLASLt runs it on its
// fallback kernels (at most 0.27 of the peak in the sixth run, against
// 0.52–0.73 for its Hopper kernels on the LM head's padded GEMMs). It runs
// instead over M and N rounded up to 8, which the operands' bf16 copies
// have (their rows are bf16LD(cols) long), into the reductions' workspace
// in rows of the padded N, then compact_rows_f32 copies the real rows and
// columns out. Each element of dW reads only its own column of dy and of
// x, so the padding columns' contents (zero or not) never reach it, and
// the sums over K are of the same products (TestGPUPaddedGradW). The copy
// is weights-sized, small beside the GEMM's 24,576-row operands.

// gemmPaddedGradW is the step of a weight gradient over padded M and N
// (Options.PadGradW).
func (p *program) gemmPaddedGradW(s GemmShape, a, b operand, o *dval) func() error {
	Mp, Np := bf16LD(s.M), bf16LD(s.N)
	p.needGEMM(s, a, b)
	p.needWork((Mp*Np + 1) / 2)
	ps := s
	ps.LDC = Np
	grow := growDims(true, growM, growN)
	return func() error {
		scratch := Buffer{Ptr: p.work.Ptr, Bytes: uint64(4 * Mp * Np)}
		if err := p.gemmGrown(ps, grow, a, b, 0, scratch, Buffer{}); err != nil {
			return err
		}
		return p.each("compact_rows_f32", o.n, o.buf.Ptr, scratch.Ptr, uint64(0), int32(s.N), int32(Np), int64(o.n))
	}
}

func (p *program) buildMatMul(n *ir.Node, in, out []*dval) (func() error, error) {
	a, b, o := in[0], in[1], out[0]
	sa, sb := a.v.Shape, b.v.Shape
	r := len(sa)
	s := GemmShape{TransA: n.Attrs.Bool("transA", false), TransB: n.Attrs.Bool("transB", false)}
	s.M, s.K = sa[r-2], sa[r-1]
	if s.TransA {
		s.M, s.K = s.K, s.M
	}
	s.N = sb[r-1]
	if s.TransB {
		s.N = sb[r-2]
	}
	s.Batch = 1
	for _, d := range sa[:r-2] {
		s.Batch *= d
	}
	s.StrideA, s.StrideB, s.StrideC = int64(sa[r-2]*sa[r-1]), int64(sb[r-2]*sb[r-1]), int64(s.M*s.N)
	return p.gemmStep(s, a, b, o), nil
}

// ---- rows ----

func (p *program) buildSoftmax(n *ir.Node, in, out []*dval) (func() error, error) {
	o := out[0]
	cols := lastDim(o.v.Shape)
	rows := o.n / max(1, cols)
	if n.Op == ir.OpSoftmax {
		x := in[0]
		return func() error {
			return p.launch("softmax_rows_f32", blocks(rows, 1), block1, 0, o.buf.Ptr, x.buf.Ptr, int32(rows), int32(cols))
		}, nil
	}
	dy, y := in[0], in[1]
	return func() error {
		return p.launch("softmax_rows_bwd_f32", blocks(rows, 1), block1, 0, o.buf.Ptr, dy.buf.Ptr, y.buf.Ptr, int32(rows), int32(cols))
	}, nil
}

func (p *program) buildLayerNorm(n *ir.Node, in, out []*dval) (func() error, error) {
	x, g, b, o := in[0], in[1], in[2], out[0]
	D := lastDim(x.v.Shape)
	rows := x.n / max(1, D)
	stats, err := p.alloc(2 * rows)
	if err != nil {
		return nil, err
	}
	eps := float32(n.Attrs.Float("eps", 1e-5))
	W := int32(ir.LayerNormWidth(x.v.Shape, n.Attrs))
	if p.packsOutput(n) {
		if err := p.packInto(o, D); err != nil {
			return nil, err
		}
		return func() error {
			return p.launch("layernorm_fwd_bf16pad", warpGrid(rows), reduceBlock, 0, o.buf.Ptr, stats.Ptr,
				stats.Ptr+uint64(4*rows), x.buf.Ptr, g.buf.Ptr, b.buf.Ptr, int32(rows), int32(D), W, int32(bf16LD(D)), eps)
		}, nil
	}
	return func() error {
		return p.launch("layernorm_fwd_f32", warpGrid(rows), reduceBlock, 0, o.buf.Ptr, stats.Ptr,
			stats.Ptr+uint64(4*rows), x.buf.Ptr, g.buf.Ptr, b.buf.Ptr, int32(rows), int32(D), W, eps)
	}, nil
}

// LayerNorm's backward: up to lnFusedWidth columns in one kernel,
// layernorm_bwd_f32 (dy and x read once for dx and the parameters'
// partial gradients; Options.LNFused), each warp over lnWarpRows rows, a block of 8 warps
// over a chunk of 8·lnWarpRows (24,576 rows: 768 blocks, about 3 waves of
// 2 blocks an SM on 132 SMs; 6.3 MB of partials for 510 columns); wider
// rows, and any without LNFused, in two, layernorm_bwd_dx_f32 and
// layernorm_bwd_params_f32, whose partial sums cover lnChunk rows each
// (768 blocks of 128 threads).
const (
	lnFusedWidth = 512
	lnWarpRows   = 4
	lnChunk      = 128
)

func (p *program) buildLayerNormGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	dy, x, g := in[0], in[1], in[2]
	dx, dg, db := out[0], out[1], out[2]
	D, W := lastDim(x.v.Shape), ir.LayerNormWidth(x.v.Shape, n.Attrs)
	rows := x.n / max(1, D)
	eps := float32(n.Attrs.Float("eps", 1e-5))
	if W <= lnFusedWidth && p.be.lnFused {
		chunks := max(1, ceilDiv(rows, 8*lnWarpRows))
		p.needWork(2 * chunks * W)
		return func() error {
			if err := p.launch("layernorm_bwd_f32", [3]uint32{uint32(chunks), 1, 1}, reduceBlock, 0, dx.buf.Ptr, p.work.Ptr,
				dy.buf.Ptr, x.buf.Ptr, g.buf.Ptr, int32(rows), int32(D), int32(W), int32(lnWarpRows), eps); err != nil {
				return err
			}
			return layerNormParamSums(p.launch, dg.buf.Ptr, db.buf.Ptr, p.work.Ptr, chunks, W)
		}, nil
	}
	chunks := max(1, (rows+lnChunk-1)/lnChunk)
	stats, err := p.alloc(2 * rows)
	if err != nil {
		return nil, err
	}
	p.needWork(2 * chunks * W)
	cols := uint32((W + 127) / 128)
	return func() error {
		if err := p.launch("layernorm_bwd_dx_f32", warpGrid(rows), reduceBlock, 0, dx.buf.Ptr, stats.Ptr,
			dy.buf.Ptr, x.buf.Ptr, g.buf.Ptr, int32(rows), int32(D), int32(W), eps); err != nil {
			return err
		}
		if err := p.launch("layernorm_bwd_params_f32", [3]uint32{cols, uint32(chunks), 1}, [3]uint32{128, 1, 1}, 0,
			p.work.Ptr, dy.buf.Ptr, x.buf.Ptr, stats.Ptr, int32(rows), int32(D), int32(W), int32(lnChunk)); err != nil {
			return err
		}
		return layerNormParamSums(p.launch, dg.buf.Ptr, db.buf.Ptr, p.work.Ptr, chunks, W)
	}, nil
}

// layerNormParamSums launches dg and db (W each) from
// layernorm_bwd_params_f32's partials (dg's W·chunks doubles, then db's).
func layerNormParamSums(launch launcher, dg, db, part uint64, chunks, W int) error {
	if err := sumParts(launch, dg, part, chunks, 1, W); err != nil {
		return err
	}
	return sumParts(launch, db, part+uint64(8*chunks*W), chunks, 1, W)
}

// dropoutThreshold mirrors the CPU backend: element i keeps when its 32-bit
// draw is below keep·2³²; kept elements are scaled by 1/keep.
func dropoutThreshold(p float64) (thresh uint64, scale float32) {
	keep := 1 - p
	switch {
	case p <= 0:
		thresh = 1 << 32
	case keep > 0:
		thresh = uint64(keep * (1 << 32))
	}
	if keep > 0 {
		scale = float32(1 / keep)
	}
	return thresh, scale
}

// buildDropout draws from the node's stream: attribute stream, else its id.
func (p *program) buildDropout(n *ir.Node, in, out []*dval) (func() error, error) {
	return p.dropout(n.Attrs.Float("p", 0), n.Stream(), in[0], out[0]), nil
}

// buildDropoutGrad applies the mask of the Dropout node n.Attrs["stream"]
// to dy, drawn again from its stream (no mask is kept).
func (p *program) buildDropoutGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	stream := n.Attrs.Int("stream", -1)
	if stream < 0 {
		return nil, fmt.Errorf("DropoutGrad: no stream (the Dropout node's id)")
	}
	return p.dropout(n.Attrs.Float("p", 0), stream, in[0], out[0]), nil
}

// dropout launches y = x·mask, mask the draws of stream id.
func (p *program) dropout(pr float64, id int, x, y *dval) func() error {
	thresh, scale := dropoutThreshold(pr)
	return func() error {
		return p.each("dropout_f32", (y.n+1)/2, y.buf.Ptr, x.buf.Ptr, kernels.StreamKey(p.seed, id), thresh, scale, int64(y.n)) // a pair a thread
	}
}

// ---- losses ----

// sumRows adds n per-row values into one scalar (needSumRows first).
func (p *program) sumRows(dst, rows Buffer, n int) error {
	return planReduce(midAxis{A: 1, R: n, C: 1}).run(p.launch, dst.Ptr, p.work.Ptr, rows.Ptr, 0, 1)
}

// needSumRows records sumRows' workspace for n rows.
func (p *program) needSumRows(n int) { p.needWork(planReduce(midAxis{A: 1, R: n, C: 1}).workspace()) }

func (p *program) buildCrossEntropy(n *ir.Node, in, out []*dval) (func() error, error) {
	lg, tg := in[0], in[1]
	rows, V := lg.v.Shape[0], lg.v.Shape[1]
	if err := p.checkTargets(tg.v, V); err != nil {
		return nil, err
	}
	per, err := p.alloc(2 * rows)
	if err != nil {
		return nil, err
	}
	ls := float32(n.Attrs.Float("label_smoothing", 0))
	ceRows := Buffer{Ptr: per.Ptr + uint64(4*rows), Bytes: uint64(4 * rows)}
	p.needSumRows(rows)
	return func() error {
		if err := p.launch("ce_rows_f32", blocks(rows, 1), [3]uint32{512, 1, 1}, 0, per.Ptr, ceRows.Ptr, lg.buf.Ptr, tg.buf.Ptr,
			int32(rows), int32(V), ls); err != nil {
			return err
		}
		if err := p.sumRows(out[0].buf, per, rows); err != nil {
			return err
		}
		return p.sumRows(out[1].buf, ceRows, rows)
	}, nil
}

func (p *program) buildCrossEntropyGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	dl, lg, tg, o := in[0], in[1], in[2], out[0]
	rows, V := lg.v.Shape[0], lg.v.Shape[1]
	if err := p.checkTargets(tg.v, V); err != nil {
		return nil, err
	}
	ls := float32(n.Attrs.Float("label_smoothing", 0))
	return func() error {
		return p.launch("ce_grad_f32", blocks(rows, 1), [3]uint32{512, 1, 1}, 0, o.buf.Ptr, lg.buf.Ptr, tg.buf.Ptr, dl.buf.Ptr,
			int32(rows), int32(V), ls)
	}, nil
}

// lmHead is the device state of one LMHeadCrossEntropy node: the chunk of
// logits (rows of logitsLD(V) floats), the per-row losses and, when the
// graph also asks for the gradient, the unscaled dx and dW accumulated
// while the forward runs.
type lmHead struct {
	logits, rows Buffer
	dx, dW       Buffer // zero Ptr when no gradient is wanted
	// gradLD: the row length of dx and dW (D, or bf16LD(D) under headPad,
	// whose GEMMs write the padded columns, zero)
	gradLD int
}

// logitsLD is the row stride of the LM head's logits: the vocabulary
// rounded up to 8 floats, so the logits GEMM writes 16-byte-aligned rows
// (cuBLASLt's fastest Hopper kernels need them; 50,257 floats are not) and
// their bf16 copy has the same stride.
func logitsLD(V int) int { return bf16LD(V) }

// lmHeadGradOf finds the LMHeadCrossEntropyGrad node on the same inputs.
func (p *program) lmHeadGradOf(n *ir.Node) *ir.Node {
	for _, m := range p.g.Nodes {
		if m.Op == ir.OpLMHeadCrossEntropyGrad && m.Inputs[1] == n.Inputs[0] && m.Inputs[2] == n.Inputs[1] && m.Inputs[3] == n.Inputs[2] {
			return m
		}
	}
	return nil
}

func (p *program) buildLMHead(n *ir.Node, in, out []*dval) (func() error, error) {
	x, W, tg := in[0], in[1], in[2]
	N, D, V := x.v.Shape[0], x.v.Shape[1], W.v.Shape[0]
	if err := p.checkTargets(tg.v, V); err != nil {
		return nil, err
	}
	chunk, ld := ir.LMHeadChunkRows(n), logitsLD(V)
	// padded (headPad) where the weight is a store tensor, whose bf16 copy
	// has the vocabulary's rows rounded up
	wt := p.operandOf(W)
	pad, dwRows := p.be.headPad && wt.stored != nil && p.bf16GEMM(GemmShape{M: chunk, N: D, K: V}), V
	st := &lmHead{gradLD: D}
	if pad { // dx and dW in rows of the padded width, dW up to the padded vocabulary
		dwRows, st.gradLD = bf16LD(V), bf16LD(D)
	}
	var err error
	if st.logits, err = p.alloc(chunk * ld); err != nil {
		return nil, err
	}
	if st.rows, err = p.alloc(2 * N); err != nil {
		return nil, err
	}
	if p.lmHeadGradOf(n) != nil {
		if st.dx, err = p.alloc(N * st.gradLD); err != nil {
			return nil, err
		}
		if st.dW, err = p.alloc(dwRows * st.gradLD); err != nil {
			return nil, err
		}
	}
	if p.lmHeads == nil {
		p.lmHeads = map[int]*lmHead{}
	}
	p.lmHeads[n.ID] = st
	p.needSumRows(N)
	ls := float32(n.Attrs.Float("label_smoothing", 0))
	p.needGEMM(GemmShape{TransB: true, M: chunk, N: V, K: D, Batch: 1, LDC: ld}, act(Buffer{}), wt)
	p.needGEMM(GemmShape{M: chunk, N: D, K: V, Batch: 1}, act(Buffer{}), wt)
	p.needGEMM(GemmShape{TransA: true, M: V, N: D, K: chunk, Batch: 1}, act(Buffer{}), act(Buffer{}))
	sm, ce, pred := out[0], out[1], out[2]
	ceRows := Buffer{Ptr: st.rows.Ptr + uint64(4*N), Bytes: uint64(4 * N)}
	growNK, growMN := growDims(pad, growN, growK), growDims(pad, growM, growN) // logits and dx; dW
	return func() error {
		for lo := 0; lo < N; lo += chunk {
			c := min(chunk, N-lo)
			xc := Buffer{Ptr: x.buf.Ptr + uint64(4*lo*D), Bytes: uint64(4 * c * D)}
			if err := p.gemmGrown(GemmShape{TransB: true, M: c, N: V, K: D, Batch: 1, LDC: ld}, growNK, act(xc), wt, 0, st.logits, Buffer{}); err != nil {
				return err
			}
			dx, dW := GemmShape{M: c, N: D, K: V, Batch: 1, LDC: st.gradLD}, GemmShape{TransA: true, M: V, N: D, K: c, Batch: 1, LDC: st.gradLD}
			logits, gb, gld := p.stageLogits(dx, st)
			kernel, keep := p.be.softmaxCE(V)
			if err := p.launch(kernel, blocks(c, 1), [3]uint32{512, 1, 1}, keep, st.logits.Ptr,
				st.rows.Ptr+uint64(4*lo), ceRows.Ptr+uint64(4*lo), pred.buf.Ptr+uint64(4*lo), tg.buf.Ptr+uint64(4*lo),
				int32(c), int32(V), int32(ld), ls, float32(1), gb, int32(gld)); err != nil {
				return err
			}
			if st.dx.Ptr == 0 {
				continue
			}
			dxc := Buffer{Ptr: st.dx.Ptr + uint64(4*lo*st.gradLD), Bytes: uint64(4 * c * st.gradLD)}
			if !logits.staged { // fp32 GEMMs read the padded rows as they are
				dx.LDA, dW.LDA = ld, ld
			}
			if err := p.gemmGrown(dx, growNK, logits, wt, 0, dxc, Buffer{}); err != nil {
				return err
			}
			beta := float32(1)
			if lo == 0 {
				beta = 0
			}
			if err := p.gemmGrown(dW, growMN, logits, act(xc), beta, st.dW, Buffer{}); err != nil {
				return err
			}
		}
		if err := p.sumRows(sm.buf, st.rows, N); err != nil {
			return err
		}
		return p.sumRows(ce.buf, ceRows, N)
	}, nil
}

// softmaxCE is the fused softmax cross-entropy kernel for rows of V
// logits and the dynamic shared memory it is launched with: the row kept
// in shared memory where it fits (softmax_ce_smem_f32: the logits read
// from DRAM once, not twice), else softmax_ce_fused_f32. At the paper's
// vocabulary a row is 201 KB: one block an SM, within sm_90's 227 KiB.
func (b *Backend) softmaxCE(V int) (string, uint32) {
	if 4*V <= b.ceShared {
		return "softmax_ce_smem_f32", uint32(4 * V)
	}
	return "softmax_ce_fused_f32", 0
}

// The LM head's GEMMs (Options.HeadPad, the default) run over the vocabulary
// V and the model width D rounded up to 8 (50,264 and 512 at the paper
// preset): the logits as 4,096 × 50,264 over 512, dx over 50,264 and dW as
// 50,264 rows. Every operand is zero there (the weight's bf16 copy has
// its rows rounded up, zero, bf16Copy; the activations' copies and the
// fused softmax's bf16 gradient have zero columns to their rows' ends),
// so the sums are the same and the extra logits and dW rows are zero
// (the logits' row stride is the padded vocabulary already; dW has the
// rows). cuBLASLt runs its Hopper kernels only on dims that are all
// multiples of 8: the sixth run (H200) measured the logits GEMM at 2.44 ms
// (86 TFLOP/s, a Turing-era CUTLASS kernel for alignment 1) as 4,096 ×
// 50,257 over 510 and at 0.41 ms (517 TFLOP/s, nvjet_sm90) as 4,096 ×
// 50,264 over 512, and the paper step at T = 384 at 132 ms without the
// padding and 114 ms with it.

// growM, growN and growK round one dim of a GEMM shape up to 8.
func growM(s *GemmShape) { s.M = bf16LD(s.M) }
func growN(s *GemmShape) { s.N = bf16LD(s.N) }
func growK(s *GemmShape) { s.K = bf16LD(s.K) }

// growDims applies every grow of dims when on (headPad, padGradW), else
// nothing.
func growDims(on bool, dims ...func(*GemmShape)) func(*GemmShape) {
	if !on {
		return nil
	}
	return func(s *GemmShape) {
		for _, g := range dims {
			g(s)
		}
	}
}

// stageLogits is where the chunk's logit gradients go for the two GEMMs
// that read them as A (dx and dW): under bf16 GEMMs the fused softmax
// writes them as bf16 (gb, rows gld apart) into staging buffer 0 of side 0,
// marked as just read (the two GEMMs follow with no conversion on side 0
// between them); else (or with no gradient) they stay in the fp32 logits
// (gb 0).
func (p *program) stageLogits(s GemmShape, st *lmHead) (operand, uint64, int) {
	if st.dx.Ptr == 0 || !p.bf16GEMM(s) {
		return act(st.logits), 0, 0
	}
	p.staging[0][0] = stagedCopy{}
	p.touchStage(0, 0)
	return operand{buf: st.logits, staged: true}, p.bf16[0][0].Ptr, bf16LD(s.K)
}

func (p *program) buildLMHeadGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	var st *lmHead
	for _, m := range p.g.Nodes {
		if m.Op == ir.OpLMHeadCrossEntropy && p.lmHeadGradOf(m) == n {
			st = p.lmHeads[m.ID]
		}
	}
	if st == nil || st.dx.Ptr == 0 {
		return nil, fmt.Errorf("LMHeadCrossEntropyGrad without its LMHeadCrossEntropy on the same inputs earlier in the graph")
	}
	dsm, dx, dW := in[0], out[0], out[1]
	return func() error {
		if err := p.scaleRows(dx, st.dx, dsm.buf, st.gradLD); err != nil {
			return err
		}
		return p.scaleRows(dW, st.dW, dsm.buf, st.gradLD)
	}, nil
}

// scaleRows writes out = (*s) · src, src in rows of ld ≥ out's last dim
// (the LM head's accumulated gradients).
func (p *program) scaleRows(out *dval, src, s Buffer, ld int) error {
	cols := out.v.Shape[len(out.v.Shape)-1]
	if ld == cols {
		return p.each("scale_ptr_f32", out.n, out.buf.Ptr, src.Ptr, s.Ptr, int64(out.n))
	}
	return p.each("compact_rows_f32", out.n, out.buf.Ptr, src.Ptr, s.Ptr, int32(cols), int32(ld), int64(out.n))
}

// ---- the paper's ops ----

func (p *program) buildMembership(n *ir.Node, in, out []*dval) (func() error, error) {
	if n.Op == ir.OpGaussianMembership {
		z, c, ls, mu := in[0], in[1], in[2], out[0]
		R, D := c.v.Shape[0], c.v.Shape[1]
		if R > 32 {
			return nil, fmt.Errorf("%d regimes: the CUDA kernel takes at most 32", R)
		}
		N := z.n / max(1, D)
		return func() error {
			return p.launch("gaussian_membership_f32", blocks(N*32, threads), block1, 0, mu.buf.Ptr, z.buf.Ptr, c.buf.Ptr,
				ls.buf.Ptr, int32(N), int32(D), int32(R))
		}, nil
	}
	dmu, z, c, ls, mu := in[0], in[1], in[2], in[3], in[4]
	dz, dc, dls := out[0], out[1], out[2]
	R, D := c.v.Shape[0], c.v.Shape[1]
	if R > 32 {
		return nil, fmt.Errorf("%d regimes: the CUDA kernel takes at most 32", R)
	}
	N := z.n / max(1, D)
	work, err := p.alloc(2 * N * R) // dz2 and dss per row, summed by the parameters' kernels
	if err != nil {
		return nil, err
	}
	dss := work.Ptr + uint64(4*N*R)
	p.needWork(membershipParamsWorkspace(N, D, R))
	return func() error {
		if err := p.launch("gaussian_membership_bwd_rows_f32", blocks(N*32, threads), block1, 0, dz.buf.Ptr, work.Ptr, dss,
			dmu.buf.Ptr, z.buf.Ptr, c.buf.Ptr, ls.buf.Ptr, mu.buf.Ptr, int32(N), int32(D), int32(R)); err != nil {
			return err
		}
		return membershipParams(p.launch, dc.buf.Ptr, dls.buf.Ptr, p.work.Ptr, work.Ptr, dss, z.buf.Ptr, c.buf.Ptr,
			ls.buf.Ptr, N, D, R)
	}, nil
}

func (p *program) buildSinkhorn(n *ir.Node, in, out []*dval) (func() error, error) {
	iters := n.Attrs.Int("iters", 1)
	o := out[0]
	R, K := o.v.Shape[0], o.v.Shape[1]
	one := [3]uint32{1, 1, 1}
	if n.Op == ir.OpSinkhorn {
		X := in[0]
		work, err := p.alloc(2 * R * K) // R·K doubles
		if err != nil {
			return nil, err
		}
		return func() error {
			return p.launch("sinkhorn_f32", one, [3]uint32{32, 1, 1}, 0, o.buf.Ptr, X.buf.Ptr, work.Ptr, int32(R), int32(K), int32(iters))
		}, nil
	}
	dP, X := in[0], in[1]
	work, err := p.alloc(2 * (2*R*K + iters*(2*R*K+R+K))) // doubles
	if err != nil {
		return nil, err
	}
	return func() error {
		return p.launch("sinkhorn_bwd_f32", one, [3]uint32{32, 1, 1}, 0, o.buf.Ptr, dP.buf.Ptr, X.buf.Ptr, work.Ptr,
			int32(R), int32(K), int32(iters))
	}, nil
}

func (p *program) buildZScore(n *ir.Node, in, out []*dval) (func() error, error) {
	o := out[0]
	N := o.n
	work, err := p.alloc(8) // stats and sums: 4 doubles
	if err != nil {
		return nil, err
	}
	stats, sums := work.Ptr, work.Ptr+16
	p.needWork(zscoreWorkspace(N))
	if n.Op == ir.OpZScore {
		x := in[0]
		return func() error {
			if err := zscoreStats(p.launch, stats, p.work.Ptr, x.buf.Ptr, N); err != nil {
				return err
			}
			return p.each("zscore_fwd_f32", o.n, o.buf.Ptr, x.buf.Ptr, stats, int64(N))
		}, nil
	}
	dy, x := in[0], in[1]
	return func() error {
		if err := zscoreStats(p.launch, stats, p.work.Ptr, x.buf.Ptr, N); err != nil {
			return err
		}
		if err := zscoreGradSums(p.launch, sums, p.work.Ptr, dy.buf.Ptr, x.buf.Ptr, stats, N); err != nil {
			return err
		}
		return p.each("zscore_bwd_f32", o.n, o.buf.Ptr, dy.buf.Ptr, x.buf.Ptr, stats, sums, int64(N))
	}, nil
}

// attention is a FusedAttention or FusedAttentionGrad node's geometry on
// the CUDA kernels (causal, T == S, v's head size equal to q's).
type attention struct {
	BH, T, Hd int
	// H is the kernels' layout argument: 0 for [B,H,T,Hd], the heads for
	// [B,T,H,Hd] (ir.AttnBTHD).
	H      int
	scale  float32
	bias   *dval // nil without a mask
	stream int
	thresh uint64
	keep   float32 // 0: no dropout
	// path: the kernels that run it (attngemm.go)
	path attnPath
	// outTwin: where the GEMM path's forward also writes its output as
	// bf16 for the GEMMs that read it (packed.go's attnOutTwin); no
	// buffer: none
	outTwin twin
}

// attnMaxHead is the largest head size of flash.cu's kernels (8 tiles of
// 16 in registers and shared memory).
const attnMaxHead = 128

// attnRows: flash.cu's rows per block. attnPartBytes: the most memory
// the bias gradient's partial sums take (the dq kernel's grid.y with a
// bias is one block row per partial sum). A partial sum per (sequence,
// head) pair keeps every pair's dq tile its own block: on an H200 at the
// paper preset (T = 768, 192 pairs) that took dq from 73.5 ms to 49.4 ms
// per step against 32 partial sums (rpac bench train --measure). 512 MiB
// allows all 192 at T = 768 and 8 at T = 4,096.
const (
	attnRows      = 64
	attnPartBytes = 512 << 20
)

// newAttention is a node's geometry and path: under bf16 GEMMs the GEMM
// path when choice allows and its work buffer fits (the backward's when
// backward, else the forward's), else flash.cu's kernels.
func newAttention(n *ir.Node, q, k, v *dval, mask *dval, gemm ir.Precision, choice AttentionPath, backward bool) (*attention, error) {
	lay := ir.AttnLayoutOf(n.Attrs)
	B, H, T, Hd := lay.Dims(q.v.Shape)
	_, _, S, _ := lay.Dims(k.v.Shape)
	a := &attention{BH: B * H, T: T, Hd: Hd, bias: mask, stream: n.Stream()}
	if lay == ir.AttnBTHD {
		a.H = H
	}
	if v.v.Shape[3] != a.Hd {
		return nil, fmt.Errorf("the CUDA attention kernels want v's head size (%d) equal to q's and k's (%d)", v.v.Shape[3], a.Hd)
	}
	if !n.Attrs.Bool("causal", false) || S != a.T {
		return nil, fmt.Errorf("the CUDA attention kernels are causal over equal lengths; got causal=%v, T=%d, S=%d",
			n.Attrs.Bool("causal", false), a.T, S)
	}
	a.scale = float32(n.Attrs.Float("scale", 1/math.Sqrt(float64(a.Hd))))
	if pr := n.Attrs.Float("dropout", 0); pr > 0 {
		a.thresh, a.keep = dropoutThreshold(pr)
	}
	// The tensor cores under bf16 GEMMs only, by the GEMM policy's rules:
	// fp32 GEMMs promise the CPU's results to fp32 rounding, and products
	// over at most SmallGEMMDim terms (a head of 8: q·k, dO·v) stay fp32
	// (with the heads of 8 of a d_model-16 model in bf16, pos_beta's
	// gradient was off by 0.15). Heads above attnMaxHead do not fit.
	// The GEMM path where the backend prefers it and its work buffer
	// fits, else flash.cu's.
	if gemm == ir.BF16 && min(a.T, a.Hd) > SmallGEMMDim && a.Hd <= attnMaxHead {
		a.path = attnFlash
		if choice == AttentionGEMM && attnGEMMFits(a, backward) {
			a.path = attnGEMM
		}
	}
	return a, nil
}

func (a *attention) biasPtr() uint64 {
	if a.bias == nil {
		return 0
	}
	return a.bias.buf.Ptr
}

// dropoutArgs are the kernels' trailing (key, thresh, keep) for this run.
func (a *attention) dropoutArgs(seed uint64) []any {
	return []any{kernels.StreamKey(seed, a.stream), a.thresh, a.keep}
}

// rows is the scalar kernels' grid: a block per row.
func (a *attention) rows() [3]uint32 { return [3]uint32{uint32(a.T), uint32(a.BH), 1} }

// tiles is flash.cu's grid over n: a block per 64 rows of each of n
// (sequence, head) pairs.
func (a *attention) tiles(n int) [3]uint32 {
	return [3]uint32{uint32((a.T + attnRows - 1) / attnRows), uint32(n), 1}
}

// parts is the number of bias-gradient partial sums: (sequence, head)
// pairs are dealt to this many blocks per row tile, in a fixed order that
// depends on the shape only.
func (a *attention) parts() int {
	if a.bias == nil {
		return a.BH
	}
	return min(a.BH, max(1, attnPartBytes/(4*a.T*a.T)))
}

var attnBlock = [3]uint32{128, 1, 1}

// forward launches the forward kernel: o and the rows' log-sum-exp.
func (p *program) attentionForward(a *attention, o, lse uint64, q, k, v *dval) error {
	if a.path == attnGEMM {
		return p.attentionForwardGEMM(a, o, lse, q, k, v)
	}
	args := append([]any{o, lse, q.buf.Ptr, k.buf.Ptr, v.buf.Ptr, a.biasPtr(), int32(a.T), int32(a.Hd), int32(a.H), a.scale}, a.dropoutArgs(p.seed)...)
	if a.path == attnFlash {
		return p.launch("attention_fwd_bf16", a.tiles(a.BH), attnBlock, 0, args...)
	}
	return p.launch("attention_fwd_f32", a.rows(), attnBlock, uint32(4*(32+a.T)), args...)
}

func (p *program) buildFusedAttention(n *ir.Node, in, out []*dval) (func() error, error) {
	var mask *dval
	if len(in) == 4 {
		mask = in[3]
	}
	a, err := newAttention(n, in[0], in[1], in[2], mask, p.be.gemm, p.be.attention, p.hasAttentionGrad())
	if err != nil {
		return nil, err
	}
	p.noteAttnWork(a)
	if err := p.saveAGPacks(a, in[0], in[1], in[2]); err != nil {
		return nil, err
	}
	if a.path == attnGEMM {
		p.attnWorkNeed = max(p.attnWorkNeed, newAGLayout(a).fwdBytes)
		if a.H > 0 {
			if a.outTwin, _, err = p.attnOutTwin(n); err != nil {
				return nil, err
			}
		}
	}
	lse, err := p.alloc(a.BH * a.T)
	if err != nil {
		return nil, err
	}
	if p.attnLSE == nil {
		p.attnLSE = map[*dval]Buffer{}
	}
	p.attnLSE[out[0]] = lse
	return func() error { return p.attentionForward(a, out[0].buf.Ptr, lse.Ptr, in[0], in[1], in[2]) }, nil
}

// buildFusedAttentionGrad computes dq (with D_i = dO_i·o_i), dk and dv,
// and the bias gradient summed over heads in a fixed order. o and the rows'
// log-sum-exp are the forward node's when the gradient is given the
// forward's output (with_out) and that node ran in this program; else the
// forward runs again first (the weights are never stored).
func (p *program) buildFusedAttentionGrad(n *ir.Node, in, out []*dval) (func() error, error) {
	in, fwdOut, hasOut := ir.SplitAttentionGrad(n.Attrs, in)
	dO, q, k, v := in[0], in[1], in[2], in[3]
	var mask *dval
	if len(in) == 5 {
		mask = in[4]
	}
	a, err := newAttention(n, q, k, v, mask, p.be.gemm, p.be.attention, true)
	if err != nil {
		return nil, err
	}
	g := &attnGrad{a: a, dO: dO, q: q, k: k, v: v, out: out, cols: [3]int{-1, -1, -1}}
	p.noteAttnWork(a)
	lse, saved := p.attnLSE[fwdOut]
	switch {
	case a.path == attnGEMM:
		p.attnWorkNeed = max(p.attnWorkNeed, newAGLayout(a).bytes)
		if a.H > 0 {
			if g.rows, g.cols, _, err = p.attnGradRows(n); err != nil {
				return nil, err
			}
		}
	case a.path == attnFlash && mask != nil:
		p.attnWorkNeed = max(p.attnWorkNeed, int64(4*a.parts()*a.T*a.T))
	}
	if hasOut && saved {
		D, err := p.alloc(a.BH * a.T)
		if err != nil {
			return nil, err
		}
		g.lse, g.D = lse.Ptr, D.Ptr
		return func() error {
			g.o = fwdOut.buf.Ptr // the plan's slot, known when the program runs
			return p.attentionBackward(g)
		}, nil
	}
	work, err := p.alloc(a.BH*a.T*a.Hd + 2*a.BH*a.T) // o, lse, D
	if err != nil {
		return nil, err
	}
	g.o = work.Ptr
	g.lse = g.o + uint64(4*a.BH*a.T*a.Hd)
	g.D = g.lse + uint64(4*a.BH*a.T)
	return func() error {
		if err := p.attentionForward(a, g.o, g.lse, q, k, v); err != nil {
			return err
		}
		return p.attentionBackward(g)
	}, nil
}

// attentionBackward runs the backward kernels of a's path.
func (p *program) attentionBackward(g *attnGrad) error {
	switch g.a.path {
	case attnGEMM:
		return p.attentionBackwardGEMM(g)
	case attnFlash:
		return p.attentionBackwardTC(g)
	}
	return p.attentionBackwardScalar(g)
}

// attnGrad is a FusedAttentionGrad node's operands: the inputs, the
// outputs (dq, dk, dv and, with a bias, its gradient) and the work
// buffers o, lse and D.
type attnGrad struct {
	a           *attention
	dO, q, k, v *dval
	out         []*dval
	o, lse, D   uint64
	// rows: where the GEMM path writes dq, dk and dv as bf16 instead, the
	// joined gradients' operand (packed.go's attnGradRows), from column
	// cols[j] for output j (-1: in fp32 as usual)
	rows twin
	cols [3]int
}

// attentionBackwardScalar: attention.cu's kernels, a block per row.
func (p *program) attentionBackwardScalar(g *attnGrad) error {
	a := g.a
	drop := a.dropoutArgs(p.seed)
	common := []any{int32(a.T), int32(a.Hd), int32(a.H), a.scale}
	dq := append(append([]any{g.out[0].buf.Ptr, g.D, g.q.buf.Ptr, g.k.buf.Ptr, g.v.buf.Ptr, g.o, g.dO.buf.Ptr, g.lse, a.biasPtr()}, common...), drop...)
	if err := p.launch("attention_bwd_dq_f32", a.rows(), attnBlock, uint32(4*(32+a.T)), dq...); err != nil {
		return err
	}
	dkdv := append(append([]any{g.out[1].buf.Ptr, g.out[2].buf.Ptr, g.q.buf.Ptr, g.k.buf.Ptr, g.v.buf.Ptr, g.dO.buf.Ptr, g.lse, g.D, a.biasPtr()}, common...), drop...)
	if err := p.launch("attention_bwd_dkdv_f32", a.rows(), attnBlock, uint32(4*2*a.T), dkdv...); err != nil {
		return err
	}
	if a.bias == nil {
		return nil
	}
	db := append(append([]any{g.out[3].buf.Ptr, g.q.buf.Ptr, g.k.buf.Ptr, g.v.buf.Ptr, g.dO.buf.Ptr, g.lse, g.D, a.biasPtr(), int32(a.BH)}, common...), drop...)
	return p.launch("attention_bwd_dbias_f32", [3]uint32{uint32(a.T), 1, 1}, attnBlock, 0, db...)
}

// attentionBackwardTC: flash.cu's kernels. dq (and D, and the bias
// gradient's partial sums), then dk and dv, then the partial sums reduced
// in order.
func (p *program) attentionBackwardTC(g *attnGrad) error {
	a := g.a
	drop := a.dropoutArgs(p.seed)
	var part uint64
	if a.bias != nil {
		part = p.attnWork.Ptr
	}
	dq := append([]any{g.out[0].buf.Ptr, g.D, part, g.q.buf.Ptr, g.k.buf.Ptr, g.v.buf.Ptr, g.o, g.dO.buf.Ptr, g.lse, a.biasPtr(),
		int32(a.BH), int32(a.T), int32(a.Hd), int32(a.H), a.scale}, drop...)
	if err := p.launch("attention_bwd_dq_bf16", a.tiles(a.parts()), attnBlock, 0, dq...); err != nil {
		return err
	}
	dkdv := append([]any{g.out[1].buf.Ptr, g.out[2].buf.Ptr, g.q.buf.Ptr, g.k.buf.Ptr, g.v.buf.Ptr, g.dO.buf.Ptr, g.lse, g.D, a.biasPtr(),
		int32(a.T), int32(a.Hd), int32(a.H), a.scale}, drop...)
	if err := p.launch("attention_bwd_dkdv_bf16", a.tiles(a.BH), attnBlock, 0, dkdv...); err != nil {
		return err
	}
	if a.bias == nil {
		return nil
	}
	return p.each("attention_dbias_reduce_f32", a.T*a.T, g.out[3].buf.Ptr, part, int32(a.parts()), int32(a.T))
}

// stageAttention allocates the work buffer of the tensor-core attention
// paths: flash.cu's bias-gradient partial sums, the GEMM path's operands
// (nodes run one at a time, so they share it).
func (p *program) stageAttention() error {
	if p.attnWorkNeed == 0 {
		return nil
	}
	b, err := p.alloc(int((p.attnWorkNeed + 3) / 4))
	if err != nil {
		return err
	}
	p.attnWork = b
	if !p.agUpperZero {
		return nil
	}
	return p.be.dev.zero(b, b.Bytes) // the weights' rows above the diagonal, never written after
}
