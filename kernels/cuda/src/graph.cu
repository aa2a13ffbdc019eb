// The generic kernels the graph executor (backend.go) launches for the IR's
// shape and elementwise ops: one kernel per family, the op chosen by a code,
// shapes described by a small int64 "view" array uploaded once per node.
// Reductions run in a fixed order (no atomics), so a step repeats bit for
// bit on the same device.

// Op codes shared with backend.go (unaryOp, gradOp, binaryOp).
#define U_COPY 0
#define U_NEG 1
#define U_EXP 2
#define U_LOG 3
#define U_SIGMOID 4
#define U_TANH 5
#define U_GELU 6
#define U_RELU 7
#define U_SCALE 8
#define U_CLAMP 9
#define U_NANTONUM 10

#define G_SIGMOID 0
#define G_TANH 1
#define G_GELU 2
#define G_RELU 3
#define G_CLAMP 4
#define G_NANTONUM 5

#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3

// unary_f32: y = op(x); a, b, c are the op's parameters (Scale: alpha, beta;
// Clamp: lo, hi; NanToNum: nan, posinf, neginf).
extern "C" __global__ void unary_f32(float* y, const float* x, int op, float a, float b, float c, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float r;
        switch (op) {
        case U_NEG: r = -v; break;
        case U_EXP: r = expf(v); break;
        case U_LOG: r = logf(v); break;
        case U_SIGMOID: r = 1.0f / (1.0f + expf(-v)); break;
        case U_TANH: r = tanhf(v); break;
        case U_GELU: r = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
        case U_RELU: r = v > 0.0f ? v : 0.0f; break;
        case U_SCALE: r = a * v + b; break;
        case U_CLAMP:
            r = v;
            if (r < a) r = a;
            if (r > b) r = b;
            break;
        case U_NANTONUM:
            if (v != v) r = a;
            else if ((__float_as_uint(v) & 0x7fffffffu) == 0x7f800000u) r = v > 0.0f ? b : c;
            else r = v;
            break;
        default: r = v;
        }
        y[i] = r;
    }
}

// grad_unary_f32: dx = dy · op'(x-or-y); a, b are Clamp's lo and hi.
extern "C" __global__ void grad_unary_f32(float* dx, const float* dy, const float* x, int op, float a, float b, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i], g = dy[i], r;
        switch (op) {
        case G_SIGMOID: r = g * v * (1.0f - v); break;
        case G_TANH: r = g * (1.0f - v * v); break;
        case G_GELU: {
            float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
            float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
            r = g * (cdf + v * pdf);
            break;
        }
        case G_RELU: r = v > 0.0f ? g : 0.0f; break;
        case G_CLAMP: r = (a <= v && v <= b) ? g : 0.0f; break;
        case G_NANTONUM: r = (v - v == 0.0f) ? g : 0.0f; break;
        default: r = g;
        }
        dx[i] = r;
    }
}

// A view: dims[rank] of the iteration space, then one stride array per
// operand, then (copy/scatter) a base offset. Element i of the iteration
// space maps to Σ_d idx_d·stride_d.
__device__ __forceinline__ i64 view_offset(i64 i, const i64* dims, const i64* strides, int rank) {
    i64 off = 0;
    for (int d = rank - 1; d >= 0; d--) {
        i64 q = i / dims[d];
        off += (i - q * dims[d]) * strides[d];
        i = q;
    }
    return off;
}

// binary_f32: out[i] = a[view_a(i)] op b[view_b(i)]; view = dims, astrides,
// bstrides (numpy broadcasting: stride 0 on broadcast axes).
extern "C" __global__ void binary_f32(float* out, const float* a, const float* b, const i64* view, int rank, int op, i64 n) {
    const i64* dims = view;
    const i64* as = view + rank;
    const i64* bs = view + 2 * rank;
    GRID_STRIDE(i, n) {
        float x = a[view_offset(i, dims, as, rank)];
        float y = b[view_offset(i, dims, bs, rank)];
        float r;
        switch (op) {
        case B_ADD: r = x + y; break;
        case B_SUB: r = x - y; break;
        case B_MUL: r = x * y; break;
        default: r = x / y;
        }
        out[i] = r;
    }
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
