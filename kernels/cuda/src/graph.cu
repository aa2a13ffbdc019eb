// The generic kernels the graph executor (backend.go) launches for the IR's
// shape and elementwise ops: one kernel per family, the op chosen by a code,
// shapes described by a small int64 "view" array uploaded once per node.
// Reductions run in a fixed order (no atomics), so a step repeats bit for
// bit on the same device.

// The op codes (U_*, G_*, B_*) and the formulas (ew_unary, ew_grad,
// ew_binary) are in prelude.cuh, shared with fused.cu.

// unary_f32: y = op(x); a, b, c are the op's parameters (Scale: alpha, beta;
// Clamp: lo, hi; NanToNum: nan, posinf, neginf).
extern "C" __global__ void unary_f32(float* y, const float* x, int op, float a, float b, float c, i64 n) {
    GRID_STRIDE(i, n) y[i] = ew_unary(op, x[i], a, b, c);
}

// grad_unary_f32: dx = dy · op'(x-or-y); a, b are Clamp's lo and hi.
extern "C" __global__ void grad_unary_f32(float* dx, const float* dy, const float* x, int op, float a, float b, i64 n) {
    GRID_STRIDE(i, n) dx[i] = ew_grad(op, dy[i], x[i], a, b);
}

// binary_dense_f32: out[i] = a[i] op b[i], for operands of the output's
// shape (no broadcast axis): a plain stream, without binary_f32's index
// arithmetic.
extern "C" __global__ void binary_dense_f32(float* out, const float* a, const float* b, int op, i64 n) {
    GRID_STRIDE(i, n) out[i] = ew_binary(op, a[i], b[i]);
}

// binary_f32: out[i] = a[view_a(i)] op b[view_b(i)]; view = dims, astrides,
// bstrides (numpy broadcasting: stride 0 on broadcast axes).
extern "C" __global__ void binary_f32(float* out, const float* a, const float* b, const i64* view, int rank, int op, i64 n) {
    const i64* dims = view;
    const i64* as = view + rank;
    const i64* bs = view + 2 * rank;
    GRID_STRIDE(i, n) out[i] = ew_binary(op, a[view_offset_n(i, n, dims, as, rank)], b[view_offset_n(i, n, dims, bs, rank)]);
}

// gather_view_f32: out[i] = x[base + view(i)] (Transpose, Slice,
// BroadcastTo); view = dims, xstrides, base.
extern "C" __global__ void gather_view_f32(float* out, const float* x, const i64* view, int rank, i64 n) {
    const i64 base = view[2 * rank];
    GRID_STRIDE(i, n) out[i] = x[base + view_offset_n(i, n, view, view + rank, rank)];
}

// scatter_view_f32: out[base + view(i)] = x[i] (SliceGrad, into zeros).
extern "C" __global__ void scatter_view_f32(float* out, const float* x, const i64* view, int rank, i64 n) {
    const i64 base = view[2 * rank];
    GRID_STRIDE(i, n) out[base + view_offset_n(i, n, view, view + rank, rank)] = x[i];
}

// red_term: the term i of a reduction, x[i], or with y (a product sum,
// SumToProduct) the float product x[i]·y[i], as a Mul kernel writes it.
__device__ __forceinline__ float red_term(const float* x, const float* y, i64 i) {
    return y ? x[i] * y[i] : x[i];
}

// reduce_view_f32: out[o] = scale · Σ_k x[view_out(o) + view_red(k)] (times
// y at the same offset when y is given), in order of k, accumulated in
// double; view = out dims, out strides (in x), reduced dims, reduced
// strides. One thread per output: the general path for reductions that
// are not over the middle axis of a row-major [A,R,C] (those run in
// reduce_rows_f32 / reduce_cols_f32).
extern "C" __global__ void reduce_view_f32(float* out, const float* x, const float* y, const i64* view, int orank,
                                           int rrank, i64 nred, float scale, i64 nout) {
    const i64* odims = view;
    const i64* ostr = view + orank;
    const i64* rdims = view + 2 * orank;
    const i64* rstr = view + 2 * orank + rrank;
    GRID_STRIDE(o, nout) {
        i64 base = view_offset(o, odims, ostr, orank);
        double s = 0.0;
        for (i64 k = 0; k < nred; k++) s += red_term(x, y, base + view_offset(k, rdims, rstr, rrank));
        out[o] = (float)(s * scale);
    }
}

// ---- two-pass reductions (kernels/cuda/reduce.go plans them) ----
// The first pass sums fixed chunks of the reduced axis into partials
// (double) in the program's workspace, many blocks at once with coalesced
// loads; the second sums each output's partials in a fixed tree. No
// atomics: a step repeats bit for bit.

