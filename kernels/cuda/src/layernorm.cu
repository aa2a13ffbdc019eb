// LayerNorm over the last axis (biased variance), one block per row.
// The forward keeps each row's mean and 1/std for the backward.

extern "C" __global__ void layernorm_fwd_f32(float* out, float* mean, float* rstd, const float* x,
                                             const float* g, const float* b, int rows, int D, float eps) {
    __shared__ float shared[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (i64)r * D;
    float s = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
    float mu = block_sum(s, shared) / D;
    float q = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) { float d = xr[j] - mu; q += d * d; }
    float rs = rsqrtf(block_sum(q, shared) / D + eps);
    float* yr = out + (i64)r * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) yr[j] = (xr[j] - mu) * rs * g[j] + b[j];
    if (threadIdx.x == 0) { mean[r] = mu; rstd[r] = rs; }
}

// dx per row; dg and db accumulate over rows with atomics (zero them first).
extern "C" __global__ void layernorm_bwd_f32(float* dx, float* dg, float* db, const float* dy, const float* x,
                                             const float* mean, const float* rstd, const float* g, int rows, int D) {
    __shared__ float shared[32];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (i64)r * D;
    const float* dyr = dy + (i64)r * D;
    float mu = mean[r], rs = rstd[r];
    float a = 0.0f, c = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float xh = (xr[j] - mu) * rs;
        float dxh = dyr[j] * g[j];
        a += dxh;
        c += dxh * xh;
        atomicAdd(&dg[j], dyr[j] * xh);
        atomicAdd(&db[j], dyr[j]);
    }
    a = block_sum(a, shared) / D;
    c = block_sum(c, shared) / D;
    float* dxr = dx + (i64)r * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float xh = (xr[j] - mu) * rs;
        dxr[j] = (dyr[j] * g[j] - a - xh * c) * rs;
    }
}
