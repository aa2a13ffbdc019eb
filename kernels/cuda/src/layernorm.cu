// LayerNorm over the last axis (biased variance), a warp per row (8 rows
// per 256-thread block): lane l takes the columns l, l + 32, ... and the
// lanes combine their sums in a fixed butterfly (every lane ends with the
// same bits). The backward recomputes each row's statistics and sums the
// parameters' gradients over fixed chunks of rows, then the chunks'
// partials in a fixed tree (no atomics: a step repeats bit for bit).
// Rows are D floats apart; the statistics and the parameters g, b cover
// their first W (≤ D) entries, and the entries from W on are padding:
// output and gradients 0.

#define LN_ROWS 8  // rows (warps) per block of the row kernels

// ln_warp_row: the row this warp takes, or −1.
__device__ __forceinline__ int ln_warp_row(int rows) {
    int r = blockIdx.x * LN_ROWS + (threadIdx.x >> 5);
    return r < rows ? r : -1;
}

// ln_warp_sum: the warp's sum in every lane (xor butterfly).
__device__ __forceinline__ float ln_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ln_stats: the mean (*mu) and 1/std (*rs) of the first W entries of the
// row xr, computed by the warp.
__device__ __forceinline__ void ln_stats(const float* xr, int W, float eps, float* mu, float* rs) {
    int lane = threadIdx.x & 31;
    float s = 0.0f;
    for (int j = lane; j < W; j += 32) s += xr[j];
    float m = ln_warp_sum(s) / W;
    float q = 0.0f;
    for (int j = lane; j < W; j += 32) {
        float d = xr[j] - m;
        q += d * d;
    }
    *mu = m;
    *rs = rsqrtf(ln_warp_sum(q) / W + eps);
}

// ln_row: row r of x (D floats apart), the mean and 1/std of its first W
// entries computed by the warp (lane 0 stores them in mean[r] and rstd[r]).
__device__ __forceinline__ const float* ln_row(const float* x, int r, int D, int W, float eps, float* mean, float* rstd,
                                               float* mu, float* rs) {
    const float* xr = x + (i64)r * D;
    ln_stats(xr, W, eps, mu, rs);
    if ((threadIdx.x & 31) == 0) {
        mean[r] = *mu;
        rstd[r] = *rs;
    }
    return xr;
}
// ln_out: output element j of a row, each operation rounded on its own
// (no contraction), so the fp32 and the bf16 forms agree bit for bit.
__device__ __forceinline__ float ln_out(const float* xr, int j, float mu, float rs, const float* g, const float* b) {
    return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[j], mu), rs), g[j]), b[j]);
}

extern "C" __global__ void layernorm_fwd_f32(float* out, float* mean, float* rstd, const float* x,
                                             const float* g, const float* b, int rows, int D, int W, float eps) {
    int r = ln_warp_row(rows);
    if (r < 0) return;
    float mu, rs;
    const float* xr = ln_row(x, r, D, W, eps, mean, rstd, &mu, &rs);
    float* yr = out + (i64)r * D;
    for (int j = threadIdx.x & 31; j < D; j += 32) yr[j] = j < W ? ln_out(xr, j, mu, rs, g, b) : 0.0f;
}

// layernorm_fwd_bf16pad: layernorm_fwd_f32 with the output written as the
// padded bf16 rows its GEMMs read (ld ≥ D, a multiple of 8; columns D to
// ld zero), each element rounded as f32_to_bf16_pad_kernel rounds it.
extern "C" __global__ void layernorm_fwd_bf16pad(bf16_t* out, float* mean, float* rstd, const float* x,
                                                 const float* g, const float* b, int rows, int D, int W, int ld, float eps) {
    int r = ln_warp_row(rows);
    if (r < 0) return;
    float mu, rs;
    const float* xr = ln_row(x, r, D, W, eps, mean, rstd, &mu, &rs);
    bf16_t* yr = out + (i64)r * ld;
    for (int j = threadIdx.x & 31; j < ld; j += 32) yr[j] = j < W ? f32_to_bf16(ln_out(xr, j, mu, rs, g, b)) : (bf16_t)0;
}

// ln_dx_row: row r of dx, recomputing the row's mean and 1/std (returned
// in *mu, *rs).
__device__ __forceinline__ void ln_dx_row(float* dx, const float* dy, const float* x, const float* g, int r, int D, int W,
                                          float eps, float* mu_, float* rs_) {
    int lane = threadIdx.x & 31;
    const float* xr = x + (i64)r * D;
    const float* dyr = dy + (i64)r * D;
    float mu, rs;
    ln_stats(xr, W, eps, &mu, &rs);
    float a = 0.0f, c = 0.0f;
    for (int j = lane; j < W; j += 32) {
        float xh = (xr[j] - mu) * rs;
        float dxh = dyr[j] * g[j];
        a += dxh;
        c += dxh * xh;
    }
    a = ln_warp_sum(a) / W;
    c = ln_warp_sum(c) / W;
    float* dxr = dx + (i64)r * D;
    for (int j = lane; j < D; j += 32) {
        float xh = (xr[j] - mu) * rs;
        dxr[j] = j < W ? (dyr[j] * g[j] - a - xh * c) * rs : 0.0f;
    }
    *mu_ = mu;
    *rs_ = rs;
}

