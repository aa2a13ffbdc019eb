// Causal attention as batched cuBLASLt GEMMs around row kernels: the same
// operation as flash.cu's kernels (bf16 GEMM inputs, fp32 accumulation,
// the additive [T,T] bias, dropout with the same draws), with the scores
// held in device memory one attention node at a time. The Go side
// (attngemm.go) runs, for each node:
//
//   forward:  q, k, v packed (attn_pack_bf16) → S = scale·q·kᵀ (GEMM, fp32
//             [BH,T,T]) → attn_softmax_fwd_f32 (lse, P after dropout as
//             bf16 [BH,T,Tp]) → O = P·v (GEMM) → o (attn_unpack_f32);
//   backward: q, k, v and dO packed (attn_pack_do_bf16 also takes
//             D_i = dO_i·o_i) → S again and dP = dO·vᵀ (GEMMs) →
//             attn_softmax_bwd_f32 (P after dropout and dS as bf16; with a
//             bias, the bias gradient's partial sums over groups of
//             (sequence, head) pairs, attention_dbias_reduce_f32 their
//             sum) → dv = Pᵀ·dO, dq = scale·dS·k, dk = scale·dSᵀ·q (GEMMs)
//             → unpacked.
//
// Packed operands are bf16 [BH,T,Hp], Hp the head rounded up to 8 (16-byte
// rows for the GEMMs; zero columns add nothing); P and dS are [BH,T,Tp],
// Tp = T rounded up to 8, zero above the diagonal and beyond T. The row
// kernels give each row one warp (8 rows per 256-thread block); a lane
// takes the columns lane, lane+32, ... in order and the lanes combine in a
// fixed butterfly, so every result is the same on every run.

#define AG_ROWS 8  // rows (warps) per block of the row kernels
#define AG_FULL 0xffffffffu

// attn_pack_bf16: dst [BH,T,Hp] bf16 from src, an attention operand in
// the layout attn_head reads (H = 0: [B,H,T,Hd]; else [B,T,H,Hd]), the
// columns from Hd to Hp zero. Eight elements per thread.
extern "C" __global__ void attn_pack_bf16(bf16_t* dst, const float* src, int BH, int T, int Hd, int H, int Hp) {
    int groups = Hp >> 3;
    GRID_STRIDE(g, (i64)BH * T * groups) {
        i64 row = g / groups;
        int c = (int)(g - row * groups) << 3;
        i64 bh = row / T;
        attn_view hv = attn_head(bh, T, Hd, H);
        ((rpac_bf16x8*)dst)[g] = bf16x8_of(src + hv.base + (row - bh * T) * hv.rs, c, Hd);
    }
}

// attn_unpack_f32: out, in attn_head's layout, from the GEMM result src
// [BH,T,Hp] fp32 (columns below Hd); with tw (H > 0: out is [B,T,H,Hd])
// also its bf16 copy in rows of ld for the GEMMs that read out as
// [B·T, H·Hd] (attn_unpack_bf16's placement, from column 0).
extern "C" __global__ void attn_unpack_f32(float* out, const float* src, int BH, int T, int Hd, int H, int Hp, bf16_t* tw,
                                           int ld) {
    GRID_STRIDE(e, (i64)BH * T * Hd) {
        i64 row = e / Hd;
        int d = (int)(e - row * Hd);
        i64 bh = row / T;
        attn_view hv = attn_head(bh, T, Hd, H);
        float x = src[row * Hp + d];
        out[hv.base + (row - bh * T) * hv.rs + d] = x;
        if (tw) {
            i64 b = bh / H;
            tw[(b * T + row - bh * T) * ld + (bh - b * H) * Hd + d] = f32_to_bf16(x);
        }
    }
}

// attn_unpack_bf16: the GEMM result src [BH,T,Hp] fp32 (columns below Hd)
// as bf16 into rows of ld elements, from column off: element (b, t, h, d)
// of the [B,T,H,Hd] operand to row b·T + t, column off + h·Hd + d (a
// joined gradient's part, written straight into its bf16 operand), each
// rounded as the conversion kernels round it.
extern "C" __global__ void attn_unpack_bf16(bf16_t* out, const float* src, int BH, int T, int Hd, int H, int Hp, int ld,
                                            int off) {
    GRID_STRIDE(e, (i64)BH * T * Hd) {
        i64 row = e / Hd;
        int d = (int)(e - row * Hd);
        i64 bh = row / T;
        i64 b = bh / H, t = row - bh * T;
        int h = (int)(bh - b * H);
        out[(b * T + t) * ld + off + h * Hd + d] = f32_to_bf16(src[row * Hp + d]);
    }
}

// ag_row: the row (bh·T + i) a warp of the row kernels takes, or −1.
__device__ __forceinline__ i64 ag_row(int BH, int T) {
    i64 row = (i64)blockIdx.x * AG_ROWS + (threadIdx.x >> 5);
    return row < (i64)BH * T ? row : -1;
}

// attn_pack_do_bf16: dst [BH,T,Hp] bf16 from dO (as attn_pack_bf16), and
// D[row] = Σ_d dO·o over the row in fp32.
extern "C" __global__ void attn_pack_do_bf16(bf16_t* dst, float* D, const float* dO, const float* o, int BH, int T, int Hd, int H,
                                              int Hp) {
    i64 row = ag_row(BH, T);
    if (row < 0) return;
    int lane = threadIdx.x & 31;
    i64 bh = row / T;
    attn_view hv = attn_head(bh, T, Hd, H);
    i64 at = hv.base + (row - bh * T) * hv.rs;
    float part = 0.0f;
    for (int d = lane; d < Hp; d += 32) {
        float g = d < Hd ? dO[at + d] : 0.0f;
        if (d < Hd) part += g * o[at + d];
        dst[row * Hp + d] = f32_to_bf16(g);
    }
    for (int s = 16; s > 0; s >>= 1) part += __shfl_xor_sync(AG_FULL, part, s);
    if (lane == 0) D[row] = part;
}