// reduce_rows_f32: x is [A, R] row-major, summed over R (with y, the
// products x·y: red_term). Warp w of the grid (8 per 256-thread block) sums
// chunk k = w mod chunks of row a = w / chunks: x[a, k·chunk, +chunk), each
// lane a strided partial in double, then the tree. With part, part[w]
// holds the sum; without (one chunk per row), out[a] = scale·sum.
extern "C" __global__ void reduce_rows_f32(float* out, double* part, const float* x, const float* y, i64 A, i64 R,
                                           int chunk, float scale) {
    i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    i64 chunks = (R + chunk - 1) / chunk;
    if (w >= A * chunks) return;  // the whole warp
    i64 a = w / chunks, lo = (w - a * chunks) * chunk;
    i64 hi = lo + chunk < R ? lo + chunk : R;
    double s = 0.0;
    // RED_AHEAD terms per lane loaded at once, then added in order
    for (i64 i0 = lo + (threadIdx.x & 31); i0 < hi; i0 += 32 * RED_AHEAD) {
        float v[RED_AHEAD];
#pragma unroll
        for (int u = 0; u < RED_AHEAD; u++) {
            i64 i = i0 + u * 32;
            v[u] = i < hi ? red_term(x, y, a * R + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < RED_AHEAD; u++)
            if (i0 + u * 32 < hi) s += v[u];
    }
    s = warp_sum_d(s);
    if ((threadIdx.x & 31) != 0) return;
    if (part) part[w] = s;
    else out[a] = (float)(s * scale);
}

// reduce_cols_f32: x is [A, R, C] row-major, summed over R (with y, the
// products x·y: red_term). Block b covers
// the 32 columns [32·t, +32) of rows [k·chunk, +chunk) of slab a, b = (a·
// chunks + k)·tiles + t; its 256 threads are 32 columns × 8 row lanes (a
// warp reads 32 adjacent floats of one row), each lane a partial in double,
// then a fixed tree over the row lanes. With part, part[(a·C + c)·chunks +
// k] holds the sum; without (one chunk), out[a·C + c] = scale·sum.
extern "C" __global__ void reduce_cols_f32(float* out, double* part, const float* x, const float* y, i64 A, i64 R, i64 C,
                                           int chunk, float scale) {
    __shared__ double sh[RED_ROW_LANES][32];
    i64 tiles = (C + 31) / 32, chunks = (R + chunk - 1) / chunk;
    i64 b = blockIdx.x;
    i64 t = b % tiles, k = (b / tiles) % chunks, a = b / (tiles * chunks);
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    i64 c = t * 32 + tx;
    i64 lo = k * chunk, hi = lo + chunk < R ? lo + chunk : R;
    double s = 0.0;
    if (c < C) {
        i64 base = a * R * C + c;
        // RED_AHEAD rows' terms loaded at once (that many loads in flight
        // per thread), then added in row order
        for (i64 r0 = lo + ty; r0 < hi; r0 += RED_ROW_LANES * RED_AHEAD) {
            float v[RED_AHEAD];
#pragma unroll
            for (int u = 0; u < RED_AHEAD; u++) {
                i64 r = r0 + u * RED_ROW_LANES;
                v[u] = r < hi ? red_term(x, y, base + r * C) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < RED_AHEAD; u++)
                if (r0 + u * RED_ROW_LANES < hi) s += v[u];
        }
    }
    sh[ty][tx] = s;
    __syncthreads();
    for (int h = RED_ROW_LANES / 2; h > 0; h >>= 1) {
        if (ty < h) sh[ty][tx] += sh[ty + h][tx];
        __syncthreads();
    }
    if (ty != 0 || c >= C) return;
    if (part) part[(a * C + c) * chunks + k] = sh[0][tx];
    else out[a * C + c] = (float)(sh[0][tx] * scale);
}

// reduce_parts_f32: out[o] = scale·Σ_k part[o·parts + k], one warp per
// output.
extern "C" __global__ void reduce_parts_f32(float* out, const double* part, int parts, float scale, i64 nout) {
    i64 o = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (o >= nout) return;
    double s = warp_sum_parts(part + o * parts, parts);
    if ((threadIdx.x & 31) == 0) out[o] = (float)(s * scale);
}

// sum_parts_f64: out[o] = Σ_k part[o·parts + k] in double, one warp per
// output.
extern "C" __global__ void sum_parts_f64(double* out, const double* part, int parts, i64 nout) {
    i64 o = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (o >= nout) return;
    double s = warp_sum_parts(part + o * parts, parts);
    if ((threadIdx.x & 31) == 0) out[o] = s;
}

// scale_ptr_f32: y = (*s) · x, the scale read from device memory (the
// incoming gradient of a scalar loss).
extern "C" __global__ void scale_ptr_f32(float* y, const float* x, const float* s, i64 n) {
    float k = *s;
    GRID_STRIDE(i, n) y[i] = k * x[i];
}

// compact_rows_f32: y, dense rows of cols, from x in rows of xld ≥ cols
// elements, times *s (s null: 1): y[r, j] = (*s) · x[r·xld + j] (GEMM
// results over padded dims: the LM head's gradients, the padded weight
// gradients).
extern "C" __global__ void compact_rows_f32(float* y, const float* x, const float* s, int cols, int xld, i64 n) {
    float k = s ? *s : 1.0f;
    GRID_STRIDE(i, n) {
        i64 r = i / cols;
        y[i] = k * x[r * xld + (i - r * cols)];
    }
}

// add_rows_f32: y[r, j] += b[j] (a Linear's bias).
extern "C" __global__ void add_rows_f32(float* y, const float* b, int cols, i64 n) {
    GRID_STRIDE(i, n) y[i] += b[i % cols];
}

// causal_mask_f32: entries j > i of each trailing [T,T] matrix become fill.
extern "C" __global__ void causal_mask_f32(float* y, const float* x, int T, float fill, i64 n) {
    GRID_STRIDE(i, n) {
        i64 j = i % T, r = (i / T) % T;
        y[i] = j > r ? fill : x[i];
    }
}

// dropout_f32: element i keeps when the 32-bit half (i&1) of draw i>>1 is
// below thresh; kept elements are scaled by scale. Dropout (x) and
// DropoutGrad (dy, with the forward node's key) are the same launch. A
// thread takes the pair of elements 2p, 2p + 1 and their one draw p (the
// launch: (n + 1) / 2 threads' worth).
extern "C" __global__ void dropout_f32(float* y, const float* x, unsigned long long key,
                                       unsigned long long thresh, float scale, i64 n) {
    GRID_STRIDE(p, (n + 1) >> 1) {
        float r0, r1;
        dropout_pair(key, p, thresh, scale, r0, r1);
        i64 i = p << 1;
        y[i] = x[i] * r0;
        if (i + 1 < n) y[i + 1] = x[i + 1] * r1;
    }
}

// gumbel_f32: y = x − log(−log(u)), u the 53-bit uniform draw i clamped to
// [1e-6, 1−1e-6], computed in double as the CPU backend does.
extern "C" __global__ void gumbel_f32(float* y, const float* x, unsigned long long key, i64 n) {
    GRID_STRIDE(i, n) {
        unsigned long long h = mix64(key + (unsigned long long)(i + 1) * RPAC_GOLDEN);
        double u = (double)(h >> 11) * (1.0 / 9007199254740992.0);
        u = fmin(fmax(u, 1e-6), 1.0 - 1e-6);
        y[i] = x[i] - (float)log(-log(u));
    }
}

// ce_rows_f32: per row of logits [rows, V] with label smoothing ls, the
// smoothed loss and the pure CE, without touching the logits; 0 and 0 for a
// row whose target is the ignored target (negative).
extern "C" __global__ void ce_rows_f32(float* loss_sm, float* loss_ce, const float* logits, const int* targets,
                                       int rows, int V, float ls) {
    __shared__ float red[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = logits + (i64)r * V;
    float m = RPAC_NEG_INF;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, red);
    float se = 0.0f, sx = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        se += expf(x[j] - m);
        sx += x[j];
    }
    se = block_sum(se, red);
    sx = block_sum(sx, red);
    if (threadIdx.x == 0) {
        int t = targets[r];
        if (t < 0) {  // the ignored target: the row adds nothing
            loss_ce[r] = 0.0f;
            loss_sm[r] = 0.0f;
            return;
        }
        float lse = m + logf(se);
        float ce = lse - x[t];
        loss_ce[r] = ce;
        loss_sm[r] = (1.0f - ls) * ce + ls * (lse - sx / V);
    }
}

