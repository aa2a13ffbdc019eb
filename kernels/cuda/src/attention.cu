// Causal multi-head attention with an optional additive [T,T] bias (the
// folded or live RPA prior, shared by every sequence and head), for any head
// size. q, k, v, o, dO, dq, dk, dv are [B,H,T,Hd]; lse and D are [B,H,T].
// The [B,H,T,T] scores never exist in device memory: each block handles one
// row and keeps that row's T scores in shared memory (dynamic shared memory
// of T floats, plus 32 for reductions).
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
                                             const float* bias, int T, int Hd, float scale) {
    extern __shared__ float sh[];
    float* red = sh;        // 32 floats
    float* p = sh + 32;     // T floats
    int i = blockIdx.x;
    i64 bh = blockIdx.y;
    const float* qi = q + (bh * T + i) * Hd;
    const float* kb = k + bh * T * Hd;
    const float* vb = v + bh * T * Hd;
    float m = RPAC_NEG_INF;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        float s = attn_score(qi, kb + (i64)j * Hd, Hd, scale, bias, T, i, j);
        p[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        float e = expf(p[j] - m);
        p[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);  // synchronises: p is complete
    float inv = 1.0f / sum;
    float* oi = o + (bh * T + i) * Hd;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) acc += p[j] * vb[(i64)j * Hd + d];
        oi[d] = acc * inv;
    }
    if (threadIdx.x == 0) lse[bh * T + i] = m + logf(sum);
}

// dq for row i, D_i = dO_i·O_i (kept for attention_bwd_dkdv_f32), and the
// bias gradient dB[i,j] += dS_ij summed over sequences and heads (atomics;
// zero dbias first; pass dbias = 0 without a bias).
extern "C" __global__ void attention_bwd_dq_f32(float* dq, float* Dbuf, float* dbias, const float* q, const float* k,
                                                const float* v, const float* o, const float* dO, const float* lse,
                                                const float* bias, int T, int Hd, float scale) {
    extern __shared__ float sh[];
    float* red = sh;
    float* ds = sh + 32;
    int i = blockIdx.x;
    i64 bh = blockIdx.y;
    i64 row = bh * T + i;
    const float* qi = q + row * Hd;
    const float* doi = dO + row * Hd;
    const float* oi = o + row * Hd;
    const float* kb = k + bh * T * Hd;
    const float* vb = v + bh * T * Hd;
    float part = 0.0f;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) part += doi[d] * oi[d];
    float Di = block_sum(part, red);
    float L = lse[row];
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        float pij = expf(attn_score(qi, kb + (i64)j * Hd, Hd, scale, bias, T, i, j) - L);
        float dp = 0.0f;
        for (int d = 0; d < Hd; d++) dp += doi[d] * vb[(i64)j * Hd + d];
        float dsij = pij * (dp - Di);
        ds[j] = dsij;
        if (dbias) atomicAdd(&dbias[(i64)i * T + j], dsij);
    }
    __syncthreads();
    float* dqi = dq + row * Hd;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) acc += ds[j] * kb[(i64)j * Hd + d];
        dqi[d] = acc * scale;
    }
    if (threadIdx.x == 0) Dbuf[row] = Di;
}

// dk and dv for key row j (blockIdx.x), from the rows i ≥ j that see it.
extern "C" __global__ void attention_bwd_dkdv_f32(float* dk, float* dv, const float* q, const float* k, const float* v,
                                                  const float* dO, const float* lse, const float* Dbuf,
                                                  const float* bias, int T, int Hd, float scale) {
    extern __shared__ float sh[];
    float* p = sh;           // T floats: p_ij
    float* ds = sh + T;      // T floats: dS_ij
    int j = blockIdx.x;
    i64 bh = blockIdx.y;
    const float* kj = k + (bh * T + j) * Hd;
    const float* vj = v + (bh * T + j) * Hd;
    const float* qb = q + bh * T * Hd;
    const float* dob = dO + bh * T * Hd;
    for (int i = j + threadIdx.x; i < T; i += blockDim.x) {
        i64 row = bh * T + i;
        float pij = expf(attn_score(qb + (i64)i * Hd, kj, Hd, scale, bias, T, i, j) - lse[row]);
        float dp = 0.0f;
        for (int d = 0; d < Hd; d++) dp += dob[(i64)i * Hd + d] * vj[d];
        p[i] = pij;
        ds[i] = pij * (dp - Dbuf[row]);
    }
    __syncthreads();
    float* dkj = dk + (bh * T + j) * Hd;
    float* dvj = dv + (bh * T + j) * Hd;
    for (int d = threadIdx.x; d < Hd; d += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int i = j; i < T; i++) {
            ak += ds[i] * qb[(i64)i * Hd + d];
            av += p[i] * dob[(i64)i * Hd + d];
        }
        dkj[d] = ak * scale;
        dvj[d] = av;
    }
}
