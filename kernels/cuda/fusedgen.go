package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/ir"
)

// Generated elementwise chains. An interpreter kernel (fused_ew_f32, since
// removed) ran a FusedElementwise body per element: a switch over the step
// kinds and op codes, its registers in shared memory. On an H200 it was
// bound by its instructions (Nsight Compute: 69% SM throughput, 35% of the
// memory bandwidth), not by the bytes it moves. So each chain of a program
// is a kernel of its own: the steps as straight-line code over
// local variables, the op codes and parameters as constants (the prelude's
// ew_* switches fold away), the dense inputs read at i, a broadcast input
// at an offset computed from the view's dims and strides as constants
// (divisions by constants: a multiply and a shift, not the runtime view's
// division loop, the interpreter's and binary_f32's cost). All
// chains of one program are one NVRTC module, compiled when the program is
// (cached on disk like the embedded sources). The formulas are the
// prelude's ew_* functions, step for step.

// fusedGenPrefix starts every generated chain kernel's name.
const fusedGenPrefix = "fused_gen_"

// The names the trace gives the generated chain kernels:
//   - fusedGenDense: every input read at i (costed as a stream, like
//     binary_dense_f32);
//   - fusedGenBcast: a broadcast input over a view that collapses to two
//     dims, rows and columns (a per-row value such as a gate [B,T,1] over
//     [B,T,D], or a per-column one such as a bias): its offset is one
//     division or one remainder by a constant (a multiply-high and a
//     shift) and its loads are the same address across most of a warp,
//     so the kernel is the dense chain's plus two or three integer
//     instructions per element: costed as a stream too (an estimate, to
//     calibrate: reported apart for that);
//   - fusedGenView: a broadcast over three or more collapsed dims (a
//     division and a remainder per dim), costed like binary_f32, which
//     reads through a runtime view, until a GPU measures the constant one;
//   - fusedGenSum: a chain folding the column sums of its result
//     (chainsum.go; dense or a two-dim broadcast), in reduce_cols_f32's
//     layout: costed as a stream, like reduce_cols_f32.
const (
	fusedGenDense = "fused_gen_f32"
	fusedGenBcast = "fused_gen_bcast_f32"
	fusedGenView  = "fused_gen_view_f32"
	fusedGenSum   = "fused_gen_sum_f32"
)

// reportName is the name a launch of kernel name is reported under: the
// generated chains by kind, every other kernel by its own name.
func reportName(name string) string {
	switch {
	case strings.HasPrefix(name, fusedGenPrefix+"sum_"):
		return fusedGenSum
	case strings.HasPrefix(name, fusedGenPrefix+"view_"):
		return fusedGenView
	case strings.HasPrefix(name, fusedGenPrefix+"bcast_"):
		return fusedGenBcast
	case strings.HasPrefix(name, fusedGenPrefix):
		return fusedGenDense
	}
	return name
}

// fusedChain is one FusedElementwise body as its kernel runs it:
// the encoded steps (fusedStep) and how each input is read.
type fusedChain struct {
	dense []bool // input k has the output's shape
	// half: input k is stored as bf16 (a GEMM's result, halfOutput), read
	// dense
	half []bool
	// view: the collapsed view of the inputs over the output (its dims
	// and each input's strides; rank 0 when every input is dense)
	view view
	// idx32: the output has fewer than 2³¹ elements, so the view's
	// divisions go in 32 bits
	idx32  bool
	prog   []int32
	params []float32
	// packCols: the result goes out as padded bf16 rows of packCols
	// elements (packed.go), eight to a thread; 0: fp32 at i.
	packCols int
	// twinCols: the result also goes out as bf16 into tw, element (r, c)
	// of its rows of twinCols at tw[r·twinLD + twinOff + c] (packed.go's
	// twins); 0: no copy.
	twinCols, twinLD, twinOff int
	// sum: the chain folds a sum of its results (chainsum.go), in
	// reduce_cols_f32's (A = 1) or reduce_rows_f32's (C = 1) layout with
	// sum's chunks, writing partials to part; skipOut: nothing reads the
	// fp32 result, so it is not written.
	sum     reducePlan
	skipOut bool
	// sumY: the terms of the sum are the results' products with ry (a
	// SumToProduct's other factor)
	sumY bool
}

