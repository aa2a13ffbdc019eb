// Causal attention on the tensor cores (the prelude's rpac_mma tiles: bf16
// inputs, fp32 accumulation), the same operation as attention.cu's scalar
// kernels: an optional additive [T,T] bias shared by every sequence and
// head, optional dropout on the weights with the same draws (element
// ((bh·T)+i)·T+j of stream key, see dropout_keep; keep = 0: none). q, k,
// v, o, dO, dq, dk, dv are fp32 [B,H,T,Hd]; lse and D are [B,H,T].
//
// Tiles: a block is 4 warps (blockDim.x = 128); each warp owns 16 rows of
// a 64-row block tile (queries in the forward and dq kernels, keys in the
// dk/dv kernel) and walks the other side in tiles of 32. Operands are
// staged in shared memory as bf16, the head padded with zeros to Hp, a
// multiple of 16 (zero columns add nothing to any product); Hd ≤ 128. The
// [T,T] weights never exist in device memory: the forward makes two passes
// over the keys (the rows' log-sum-exp, then o = P·v with P already
// normalised, so no accumulator is ever rescaled), and the backward
// recomputes P from lse. Tiles entirely above the diagonal are skipped.
// The elementwise work on a warp's 16×32 tile of scores goes through
// shared memory: lane l owns row r = l/2, columns 16·(l mod 2) to +16. The
// backward kernels visit them in a rotated order (fa_col) so that the 32
// lanes of one step read 32 different banks, store staged operands with
// rows of Hp + 8 (FA_PAD) elements, which spreads the tensor-core loads of
// 8 rows over all banks, and the dq kernel stages its bias tile in shared
// memory with coalesced loads; the dk/dv kernel, short of shared memory,
// reads the bias from global memory in an order that keeps a step within 4
// sectors (fa_col_keys). The forward keeps the plain order (measured faster
// there, see attention_fwd_bf16).

#define FA_ROWS 64   // rows per block: 4 warps × 16
#define FA_TILE 32   // keys (or queries) per tile
#define FA_NK 8      // at most 8 column tiles of 16: Hd ≤ 128
#define FA_HMAX (16 * FA_NK)
#define FA_FULL 0xffffffffu
#define FA_PAD 8     // extra bf16 per staged row
#define FA_LD (FA_HMAX + FA_PAD)
#define FA_KS 36     // the dk/dv kernel's fp32 tile rows (fa_col_keys: 2-way)
#define FA_KP 40     // the dk/dv kernel's bf16 tile rows

// fa_col: the column of lane (row r, half c0) at step c of its 16: each of
// the 16 rows of a half starts at another column, so a step's 32 reads of a
// row-major [16][32] fp32 tile, or writes of a bf16 one, hit 32 banks.
__device__ __forceinline__ int fa_col(int c, int r, int c0) { return c0 + ((c + r) & 15); }

// fa_col_keys: the dk/dv kernel's order: rows in two groups of 8, so a
// step reads at most 4 sectors of the [T,T] bias (queries × keys) and
// 2-way conflicting words of FA_KS-wide tiles.
__device__ __forceinline__ int fa_col_keys(int c, int r, int c0) { return c0 + ((c + (r >> 3)) & 15); }

// fa_stage: rows [r0, r0+rows) of the [T,Hd] fp32 matrix src as a bf16
// [rows][Hs] tile (Hs ≥ Hp), zero beyond T and Hd up to Hp (all the
// block's threads).
__device__ __forceinline__ void fa_stage(bf16_t* dst, const float* src, int r0, int rows, int T, int Hd, int Hp, int Hs) {
    for (int e = threadIdx.x; e < rows * Hp; e += blockDim.x) {
        int r = e / Hp, d = e - r * Hp, t = r0 + r;
        dst[r * Hs + d] = f32_to_bf16(t < T && d < Hd ? src[(i64)t * Hd + d] : 0.0f);
    }
}

