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

// Double-precision block sum; every thread gets it.
__device__ double block_sum_d(double v, double* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x >> 5)) ? shared[threadIdx.x] : 0.0;
    if (warp == 0) for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

// stats = {mean, unbiased std} of x[0..n) (one block; the tensors it sees
// are [T,T] biases).
extern "C" __global__ void zscore_stats_f32(double* stats, const float* x, i64 n) {
    __shared__ double red[32];
    double s = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    double mean = block_sum_d(s, red) / (double)n;
    double q = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) { double d = x[i] - mean; q += d * d; }
    q = block_sum_d(q, red);
    if (threadIdx.x == 0) { stats[0] = mean; stats[1] = sqrt(q / (double)(n - 1)); }
}

// y = (x − mean)/(std + 1e-6).
extern "C" __global__ void zscore_fwd_f32(float* y, const float* x, const double* stats, i64 n) {
    double mean = stats[0], c = stats[1] + 1e-6;
    GRID_STRIDE(i, n) y[i] = (float)((x[i] - mean) / c);
}

// sums = {Σ dy, Σ dy·(x − mean)} (one block).
extern "C" __global__ void zscore_grad_sums_f32(double* sums, const float* dy, const float* x, const double* stats, i64 n) {
    __shared__ double red[32];
    double mean = stats[0];
    double a = 0.0, b = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) { a += dy[i]; b += dy[i] * (x[i] - mean); }
    a = block_sum_d(a, red);
    b = block_sum_d(b, red);
    if (threadIdx.x == 0) { sums[0] = a; sums[1] = b; }
}

// dx = (dy − mean(dy))/c − k·(x − mean), c = std + 1e-6, k = Σdy(x−mean)/(c²(n−1)std).
extern "C" __global__ void zscore_bwd_f32(float* dx, const float* dy, const float* x, const double* stats,
                                          const double* sums, i64 n) {
    double mean = stats[0], sd = stats[1], c = sd + 1e-6;
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
// iters rounds; one thread (R and K are the regime and block counts).
extern "C" __global__ void sinkhorn_f32(float* P, const float* X, int R, int K, int iters) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int i = 0; i < R * K; i++) P[i] = X[i];
    for (int it = 0; it < iters; it++) {
        for (int r = 0; r < R; r++) {
            float s = 0.0f;
            for (int c = 0; c < K; c++) s += P[r * K + c];
            for (int c = 0; c < K; c++) P[r * K + c] /= (s + 1e-9f);
        }
        for (int c = 0; c < K; c++) {
            float s = 0.0f;
            for (int r = 0; r < R; r++) s += P[r * K + c];
            for (int r = 0; r < R; r++) P[r * K + c] /= (s + 1e-9f);
        }
    }
}