// source is the chain's kernel. Its parameters: out, the inputs x0.., n,
// and the ir.MaxFusedDraws stream keys. n is the elements, or with packCols the
// groups of eight bf16 of the padded rows.
func (c fusedChain) source(name string) string {
	var b strings.Builder
	out := "float* out"
	if c.packCols > 0 {
		out = "rpac_bf16x8* out"
	}
	fmt.Fprintf(&b, "extern \"C\" __global__ void %s(%s", name, out)
	if c.twinCols > 0 {
		b.WriteString(", bf16_t* tw")
	}
	for k := range c.dense {
		if c.isHalf(k) {
			fmt.Fprintf(&b, ", const bf16_t* x%d", k)
			continue
		}
		fmt.Fprintf(&b, ", const float* x%d", k)
	}
	if c.sum.m.C > 0 {
		b.WriteString(", double* part")
		if c.sumY {
			b.WriteString(", const float* ry")
		}
	}
	b.WriteString(", i64 n")
	for k := range ir.MaxFusedDraws {
		fmt.Fprintf(&b, ", unsigned long long k%d", k)
	}
	b.WriteString(") {\n")
	if c.sum.m.C > 0 {
		c.sumBody(&b)
		return b.String()
	}
	if c.packCols == 0 {
		b.WriteString("    GRID_STRIDE(i, n) {\n")
		c.body(&b, "        ")
		c.stores(&b, "        ")
		b.WriteString("    }\n}\n")
		return b.String()
	}
	// a group g of eight columns of row r: element i = r·cols + c of the
	// result for the columns c < cols, zero in the padding (as
	// bf16x8_of writes it)
	groups := bf16LD(c.packCols) / 8
	fmt.Fprintf(&b, "    GRID_STRIDE(g, n) {\n        i64 row = g / %d;\n        int c0 = (int)(g - row * %d) << 3;\n", groups, groups)
	b.WriteString("        unsigned h[8];\n#pragma unroll\n        for (int e = 0; e < 8; e++) {\n")
	fmt.Fprintf(&b, "            h[e] = 0u;\n            if (c0 + e >= %d) continue;\n            i64 i = row * %dll + c0 + e;\n", c.packCols, c.packCols)
	c.body(&b, "            ")
	fmt.Fprintf(&b, "            h[e] = f32_to_bf16(r%d);\n        }\n", c.result())
	b.WriteString("        rpac_bf16x8 v;\n#pragma unroll\n        for (int e = 0; e < 4; e++) v.w[e] = h[2 * e] | (h[2 * e + 1] << 16);\n")
	b.WriteString("        out[g] = v;\n    }\n}\n")
	return b.String()
}

// stores writes the result of element i out: to out[i] (unless skipOut)
// and, with a twin, as bf16 to its place in tw.
func (c fusedChain) stores(b *strings.Builder, indent string) {
	if !c.skipOut {
		fmt.Fprintf(b, "%sout[i] = r%d;\n", indent, c.result())
	}
	if c.twinCols > 0 {
		u, suffix := "(i64)i", "ll"
		if c.idx32 {
			u, suffix = "(unsigned)i", "u"
		}
		fmt.Fprintf(b, "%stw[(i64)(%s / %d%s) * %dll + %dll + (i64)(%s %% %d%s)] = f32_to_bf16(r%d);\n",
			indent, u, c.twinCols, suffix, c.twinLD, c.twinOff, u, c.twinCols, suffix, c.result())
	}
}

// sumBody is the kernel body of a chain that folds a sum of its results
// (or of their products with ry, sumY): over rows (C = 1) reduce_rows_f32's
// warps, else (A = 1) reduce_cols_f32's blocks, and their partial sums,
// over the chain's results instead of a stored x. The launch is the first
// pass's grid (chainSumGrid) of reduceBlock threads.
func (c fusedChain) sumBody(b *strings.Builder) {
	m := c.sum.m
	if m.C == 1 {
		fmt.Fprintf(b, "    i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n    if (w >= %dll) return;  // the whole warp\n",
			m.A*c.sum.chunks)
		fmt.Fprintf(b, "    i64 a = w / %d, lo = (w - a * %d) * %dll, hi = lo + %dll < %dll ? lo + %dll : %dll;\n",
			c.sum.chunks, c.sum.chunks, c.sum.chunk, c.sum.chunk, m.R, c.sum.chunk, m.R)
		b.WriteString("    double s = 0.0;\n")
		c.sumLoop(b, "    ", "lo + (threadIdx.x & 31)", "32", fmt.Sprintf("a * %dll + j", m.R))
		b.WriteString("    s = warp_sum_d(s);\n    if ((threadIdx.x & 31) == 0) part[w] = s;\n}\n")
		return
	}
	tiles := ceilDiv(m.C, 32)
	fmt.Fprintf(b, "    __shared__ double sh[RED_ROW_LANES][32];\n")
	fmt.Fprintf(b, "    i64 t = blockIdx.x %% %d, k = blockIdx.x / %d;\n", tiles, tiles)
	b.WriteString("    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;\n")
	fmt.Fprintf(b, "    i64 col = t * 32 + tx, lo = k * %dll, hi = lo + %dll < %dll ? lo + %dll : %dll;\n",
		c.sum.chunk, c.sum.chunk, m.R, c.sum.chunk, m.R)
	b.WriteString("    double s = 0.0;\n")
	fmt.Fprintf(b, "    if (col < %d) {\n", m.C)
	c.sumLoop(b, "        ", "lo + ty", "RED_ROW_LANES", fmt.Sprintf("j * %dll + col", m.C))
	b.WriteString("    }\n    sh[ty][tx] = s;\n    __syncthreads();\n")
	b.WriteString("    for (int h = RED_ROW_LANES / 2; h > 0; h >>= 1) {\n        if (ty < h) sh[ty][tx] += sh[ty + h][tx];\n        __syncthreads();\n    }\n")
	fmt.Fprintf(b, "    if (ty != 0 || col >= %d) return;\n    part[col * %dll + k] = sh[0][tx];\n}\n", m.C, c.sum.chunks)
}