// fa_bias_at: entry (i, j) of the [T,T] bias, 0 without one or outside.
__device__ __forceinline__ float fa_bias_at(const float* bias, int T, int i, int j) {
    return bias && i < T && j < T ? bias[(i64)i * T + j] : 0.0f;
}

// fa_stage_bias: the [64][32] tile of the [T,T] bias at rows i0 and
// columns j0 (zero outside), coalesced; nothing without a bias.
__device__ __forceinline__ void fa_stage_bias(float* dst, const float* bias, int i0, int j0, int T) {
    if (!bias) return;
    for (int e = threadIdx.x; e < FA_ROWS * FA_TILE; e += blockDim.x) {
        int i = i0 + (e >> 5), j = j0 + (e & 31);
        dst[e] = i < T && j < T ? bias[(i64)i * T + j] : 0.0f;
    }
}

// fa_rows: a warp's 16 staged rows (stride Hs) as left operands over the
// head.
__device__ __forceinline__ void fa_rows(rpac_a_row* f, const bf16_t* s, int nk, int Hs) {
#pragma unroll
    for (int kk = 0; kk < FA_NK; kk++) {
        if (kk < nk) rpac_load(f[kk], s + kk * 16, Hs);
    }
}

// fa_dots: dst[16][32] (fp32, rows of ldd) = a · xᵀ, a the warp's 16 rows
// over the head and x a staged [32][Hs] tile: every dot product of a row
// with x's rows.
__device__ __forceinline__ void fa_dots(float* dst, unsigned ldd, const rpac_a_row* a, const bf16_t* x, int nk, int Hs) {
    for (int nn = 0; nn < 2; nn++) {
        rpac_acc acc;
        rpac_fill(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < FA_NK; kk++) {
            if (kk < nk) {
                rpac_b_col b;
                rpac_load(b, x + nn * 16 * Hs + kk * 16, Hs);
                rpac_mma(acc, a[kk], b, acc);
            }
        }
        rpac_store(dst + nn * 16, acc, ldd);
    }
}

// fa_accumulate: acc += p · y, p a warp's bf16 [16][32] tile in shared
// memory (rows of ldp) and y a staged [32][Hs] tile.
__device__ __forceinline__ void fa_accumulate(rpac_acc* acc, const bf16_t* p, unsigned ldp, const bf16_t* y, int nk, int Hs) {
    rpac_a_row pa[2];
    rpac_load(pa[0], p, ldp);
    rpac_load(pa[1], p + 16, ldp);
#pragma unroll
    for (int nn = 0; nn < FA_NK; nn++) {
        if (nn < nk) {
            for (int kk = 0; kk < 2; kk++) {
                rpac_b_row b;
                rpac_load(b, y + kk * 16 * Hs + nn * 16, Hs);
                rpac_mma(acc[nn], pa[kk], b, acc[nn]);
            }
        }
    }
}

__device__ __forceinline__ void fa_zero(rpac_acc* acc) {
#pragma unroll
    for (int nn = 0; nn < FA_NK; nn++) rpac_fill(acc[nn], 0.0f);
}

// fa_write: a warp's 16 accumulated rows (from row0) times mul into the
// [T,Hd] matrix out, through stage (256 floats of the warp's own).
__device__ __forceinline__ void fa_write(float* out, const rpac_acc* acc, float* stage, int row0, int T, int Hd, int nk,
                                         float mul) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int nn = 0; nn < FA_NK; nn++) {
        if (nn < nk) {
            rpac_store(stage, acc[nn], 16);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int r = e >> 4, d = nn * 16 + (e & 15);
                if (row0 + r < T && d < Hd) out[(i64)(row0 + r) * Hd + d] = stage[e] * mul;
            }
            __syncwarp();
        }
    }
}

