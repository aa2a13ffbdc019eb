package cuda

// Two-pass reductions: the first pass sums fixed chunks of the reduced
// axis into partials (double) in the program's workspace, many blocks at
// once with coalesced loads; the second sums each output's partials in a
// fixed tree (src/graph.cu, src/paper.cu). The chunking depends only on
// the shape, so a reduction runs in the same order on every device and
// every run, and no float atomics are involved.

// launcher is a kernel launch (program.launch, Context.Launch).
type launcher func(name string, grid, block [3]uint32, shared uint32, args ...any) error

// midAxis is a reduction of x, read as a row-major [A, R, C], over its
// middle axis: out[a, c] = Σ_r x[a, r, c]. Column sums (A = 1), row sums
// (C = 1) and whole sums (A = C = 1) are its cases.
type midAxis struct{ A, R, C int }

// midAxisOf recognises the collapsed views of reduceViews that are a sum
// over the middle axis of a row-major [A, R, C]; other views (reduced axes
// that interleave with kept ones) are not.
func midAxisOf(ov, rv view) (midAxis, bool) {
	if rv.rank() != 1 {
		return midAxis{}, false
	}
	R, rs := rv.dims[0], rv.strides[0][0]
	od, os := ov.dims, ov.strides[0]
	var m midAxis
	switch {
	case len(od) == 1 && od[0] == 1: // everything
		m = midAxis{1, int(R), 1}
	case len(od) == 1 && os[0] == 1: // columns
		m = midAxis{1, int(R), int(od[0])}
	case len(od) == 1 && os[0] == R: // rows
		m = midAxis{int(od[0]), int(R), 1}
	case len(od) == 2 && os[1] == 1 && os[0] == R*od[1]:
		m = midAxis{int(od[0]), int(R), int(od[1])}
	default:
		return midAxis{}, false
	}
	// x[a, r, c] sits at (a·R + r)·C + c: the reduced stride is C (any
	// stride when R is 1).
	return m, R == 1 || rs == int64(m.C)
}

// outerInner is a sum of x, read as a row-major [X, K, Y], over its outer
// and inner axes: out[k] = Σ_x Σ_y x[x, k, y] (the gradient of a per-head
// or per-channel parameter broadcast over the rows and the columns). It
// runs as two midAxis reductions: row sums over Y into [X·K], then column
// sums over X.
type outerInner struct{ X, K, Y int }

// outerInnerOf recognises the collapsed views of reduceViews that are an
// outerInner sum.
func outerInnerOf(ov, rv view) (outerInner, bool) {
	if rv.rank() != 2 || ov.rank() != 1 {
		return outerInner{}, false
	}
	X, Y, K := rv.dims[0], rv.dims[1], ov.dims[0]
	if rv.strides[0][1] != 1 || rv.strides[0][0] != K*Y || ov.strides[0][0] != Y {
		return outerInner{}, false
	}
	return outerInner{int(X), int(K), int(Y)}, true
}

// outerInnerPlan is how an outerInner sum runs: the two reductions and
// the [X·K] float32 row sums between them, kept at the start of the
// workspace (tmpDoubles of it), the partials after them.
type outerInnerPlan struct {
	rows, cols reducePlan
	tmpDoubles int
}

func planOuterInner(m outerInner) outerInnerPlan {
	return outerInnerPlan{
		rows:       planReduce(midAxis{A: m.X * m.K, R: m.Y, C: 1}),
		cols:       planReduce(midAxis{A: 1, R: m.X, C: m.K}),
		tmpDoubles: ceilDiv(m.X*m.K, 2),
	}
}

// workspace is the doubles the plan needs.
func (r outerInnerPlan) workspace() int {
	return r.tmpDoubles + max(r.rows.workspace(), r.cols.workspace())
}

// run sums x (or the products x·y, y non-zero) into out (scaled) through
// work (r.workspace() doubles).
func (r outerInnerPlan) run(launch launcher, out, work, x, y uint64, scale float32) error {
	tmp, part := work, work+uint64(8*r.tmpDoubles)
	if err := r.rows.run(launch, tmp, part, x, y, 1); err != nil {
		return err
	}
	return r.cols.run(launch, out, part, tmp, 0, scale)
}

// reduceBlock is the block of every reduction kernel: 8 warps.
var reduceBlock = [3]uint32{256, 1, 1}

// Chunk sizes. A row sum (C = 1) gives each warp a chunk of the row of at
// least rowChunkMin elements, aiming at rowWarps warps in all; a column sum
// gives each 256-thread block (32 columns × 8 row lanes) a chunk of at
// least colChunkMin rows, aiming at colBlocks blocks. Enough warps or
// blocks to fill an H100 (132 SMs × 64 warps), few enough partials that
// the second pass stays short.
const (
	rowChunkMin = 256
	rowWarps    = 4096
	colChunkMin = 64
	colBlocks   = 1024
)

// reducePlan is how one midAxis reduction runs: the chunk of the reduced
// axis each first-pass warp (row sums) or block (column sums) takes.
type reducePlan struct {
	m      midAxis
	chunk  int
	chunks int
}

