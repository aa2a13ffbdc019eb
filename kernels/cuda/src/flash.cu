// Causal attention on the tensor cores (the prelude's rpac_mma tiles: bf16
// inputs, fp32 accumulation), the same operation as attention.cu's scalar
// kernels: an optional additive [T,T] bias shared by every sequence and
// head, optional dropout on the weights with the same draws (element
// ((bh·T)+i)·T+j of stream key, see dropout_keep; keep = 0: none). q, k,
// v, o, dO, dq, dk, dv are fp32 [B,H,T,Hd], or [B,T,H,Hd] when H > 0
// (attn_head); lse and D are [B,H,T].
//
// Tiles: a block is 4 warps (blockDim.x = 128); each warp owns 16 rows of
// a 64-row block tile (queries in the forward and dq kernels, keys in the
// dk/dv kernel) and walks the other side in tiles of 32. Operands are
// staged in shared memory as bf16, the head padded with zeros to Hp, a
// multiple of 16 (zero columns add nothing to any product); Hd ≤ 128. The
// [T,T] weights never exist in device memory: the forward makes one pass
// over the keys with the online softmax (the accumulator's rows rescaled
// through fa_row_ids when a row's maximum rises), and the backward
// recomputes P from lse. Tiles entirely above the diagonal are skipped.
// The elementwise work on a warp's 16×32 tile of scores goes through
// shared memory: lane l owns row r = l/2, columns 16·(l mod 2) to +16. The
// backward kernels visit them in a rotated order (fa_col) so that the 32
// lanes of one step read 32 different banks, store staged operands with
// rows of Hp + 8 (FA_PAD) elements, which spreads the tensor-core loads of
// 8 rows over all banks, and the dq kernel stages its bias tile in shared
// memory with coalesced loads; the dk/dv kernel, short of shared memory,
// reads the bias from global memory in an order that keeps a step within 4
// sectors (fa_col_keys). The forward keeps the plain order, rows of Hp and
// the bias read from global memory: on an H200 at the paper preset the
// rotated order with padded rows and a staged bias tile took 89.1 ms per
// step against 80.3 ms for this form (the two-pass forward of the time,
// rpac bench train --measure).

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

