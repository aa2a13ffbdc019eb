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

// pad_f32: y (rows × cols stored) from x (logical); n = rows·cols.
extern "C" __global__ void pad_f32(float* y, const float* x, int rsize, int rpad, int cols, int csize, int cpad, i64 n) {
    i64 xcols = (i64)(cols / cpad) * csize;
    GRID_STRIDE(i, n) {
        i64 r = pad_src(i / cols, rsize, rpad), c = pad_src(i % cols, csize, cpad);
        y[i] = (r < 0 || c < 0) ? 0.0f : x[r * xcols + c];
    }
}

// pad_grad_f32: dx (rows × cols logical) from dy (stored): the entries Pad
// took from x; n = rows·cols.
extern "C" __global__ void pad_grad_f32(float* dx, const float* dy, int rsize, int rpad, int cols, int csize, int cpad, i64 n) {
    i64 ycols = (i64)(cols / csize) * cpad;
    GRID_STRIDE(i, n) dx[i] = dy[pad_dst(i / cols, rsize, rpad) * ycols + pad_dst(i % cols, csize, cpad)];
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