// ce_grad_f32: dlogits = (*dloss)·(softmax − ((1−ls)·onehot + ls/V)), zero
// on a row whose target is the ignored target (negative).
extern "C" __global__ void ce_grad_f32(float* dx, const float* logits, const int* targets, const float* dloss,
                                       int rows, int V, float ls) {
    __shared__ float red[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = logits + (i64)r * V;
    float* d = dx + (i64)r * V;
    int t = targets[r];
    if (t < 0) {  // the ignored target: a zero row (the whole block returns together)
        for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0.0f;
        return;
    }
    float m = RPAC_NEG_INF;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, red);
    float se = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) se += expf(x[j] - m);
    float inv = 1.0f / block_sum(se, red);
    float k = *dloss;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float tgt = ls / V + (j == t ? 1.0f - ls : 0.0f);
        d[j] = k * (expf(x[j] - m) * inv - tgt);
    }
}

// gather_grad_csr_f32: dW[ids[u], :] = Σ dy[rows[k], :] for k in
// [starts[u], starts[u+1]), rows in increasing order; one block per
// distinct id (dW zeroed first). The host sorts the ids, so the sum's order
// is fixed.
extern "C" __global__ void gather_grad_csr_f32(float* dW, const float* dy, const int* csr, int nuniq, int D) {
    int u = blockIdx.x;
    if (u >= nuniq) return;
    const int* ids = csr;
    const int* starts = csr + nuniq;
    const int* rows = csr + 2 * nuniq + 1;
    float* w = dW + (i64)ids[u] * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float s = 0.0f;
        for (int k = starts[u]; k < starts[u + 1]; k++) s += dy[(i64)rows[k] * D + j];
        w[j] = s;
    }
}

// copy_words: y = x as 32-bit words (float or int32 data, bit for bit).
extern "C" __global__ void copy_words(unsigned int* y, const unsigned int* x, i64 n) {
    GRID_STRIDE(i, n) y[i] = x[i];
}
