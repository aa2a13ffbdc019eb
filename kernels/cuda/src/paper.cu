// Row softmax, the z-score over a whole tensor, clamps, top-k masks and
// Sinkhorn: the pieces of the RPA prior and the FuzzyMoE gate that are not
// GEMMs. Semantics follow the IR op table (ir/ops.go).

// Softmax over rows of length n (max-subtracted; a row of all -Inf gives
// zeros), one block per row.
extern "C" __global__ void softmax_rows_f32(float* y, const float* x, int rows, int n) {
    __shared__ float red[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (i64)r * n;
    float* yr = y + (i64)r * n;
    float m = RPAC_NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, red);
    if (m == RPAC_NEG_INF) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = 0.0f;
        return;
    }
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
    float inv = 1.0f / block_sum(s, red);
    for (int j = threadIdx.x; j < n; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
}

// dx = y·(dy − Σ dy·y) per row.
extern "C" __global__ void softmax_rows_bwd_f32(float* dx, const float* dy, const float* y, int rows, int n) {
    __shared__ float red[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* gr = dy + (i64)r * n;
    const float* yr = y + (i64)r * n;
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += gr[j] * yr[j];
    s = block_sum(s, red);
    float* dr = dx + (i64)r * n;
    for (int j = threadIdx.x; j < n; j += blockDim.x) dr[j] = yr[j] * (gr[j] - s);
}

// The z-score's moments: stats = {Σx, Σ(x − mean)²} over x[0..n), each a
// two-pass reduction (reduce_rows_f32 or the parts below over chunks of
// chunk elements, then sum_parts_f64). zscore_moments reads them.
__device__ __forceinline__ double zscore_mean(const double* stats, i64 n) { return stats[0] / (double)n; }
__device__ __forceinline__ void zscore_moments(const double* stats, i64 n, double* mean, double* sd) {
    *mean = zscore_mean(stats, n);
    *sd = sqrt(stats[1] / (double)(n - 1));
}

// zscore_sq_part_f32: part[k] = Σ (x − mean)² over chunk k of x (one warp
// per chunk, mean from stats[0]).
extern "C" __global__ void zscore_sq_part_f32(double* part, const float* x, const double* stats, i64 n, int chunk) {
    i64 k = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (k >= (n + chunk - 1) / chunk) return;
    double mean = zscore_mean(stats, n);
    i64 lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double q = 0.0;
    for (i64 i = lo + (threadIdx.x & 31); i < hi; i += 32) { double d = x[i] - mean; q += d * d; }
    q = warp_sum_d(q);
    if ((threadIdx.x & 31) == 0) part[k] = q;
}

// y = (x − mean)/(std + 1e-6).
extern "C" __global__ void zscore_fwd_f32(float* y, const float* x, const double* stats, i64 n) {
    double mean, sd;
    zscore_moments(stats, n, &mean, &sd);
    double c = sd + 1e-6;
    GRID_STRIDE(i, n) y[i] = (float)((x[i] - mean) / c);
}

// zscore_grad_part_f32: part[k] = Σ dy and part[chunks + k] = Σ dy·(x −
// mean) over chunk k (one warp per chunk); sum_parts_f64 turns them into
// sums = {Σ dy, Σ dy·(x − mean)}.
extern "C" __global__ void zscore_grad_part_f32(double* part, const float* dy, const float* x, const double* stats,
                                                i64 n, int chunk) {
    i64 chunks = (n + chunk - 1) / chunk;
    i64 k = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (k >= chunks) return;
    double mean = zscore_mean(stats, n);
    i64 lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double a = 0.0, b = 0.0;
    for (i64 i = lo + (threadIdx.x & 31); i < hi; i += 32) { a += dy[i]; b += dy[i] * (x[i] - mean); }
    a = warp_sum_d(a);
    b = warp_sum_d(b);
    if ((threadIdx.x & 31) == 0) { part[k] = a; part[chunks + k] = b; }
}

// dx = (dy − mean(dy))/c − k·(x − mean), c = std + 1e-6, k = Σdy(x−mean)/(c²(n−1)std).
extern "C" __global__ void zscore_bwd_f32(float* dx, const float* dy, const float* x, const double* stats,
                                          const double* sums, i64 n) {
    double mean, sd;
    zscore_moments(stats, n, &mean, &sd);
    double c = sd + 1e-6;
    double mg = sums[0] / (double)n;
    double k = sd > 0.0 ? sums[1] / (c * c * (double)(n - 1) * sd) : 0.0;
    GRID_STRIDE(i, n) dx[i] = (float)((dy[i] - mg) / c - k * (x[i] - mean));
}

// Clamp(x; lo, hi): NaN stays NaN. ±Inf bounds mean unbounded.
extern "C" __global__ void clamp_f32(float* y, const float* x, float lo, float hi, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        y[i] = (v != v) ? v : fminf(fmaxf(v, lo), hi);
    }
}