// fa_logit: the scaled score plus the bias b of query i and key j, or −inf
// where the causal mask (j > i) or the padding (i ≥ T) hides it.
__device__ __forceinline__ float fa_logit(float dot, float scale, float b, int T, int i, int j) {
    if (i >= T || j > i) return RPAC_NEG_INF;
    return dot * scale + b;
}

// fa_online: the running max m and sum l of exp(x − m) over the lane's 16
// logits of one tile of scores (row i, keys from j0), the bias read from
// global memory.
__device__ __forceinline__ void fa_online(const float* s, float scale, const float* bias, int T, int i, int j0,
                                          float* m, float* l) {
    int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 16;
    float x[16];
    float tm = RPAC_NEG_INF;
    for (int c = 0; c < 16; c++) {
        int j = j0 + c0 + c;
        x[c] = fa_logit(s[r * FA_TILE + c0 + c], scale, fa_bias_at(bias, T, i, j), T, i, j);
        tm = fmaxf(tm, x[c]);
    }
    if (tm == RPAC_NEG_INF) return;
    float mn = fmaxf(*m, tm);
    float sum = *l * expf(*m - mn);
    for (int c = 0; c < 16; c++) sum += expf(x[c] - mn);
    *m = mn;
    *l = sum;
}

// fa_lse: log Σ exp over the row, from the two lanes that share it.
__device__ __forceinline__ float fa_lse(float m, float l) {
    float m2 = __shfl_xor_sync(FA_FULL, m, 1), l2 = __shfl_xor_sync(FA_FULL, l, 1);
    float mm = fmaxf(m, m2);
    if (mm == RPAC_NEG_INF) return RPAC_NEG_INF;
    float a = m == RPAC_NEG_INF ? 0.0f : l * expf(m - mm);
    float b = m2 == RPAC_NEG_INF ? 0.0f : l2 * expf(m2 - mm);
    return mm + logf(a + b);
}

// attention_fwd_bf16: o and the rows' log-sum-exp. grid = (⌈T/64⌉, B·H).
// Unlike the backward kernels it keeps the plain lane order, rows of Hp and
// the bias read from global memory: on an H200 at the paper preset the
// rotated order with padded rows and a staged bias tile took 89.1 ms per
// step against 80.3 ms for this form (rpac bench train --measure).
extern "C" __global__ void attention_fwd_bf16(float* o, float* lse, const float* q, const float* k, const float* v, const float* bias, int T,
                       int Hd, float scale, unsigned long long key, unsigned long long thresh, float keep) {
    __shared__ __align__(32) bf16_t sq[FA_ROWS * FA_HMAX];   // q's rows; then each warp's P tile
    __shared__ __align__(32) bf16_t skv[FA_TILE * FA_HMAX];  // a tile of k or v
    __shared__ __align__(32) float ss[4][16 * FA_TILE];      // each warp's scores
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nk = (Hd + 15) >> 4, Hp = nk * 16;
    int q0 = blockIdx.x * FA_ROWS, wr = q0 + w * 16;
    int i = wr + (lane >> 1), r = lane >> 1, c0 = (lane & 1) * 16;
    i64 bh = blockIdx.y, base = bh * T * Hd;
    float* s = ss[w];
    fa_stage(sq, q + base, q0, FA_ROWS, T, Hd, Hp, Hp);
    __syncthreads();
    rpac_a_row qa[FA_NK];
    fa_rows(qa, sq + w * 16 * Hp, nk, Hp);
    __syncthreads();
    int tiles = (min(q0 + FA_ROWS, T) - 1) / FA_TILE + 1;
    float m = RPAC_NEG_INF, l = 0.0f;
    for (int t = 0; t < tiles; t++) {  // pass 1: max and sum
        fa_stage(skv, k + base, t * FA_TILE, FA_TILE, T, Hd, Hp, Hp);
        __syncthreads();
        if (wr < T && t * FA_TILE <= wr + 15) {
            fa_dots(s, FA_TILE, qa, skv, nk, Hp);
            __syncwarp();
            fa_online(s, scale, bias, T, i, t * FA_TILE, &m, &l);
        }
        __syncthreads();
    }
    float L = fa_lse(m, l);
    if ((lane & 1) == 0 && i < T) lse[bh * T + i] = L;
    rpac_acc acc[FA_NK];
    fa_zero(acc);
    bf16_t* p = sq + w * 16 * FA_TILE;
    for (int t = 0; t < tiles; t++) {  // pass 2: o = P·v
        bool live = wr < T && t * FA_TILE <= wr + 15;
        fa_stage(skv, k + base, t * FA_TILE, FA_TILE, T, Hd, Hp, Hp);
        __syncthreads();
        if (live) {
            fa_dots(s, FA_TILE, qa, skv, nk, Hp);
            __syncwarp();
            for (int c = c0; c < c0 + 16; c++) {
                int j = t * FA_TILE + c;
                float x = fa_logit(s[r * FA_TILE + c], scale, fa_bias_at(bias, T, i, j), T, i, j);
                float pv = 0.0f;
                if (x != RPAC_NEG_INF) pv = expf(x - L) * dropout_keep(key, (bh * T + i) * T + j, thresh, keep);
                p[r * FA_TILE + c] = f32_to_bf16(pv);
            }
        }
        __syncthreads();
        fa_stage(skv, v + base, t * FA_TILE, FA_TILE, T, Hd, Hp, Hp);
        __syncthreads();
        if (live) fa_accumulate(acc, p, FA_TILE, skv, nk, Hp);
        __syncthreads();
    }
    fa_write(o + base, acc, s, wr, T, Hd, nk, 1.0f);
}

