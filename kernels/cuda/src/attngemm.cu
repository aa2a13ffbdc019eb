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

// ag_row: the row (bh·T + i) a warp of the row kernels takes, or −1.
__device__ __forceinline__ i64 ag_row(int BH, int T) {
    i64 row = (i64)blockIdx.x * AG_ROWS + (threadIdx.x >> 5);
    return row < (i64)BH * T ? row : -1;
}

// attn_pack_bf16: dst [BH,T,Hp] bf16 from src, an attention operand in
// the layout attn_head reads (H = 0: [B,H,T,Hd]; else [B,T,H,Hd]), the
// columns from Hd to Hp zero: src fp32, each element rounded as the
// conversion kernels round it, or (half) bf16 that its GEMM rounded so,
// copied as it is. A warp per row (the row kernels' grid): the divisions
// once per row, lane l the columns l, l + 32, ...
extern "C" __global__ void attn_pack_bf16(bf16_t* dst, const void* src, int BH, int T, int Hd, int H, int Hp, int half) {
    i64 row = ag_row(BH, T);
    if (row < 0) return;
    i64 bh = row / T;
    attn_view hv = attn_head(bh, T, Hd, H);
    i64 at = hv.base + (row - bh * T) * hv.rs;
    bf16_t* d = dst + row * Hp;
    if (half) {
        const bf16_t* s = (const bf16_t*)src + at;
        for (int c = threadIdx.x & 31; c < Hp; c += 32) d[c] = c < Hd ? s[c] : (bf16_t)0;
        return;
    }
    const float* s = (const float*)src + at;
    for (int c = threadIdx.x & 31; c < Hp; c += 32) d[c] = c < Hd ? f32_to_bf16(s[c]) : (bf16_t)0;
}

// attn_unpack_f32: out, in attn_head's layout, from the GEMM result src
// [BH,T,Hp] fp32 (columns below Hd); with tw (H > 0: out is [B,T,H,Hd])
// also its bf16 copy in rows of ld for the GEMMs that read out as
// [B·T, H·Hd] (attn_unpack_bf16's placement, from column 0). A warp per
// row (the row kernels' grid): the divisions once per row.
extern "C" __global__ void attn_unpack_f32(float* out, const float* src, int BH, int T, int Hd, int H, int Hp, bf16_t* tw,
                                           int ld) {
    i64 row = ag_row(BH, T);
    if (row < 0) return;
    int lane = threadIdx.x & 31;
    i64 bh = row / T, t = row - bh * T;
    attn_view hv = attn_head(bh, T, Hd, H);
    float* o = out + hv.base + t * hv.rs;
    const float* s = src + row * Hp;
    bf16_t* w = 0;
    if (tw) {
        i64 b = bh / H;
        w = tw + (b * T + t) * ld + (bh - b * H) * Hd;
    }
    for (int d = lane; d < Hd; d += 32) {
        float x = s[d];
        o[d] = x;
        if (w) w[d] = f32_to_bf16(x);
    }
}

