// Shared by every rpac kernel source (prepended by the Go side): NVRTC
// compiles without toolkit headers, so the few types and helpers the
// kernels need are defined here.
typedef unsigned short bf16_t;   // bfloat16 bits
typedef long long i64;
#define RPAC_NEG_INF (__int_as_float(0xff800000))

// bf16 <-> f32 by bits: round to nearest even, NaN kept quiet.
__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
        return (bf16_t)((u >> 16) | 0x0040u);  // quiet NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// rpac_bf16x8: eight bf16 for one 16-byte store. bf16x8_of: elements c to
// c+7 of the fp32 row src as bf16, zero from column cols on (GEMM operands
// padded to 16-byte-aligned rows).
struct __align__(16) rpac_bf16x8 { unsigned int w[4]; };
__device__ __forceinline__ rpac_bf16x8 bf16x8_of(const float* src, int c, int cols) {
    rpac_bf16x8 v;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int c0 = c + 2 * e, c1 = c0 + 1;
        unsigned lo = c0 < cols ? f32_to_bf16(src[c0]) : 0u;
        unsigned hi = c1 < cols ? f32_to_bf16(src[c1]) : 0u;
        v.w[e] = lo | (hi << 16);
    }
    return v;
}

// The combining operations of the warp and block reductions, each with the
// value that leaves the other operand unchanged.
struct rpac_sum_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
    __device__ __forceinline__ static float identity() { return 0.0f; }
};
struct rpac_max_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ __forceinline__ static float identity() { return RPAC_NEG_INF; }
};

// warp_reduce: the warp's result in lane 0, in a fixed shuffle tree.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v) {
    Op op;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<rpac_sum_op>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<rpac_max_op>(v); }

