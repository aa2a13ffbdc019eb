// A mixture of experts' expert on its routed tokens only (ExpertFFN,
// ExpertFFNGrad): the tokens t with w[t·E + e] ≠ 0 listed in ascending
// order (rows[0..*count)), their rows of x gathered, fp32 products over
// those rows only (the count read on the device: no copy to the host),
// and the results scattered back. Every kernel but the route reads the
// count and leaves the rows past it alone. Dropout draws element
// t·width + j of its stream for row r of token t = rows[r]: the draws of
// a Dropout of the dense [tokens, width] tensor. Sums run in a fixed
// order, so a step repeats bit for bit.

#define EXPERT_TILE 16

// expert_route_i32: rows[0..count) = the tokens t < n with w[t·E + e] ≠ 0,
// ascending; count is rows[n]. One block: a scan of the flags per chunk of
// blockDim.x tokens (blockDim.x ≤ 1024, a power of two).
extern "C" __global__ void expert_route_i32(int* rows, const float* w, int E, int e, i64 n) {
    __shared__ int scan[1024];
    int base = 0;
    for (i64 t0 = 0; t0 < n; t0 += blockDim.x) {
        i64 t = t0 + threadIdx.x;
        int f = (t < n && w[t * E + e] != 0.0f) ? 1 : 0;
        scan[threadIdx.x] = f;
        __syncthreads();
        for (int off = 1; off < (int)blockDim.x; off <<= 1) {
            int v = (int)threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
            __syncthreads();
            scan[threadIdx.x] += v;
            __syncthreads();
        }
        if (f) rows[base + scan[threadIdx.x] - 1] = (int)t;
        base += scan[blockDim.x - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0) rows[n] = base;
}

// expert_gather_f32: xg[r] = x[rows[r]] (D columns) for r < count; n =
// the capacity's elements.
extern "C" __global__ void expert_gather_f32(float* xg, const float* x, const int* rows, int D, i64 n) {
    i64 lim = (i64)rows[n / D] * D;
    GRID_STRIDE(i, lim) { xg[i] = x[(i64)rows[i / D] * D + i % D]; }
}

// expert_gemm_f32: C[i,j] = Σ_k A(i,k)·B(k,j) (+ bias[j]) over i < M,
// j < N, with A(i,k) = A[i·sai + k·sak], B(k,j) = B[k·sbk + j·sbj] and
// rows of C ldc apart. M is the routed count (dyn 1) or m, K the routed
// count (dyn 2) or k; count is rows[cap]. 16×16 tiles, a thread per
// element of C, k in order. A block of tiles past the count returns.
extern "C" __global__ void expert_gemm_f32(float* C, const float* A, const float* B, const float* bias, const int* rows,
                                           i64 cap, int dyn, int m, int N, int k, i64 sai, i64 sak, i64 sbk, i64 sbj,
                                           i64 ldc) {
    __shared__ float As[EXPERT_TILE][EXPERT_TILE + 1];
    __shared__ float Bs[EXPERT_TILE][EXPERT_TILE + 1];
    int M = dyn == 1 ? rows[cap] : m, K = dyn == 2 ? rows[cap] : k;
    int i0 = blockIdx.y * EXPERT_TILE, j0 = blockIdx.x * EXPERT_TILE;
    if (i0 >= M) return;
    int ty = threadIdx.x / EXPERT_TILE, tx = threadIdx.x % EXPERT_TILE;
    int i = i0 + ty, j = j0 + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += EXPERT_TILE) {
        As[ty][tx] = (i < M && k0 + tx < K) ? A[i * sai + (i64)(k0 + tx) * sak] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && j < N) ? B[(i64)(k0 + ty) * sbk + j * sbj] : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < EXPERT_TILE && k0 + kk < K; kk++) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
        __syncthreads();
    }
    if (i < M && j < N) C[i * ldc + j] = bias ? acc + bias[j] : acc;
}