// sumLoop writes the loop of one thread's terms: j from start below hi by
// step, element i = index(j). RED_AHEAD terms' inputs are loaded before
// any is used, so that many loads are in flight per thread (as in
// reduce_rows_f32 and reduce_cols_f32), then each element's steps, stores
// and term in order of j; a term is the result, or its float product with
// ry[i] (red_term's).
func (c fusedChain) sumLoop(b *strings.Builder, indent, start, step, index string) {
	ins := len(c.dense)
	load := func(k int) string { return c.load(k) }
	if c.sumY {
		ins++
		load = func(k int) string {
			if k == len(c.dense) {
				return "ry[i]"
			}
			return c.load(k)
		}
	}
	in := indent + "    "
	fmt.Fprintf(b, "%sfor (i64 j0 = %s; j0 < hi; j0 += %s * RED_AHEAD) {\n", indent, start, step)
	for k := 0; k < ins; k++ {
		fmt.Fprintf(b, "%sfloat in%d[RED_AHEAD];\n", in, k)
	}
	head := fmt.Sprintf("#pragma unroll\n%sfor (int u = 0; u < RED_AHEAD; u++) {\n%s    i64 j = j0 + u * %s, i = %s;\n%s    if (j >= hi) break;\n",
		in, in, step, index, in)
	b.WriteString(head)
	for k := 0; k < ins; k++ {
		fmt.Fprintf(b, "%s    in%d[u] = %s;\n", in, k, load(k))
	}
	fmt.Fprintf(b, "%s}\n", in)
	b.WriteString(head)
	for k := range c.dense {
		fmt.Fprintf(b, "%s    float r%d = in%d[u];\n", in, k, k)
	}
	c.steps(b, in+"    ")
	c.stores(b, in+"    ")
	if c.sumY {
		fmt.Fprintf(b, "%s    float term = r%d * in%d[u];\n%s    s += term;\n", in, c.result(), len(c.dense), in)
	} else {
		fmt.Fprintf(b, "%s    s += r%d;\n", in, c.result())
	}
	fmt.Fprintf(b, "%s}\n%s}\n", in, indent)
}

// chainSumGrid is the grid of a chain folding the sums of plan: the first
// pass's of reduce_rows_f32 (C = 1) or reduce_cols_f32 (A = 1).
func chainSumGrid(plan reducePlan) [3]uint32 {
	if plan.m.C == 1 {
		return warpGrid(plan.m.A * plan.chunks)
	}
	return [3]uint32{uint32(plan.chunks * ceilDiv(plan.m.C, 32)), 1, 1}
}

// body writes the chain's statements for element i: the inputs read into
// r0.., then each step into the next register.
func (c fusedChain) body(b *strings.Builder, indent string) {
	for k := range c.dense {
		fmt.Fprintf(b, "%sfloat r%d = %s;\n", indent, k, c.load(k))
	}
	c.steps(b, indent)
}

// isHalf: input k is stored as bf16.
func (c fusedChain) isHalf(k int) bool { return k < len(c.half) && c.half[k] }

