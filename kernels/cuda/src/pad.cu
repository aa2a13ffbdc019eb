// Pad and its gradient (ir's Pad: the aligned-width graphs' padded
// parameters): a matrix whose rows (axis 0) and columns are each blocks of
// size entries, stored as blocks of pad (≥ size) entries, its own first and
// zeros after; a vector is a matrix of one row.

// pad_src: the logical index that stored index i of an axis holds, or −1
// where i is padding.
__device__ __forceinline__ i64 pad_src(i64 i, int size, int pad) {
    i64 j = i % pad;
    return j < size ? (i / pad) * size + j : -1;
}

// pad_dst: the stored index of logical index i.
__device__ __forceinline__ i64 pad_dst(i64 i, int size, int pad) { return (i / size) * pad + i % size; }

// pad_elem: element i of y (rows × cols stored) from x (logical).
__device__ __forceinline__ void pad_elem(float* y, const float* x, int rsize, int rpad, int cols, int csize, int cpad, i64 i) {
    i64 xcols = (i64)(cols / cpad) * csize;
    i64 r = pad_src(i / cols, rsize, rpad), c = pad_src(i % cols, csize, cpad);
    y[i] = (r < 0 || c < 0) ? 0.0f : x[r * xcols + c];
}

// pad_grad_elem: element i of dx (rows × cols logical) from dy (stored):
// the entry Pad took from x.
__device__ __forceinline__ void pad_grad_elem(float* dx, const float* dy, int rsize, int rpad, int cols, int csize, int cpad,
                                              i64 i) {
    i64 ycols = (i64)(cols / csize) * cpad;
    dx[i] = dy[pad_dst(i / cols, rsize, rpad) * ycols + pad_dst(i % cols, csize, cpad)];
}

// pad_f32: y (rows × cols stored) from x (logical); n = rows·cols.
extern "C" __global__ void pad_f32(float* y, const float* x, int rsize, int rpad, int cols, int csize, int cpad, i64 n) {
    GRID_STRIDE(i, n) pad_elem(y, x, rsize, rpad, cols, csize, cpad, i);
}

// pad_grad_f32: dx (rows × cols logical) from dy (stored); n = rows·cols.
extern "C" __global__ void pad_grad_f32(float* dx, const float* dy, int rsize, int rpad, int cols, int csize, int cpad, i64 n) {
    GRID_STRIDE(i, n) pad_grad_elem(dx, dy, rsize, rpad, cols, csize, cpad, i);
}

// pad_multi_f32: pad_f32 (grad 0) or pad_grad_f32 (grad 1) over many
// tensors in one launch. Entry e of table (nine words: the output's and
// the input's addresses, rsize, rpad, cols, csize, cpad as pad_f32 takes
// them, the output's length and its first block) owns the blocks [first,
// first + ⌈len/chunk⌉); block b updates [k·chunk, +chunk) ∩ [0, len) of its
// entry, k = b − first. n is the elements of all entries.
extern "C" __global__ void pad_multi_f32(const unsigned long long* table, int entries, int chunk, int grad, i64 n) {
    const unsigned long long* e = table + 9 * table_entry(table, entries, 9, 8, blockIdx.x);
    i64 len = (i64)e[7];
    i64 lo = ((i64)blockIdx.x - (i64)e[8]) * chunk;
    i64 hi = lo + chunk < len ? lo + chunk : len;
    float* y = (float*)e[0];
    const float* x = (const float*)e[1];
    int rsize = (int)e[2], rpad = (int)e[3], cols = (int)e[4], csize = (int)e[5], cpad = (int)e[6];
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (grad) {
            pad_grad_elem(y, x, rsize, rpad, cols, csize, cpad, i);
        } else {
            pad_elem(y, x, rsize, rpad, cols, csize, cpad, i);
        }
    }
}

// pad_bf16: a weight's padded bf16 copy for its GEMMs: y has rows × cols
// stored entries in rows of ld (≥ cols, a multiple of 8), zero from cols on,
// each rounded as f32_to_bf16_pad_kernel rounds it; n = rows·ld.
extern "C" __global__ void pad_bf16(bf16_t* y, const float* x, int rsize, int rpad, int cols, int csize, int cpad, int ld, i64 n) {
    i64 xcols = (i64)(cols / cpad) * csize;
    GRID_STRIDE(i, n) {
        i64 c0 = i % ld;
        i64 r = pad_src(i / ld, rsize, rpad), c = c0 < cols ? pad_src(c0, csize, cpad) : -1;
        y[i] = (r < 0 || c < 0) ? (bf16_t)0 : f32_to_bf16(x[r * xcols + c]);
    }
}