// fa_stage: rows [r0, r0+rows) of the fp32 matrix src (T rows of Hd, rs
// apart) as a bf16 [rows][Hs] tile (Hs ≥ Hp), zero beyond T and Hd up to
// Hp (all the
// block's threads, element e = r·Hp + d by thread e mod blockDim.x; the
// thread's (r, d) advances by blockDim.x elements without a division).
__device__ __forceinline__ void fa_stage(bf16_t* dst, const float* src, int r0, int rows, int T, int Hd, int rs, int Hp,
                                         int Hs) {
    int r = threadIdx.x / Hp, d = threadIdx.x - r * Hp;
    int sr = blockDim.x / Hp, sd = blockDim.x - sr * Hp;
    for (; r < rows; r += sr) {
        int t = r0 + r;
        dst[r * Hs + d] = f32_to_bf16(t < T && d < Hd ? src[(i64)t * rs + d] : 0.0f);
        d += sd;
        if (d >= Hp) {
            d -= Hp;
            r++;
        }
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

// fa_block_rows: the block's FA_ROWS rows of src from r0 staged through buf
// (a [FA_ROWS][Hs] tile, see fa_stage), then the warp's 16 of them as left
// operands in f (fa_rows); all the block's threads, synchronised after each
// step, so that buf may be staged again.
__device__ __forceinline__ void fa_block_rows(rpac_a_row* f, bf16_t* buf, const float* src, int r0, int T, int Hd, int rs,
                                              int Hp, int Hs, int nk) {
    fa_stage(buf, src, r0, FA_ROWS, T, Hd, rs, Hp, Hs);
    __syncthreads();
    fa_rows(f, buf + (threadIdx.x >> 5) * 16 * Hs, nk, Hs);
    __syncthreads();
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
__device__ __forceinline__ void fa_write(float* out, const rpac_acc* acc, float* stage, int row0, int T, int Hd, int rs, int nk,
                                         float mul) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int nn = 0; nn < FA_NK; nn++) {
        if (nn < nk) {
            rpac_store(stage, acc[nn], 16);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int r = e >> 4, d = nn * 16 + (e & 15);
                if (row0 + r < T && d < Hd) out[(i64)(row0 + r) * rs + d] = stage[e] * mul;
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

// fa_row_ids: the accumulator fragment whose every element holds its own
// row (0..15) of the 16×16 tile, made by the tensor cores from two pattern
// tiles in shared memory (a[r][0] = r, b[0][c] = 1, zero elsewhere; 512
// bf16 of scratch, all the warp's lanes). Fragments of one type share one
// element-to-position mapping, so a loop over f.x[e] can scale element e
// by a per-row factor through ids.x[e] without assuming the mapping.
__device__ __forceinline__ void fa_row_ids(rpac_acc& ids, bf16_t* scratch) {
    int lane = threadIdx.x & 31;
    for (int e = lane; e < 256; e += 32) {
        int r = e >> 4, c = e & 15;
        scratch[e] = f32_to_bf16(c == 0 ? (float)r : 0.0f);
        scratch[256 + e] = f32_to_bf16(r == 0 ? 1.0f : 0.0f);
    }
    __syncwarp();
    rpac_a_row a;
    rpac_b_row b;
    rpac_load(a, scratch, 16);
    rpac_load(b, scratch + 256, 16);
    rpac_fill(ids, 0.0f);
    rpac_mma(ids, a, b, ids);
    __syncwarp();
}

// fa_scale_rows: acc[nn] element e times f[row of e] for the warp's 16
// rows (f in shared memory, ids from fa_row_ids).
__device__ __forceinline__ void fa_scale_rows(rpac_acc* acc, const rpac_acc& ids, const float* f, int nk) {
#pragma unroll
    for (int nn = 0; nn < FA_NK; nn++) {
        if (nn < nk) {
            for (int e = 0; e < RPAC_ACC_N; e++) acc[nn].x[e] *= f[(int)ids.x[e]];
        }
    }
}

// fa_max2: the maximum over the row's two lanes.
__device__ __forceinline__ float fa_max2(float x) { return fmaxf(x, __shfl_xor_sync(FA_FULL, x, 1)); }

// fa_geom: a flash block's thread geometry: warp w and its lane, the head
// dimension in nk 16-column blocks (Hp columns), the block's FA_ROWS rows
// from b0, the warp's 16 rows from w0, the lane's row w0 + r and column half
// c0, and head bh's view of q, k and v (base, row stride rs).
struct fa_geom {
    int w, lane, nk, Hp, b0, w0, row, r, c0, rs;
    i64 bh, base;
};
__device__ __forceinline__ fa_geom fa_geometry(int T, int Hd, int H) {
    fa_geom g;
    g.w = threadIdx.x >> 5;
    g.lane = threadIdx.x & 31;
    g.nk = (Hd + 15) >> 4;
    g.Hp = g.nk * 16;
    g.b0 = blockIdx.x * FA_ROWS;
    g.w0 = g.b0 + g.w * 16;
    g.r = g.lane >> 1;
    g.row = g.w0 + g.r;
    g.c0 = (g.lane & 1) * 16;
    g.bh = blockIdx.y;
    attn_view hv = attn_head(g.bh, T, Hd, H);
    g.base = hv.base;
    g.rs = hv.rs;
    return g;
}

// attention_fwd_bf16: o and the rows' log-sum-exp, in one pass over the
// keys with the online softmax. grid = (⌈T/64⌉, B·H). Per tile of 32 keys
// the two lanes of a row take the tile's row maximum m' = max(m, scores),
// rescale their running sum l by α = exp(m − m'), add exp(x − m'), and
// write P = exp(x − m')·dropout as bf16; when a row's maximum rose (α < 1
// for some row of the warp) the accumulator's rows are scaled by α through
// fa_row_ids before o += P·v; at the end o = acc / l and lse = m + log l.
// The backward recomputes P as exp(x − lse).
extern "C" __global__ __launch_bounds__(128, 3) void attention_fwd_bf16(float* o, float* lse, const float* q, const float* k, const float* v, const float* bias, int T,
                       int Hd, int H, float scale, unsigned long long key, unsigned long long thresh, float keep) {
    __shared__ __align__(32) bf16_t sq[FA_ROWS * FA_HMAX];   // q's rows; then each warp's P tile
    __shared__ __align__(32) bf16_t skv[FA_TILE * FA_HMAX];  // a tile of k or v
    __shared__ __align__(32) float ss[4][16 * FA_TILE];      // each warp's scores
    __shared__ float srow[4][16];                            // each warp's per-row factors
    fa_geom g = fa_geometry(T, Hd, H);
    int w = g.w, lane = g.lane, nk = g.nk, Hp = g.Hp;
    int q0 = g.b0, wr = g.w0, i = g.row, r = g.r, c0 = g.c0, rs = g.rs;
    i64 bh = g.bh, base = g.base;
    float* s = ss[w];
    rpac_acc ids;
    fa_row_ids(ids, (bf16_t*)s);  // ss[w] is 2,048 bytes: the patterns fit
    rpac_a_row qa[FA_NK];
    fa_block_rows(qa, sq, q + base, q0, T, Hd, rs, Hp, Hp, nk);
    int tiles = (min(q0 + FA_ROWS, T) - 1) / FA_TILE + 1;
    float m = RPAC_NEG_INF, l = 0.0f;
    rpac_acc acc[FA_NK];
    fa_zero(acc);
    bf16_t* p = sq + w * 16 * FA_TILE;
    for (int t = 0; t < tiles; t++) {
        bool live = wr < T && t * FA_TILE <= wr + 15;
        fa_stage(skv, k + base, t * FA_TILE, FA_TILE, T, Hd, rs, Hp, Hp);
        __syncthreads();
        if (live) {
            fa_dots(s, FA_TILE, qa, skv, nk, Hp);
            __syncwarp();
            float x[16];
            float tm = RPAC_NEG_INF;
            for (int c = 0; c < 16; c++) {
                int j = t * FA_TILE + c0 + c;
                x[c] = fa_logit(s[r * FA_TILE + c0 + c], scale, fa_bias_at(bias, T, i, j), T, i, j);
                tm = fmaxf(tm, x[c]);
            }
            float mn = fmaxf(m, fa_max2(tm));
            float alpha = mn == m ? 1.0f : (m == RPAC_NEG_INF ? 0.0f : expf(m - mn));
            float sum = 0.0f;
            for (int c = 0; c < 16; c++) {
                int j = t * FA_TILE + c0 + c;
                float pv = 0.0f;
                if (x[c] != RPAC_NEG_INF) {
                    pv = expf(x[c] - mn);
                    sum += pv;
                    pv *= dropout_keep(key, (bh * T + i) * T + j, thresh, keep);
                }
                p[r * FA_TILE + c0 + c] = f32_to_bf16(pv);
            }
            l = l * alpha + sum;
            m = mn;
            if (__any_sync(FA_FULL, alpha != 1.0f)) {
                if ((lane & 1) == 0) srow[w][r] = alpha;
                __syncwarp();
                fa_scale_rows(acc, ids, srow[w], nk);
            }
        }
        __syncthreads();
        fa_stage(skv, v + base, t * FA_TILE, FA_TILE, T, Hd, rs, Hp, Hp);
        __syncthreads();
        if (live) fa_accumulate(acc, p, FA_TILE, skv, nk, Hp);
        __syncthreads();
    }
    float lt = l + __shfl_xor_sync(FA_FULL, l, 1);
    if ((lane & 1) == 0) {
        if (i < T) lse[bh * T + i] = m == RPAC_NEG_INF ? RPAC_NEG_INF : m + logf(lt);
        srow[w][r] = lt > 0.0f ? 1.0f / lt : 0.0f;
    }
    __syncwarp();
    fa_scale_rows(acc, ids, srow[w], nk);
    fa_write(o + base, acc, s, wr, T, Hd, rs, nk, 1.0f);
}

// fa_rowdot: dO_i·o_i, each of the row's two lanes summing every other
// column, then both adding the two halves.
__device__ __forceinline__ float fa_rowdot(const float* a, const float* b, int i, int T, int Hd, int rs) {
    float part = 0.0f;
    if (i < T) {
        for (int d = threadIdx.x & 1; d < Hd; d += 2) part += a[(i64)i * rs + d] * b[(i64)i * rs + d];
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
                          int H, float scale, unsigned long long key, unsigned long long thresh, float keep) {
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
        attn_view hv = attn_head(bh, T, Hd, H);
        i64 base = hv.base, row = (i64)bh * T + i;
        int rs = hv.rs;
        float Di = fa_rowdot(dO + base, o + base, i, T, Hd, rs);
        if ((lane & 1) == 0 && i < T) Dbuf[row] = Di;
        float L = i < T ? lse[row] : 0.0f;
        rpac_a_row qa[FA_NK], da[FA_NK];
        fa_block_rows(qa, skv, q + base, q0, T, Hd, rs, Hp, Hs, nk);
        fa_block_rows(da, skv, dO + base, q0, T, Hd, rs, Hp, Hs, nk);
        rpac_acc acc[FA_NK];
        fa_zero(acc);
        for (int t = 0; t < tiles; t++) {
            fa_stage(sk, k + base, t * FA_TILE, FA_TILE, T, Hd, rs, Hp, Hs);
            fa_stage(sv, v + base, t * FA_TILE, FA_TILE, T, Hd, rs, Hp, Hs);
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
                    }
                    if (mypart && i < T && j <= i) {  // every entry the reduction reads, 0 where masked
                        float* dst = mypart + (i64)i * T + j;
                        *dst = first ? ds : *dst + ds;
                    }
                    sds[w][r * FA_TILE + col] = f32_to_bf16(ds);
                }
                __syncwarp();
                fa_accumulate(acc, sds[w], FA_TILE, sk, nk, Hs);
            }
            __syncthreads();
        }
        fa_write(dq + base, acc, ss[w], wr, T, Hd, rs, nk, scale);
        __syncthreads();
    }
}

// attention_bwd_dkdv_bf16: dk and dv for the block's 64 keys, from the
// query tiles at or below the diagonal. grid = (⌈T/64⌉, B·H).
extern "C" __global__ void attention_bwd_dkdv_bf16(float* dk, float* dv, const float* q, const float* k, const float* v, const float* dO,
                            const float* lse, const float* Dbuf, const float* bias, int T, int Hd, int H, float scale,
                            unsigned long long key, unsigned long long thresh, float keep) {
    __shared__ __align__(32) bf16_t sqd[2 * FA_TILE * FA_LD];  // k's, then v's rows; then tiles of q and dO
    __shared__ __align__(32) float ss[4][16 * FA_KS];          // scores, transposed (keys × queries)
    __shared__ __align__(32) float sp[4][16 * FA_KS];          // v·dO
    __shared__ __align__(32) bf16_t spt[4][16 * FA_KP];        // the weights after dropout
    __shared__ __align__(32) bf16_t sdt[4][16 * FA_KP];        // dS
    __shared__ float sl[FA_TILE], sd[FA_TILE];                  // the tile's lse and D
    fa_geom g = fa_geometry(T, Hd, H);
    int w = g.w, lane = g.lane, nk = g.nk, Hp = g.Hp, Hs = Hp + FA_PAD;
    int k0 = g.b0, kw = g.w0, j = g.row, r = g.r, c0 = g.c0, rs = g.rs;
    i64 bh = g.bh, base = g.base;
    bf16_t* sq = sqd;
    bf16_t* sdo = sqd + FA_TILE * Hs;
    rpac_a_row ka[FA_NK], va[FA_NK];
    fa_block_rows(ka, sqd, k + base, k0, T, Hd, rs, Hp, Hs, nk);
    fa_block_rows(va, sqd, v + base, k0, T, Hd, rs, Hp, Hs, nk);
    rpac_acc dK[FA_NK], dV[FA_NK];
    fa_zero(dK);
    fa_zero(dV);
    for (int t = k0 / FA_TILE; t * FA_TILE < T; t++) {
        int i0 = t * FA_TILE;
        fa_stage(sq, q + base, i0, FA_TILE, T, Hd, rs, Hp, Hs);
        fa_stage(sdo, dO + base, i0, FA_TILE, T, Hd, rs, Hp, Hs);
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
    fa_write(dk + base, dK, ss[w], kw, T, Hd, rs, nk, scale);
    fa_write(dv + base, dV, ss[w], kw, T, Hd, rs, nk, 1.0f);
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