// expert_act_f32: a = GELU(u)·mask (element rows[r]·F + f of stream key)
// for r < count; n = the capacity's elements.
extern "C" __global__ void expert_act_f32(float* a, const float* u, const int* rows, int F, unsigned long long key,
                                          unsigned long long thresh, float scale, i64 n) {
    i64 lim = (i64)rows[n / F] * F;
    GRID_STRIDE(i, lim) {
        i64 r = i / F;
        a[i] = ew_unary(U_GELU, u[i], 0.0f, 0.0f, 0.0f) * dropout_scale(key, (i64)rows[r] * F + (i - r * F), thresh, scale);
    }
}

// expert_drop_f32: h ·= mask (element rows[r]·D + d of stream key) for
// r < count.
extern "C" __global__ void expert_drop_f32(float* h, const int* rows, int D, unsigned long long key,
                                           unsigned long long thresh, float scale, i64 n) {
    i64 lim = (i64)rows[n / D] * D;
    GRID_STRIDE(i, lim) {
        i64 r = i / D;
        h[i] *= dropout_scale(key, (i64)rows[r] * D + (i - r * D), thresh, scale);
    }
}

// expert_scatter_f32: o[rows[r]] = w[rows[r]·E + e]·h[r] (w null: h[r])
// for r < count; the other rows of o are left as they are (zeroed).
extern "C" __global__ void expert_scatter_f32(float* o, const float* h, const float* w, const int* rows, int D, int E,
                                              int e, i64 n) {
    i64 lim = (i64)rows[n / D] * D;
    GRID_STRIDE(i, lim) {
        i64 r = i / D, t = rows[r];
        float v = h[i];
        o[t * D + (i - r * D)] = w ? w[t * E + e] * v : v;
    }
}

// expert_out_grad_f32: a thread per routed row r < count, token t: dh[r,d]
// = dout[t,d]·w[t,e]·mask (element t·D + d of stream key) and
// dw[t·E + e] = Σ_d dout[t,d]·h[r,d] (in double, d in order). n = the
// capacity's rows.
extern "C" __global__ void expert_out_grad_f32(float* dh, float* dw, const float* dout, const float* w, const float* h,
                                               const int* rows, int D, int E, int e, unsigned long long key,
                                               unsigned long long thresh, float scale, i64 n) {
    i64 lim = rows[n];
    GRID_STRIDE(r, lim) {
        i64 t = rows[r];
        float k = w[t * E + e];
        double dot = 0.0;
        for (int d = 0; d < D; d++) {
            float g = dout[t * D + d];
            dot += (double)(g * h[r * D + d]);
            dh[r * D + d] = g * k * dropout_scale(key, t * D + d, thresh, scale);
        }
        dw[t * E + e] = (float)dot;
    }
}

// expert_hidden_grad_f32: dz = GELUGrad(dz·mask, u), the mask's element
// rows[r]·F + f of stream key, for r < count.
extern "C" __global__ void expert_hidden_grad_f32(float* dz, const float* u, const int* rows, int F,
                                                  unsigned long long key, unsigned long long thresh, float scale, i64 n) {
    i64 lim = (i64)rows[n / F] * F;
    GRID_STRIDE(i, lim) {
        i64 r = i / F;
        float g = dz[i] * dropout_scale(key, (i64)rows[r] * F + (i - r * F), thresh, scale);
        dz[i] = ew_grad(G_GELUGRAD, g, u[i], 0.0f, 0.0f);
    }
}

// expert_colsum_f32: db[j] = Σ_{r < count} m[r·W + j] in double, rows in
// order, a thread per column; count is rows[cap].
extern "C" __global__ void expert_colsum_f32(float* db, const float* m, const int* rows, i64 cap, int W) {
    i64 R = rows[cap];
    GRID_STRIDE(j, W) {
        double s = 0.0;
        for (i64 r = 0; r < R; r++) s += (double)m[r * W + j];
        db[j] = (float)s;
    }
}
