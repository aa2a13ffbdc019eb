// Softmax cross-entropy with label smoothing over a large vocabulary, fused
// with its gradient: one block per row reads the row's logits, writes the
// row's losses and argmax, and overwrites the logits with
// scale·(softmax − ((1−ls)·onehot + ls/V)), so no probability tensor makes a
// round trip through memory. A row whose target is the ignored target
// (negative) gets zero losses and a zero gradient row; its argmax is kept.
// Row r starts at logits + r·ld (ld ≥ V: the LM head's chunk has rows
// padded to 16-byte multiples, which cuBLASLt's fastest kernels need).
// With gb not null the gradient goes to gb instead, as bf16 in rows of
// gld ≥ V (the columns from V to gld zero): the operand of the bf16 GEMMs
// that read it, with the bits a conversion of the fp32 gradient would
// give; the logits are then left as they are.
//
// softmax_ce_smem_f32 is the same kernel with the row kept in dynamic
// shared memory (V floats, launched with the opt-in above 48 KiB): the
// logits are read from DRAM once instead of twice, the gradient pass
// reads the block's copy. Each thread takes the same values in the same
// order, so both kernels give the same bits.

#define CE_AHEAD 4  // loads in flight per thread

// ce_load: x[j0 + u·step] for u < AHEAD (0 at and past V), all issued
// before any is used.
template <int AHEAD>
__device__ __forceinline__ void ce_load(float* vs, const float* x, int j0, int step, int V) {
#pragma unroll
    for (int u = 0; u < AHEAD; u++) {
        int j = j0 + u * step;
        vs[u] = j < V ? x[j] : 0.0f;
    }
}

// ce_each: f(j, x[j]) for the thread's entries of the row (j from
// threadIdx.x, blockDim.x apart, below V) in order, the loads AHEAD at a
// time (ce_load).
template <int AHEAD, typename F>
__device__ __forceinline__ void ce_each(const float* x, int V, F f) {
    const int step = blockDim.x;
    for (int j0 = threadIdx.x; j0 < V; j0 += AHEAD * step) {
        float vs[AHEAD];
        ce_load<AHEAD>(vs, x, j0, step, V);
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            int j = j0 + u * step;
            if (j >= V) break;
            f(j, vs[u]);
        }
    }
}

// ce_put: gradient entry j of the row, into the fp32 row x or the bf16
// row g.
__device__ __forceinline__ void ce_put(float* x, bf16_t* g, int j, float v) {
    if (g) {
        g[j] = f32_to_bf16(v);
    } else {
        x[j] = v;
    }
}

// ce_row: the kernels' body for row blockIdx.x. With keep not null the
// first pass also stores the row there and the second reads it back;
// AHEAD is the loads each thread has in flight (the order of the values
// each thread takes does not depend on it).
template <int AHEAD>
__device__ __forceinline__ void ce_row(float* logits, float* loss_sm, float* loss_ce, int* pred, const int* targets,
                                       int rows, int V, int ld, float ls, float scale, bf16_t* gb, int gld,
                                       float* keep) {
    __shared__ float shared[32];
    __shared__ int shared_arg[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    float* x = logits + (i64)r * ld;
    bf16_t* g = gb ? gb + (i64)r * gld : 0;
    if (g) {
        for (int j = V + threadIdx.x; j < gld; j += blockDim.x) g[j] = 0;
    }
    // One pass over the row for the maximum, its index, Σx and Σ exp(x − m)
    // (each thread's sum rescaled when its maximum rises), then the row is
    // read once more (from keep, if kept) to write the gradient.
    // The loads go AHEAD at a time (independent, all in flight before the
    // first is used: the loop is bound by memory latency otherwise); the
    // values are taken in the same order as one at a time.
    float m = RPAC_NEG_INF;
    int arg = 0x7fffffff;
    float sx = 0.0f, se = 0.0f;
    ce_each<AHEAD>(x, V, [&](int j, float v) {
        if (keep) keep[j] = v;
        if (v > m) {
            se = (m == RPAC_NEG_INF ? 0.0f : se * expf(m - v)) + 1.0f;
            m = v;
            arg = j;
        } else {
            if (m != RPAC_NEG_INF) se += expf(v - m);  // (v = m = −Inf adds nothing)
            if (v == m && j < arg) arg = j;
        }
        sx += v;
    });
    // argmax with ties to the lower index: reduce (value, index) pairs.
    // (block_max's barriers: the kept row is whole after it.)
    float bm = block_max(m, shared);
    int cand = (m == bm) ? arg : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_down_sync(0xffffffffu, cand, o));
    if ((threadIdx.x & 31) == 0) shared_arg[threadIdx.x >> 5] = cand;
    __syncthreads();
    if (threadIdx.x == 0) {
        int best = 0x7fffffff;
        for (int w = 0; w < (blockDim.x >> 5); w++) best = min(best, shared_arg[w]);
        pred[r] = best;
    }
    se = block_sum(m == RPAC_NEG_INF ? 0.0f : se * expf(m - bm), shared);
    sx = block_sum(sx, shared);
    float lse = bm + logf(se);
    int t = targets[r];
    if (t < 0) {  // the ignored target: no loss, a zero gradient row (pred kept)
        if (threadIdx.x == 0) {
            loss_ce[r] = 0.0f;
            loss_sm[r] = 0.0f;
        }
        for (int j = threadIdx.x; j < V; j += blockDim.x) ce_put(x, g, j, 0.0f);
        return;
    }
    const float* src = keep ? keep : x;
    float ce = lse - src[t];
    if (threadIdx.x == 0) {
        loss_ce[r] = ce;
        loss_sm[r] = (1.0f - ls) * ce + ls * (lse - sx / V);
    }
    __syncthreads();  // every thread has read x[t] before it is overwritten (fp32 gradient)
    float inv = 1.0f / se;
    ce_each<AHEAD>(src, V, [&](int j, float v) {
        float p = expf(v - bm) * inv;
        float tgt = ls / V + (j == t ? 1.0f - ls : 0.0f);
        ce_put(x, g, j, scale * (p - tgt));
    });
}

extern "C" __global__ void softmax_ce_fused_f32(float* logits, float* loss_sm, float* loss_ce, int* pred,
                                                const int* targets, int rows, int V, int ld, float ls, float scale,
                                                bf16_t* gb, int gld) {
    ce_row<CE_AHEAD>(logits, loss_sm, loss_ce, pred, targets, rows, V, ld, ls, scale, gb, gld, 0);
}

// softmax_ce_smem_f32: launched with 4·V bytes of dynamic shared memory
// (one block an SM at the paper's vocabulary), so each thread keeps twice
// the loads in flight.
extern "C" __global__ void softmax_ce_smem_f32(float* logits, float* loss_sm, float* loss_ce, int* pred,
                                               const int* targets, int rows, int V, int ld, float ls, float scale,
                                               bf16_t* gb, int gld) {
    extern __shared__ float ce_keep[];
    ce_row<2 * CE_AHEAD>(logits, loss_sm, loss_ce, pred, targets, rows, V, ld, ls, scale, gb, gld, ce_keep);
}