// planReduce chooses the chunks of m (a function of the shape only).
func planReduce(m midAxis) reducePlan {
	R := max(1, m.R)
	if m.C == 1 {
		want := max(1, ceilDiv(rowWarps, max(1, m.A)))
		chunk := roundUp(max(rowChunkMin, ceilDiv(R, want)), 32)
		return reducePlan{m: m, chunk: chunk, chunks: ceilDiv(R, chunk)}
	}
	tiles := ceilDiv(m.C, 32)
	want := max(1, ceilDiv(colBlocks, max(1, m.A)*tiles))
	chunk := roundUp(max(colChunkMin, ceilDiv(R, want)), 8)
	return reducePlan{m: m, chunk: chunk, chunks: ceilDiv(R, chunk)}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func roundUp(a, m int) int { return ceilDiv(a, m) * m }

// outputs is the number of sums.
func (r reducePlan) outputs() int { return r.m.A * r.m.C }

// workspace is the doubles of partials the plan needs (none with one
// chunk: the first pass writes the result).
func (r reducePlan) workspace() int {
	if r.chunks <= 1 {
		return 0
	}
	return r.outputs() * r.chunks
}

// firstPass launches the partial sums of x (or of the products x·y, y
// non-zero) into part (0: one chunk, the sums scaled into out).
func (r reducePlan) firstPass(launch launcher, out, part, x, y uint64, scale float32) error {
	m := r.m
	if m.C == 1 {
		warps := m.A * r.chunks
		return launch("reduce_rows_f32", warpGrid(warps), reduceBlock, 0, out, part, x, y, int64(m.A), int64(m.R),
			int32(r.chunk), scale)
	}
	b := m.A * r.chunks * ceilDiv(m.C, 32)
	return launch("reduce_cols_f32", [3]uint32{uint32(b), 1, 1}, reduceBlock, 0, out, part, x, y, int64(m.A), int64(m.R),
		int64(m.C), int32(r.chunk), scale)
}

// run sums x (or the products x·y, y non-zero) into out (scaled), through
// part (r.workspace() doubles) when there is more than one chunk.
func (r reducePlan) run(launch launcher, out, part, x, y uint64, scale float32) error {
	if r.outputs() == 0 {
		return nil
	}
	if r.chunks <= 1 {
		return r.firstPass(launch, out, 0, x, y, scale)
	}
	if err := r.firstPass(launch, out, part, x, y, 1); err != nil {
		return err
	}
	return sumParts(launch, out, part, r.chunks, scale, r.outputs())
}

// warpGrid is the grid of n warps in blocks of reduceBlock.
func warpGrid(n int) [3]uint32 { return [3]uint32{uint32(max(1, ceilDiv(n, 8))), 1, 1} }

// sumParts launches reduce_parts_f32: out[o] = scale·Σ_k part[o·parts + k].
func sumParts(launch launcher, out, part uint64, parts int, scale float32, nout int) error {
	return launch("reduce_parts_f32", warpGrid(nout), reduceBlock, 0, out, part, int32(parts), scale, int64(nout))
}

// sumPartsF64 launches sum_parts_f64: out[o] = Σ_k part[o·parts + k] in
// double.
func sumPartsF64(launch launcher, out, part uint64, parts, nout int) error {
	return launch("sum_parts_f64", warpGrid(nout), reduceBlock, 0, out, part, int32(parts), int64(nout))
}

// zscorePlan is the chunking of the z-score's sums over n elements.
func zscorePlan(n int) reducePlan { return planReduce(midAxis{A: 1, R: n, C: 1}) }

// zscoreWorkspace is the doubles of partials zscoreStats and
// zscoreGradSums need.
func zscoreWorkspace(n int) int { return 2 * zscorePlan(n).chunks }

// zscoreStats launches stats = {Σx, Σ(x − mean)²} (doubles) over x[0..n).
func zscoreStats(launch launcher, stats, part, x uint64, n int) error {
	r := zscorePlan(n)
	if err := r.firstPass(launch, 0, part, x, 0, 1); err != nil {
		return err
	}
	if err := sumPartsF64(launch, stats, part, r.chunks, 1); err != nil {
		return err
	}
	if err := launch("zscore_sq_part_f32", warpGrid(r.chunks), reduceBlock, 0, part, x, stats, int64(n), int32(r.chunk)); err != nil {
		return err
	}
	return sumPartsF64(launch, stats+8, part, r.chunks, 1)
}

// zscoreGradSums launches sums = {Σ dy, Σ dy·(x − mean)} (doubles).
func zscoreGradSums(launch launcher, sums, part, dy, x, stats uint64, n int) error {
	r := zscorePlan(n)
	if err := launch("zscore_grad_part_f32", warpGrid(r.chunks), reduceBlock, 0, part, dy, x, stats, int64(n), int32(r.chunk)); err != nil {
		return err
	}
	return sumPartsF64(launch, sums, part, r.chunks, 2)
}

// membershipParamsPlan is the chunking of GaussianMembership's parameter
// gradients over N rows of D columns.
func membershipParamsPlan(N, D int) reducePlan { return planReduce(midAxis{A: 1, R: N, C: D}) }

// membershipParamsWorkspace is the doubles of partials of
// membershipParams: R·D + 2R sums per chunk.
func membershipParamsWorkspace(N, D, R int) int {
	return (R*D + 2*R) * membershipParamsPlan(N, D).chunks
}

// membershipParams launches GaussianMembership's dcenters and dlog_sigma
// from the rows' dz2 and dss (gaussian_membership_bwd_rows_f32).
func membershipParams(launch launcher, dc, dls, part, dz2, dss, z, c, ls uint64, N, D, R int) error {
	r := membershipParamsPlan(N, D)
	b := r.chunks * ceilDiv(D, 32)
	if err := launch("gaussian_membership_bwd_params_part_f32", [3]uint32{uint32(b), 1, 1}, reduceBlock, 0, part, dz2, dss, z,
		int32(N), int32(D), int32(R), int32(r.chunk)); err != nil {
		return err
	}
	return launch("gaussian_membership_bwd_params_f32", warpGrid(R*D+R), reduceBlock, 0, dc, dls, part, c, ls,
		int32(r.chunks), int32(D), int32(R))
}