// layernorm_bwd_dx_f32: dx per row (the row's mean and 1/std stored in
// stats[2r], stats[2r+1] for the parameters' kernel).
extern "C" __global__ void layernorm_bwd_dx_f32(float* dx, float* stats, const float* dy, const float* x, const float* g,
                                                int rows, int D, int W, float eps) {
    int r = ln_warp_row(rows);
    if (r < 0) return;
    float mu, rs;
    ln_dx_row(dx, dy, x, g, r, D, W, eps, &mu, &rs);
    if ((threadIdx.x & 31) == 0) {
        stats[2 * r] = mu;
        stats[2 * r + 1] = rs;
    }
}

#define LNB_COLS 16  // columns each lane of layernorm_bwd_f32 sums: W ≤ 32·LNB_COLS

// layernorm_bwd_f32: layernorm_bwd_dx_f32 and layernorm_bwd_params_f32 in
// one pass over dy and x (W ≤ 512). Block b takes the chunk of
// LN_ROWS·wrows rows from b·LN_ROWS·wrows, warp w its wrows consecutive
// rows from there: dx as layernorm_bwd_dx_f32 computes it (the same
// bits), and per column the sums of dy·x̂ and dy over the warp's rows in
// order, in double; the block's warps are then added in order through
// shared memory into the chunk's partials, laid out as
// layernorm_bwd_params_f32 lays them out (chunks = gridDim.x).
extern "C" __global__ void layernorm_bwd_f32(float* dx, double* part, const float* dy, const float* x, const float* g,
                                             int rows, int D, int W, int wrows, float eps) {
    __shared__ double red[LN_ROWS][32 * LNB_COLS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double sg[LNB_COLS], sb[LNB_COLS];
#pragma unroll
    for (int k = 0; k < LNB_COLS; k++) sg[k] = sb[k] = 0.0;
    int r0 = (blockIdx.x * LN_ROWS + warp) * wrows, r1 = min(rows, r0 + wrows);
    for (int r = r0; r < r1; r++) {
        float mu, rs;
        ln_dx_row(dx, dy, x, g, r, D, W, eps, &mu, &rs);
        const float* xr = x + (i64)r * D;
        const float* dyr = dy + (i64)r * D;
#pragma unroll
        for (int k = 0; k < LNB_COLS; k++) {
            int j = lane + 32 * k;
            if (j < W) {
                float d = dyr[j];
                float xh = (xr[j] - mu) * rs;
                sg[k] += (double)d * xh;
                sb[k] += d;
            }
        }
    }
    i64 chunks = gridDim.x;
    for (int pass = 0; pass < 2; pass++) {  // dg's partials, then db's
#pragma unroll
        for (int k = 0; k < LNB_COLS; k++) red[warp][lane + 32 * k] = pass == 0 ? sg[k] : sb[k];
        __syncthreads();
        for (int j = threadIdx.x; j < W; j += blockDim.x) {
            double s = 0.0;
            for (int w = 0; w < LN_ROWS; w++) s += red[w][j];
            part[((i64)pass * W + j) * chunks + blockIdx.x] = s;
        }
        __syncthreads();
    }
}

// layernorm_bwd_params_f32: partial dg, db (W each) over the rows of
// chunk blockIdx.y (chunk rows each), in double: part[j·chunks + y] =
// Σ dy·x̂, part[(W + j)·chunks + y] = Σ dy (reduce_parts_f32 sums each over
// the chunks).
extern "C" __global__ void layernorm_bwd_params_f32(double* part, const float* dy, const float* x, const float* stats,
                                                    int rows, int D, int W, int chunk) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= W) return;
    int r0 = blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
    double sg = 0.0, sb = 0.0;
    for (int r = r0; r < r1; r++) {
        float d = dy[(i64)r * D + j];
        float xh = (x[(i64)r * D + j] - stats[2 * r]) * stats[2 * r + 1];
        sg += (double)d * xh;
        sb += d;
    }
    i64 chunks = gridDim.y;
    part[(i64)j * chunks + blockIdx.y] = sg;
    part[((i64)W + j) * chunks + blockIdx.y] = sb;
}
