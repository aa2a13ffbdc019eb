// Causal multi-head attention with an optional additive [T,T] bias (the
// folded or live RPA prior, shared by every sequence and head) and optional
// dropout on the weights (training), for any head size. q, k, v, o, dO, dq,
// dk, dv are [B,H,T,Hd], or [B,T,H,Hd] when H > 0 (attn_head); lse and D
// are [B,H,T]. The [B,H,T,T] weights never
// exist in device memory: each block handles one row and keeps that row's T
// weights in shared memory (dynamic shared memory of T floats, plus 32 for
// reductions), and the backward recomputes them from lse.
//
// Dropout repeats the Dropout op's draws over the [B,H,T,T] weights:
// element ((bh·T)+i)·T+j of stream key (see dropout_keep); keep = 0: none.
//
// These scalar fp32 kernels serve fp32 GEMMs and the heads flash.cu's
// tensor-core kernels do not take (at most 8, above 128).
//
// grid = (T, B·H), blockDim.x a multiple of 32.

__device__ __forceinline__ float attn_score(const float* q, const float* k, int Hd, float scale,
                                            const float* bias, int T, int i, int j) {
    float s = 0.0f;
    for (int d = 0; d < Hd; d++) s += q[d] * k[d];
    s *= scale;
    if (bias) s += bias[(i64)i * T + j];
    return s;
}

extern "C" __global__ void attention_fwd_f32(float* o, float* lse, const float* q, const float* k, const float* v,
                                             const float* bias, int T, int Hd, int H, float scale,
                                             unsigned long long key, unsigned long long thresh, float keep) {
    extern __shared__ float sh[];
    float* red = sh;        // 32 floats
    float* p = sh + 32;     // T floats
    int i = blockIdx.x;
    i64 bh = blockIdx.y;
    attn_view hv = attn_head(bh, T, Hd, H);
    const float* qi = q + hv.base + (i64)i * hv.rs;
    const float* kb = k + hv.base;
    const float* vb = v + hv.base;
    float m = RPAC_NEG_INF;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        float s = attn_score(qi, kb + (i64)j * hv.rs, Hd, scale, bias, T, i, j);
        p[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m, red);
    float sum = 0.0f;
    i64 row = (bh * T + i) * T;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        float e = expf(p[j] - m);
        sum += e;
        p[j] = e * dropout_keep(key, row + j, thresh, keep);
    }
    sum = block_sum(sum, red);  // synchronises: p is complete
    float inv = 1.0f / sum;
    float* oi = o + hv.base + (i64)i * hv.rs;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) acc += p[j] * vb[(i64)j * hv.rs + d];
        oi[d] = acc * inv;
    }
    if (threadIdx.x == 0) lse[bh * T + i] = m + logf(sum);
}

// attn_ds: dS_ij = P_ij·(D_ij·(dO_i·v_j) − D_i) for one (row i, key j).
__device__ __forceinline__ float attn_ds(const float* qi, const float* kj, const float* vj, const float* doi, int Hd,
                                         float scale, const float* bias, int T, int i, int j, float L, float Di,
                                         float drop, float* pij_out) {
    float pij = expf(attn_score(qi, kj, Hd, scale, bias, T, i, j) - L);
    float dp = 0.0f;
    for (int d = 0; d < Hd; d++) dp += doi[d] * vj[d];
    *pij_out = pij;
    return pij * (drop * dp - Di);
}