// NanToNum(x; nan, posinf, neginf).
extern "C" __global__ void nan_to_num_f32(float* y, const float* x, float nan, float posinf, float neginf, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        if (v != v) v = nan;
        else if (isinf(v)) v = v > 0.0f ? posinf : neginf;
        y[i] = v;
    }
}

// ranks_before: entry (a, i) ranks before (b, j): larger first, NaN last,
// ties to the lower index.
__device__ __forceinline__ bool ranks_before(float a, int i, float b, int j) {
    bool an = a != a, bn = b != b;
    if (an && bn) return i < j;
    if (an) return false;
    if (bn) return true;
    return a > b || (a == b && i < j);
}

// TopKMask: 1 at the k largest entries of each row of length n (ties: the
// lower index; NaN ranks last), else 0; one thread per row (n is the
// expert count).
extern "C" __global__ void topk_mask_f32(float* y, const float* x, int rows, int n, int k) {
    GRID_STRIDE(r, rows) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        for (int j = 0; j < n; j++) {
            int above = 0;  // entries ranked before j
            for (int i = 0; i < n; i++) {
                if (i != j && ranks_before(xr[i], i, xr[j], j)) above++;
            }
            yr[j] = above < k ? 1.0f : 0.0f;
        }
    }
}

// Sinkhorn(X[R,K]; iters): rows then columns divided by their sum + 1e-9,
// iters rounds, in double as the CPU backend does; one thread (R and K are
// the regime and block counts). With rec (double, iters·(2·R·K + R + K))
// it records what sinkhorn_bwd_f32 needs.
__device__ void sinkhorn_rounds(double* x, int R, int K, int iters, double* rec) {
    for (int it = 0; it < iters; it++) {
        double* xr = rec ? rec + (i64)it * (2 * R * K + R + K) : 0;
        double* xc = xr ? xr + R * K : 0;
        double* rs = xc ? xc + R * K : 0;
        double* cs = rs ? rs + R : 0;
        if (xr) for (int i = 0; i < R * K; i++) xr[i] = x[i];
        for (int r = 0; r < R; r++) {
            double s = 0.0;
            for (int c = 0; c < K; c++) s += x[r * K + c];
            if (rs) rs[r] = s;
            for (int c = 0; c < K; c++) x[r * K + c] /= (s + 1e-9);
        }
        if (xc) for (int i = 0; i < R * K; i++) xc[i] = x[i];
        for (int c = 0; c < K; c++) {
            double s = 0.0;
            for (int r = 0; r < R; r++) s += x[r * K + c];
            if (cs) cs[c] = s;
            for (int r = 0; r < R; r++) x[r * K + c] /= (s + 1e-9);
        }
    }
}

// work: R·K doubles (+ the record for the backward).
extern "C" __global__ void sinkhorn_f32(float* P, const float* X, double* work, int R, int K, int iters) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int i = 0; i < R * K; i++) work[i] = X[i];
    sinkhorn_rounds(work, R, K, iters, 0);
    for (int i = 0; i < R * K; i++) P[i] = (float)work[i];
}

// dX through the unrolled rounds; work: R·K + R·K + iters·(2·R·K + R + K) doubles.
extern "C" __global__ void sinkhorn_bwd_f32(float* dX, const float* dP, const float* X, double* work, int R, int K, int iters) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double* x = work;
    double* d = work + R * K;
    double* rec = d + R * K;
    for (int i = 0; i < R * K; i++) { x[i] = X[i]; d[i] = dP[i]; }
    sinkhorn_rounds(x, R, K, iters, rec);
    for (int it = iters - 1; it >= 0; it--) {
        double* xr = rec + (i64)it * (2 * R * K + R + K);
        double* xc = xr + R * K;
        double* rs = xc + R * K;
        double* cs = rs + R;
        for (int c = 0; c < K; c++) {
            double cc = cs[c] + 1e-9, q = 0.0;
            for (int r = 0; r < R; r++) q += d[r * K + c] * xc[r * K + c];
            q /= cc * cc;
            for (int r = 0; r < R; r++) d[r * K + c] = d[r * K + c] / cc - q;
        }
        for (int r = 0; r < R; r++) {
            double rr = rs[r] + 1e-9, q = 0.0;
            for (int c = 0; c < K; c++) q += d[r * K + c] * xr[r * K + c];
            q /= rr * rr;
            for (int c = 0; c < K; c++) d[r * K + c] = d[r * K + c] / rr - q;
        }
    }
    for (int i = 0; i < R * K; i++) dX[i] = (float)d[i];
}