// ag_logit: the score S (already scaled) of query i and key j plus the
// bias, or −inf where the causal mask (j > i) hides it.
__device__ __forceinline__ float ag_logit(const float* S, const float* bias, i64 row, int T, int i, int j) {
    if (j > i) return RPAC_NEG_INF;
    return S[row * T + j] + (bias ? bias[(i64)i * T + j] : 0.0f);
}

// attn_softmax_fwd_f32: for each row, lse = log Σ_j exp(x_j) over the
// keys j ≤ i (x: the scores plus the bias) and P_j = exp(x_j − lse) times
// dropout element row·T + j (flash.cu's draws), as bf16 in rows of Tp,
// zero above the diagonal. Each lane keeps a running maximum and sum of
// its columns; the lanes combine them in a fixed butterfly.
extern "C" __global__ void attn_softmax_fwd_f32(bf16_t* P, float* lse, const float* S, const float* bias, int BH, int T, int Tp,
                                                 unsigned long long key, unsigned long long thresh, float keep) {
    i64 row = ag_row(BH, T);
    if (row < 0) return;
    int lane = threadIdx.x & 31, i = (int)(row % T);
    float m = RPAC_NEG_INF, l = 0.0f;
    for (int j = lane; j <= i; j += 32) {
        float x = ag_logit(S, bias, row, T, i, j);
        if (x > m) {
            l *= expf(m - x);
            m = x;
        }
        if (x != RPAC_NEG_INF) l += expf(x - m);
    }
    for (int s = 16; s > 0; s >>= 1) {
        float mo = __shfl_xor_sync(AG_FULL, m, s), lo = __shfl_xor_sync(AG_FULL, l, s);
        float mn = fmaxf(m, mo);
        if (mn != RPAC_NEG_INF) l = (m == mn ? l : l * expf(m - mn)) + (mo == mn ? lo : lo * expf(mo - mn));
        m = mn;
    }
    float L = m == RPAC_NEG_INF ? RPAC_NEG_INF : m + logf(l);
    if (lane == 0) lse[row] = L;
    for (int j = lane; j < Tp; j += 32) {
        float p = 0.0f;
        if (j < T) {
            float x = ag_logit(S, bias, row, T, i, j);
            if (x != RPAC_NEG_INF) p = expf(x - L) * dropout_keep(key, row * T + j, thresh, keep);
        }
        P[row * Tp + j] = f32_to_bf16(p);
    }
}

// attn_softmax_bwd_f32: for each row, with P_j = exp(x_j − lse) over
// j ≤ i and dropout multiplier r_j: Pd = P·r and dS = P·(r·dP − D) as bf16
// in rows of Tp (zero above the diagonal), and, when part is not null,
// the bias gradient's partial sums: part[g,i,j] = Σ dS_j over the rows
// (bh, i) of group g (the pairs bh from g·BH/G to (g+1)·BH/G, in order) at
// j ≤ i, which attention_dbias_reduce_f32 sums over g in order. A warp
// takes query i of group g and walks the group's rows, AG_CHUNK columns
// per lane at a time, its sums in registers.
#define AG_CHUNK 8
extern "C" __global__ void attn_softmax_bwd_f32(bf16_t* Pd, bf16_t* dS, float* part, const float* S, const float* dP,
                                                 const float* bias, const float* lse, const float* D, int BH, int T, int Tp,
                                                 int G, unsigned long long key, unsigned long long thresh, float keep) {
    i64 w = (i64)blockIdx.x * AG_ROWS + (threadIdx.x >> 5);
    if (w >= (i64)G * T) return;
    int g = (int)(w / T), i = (int)(w - (i64)g * T), lane = threadIdx.x & 31;
    int bh0 = (int)((i64)g * BH / G), bh1 = (int)((i64)(g + 1) * BH / G);
    for (int c0 = 0; c0 < Tp; c0 += 32 * AG_CHUNK) {
        float acc[AG_CHUNK];
#pragma unroll
        for (int u = 0; u < AG_CHUNK; u++) acc[u] = 0.0f;
        for (int bh = bh0; bh < bh1; bh++) {
            i64 row = (i64)bh * T + i;
            float L = lse[row], Di = D[row];
#pragma unroll
            for (int u = 0; u < AG_CHUNK; u++) {
                int j = c0 + lane + 32 * u;
                if (j >= Tp) break;
                float pd = 0.0f, ds = 0.0f;
                if (j < T) {
                    float x = ag_logit(S, bias, row, T, i, j);
                    if (x != RPAC_NEG_INF) {
                        float p = expf(x - L), r = dropout_keep(key, row * T + j, thresh, keep);
                        pd = p * r;
                        ds = p * (r * dP[row * T + j] - Di);
                    }
                }
                Pd[row * Tp + j] = f32_to_bf16(pd);
                dS[row * Tp + j] = f32_to_bf16(ds);
                acc[u] += ds;
            }
        }
        if (part) {
#pragma unroll
            for (int u = 0; u < AG_CHUNK; u++) {
                int j = c0 + lane + 32 * u;
                if (j <= i) part[((i64)g * T + i) * T + j] = acc[u];
            }
        }
    }
}
