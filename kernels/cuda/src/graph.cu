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

// binary_f32: out[i] = a[view_a(i)] op b[view_b(i)]; view = dims, astrides,
// bstrides (numpy broadcasting: stride 0 on broadcast axes).
extern "C" __global__ void binary_f32(float* out, const float* a, const float* b, const i64* view, int rank, int op, i64 n) {
    const i64* dims = view;
    const i64* as = view + rank;
    const i64* bs = view + 2 * rank;
    GRID_STRIDE(i, n) out[i] = ew_binary(op, a[view_offset(i, dims, as, rank)], b[view_offset(i, dims, bs, rank)]);
}

// gather_view_f32: out[i] = x[base + view(i)] (Transpose, Slice,
// BroadcastTo); view = dims, xstrides, base.
extern "C" __global__ void gather_view_f32(float* out, const float* x, const i64* view, int rank, i64 n) {
    const i64 base = view[2 * rank];
    GRID_STRIDE(i, n) out[i] = x[base + view_offset(i, view, view + rank, rank)];
}

// scatter_view_f32: out[base + view(i)] = x[i] (SliceGrad, into zeros).
extern "C" __global__ void scatter_view_f32(float* out, const float* x, const i64* view, int rank, i64 n) {
    const i64 base = view[2 * rank];
    GRID_STRIDE(i, n) out[base + view_offset(i, view, view + rank, rank)] = x[i];
}

// reduce_view_f32: out[o] = scale · Σ_k x[view_out(o) + view_red(k)], in
// order of k, accumulated in double; view = out dims, out strides (in x),
// reduced dims, reduced strides.
extern "C" __global__ void reduce_view_f32(float* out, const float* x, const i64* view, int orank, int rrank, i64 nred,
                                           float scale, i64 nout) {
    const i64* odims = view;
    const i64* ostr = view + orank;
    const i64* rdims = view + 2 * orank;
    const i64* rstr = view + 2 * orank + rrank;
    GRID_STRIDE(o, nout) {
        const float* xo = x + view_offset(o, odims, ostr, orank);
        double s = 0.0;
        for (i64 k = 0; k < nred; k++) s += xo[view_offset(k, rdims, rstr, rrank)];
        out[o] = (float)(s * scale);
    }
}

// sum_f32: *out = Σ x[0..n) in a fixed order (one block of 1024 threads,
// each a strided partial, then a tree), accumulated in double.
extern "C" __global__ void sum_f32(float* out, const float* x, i64 n) {
    __shared__ double part[1024];
    double s = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = (float)part[0];
}

// scale_ptr_f32: y = (*s) · x, the scale read from device memory (the
// incoming gradient of a scalar loss).
extern "C" __global__ void scale_ptr_f32(float* y, const float* x, const float* s, i64 n) {
    float k = *s;
    GRID_STRIDE(i, n) y[i] = k * x[i];
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
// below thresh; kept elements are scaled by scale; mask holds 0 or scale.
extern "C" __global__ void dropout_f32(float* y, float* mask, const float* x, unsigned long long key,
                                       unsigned long long thresh, float scale, i64 n) {
    GRID_STRIDE(i, n) {
        unsigned long long h = mix64(key + (unsigned long long)((i >> 1) + 1) * RPAC_GOLDEN);
        unsigned int half = (unsigned int)(h >> (32 * (i & 1)));
        float m = ((unsigned long long)half < thresh) ? scale : 0.0f;
        mask[i] = m;
        y[i] = x[i] * m;
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
// smoothed loss and the pure CE, without touching the logits.
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
        float lse = m + logf(se);
        float ce = lse - x[targets[r]];
        loss_ce[r] = ce;
        loss_sm[r] = (1.0f - ls) * ce + ls * (lse - sx / V);
    }
}

// ce_grad_f32: dlogits = (*dloss)·(softmax − ((1−ls)·onehot + ls/V)).
extern "C" __global__ void ce_grad_f32(float* dx, const float* logits, const int* targets, const float* dloss,
                                       int rows, int V, float ls) {
    __shared__ float red[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = logits + (i64)r * V;
    float* d = dx + (i64)r * V;
    float m = RPAC_NEG_INF;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, red);
    float se = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) se += expf(x[j] - m);
    float inv = 1.0f / block_sum(se, red);
    float k = *dloss;
    int t = targets[r];
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