// ---- GaussianMembership: μ = nan_to_num(softmax_r(clamp(−½‖z−c_r‖²·s_r, −30, 30)), 1/R),
// s_r = clamp(exp(−2·log_sigma_r), 1e-3, 1e3). One warp per row; R ≤ 32.

__device__ __forceinline__ float gauss_scale(float ls) {
    float e = expf(-2.0f * ls);
    return e != e ? e : fminf(fmaxf(e, 1e-3f), 1e3f);
}

// Squared distances of row z (length D) to every center, in lane r of the
// returned value (the warp's lanes 0..R-1).
__device__ float gauss_sqdist(const float* z, const float* c, int D, int R) {
    int lane = threadIdx.x & 31;
    float mine = 0.0f;
    for (int r = 0; r < R; r++) {
        float a = 0.0f;
        for (int d = lane; d < D; d += 32) { float t = z[d] - c[(i64)r * D + d]; a += t * t; }
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == r) mine = a;
    }
    return mine;
}

extern "C" __global__ void gaussian_membership_f32(float* mu, const float* z, const float* c, const float* ls,
                                                   int N, int D, int R) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= N) return;
    float z2 = gauss_sqdist(z + (i64)warp * D, c, D, R);
    float l = RPAC_NEG_INF;
    if (lane < R) {
        l = -0.5f * z2 * gauss_scale(ls[lane]);
        if (l == l) l = fminf(fmaxf(l, -30.0f), 30.0f);
    }
    int nan = __any_sync(0xffffffffu, lane < R && l != l);
    float m = warp_max(lane < R ? l : RPAC_NEG_INF);
    m = __shfl_sync(0xffffffffu, m, 0);
    float e = (lane < R) ? expf(l - m) : 0.0f;
    float s = warp_sum(e);
    s = __shfl_sync(0xffffffffu, s, 0);
    if (lane < R) {
        float v = (nan || isinf(m)) ? 1.0f / R : e / s;
        mu[(i64)warp * R + lane] = v;
    }
}

// Per row: dz, dz2[n,r] = g_r·(−½ s_r) and dss[n,r] = g_r·(−½‖z−c_r‖²), kept
// for the parameters' kernel (which sums them over rows in a fixed order).
extern "C" __global__ void gaussian_membership_bwd_rows_f32(float* dz, float* dz2, float* dss,
                                                            const float* dmu, const float* z, const float* c,
                                                            const float* ls, const float* mu, int N, int D, int R) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= N) return;
    const float* zr = z + (i64)warp * D;
    float z2 = gauss_sqdist(zr, c, D, R);
    float s = lane < R ? gauss_scale(ls[lane]) : 0.0f;
    float lpre = lane < R ? -0.5f * z2 * s : 0.0f;
    int nan = __any_sync(0xffffffffu, lane < R && lpre != lpre);
    float* dzr = dz + (i64)warp * D;
    if (nan) {
        for (int d = lane; d < D; d += 32) dzr[d] = 0.0f;
        if (lane < R) { dz2[(i64)warp * R + lane] = 0.0f; dss[(i64)warp * R + lane] = 0.0f; }
        return;
    }
    float dm = lane < R ? dmu[(i64)warp * R + lane] : 0.0f;
    float m = lane < R ? mu[(i64)warp * R + lane] : 0.0f;
    float dot = warp_sum(dm * m);
    dot = __shfl_sync(0xffffffffu, dot, 0);
    float g = m * (dm - dot);
    if (!(lpre >= -30.0f && lpre <= 30.0f)) g = 0.0f;
    float k = g * (-0.5f * s);
    if (lane < R) {
        dz2[(i64)warp * R + lane] = k;
        dss[(i64)warp * R + lane] = g * (-0.5f * z2);
    }
    for (int d0 = 0; d0 < D; d0 += 32) {  // every lane takes part in the shuffles
        int d = d0 + lane;
        float acc = 0.0f;
        for (int r = 0; r < R; r++) {
            float kr = __shfl_sync(0xffffffffu, k, r);
            if (d < D) acc += kr * (zr[d] - c[(i64)r * D + d]);
        }
        if (d < D) dzr[d] = 2.0f * acc;
    }
}