// dq for row i, and D_i = dO_i·O_i (kept for the other backward kernels).
extern "C" __global__ void attention_bwd_dq_f32(float* dq, float* Dbuf, const float* q, const float* k,
                                                const float* v, const float* o, const float* dO, const float* lse,
                                                const float* bias, int T, int Hd, int H, float scale,
                                                unsigned long long key, unsigned long long thresh, float keep) {
    extern __shared__ float sh[];
    float* red = sh;
    float* ds = sh + 32;
    int i = blockIdx.x;
    i64 bh = blockIdx.y;
    i64 row = bh * T + i;
    attn_view hv = attn_head(bh, T, Hd, H);
    const float* qi = q + hv.base + (i64)i * hv.rs;
    const float* doi = dO + hv.base + (i64)i * hv.rs;
    const float* oi = o + hv.base + (i64)i * hv.rs;
    const float* kb = k + hv.base;
    const float* vb = v + hv.base;
    float part = 0.0f;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) part += doi[d] * oi[d];
    float Di = block_sum(part, red);
    float L = lse[row];
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        float pij;
        ds[j] = attn_ds(qi, kb + (i64)j * hv.rs, vb + (i64)j * hv.rs, doi, Hd, scale, bias, T, i, j, L, Di,
                        dropout_keep(key, row * T + j, thresh, keep), &pij);
    }
    __syncthreads();
    float* dqi = dq + hv.base + (i64)i * hv.rs;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) acc += ds[j] * kb[(i64)j * hv.rs + d];
        dqi[d] = acc * scale;
    }
    if (threadIdx.x == 0) Dbuf[row] = Di;
}

// dk and dv for key row j (blockIdx.x), from the rows i ≥ j that see it.
extern "C" __global__ void attention_bwd_dkdv_f32(float* dk, float* dv, const float* q, const float* k, const float* v,
                                                  const float* dO, const float* lse, const float* Dbuf,
                                                  const float* bias, int T, int Hd, int H, float scale,
                                                  unsigned long long key, unsigned long long thresh, float keep) {
    extern __shared__ float sh[];
    float* p = sh;           // T floats: D_ij·p_ij
    float* ds = sh + T;      // T floats: dS_ij
    int j = blockIdx.x;
    i64 bh = blockIdx.y;
    attn_view hv = attn_head(bh, T, Hd, H);
    const float* kj = k + hv.base + (i64)j * hv.rs;
    const float* vj = v + hv.base + (i64)j * hv.rs;
    const float* qb = q + hv.base;
    const float* dob = dO + hv.base;
    for (int i = j + threadIdx.x; i < T; i += blockDim.x) {
        i64 row = bh * T + i;
        float drop = dropout_keep(key, row * T + j, thresh, keep);
        float pij;
        ds[i] = attn_ds(qb + (i64)i * hv.rs, kj, vj, dob + (i64)i * hv.rs, Hd, scale, bias, T, i, j, lse[row], Dbuf[row],
                        drop, &pij);
        p[i] = drop * pij;
    }
    __syncthreads();
    float* dkj = dk + hv.base + (i64)j * hv.rs;
    float* dvj = dv + hv.base + (i64)j * hv.rs;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int i = j; i < T; i++) {
            ak += ds[i] * qb[(i64)i * hv.rs + d];
            av += p[i] * dob[(i64)i * hv.rs + d];
        }
        dkj[d] = ak * scale;
        dvj[d] = av;
    }
}

// The bias gradient dB[i,j] = Σ_bh dS_ij, for row i (blockIdx.x): each
// thread owns columns j and adds the heads in order, so the sum is the same
// every run (no atomics). BH is the number of (sequence, head) pairs.
extern "C" __global__ void attention_bwd_dbias_f32(float* dbias, const float* q, const float* k, const float* v,
                                                   const float* dO, const float* lse, const float* Dbuf,
                                                   const float* bias, int BH, int T, int Hd, int H, float scale,
                                                   unsigned long long key, unsigned long long thresh, float keep) {
    int i = blockIdx.x;
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        float acc = 0.0f;
        if (j <= i) {
            for (int bh = 0; bh < BH; bh++) {
                i64 row = (i64)bh * T + i;
                attn_view hv = attn_head(bh, T, Hd, H);
                float pij;
                acc += attn_ds(q + hv.base + (i64)i * hv.rs, k + hv.base + (i64)j * hv.rs, v + hv.base + (i64)j * hv.rs,
                               dO + hv.base + (i64)i * hv.rs, Hd,
                               scale, bias, T, i, j, lse[row], Dbuf[row], dropout_keep(key, row * T + j, thresh, keep),
                               &pij);
            }
        }
        dbias[(i64)i * T + j] = acc;
    }
}