// block_reduce (block_sum, block_max): every thread gets the block's result.
// blockDim.x must be a multiple of 32 and at most 1024; shared holds 32 floats.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_reduce<Op>(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    v = (threadIdx.x < warps) ? shared[threadIdx.x] : Op::identity();
    if (warp == 0) v = warp_reduce<Op>(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_sum(float v, float* shared) { return block_reduce<rpac_sum_op>(v, shared); }
__device__ __forceinline__ float block_max(float v, float* shared) { return block_reduce<rpac_max_op>(v, shared); }

// Two-pass reductions (graph.cu, paper.cu): the first pass writes partials
// in double, the second sums each output's partials in a fixed tree.
#define RED_ROW_LANES 8  // row lanes of reduce_cols_f32's 256-thread blocks
#define RED_AHEAD 4      // terms whose loads a reduction thread issues at once

// warp_sum_d: the warp's sum in lane 0, in a fixed shuffle tree.
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// warp_sum_parts: Σ p[0..parts) in lane 0 (lane l adds p[l], p[l+32], ...
// in order, then the tree).
__device__ __forceinline__ double warp_sum_parts(const double* p, int parts) {
    int lane = threadIdx.x & 31;
    double s = 0.0;
    for (int k = lane; k < parts; k += 32) s += p[k];
    return warp_sum_d(s);
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Counter-based randomness, bit-identical to kernels/rand.go: draw i of
// stream key is mix64(key + (i+1)·golden).
#define RPAC_GOLDEN 0x9E3779B97F4A7C15ull
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// dropout_scale: scale when element e of stream key keeps (the 32-bit half
// (e&1) of draw e>>1 below thresh), else 0: Dropout's multiplier
// (dropout_f32, and a dropout step of fused_ew_f32).
__device__ __forceinline__ float dropout_scale(unsigned long long key, i64 e, unsigned long long thresh, float scale) {
    unsigned long long h = mix64(key + (unsigned long long)((e >> 1) + 1) * RPAC_GOLDEN);
    unsigned int half = (unsigned int)(h >> (32 * (e & 1)));
    return ((unsigned long long)half < thresh) ? scale : 0.0f;
}

// dropout_pair: dropout_scale of elements 2p and 2p + 1 into r0 and r1,
// from their one draw p.
__device__ __forceinline__ void dropout_pair(unsigned long long key, i64 p, unsigned long long thresh, float scale, float& r0,
                                             float& r1) {
    unsigned long long h = mix64(key + (unsigned long long)(p + 1) * RPAC_GOLDEN);
    r0 = (unsigned long long)(unsigned int)h < thresh ? scale : 0.0f;
    r1 = (unsigned long long)(unsigned int)(h >> 32) < thresh ? scale : 0.0f;
}

// dropout_keep: the Dropout multiplier of element e (0 or keep): element e
// keeps when the 32-bit half (e&1) of draw e>>1 is below thresh. keep == 0
// means no dropout (multiplier 1).
__device__ __forceinline__ float dropout_keep(unsigned long long key, i64 e, unsigned long long thresh, float keep) {
    if (keep == 0.0f) return 1.0f;
    return dropout_scale(key, e, thresh, keep);
}

// attn_view: where head bh's rows start (elements) in an attention operand
// of T rows of Hd per head, and how far apart they are: [B,H,T,Hd] when
// H = 0, [B,T,H,Hd] with H heads otherwise (ir.AttnBTHD: a projection's
// rows as they are).
struct attn_view {
    i64 base;
    int rs;
};
__device__ __forceinline__ attn_view attn_head(i64 bh, int T, int Hd, int H) {
    attn_view v;
    if (H > 0) {
        v.base = ((bh / H) * (i64)T * H + bh % H) * Hd;
        v.rs = H * Hd;
    } else {
        v.base = bh * (i64)T * Hd;
        v.rs = Hd;
    }
    return v;
}

// ---- elementwise formulas (graph.cu's unary/grad/binary kernels and the
// generated chains: one definition of each) ----
//
// ew_unary(op, x, a, b, c): op(x), a, b, c the op's parameters;
// ew_grad(op, dy, v, a, b): dy·op'(v), v the op's input or output as its
// gradient takes it; ew_binary(op, x, y): x op y. The Go side puts the op
// codes (U_*, G_*, B_*) and the functions here, from ir.Elementwise.
// @elementwise formulas: generated from ir.Elementwise (ewgen.go)@

// A view: dims[rank] of the iteration space, then one stride array per
// operand, then (copy/scatter) a base offset. Element i of the iteration
// space maps to Σ_d idx_d·stride_d.
__device__ __forceinline__ i64 view_offset(i64 i, const i64* dims, const i64* strides, int rank) {
    i64 off = 0;
    for (int d = rank - 1; d >= 0; d--) {
        i64 q = i / dims[d];
        off += (i - q * dims[d]) * strides[d];
        i = q;
    }
    return off;
}

// view_offset32 is view_offset for iteration spaces of fewer than 2³¹
// elements (every dim then fits too), with 32-bit divisions, which cost a
// fraction of 64-bit ones; the offset is the same.
__device__ __forceinline__ i64 view_offset32(i64 i, const i64* dims, const i64* strides, int rank) {
    i64 off = 0;
    unsigned u = (unsigned)i;
    for (int d = rank - 1; d >= 0; d--) {
        unsigned dim = (unsigned)dims[d];
        unsigned q = u / dim;
        off += (i64)(u - q * dim) * strides[d];
        u = q;
    }
    return off;
}

// view_offset_n: element i's offset in an iteration space of n elements,
// by view_offset32 where n allows it.
__device__ __forceinline__ i64 view_offset_n(i64 i, i64 n, const i64* dims, const i64* strides, int rank) {
    return n <= 0x7fffffffll ? view_offset32(i, dims, strides, rank) : view_offset(i, dims, strides, rank);
}

// rpac_mma: warp-wide tensor-core tiles, m16n16k16 with bf16 inputs and
// fp32 accumulation (what WMMA calls fragments). Every lane of a warp calls
// each operation together, with the same pointer and leading dimension
// (ldm, in elements: a multiple of 8 for bf16, of 4 for fp32; pointers
// 32-byte aligned). A fragment is opaque: kernels use it only through
// rpac_load, rpac_store, rpac_fill, rpac_mma and elementwise loops over
// f.x[0..RPAC_ACC_N) that treat every element alike, never assuming which
// element is which position of the tile (the simulator draws that mapping
// at random per run; a kernel that needs it learns it through a product,
// as flash.cu's fa_row_ids does). rpac_store writes a lane's share of the
// tile only: other lanes read it after __syncwarp (or __syncthreads).
//
// Types name the operand and the layout of the tile in memory: a is the
// 16×16 M×K left operand, b the K×N right one; row: element (r, c) at
// p[r·ldm + c], col: at p[c·ldm + r]. rpac_mma(d, a, b, c): d = a·b + c.
#ifndef RPAC_CUDASIM
struct rpac_a_row { int x[4]; };
struct rpac_a_col { int x[4]; };
struct rpac_b_row { int x[4]; };
struct rpac_b_col { int x[4]; };
struct rpac_acc { float x[8]; };
#define RPAC_ACC_N 8

// The NVVM builtins behind mma.h's WMMA API (layout 0 = row, 1 = col; for
// the product, A's layout << 1 | B's).
__device__ __forceinline__ void rpac_load(rpac_a_row& f, const bf16_t* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_a(f.x, (const int*)p, ldm, 0);
}
__device__ __forceinline__ void rpac_load(rpac_a_col& f, const bf16_t* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_a(f.x, (const int*)p, ldm, 1);
}
__device__ __forceinline__ void rpac_load(rpac_b_row& f, const bf16_t* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_b(f.x, (const int*)p, ldm, 0);
}
__device__ __forceinline__ void rpac_load(rpac_b_col& f, const bf16_t* p, unsigned ldm) {
    __mma_bf16_m16n16k16_ld_b(f.x, (const int*)p, ldm, 1);
}
// rpac_store: the accumulator as a row-major fp32 tile.
__device__ __forceinline__ void rpac_store(float* p, const rpac_acc& f, unsigned ldm) {
    __hmma_m16n16k16_st_c_f32(p, f.x, ldm, 0);
}
__device__ __forceinline__ void rpac_mma(rpac_acc& d, const rpac_a_row& a, const rpac_b_row& b, const rpac_acc& c) {
    __mma_bf16_m16n16k16_mma_f32(d.x, a.x, b.x, c.x, 0, 0);
}
__device__ __forceinline__ void rpac_mma(rpac_acc& d, const rpac_a_row& a, const rpac_b_col& b, const rpac_acc& c) {
    __mma_bf16_m16n16k16_mma_f32(d.x, a.x, b.x, c.x, 1, 0);
}
__device__ __forceinline__ void rpac_mma(rpac_acc& d, const rpac_a_col& a, const rpac_b_row& b, const rpac_acc& c) {
    __mma_bf16_m16n16k16_mma_f32(d.x, a.x, b.x, c.x, 2, 0);
}
__device__ __forceinline__ void rpac_mma(rpac_acc& d, const rpac_a_col& a, const rpac_b_col& b, const rpac_acc& c) {
    __mma_bf16_m16n16k16_mma_f32(d.x, a.x, b.x, c.x, 3, 0);
}
#endif
__device__ __forceinline__ void rpac_fill(rpac_acc& f, float v) {
    for (int e = 0; e < RPAC_ACC_N; e++) f.x[e] = v;
}

// table_entry: the entry of a many-tensor table (words words each, the
// entry's first block at word first) that owns block b: the last whose
// first block is ≤ b (entries in order of first).
__device__ __forceinline__ int table_entry(const unsigned long long* table, int entries, int words, int first, i64 b) {
    int lo = 0, hi = entries - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((i64)table[words * mid + first] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