// fa_rowdot: dO_i·o_i, each of the row's two lanes summing every other
// column, then both adding the two halves.
__device__ __forceinline__ float fa_rowdot(const float* a, const float* b, int i, int T, int Hd) {
    float part = 0.0f;
    if (i < T) {
        for (int d = threadIdx.x & 1; d < Hd; d += 2) part += a[(i64)i * Hd + d] * b[(i64)i * Hd + d];
    }
    return part + __shfl_xor_sync(FA_FULL, part, 1);
}

// attention_bwd_dq_bf16: dq, D_i = dO_i·o_i (for the dk/dv kernel) and,
// with a bias, its gradient's partial sums. grid = (⌈T/64⌉, G): block y
// takes (sequence, head) pairs y, y+G, y+2G, ... in order and, with a bias,
// adds their dS into part[y] ([G,T,T], entries j ≤ i only; the first pair
// stores), so every partial sum is formed in one fixed order.
extern "C" __global__ __launch_bounds__(128, 3) void attention_bwd_dq_bf16(float* dq, float* Dbuf, float* part, const float* q, const float* k, const float* v,
                          const float* o, const float* dO, const float* lse, const float* bias, int BH, int T, int Hd,
                          float scale, unsigned long long key, unsigned long long thresh, float keep) {
    __shared__ __align__(32) bf16_t skv[2 * FA_TILE * FA_LD];  // q's, then dO's rows; then tiles of k and v
    __shared__ __align__(32) float ss[4][16 * FA_TILE];        // scores
    __shared__ __align__(32) float sp[4][16 * FA_TILE];        // dO·v
    __shared__ __align__(32) bf16_t sds[4][16 * FA_TILE];      // dS
    __shared__ __align__(32) float sbias[FA_ROWS * FA_TILE];   // the block's bias tile
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nk = (Hd + 15) >> 4, Hp = nk * 16, Hs = Hp + FA_PAD;
    int q0 = blockIdx.x * FA_ROWS, wr = q0 + w * 16;
    int i = wr + (lane >> 1), r = lane >> 1, c0 = (lane & 1) * 16;
    int tiles = (min(q0 + FA_ROWS, T) - 1) / FA_TILE + 1;
    bf16_t* sk = skv;
    bf16_t* sv = skv + FA_TILE * Hs;
    const float* sb = bias ? sbias + w * 16 * FA_TILE : 0;
    float* mypart = part ? part + (i64)blockIdx.y * T * T : 0;
    for (int bh = blockIdx.y; bh < BH; bh += gridDim.y) {
        bool first = bh == (int)blockIdx.y;
        i64 base = (i64)bh * T * Hd, row = (i64)bh * T + i;
        float Di = fa_rowdot(dO + base, o + base, i, T, Hd);
        if ((lane & 1) == 0 && i < T) Dbuf[row] = Di;
        float L = i < T ? lse[row] : 0.0f;
        rpac_a_row qa[FA_NK], da[FA_NK];
        fa_stage(skv, q + base, q0, FA_ROWS, T, Hd, Hp, Hs);
        __syncthreads();
        fa_rows(qa, skv + w * 16 * Hs, nk, Hs);
        __syncthreads();
        fa_stage(skv, dO + base, q0, FA_ROWS, T, Hd, Hp, Hs);
        __syncthreads();
        fa_rows(da, skv + w * 16 * Hs, nk, Hs);
        __syncthreads();
        rpac_acc acc[FA_NK];
        fa_zero(acc);
        for (int t = 0; t < tiles; t++) {
            fa_stage(sk, k + base, t * FA_TILE, FA_TILE, T, Hd, Hp, Hs);
            fa_stage(sv, v + base, t * FA_TILE, FA_TILE, T, Hd, Hp, Hs);
            fa_stage_bias(sbias, bias, q0, t * FA_TILE, T);
            __syncthreads();
            if (wr < T && t * FA_TILE <= wr + 15) {
                fa_dots(ss[w], FA_TILE, qa, sk, nk, Hs);
                fa_dots(sp[w], FA_TILE, da, sv, nk, Hs);
                __syncwarp();
#pragma unroll 4
                for (int c = 0; c < 16; c++) {
                    int col = fa_col(c, r, c0), j = t * FA_TILE + col;
                    float x = fa_logit(ss[w][r * FA_TILE + col], scale, sb ? sb[r * FA_TILE + col] : 0.0f, T, i, j);
                    float ds = 0.0f;
                    if (x != RPAC_NEG_INF) {
                        float pij = expf(x - L), drop = dropout_keep(key, row * T + j, thresh, keep);
                        ds = pij * (drop * sp[w][r * FA_TILE + col] - Di);
                        if (mypart) {
                            float* dst = mypart + (i64)i * T + j;
                            *dst = first ? ds : *dst + ds;
                        }
                    }
                    sds[w][r * FA_TILE + col] = f32_to_bf16(ds);
                }
                __syncwarp();
                fa_accumulate(acc, sds[w], FA_TILE, sk, nk, Hs);
            }
            __syncthreads();
        }
        fa_write(dq + base, acc, ss[w], wr, T, Hd, nk, scale);
        __syncthreads();
    }
}