// The parameters' gradients, a two-pass reduction over the N rows:
// dcenters[r,d] = −2·Σ_n dz2[n,r]·z[n,d] + 2·(Σ_n dz2[n,r])·c[r,d] and
// dlog_sigma[r] = (Σ_n dss[n,r])·(−2·e_r) inside the clamp.
//
// gaussian_membership_bwd_params_part_f32: block b = k·tiles + t sums rows
// [k·chunk, +chunk) for the 32 columns [32·t, +32) (threads as in
// reduce_cols_f32: 32 columns × 8 row lanes, partials in double, a fixed
// tree over the lanes): part[(r·D + d)·chunks + k] = Σ dz2[n,r]·z[n,d]; the
// blocks of tile 0 also write part[(R·D + r)·chunks + k] = Σ dz2[n,r] and
// part[(R·D + R + r)·chunks + k] = Σ dss[n,r]. R ≤ 32.
extern "C" __global__ void gaussian_membership_bwd_params_part_f32(double* part, const float* dz2, const float* dss,
                                                                   const float* z, int N, int D, int R, int chunk) {
    __shared__ double sh[RED_ROW_LANES][32];
    int tiles = (D + 31) / 32, chunks = (N + chunk - 1) / chunk;
    int t = blockIdx.x % tiles, k = blockIdx.x / tiles;
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int d = t * 32 + tx;
    int lo = k * chunk, hi = min(N, lo + chunk);
    for (int r = 0; r < R; r++) {
        double a = 0.0;
        if (d < D) {
            for (int n = lo + ty; n < hi; n += RED_ROW_LANES) a += (double)dz2[(i64)n * R + r] * z[(i64)n * D + d];
        }
        sh[ty][tx] = a;
        __syncthreads();
        for (int h = RED_ROW_LANES / 2; h > 0; h >>= 1) {
            if (ty < h) sh[ty][tx] += sh[ty + h][tx];
            __syncthreads();
        }
        if (ty == 0 && d < D) part[((i64)r * D + d) * chunks + k] = sh[0][tx];
        __syncthreads();
    }
    if (t != 0) return;  // the whole block
    for (int which = 0; which < 2; which++) {
        const float* src = which == 0 ? dz2 : dss;
        double a = 0.0;
        if (tx < R) {
            for (int n = lo + ty; n < hi; n += RED_ROW_LANES) a += src[(i64)n * R + tx];
        }
        sh[ty][tx] = a;
        __syncthreads();
        for (int h = RED_ROW_LANES / 2; h > 0; h >>= 1) {
            if (ty < h) sh[ty][tx] += sh[ty + h][tx];
            __syncthreads();
        }
        if (ty == 0 && tx < R) part[((i64)R * D + (i64)which * R + tx) * chunks + k] = sh[0][tx];
        __syncthreads();
    }
}

// gaussian_membership_bwd_params_f32: the second pass, one warp per output
// (R·D centers, then R log-sigmas), each sum over the chunks in a fixed tree.
extern "C" __global__ void gaussian_membership_bwd_params_f32(float* dc, float* dls, const double* part,
                                                              const float* c, const float* ls, int chunks, int D, int R) {
    i64 o = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    i64 RD = (i64)R * D;
    if (o >= RD + R) return;
    int lane = threadIdx.x & 31;
    if (o < RD) {
        int r = (int)(o / D);
        double a = warp_sum_parts(part + o * chunks, chunks);
        double s = warp_sum_parts(part + (RD + r) * chunks, chunks);
        if (lane == 0) dc[o] = (float)(-2.0 * a + 2.0 * s * c[o]);
        return;
    }
    int r = (int)(o - RD);
    double q = warp_sum_parts(part + (RD + R + r) * chunks, chunks);
    if (lane == 0) {
        float e = expf(-2.0f * ls[r]);
        dls[r] = (e >= 1e-3f && e <= 1e3f) ? (float)(q * -2.0 * e) : 0.0f;
    }
}