// attn_unpack_bf16: the GEMM result src [BH,T,Hp] (columns below Hd) as
// bf16 into rows of ld elements, from column off: element (b, t, h, d) of
// the [B,T,H,Hd] operand to row b·T + t, column off + h·Hd + d (a joined
// gradient's part, written straight into its bf16 operand). src is fp32,
// each element rounded as the conversion kernels round it, or (half) bf16
// that its GEMM rounded so in its epilogue, copied as it is. A warp per
// row.
extern "C" __global__ void attn_unpack_bf16(bf16_t* out, const void* src, int BH, int T, int Hd, int H, int Hp, int ld, int off,
                                            int half) {
    i64 row = ag_row(BH, T);
    if (row < 0) return;
    int lane = threadIdx.x & 31;
    i64 bh = row / T, t = row - bh * T, b = bh / H;
    bf16_t* o = out + (b * T + t) * ld + off + (bh - b * H) * Hd;
    if (half) {
        const bf16_t* s = (const bf16_t*)src + row * Hp;
        for (int d = lane; d < Hd; d += 32) o[d] = s[d];
        return;
    }
    const float* s = (const float*)src + row * Hp;
    for (int d = lane; d < Hd; d += 32) o[d] = f32_to_bf16(s[d]);
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

// The softmax row kernels take a row's columns in pairs: lane l the pairs
// at 2l + 64u (u < AG_PAIRS) of each step of 64·AG_PAIRS columns, so that
// a pair of even element index shares its dropout draw (dropout_keep2),
// P and dS go out as one 4-byte store per pair, and a step's loads are
// all issued before the arithmetic that needs them. exp is the fast
// __expf: P and dS are stored as bf16, whose rounding (2⁻⁹) is far above
// its error (a few units of fp32's), and lse's relative error stays at
// fp32's.
#define AG_PAIRS 4
#define AG_STEP (64 * AG_PAIRS)

// ag_col: the first column of pair u of a lane's step from c0.
__device__ __forceinline__ int ag_col(int c0, int lane, int u) { return c0 + 2 * lane + 64 * u; }

// dropout_keep2: dropout_keep of elements e and e + 1 into r0 and r1, one
// draw for both when e is even.
__device__ __forceinline__ void dropout_keep2(unsigned long long key, i64 e, unsigned long long thresh, float keep, float& r0,
                                              float& r1) {
    if (keep == 0.0f) {
        r0 = r1 = 1.0f;
        return;
    }
    if (e & 1) {
        r0 = dropout_scale(key, e, thresh, keep);
        r1 = dropout_scale(key, e + 1, thresh, keep);
        return;
    }
    dropout_pair(key, e >> 1, thresh, keep, r0, r1);
}

// st_bf16x2: a and b as bf16 at dst[k], dst[k + 1] (k even).
__device__ __forceinline__ void st_bf16x2(bf16_t* dst, i64 k, float a, float b) {
    ((unsigned int*)dst)[k >> 1] = (unsigned int)f32_to_bf16(a) | (unsigned int)f32_to_bf16(b) << 16;
}

// ag_logits: a step's scores plus the bias of query i at the lane's
// columns (ag_col), −inf where the causal mask (j > i) hides them; the
// loads are issued together.
__device__ __forceinline__ void ag_logits(float* x, const float* s, const float* b, int i, int c0, int lane) {
#pragma unroll
    for (int u = 0; u < 2 * AG_PAIRS; u++) {
        int j = ag_col(c0, lane, u >> 1) + (u & 1);
        x[u] = j <= i ? s[j] + (b ? b[j] : 0.0f) : RPAC_NEG_INF;
    }
}

// attn_softmax_fwd_f32: for each row, lse = log Σ_j exp(x_j) over the
// keys j ≤ i (x: the scores plus the bias) and P_j = exp(x_j − lse) times
// dropout element row·T + j (flash.cu's draws), as bf16 in rows of Tp,
// zero above the diagonal (written when full, else left as they are: the
// pairs of columns past the diagonal are not stored). Each lane keeps a
// running maximum and sum of its columns, rescaled once per step; the
// lanes combine them in a fixed butterfly.
extern "C" __global__ void attn_softmax_fwd_f32(bf16_t* P, float* lse, const float* S, const float* bias, int BH, int T, int Tp,
                                                 int full, unsigned long long key, unsigned long long thresh, float keep) {
    i64 row = ag_row(BH, T);
    if (row < 0) return;
    int lane = threadIdx.x & 31, i = (int)(row % T);
    const float* s = S + row * T;
    const float* b = bias ? bias + (i64)i * T : nullptr;
    float m = RPAC_NEG_INF, l = 0.0f;
    for (int c0 = 0; c0 <= i; c0 += AG_STEP) {
        float x[2 * AG_PAIRS];
        ag_logits(x, s, b, i, c0, lane);
        float cm = x[0];
#pragma unroll
        for (int u = 1; u < 2 * AG_PAIRS; u++) cm = fmaxf(cm, x[u]);
        if (cm > m) {
            l *= __expf(m - cm);
            m = cm;
        }
        if (m == RPAC_NEG_INF) continue;
#pragma unroll
        for (int u = 0; u < 2 * AG_PAIRS; u++) l += __expf(x[u] - m);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float mo = __shfl_xor_sync(AG_FULL, m, o), lo = __shfl_xor_sync(AG_FULL, l, o);
        float mn = fmaxf(m, mo);
        if (mn != RPAC_NEG_INF) l = (m == mn ? l : l * __expf(m - mn)) + (mo == mn ? lo : lo * __expf(mo - mn));
        m = mn;
    }
    float L = m == RPAC_NEG_INF ? RPAC_NEG_INF : m + logf(l);
    if (lane == 0) lse[row] = L;
    for (int c0 = 0; c0 < Tp && (full || c0 <= i); c0 += AG_STEP) {
        float x[2 * AG_PAIRS];
        if (c0 <= i) ag_logits(x, s, b, i, c0, lane);
#pragma unroll
        for (int u = 0; u < AG_PAIRS; u++) {
            int j = ag_col(c0, lane, u);
            if (j >= Tp || (!full && j > i)) break;
            float p0 = 0.0f, p1 = 0.0f;
            if (j <= i) {
                float r0, r1;
                dropout_keep2(key, row * T + j, thresh, keep, r0, r1);
                if (x[2 * u] != RPAC_NEG_INF) p0 = __expf(x[2 * u] - L) * r0;
                if (x[2 * u + 1] != RPAC_NEG_INF) p1 = __expf(x[2 * u + 1] - L) * r1;
            }
            st_bf16x2(P, row * Tp + j, p0, p1);
        }
    }
}

// attn_softmax_bwd_f32: for each row, with P_j = exp(x_j − lse) over
// j ≤ i and dropout multiplier r_j: Pd = P·r and dS = P·(r·dP − D) as bf16
// in rows of Tp (zero above the diagonal: written when full, else left as
// they are), and, when part is not null,
// the bias gradient's partial sums: part[g,i,j] = Σ dS_j over the rows
// (bh, i) of group g (the pairs bh from g·BH/G to (g+1)·BH/G, in order) at
// j ≤ i, which attention_dbias_reduce_f32 sums over g in order. A warp
// takes query i of group g and walks the group's rows a step of columns at
// a time (the bias of the step loaded once), its sums in registers.
extern "C" __global__ void attn_softmax_bwd_f32(bf16_t* Pd, bf16_t* dS, float* part, const float* S, const float* dP,
                                                 const float* bias, const float* lse, const float* D, int BH, int T, int Tp,
                                                 int G, int full, unsigned long long key, unsigned long long thresh, float keep) {
    i64 w = (i64)blockIdx.x * AG_ROWS + (threadIdx.x >> 5);
    if (w >= (i64)G * T) return;
    int g = (int)(w / T), i = (int)(w - (i64)g * T), lane = threadIdx.x & 31;
    int bh0 = (int)((i64)g * BH / G), bh1 = (int)((i64)(g + 1) * BH / G);
    for (int c0 = 0; c0 < Tp && (full || c0 <= i); c0 += AG_STEP) {
        float bj[2 * AG_PAIRS], acc[2 * AG_PAIRS];
#pragma unroll
        for (int u = 0; u < 2 * AG_PAIRS; u++) {
            int j = ag_col(c0, lane, u >> 1) + (u & 1);
            bj[u] = bias && j <= i ? bias[(i64)i * T + j] : 0.0f;
            acc[u] = 0.0f;
        }
        for (int bh = bh0; bh < bh1; bh++) {
            i64 row = (i64)bh * T + i;
            float x[2 * AG_PAIRS], dp[2 * AG_PAIRS];
            float L = 0.0f, Di = 0.0f;
            if (c0 <= i) {
                L = lse[row];
                Di = D[row];
#pragma unroll
                for (int u = 0; u < 2 * AG_PAIRS; u++) {
                    int j = ag_col(c0, lane, u >> 1) + (u & 1);
                    bool on = j <= i;
                    x[u] = on ? S[row * T + j] + bj[u] : RPAC_NEG_INF;
                    dp[u] = on ? dP[row * T + j] : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < AG_PAIRS; u++) {
                int j = ag_col(c0, lane, u);
                if (j >= Tp) break;
                float pd[2] = {0.0f, 0.0f}, ds[2] = {0.0f, 0.0f};
                if (j <= i) {
                    float r[2];
                    dropout_keep2(key, row * T + j, thresh, keep, r[0], r[1]);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float xv = x[2 * u + h];
                        if (xv != RPAC_NEG_INF) {
                            float p = __expf(xv - L);
                            pd[h] = p * r[h];
                            ds[h] = p * (r[h] * dp[2 * u + h] - Di);
                        }
                    }
                }
                if (full || j <= i) {
                    st_bf16x2(Pd, row * Tp + j, pd[0], pd[1]);
                    st_bf16x2(dS, row * Tp + j, ds[0], ds[1]);
                }
                acc[2 * u] += ds[0];
                acc[2 * u + 1] += ds[1];
            }
        }
        if (part) {
#pragma unroll
            for (int u = 0; u < 2 * AG_PAIRS; u++) {
                int j = ag_col(c0, lane, u >> 1) + (u & 1);
                if (j <= i) part[((i64)g * T + i) * T + j] = acc[u];
            }
        }
    }
}