// load is input k's value at element i.
func (c fusedChain) load(k int) string {
	if c.isHalf(k) {
		return fmt.Sprintf("bf16_to_f32(x%d[i])", k)
	}
	if c.dense[k] {
		return fmt.Sprintf("x%d[i]", k)
	}
	return fmt.Sprintf("x%d[%s]", k, c.offset(k))
}

// steps writes the chain's steps, each into the register after the
// inputs' r0...
func (c fusedChain) steps(b *strings.Builder, indent string) {
	nin := len(c.dense)
	for j := 0; j < len(c.prog)/4; j++ {
		s, q := c.prog[4*j:4*j+4], c.params[3*j:3*j+3]
		fmt.Fprintf(b, "%sfloat r%d = %s;\n", indent, nin+j, fusedExpr(fusedStepKind(s[0]), s, q))
	}
}

// result is the register holding the chain's result.
func (c fusedChain) result() int { return len(c.dense) + len(c.prog)/4 - 1 }

// offset is input k's offset at element i as an expression over
// constants: view_offset's loop unrolled, the innermost dim first, each
// dim's index (u mod dim) times its stride, the dims outside the
// outermost one with a stride left out (that dim's index is then u
// itself, since i < n).
func (c fusedChain) offset(k int) string {
	ty, suffix := "(i64)", "ll"
	if c.idx32 {
		ty, suffix = "(unsigned)", "u"
	}
	last := -1 // the outermost dim with a stride
	for d, st := range c.view.strides[k] {
		if st != 0 {
			last = d
			break
		}
	}
	if last < 0 {
		return "0"
	}
	var terms []string
	u := ty + "i"
	for d := len(c.view.dims) - 1; d >= last; d-- {
		dim, st := c.view.dims[d], c.view.strides[k][d]
		if st != 0 {
			idx := u
			if d > 0 {
				idx = fmt.Sprintf("(%s %% %d%s)", u, dim, suffix)
			}
			terms = append(terms, fmt.Sprintf("(i64)%s * %dll", idx, st))
		}
		u = fmt.Sprintf("(%s / %d%s)", u, dim, suffix)
	}
	return strings.Join(terms, " + ")
}

// fusedExpr is one step's right-hand side, the prelude's formula for it
// with the op code and parameters written as constants (floats by their
// bits, so they are exact).
func fusedExpr(kind fusedStepKind, s []int32, q []float32) string {
	f := func(x float32) string { return fmt.Sprintf("__uint_as_float(0x%08xu)", math.Float32bits(x)) }
	switch kind {
	case fusedBinary:
		return fmt.Sprintf("ew_binary(%d, r%d, r%d)", s[1], s[2], s[3])
	case fusedUnary:
		return fmt.Sprintf("ew_unary(%d, r%d, %s, %s, %s)", s[1], s[2], f(q[0]), f(q[1]), f(q[2]))
	case fusedGrad:
		return fmt.Sprintf("ew_grad(%d, r%d, r%d, %s, %s)", s[1], s[2], s[3], f(q[0]), f(q[1]))
	}
	// a drawing step: key slot s[1]; everything kept (q[2] != 0) draws
	// against 2³², which no 32-bit draw reaches
	thresh := uint64(math.Float32bits(q[1]))
	if q[2] != 0 {
		thresh = 1 << 32
	}
	return fmt.Sprintf("r%d * dropout_scale(k%d, i, 0x%xull, %s)", s[2], s[1], thresh, f(q[0]))
}

// name is the chain's kernel name: a hash of what the kernel does, so
// equal chains share one kernel within and across programs.
func (c fusedChain) name() string {
	h := sha256.New()
	fmt.Fprintf(h, "%v %v %v %v %v %v %d %d %d %d %v %v %v %v", c.view.dims, c.view.strides, c.idx32, c.dense, c.prog, c.params, c.packCols,
		c.twinCols, c.twinLD, c.twinOff, c.sum, c.skipOut, c.sumY, c.half)
	kind := ""
	switch r := c.view.rank(); {
	case c.sum.m.C > 0:
		kind = "sum_"
	case r > 2:
		kind = "view_"
	case r > 0:
		kind = "bcast_"
	}
	return fusedGenPrefix + kind + hex.EncodeToString(h.Sum(nil)[:8])
}

// fusedModule is the source of one module holding the given chain kernels
// (name → body), in name order, after the prelude.
func fusedModule(kernels map[string]string) (string, error) {
	pre, err := prelude()
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(kernels))
	for n := range kernels {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(pre)
	b.WriteString("\n#line 1 \"fused_gen.cu\"\n")
	for _, n := range names {
		b.WriteString(kernels[n])
	}
	return b.String(), nil
}