// attention_bwd_dkdv_bf16: dk and dv for the block's 64 keys, from the
// query tiles at or below the diagonal. grid = (⌈T/64⌉, B·H).
extern "C" __global__ void attention_bwd_dkdv_bf16(float* dk, float* dv, const float* q, const float* k, const float* v, const float* dO,
                            const float* lse, const float* Dbuf, const float* bias, int T, int Hd, float scale,
                            unsigned long long key, unsigned long long thresh, float keep) {
    __shared__ __align__(32) bf16_t sqd[2 * FA_TILE * FA_LD];  // k's, then v's rows; then tiles of q and dO
    __shared__ __align__(32) float ss[4][16 * FA_KS];          // scores, transposed (keys × queries)
    __shared__ __align__(32) float sp[4][16 * FA_KS];          // v·dO
    __shared__ __align__(32) bf16_t spt[4][16 * FA_KP];        // the weights after dropout
    __shared__ __align__(32) bf16_t sdt[4][16 * FA_KP];        // dS
    __shared__ float sl[FA_TILE], sd[FA_TILE];                  // the tile's lse and D
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nk = (Hd + 15) >> 4, Hp = nk * 16, Hs = Hp + FA_PAD;
    int k0 = blockIdx.x * FA_ROWS, kw = k0 + w * 16;
    int j = kw + (lane >> 1), r = lane >> 1, c0 = (lane & 1) * 16;
    i64 bh = blockIdx.y, base = bh * T * Hd;
    bf16_t* sq = sqd;
    bf16_t* sdo = sqd + FA_TILE * Hs;
    rpac_a_row ka[FA_NK], va[FA_NK];
    fa_stage(sqd, k + base, k0, FA_ROWS, T, Hd, Hp, Hs);
    __syncthreads();
    fa_rows(ka, sqd + w * 16 * Hs, nk, Hs);
    __syncthreads();
    fa_stage(sqd, v + base, k0, FA_ROWS, T, Hd, Hp, Hs);
    __syncthreads();
    fa_rows(va, sqd + w * 16 * Hs, nk, Hs);
    __syncthreads();
    rpac_acc dK[FA_NK], dV[FA_NK];
    fa_zero(dK);
    fa_zero(dV);
    for (int t = k0 / FA_TILE; t * FA_TILE < T; t++) {
        int i0 = t * FA_TILE;
        fa_stage(sq, q + base, i0, FA_TILE, T, Hd, Hp, Hs);
        fa_stage(sdo, dO + base, i0, FA_TILE, T, Hd, Hp, Hs);
        for (int e = threadIdx.x; e < FA_TILE; e += blockDim.x) {
            bool in = i0 + e < T;
            sl[e] = in ? lse[bh * T + i0 + e] : 0.0f;
            sd[e] = in ? Dbuf[bh * T + i0 + e] : 0.0f;
        }
        __syncthreads();
        if (kw < T && i0 + FA_TILE - 1 >= kw) {
            fa_dots(ss[w], FA_KS, ka, sq, nk, Hs);
            fa_dots(sp[w], FA_KS, va, sdo, nk, Hs);
            __syncwarp();
#pragma unroll 4
            for (int c = 0; c < 16; c++) {
                int col = fa_col_keys(c, r, c0), i = i0 + col;
                float x = fa_logit(ss[w][r * FA_KS + col], scale, fa_bias_at(bias, T, i, j), T, i, j);
                float pd = 0.0f, ds = 0.0f;
                if (x != RPAC_NEG_INF) {
                    float pij = expf(x - sl[col]), drop = dropout_keep(key, (bh * T + i) * T + j, thresh, keep);
                    pd = pij * drop;
                    ds = pij * (drop * sp[w][r * FA_KS + col] - sd[col]);
                }
                spt[w][r * FA_KP + col] = f32_to_bf16(pd);
                sdt[w][r * FA_KP + col] = f32_to_bf16(ds);
            }
            __syncwarp();
            fa_accumulate(dV, spt[w], FA_KP, sdo, nk, Hs);
            fa_accumulate(dK, sdt[w], FA_KP, sq, nk, Hs);
        }
        __syncthreads();
    }
    fa_write(dk + base, dK, ss[w], kw, T, Hd, nk, scale);
    fa_write(dv + base, dV, ss[w], kw, T, Hd, nk, 1.0f);
}

// attention_dbias_reduce_f32: dbias[i,j] = Σ_g part[g,i,j] in g order for
// j ≤ i, 0 above the diagonal (grid-stride over T·T).
extern "C" __global__ void attention_dbias_reduce_f32(float* dbias, const float* part, int G, int T) {
    i64 n = (i64)T * T;
    GRID_STRIDE(e, n) {
        i64 i = e / T, j = e - i * T;
        float s = 0.0f;
        if (j <= i) {
            for (int g = 0; g < G; g++) s += part[g * n + e];
        }
        dbias[e] = s;
    }
}
