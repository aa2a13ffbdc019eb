// Precision conversions between float32 and bfloat16 (GEMM inputs).
extern "C" __global__ void f32_to_bf16_kernel(bf16_t* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = f32_to_bf16(x[i]);
}
// f32_to_bf16_pad_kernel: x is rows×cols fp32 (row-major, rows xld ≥ cols
// apart); out gets it as rows of ld ≥ cols bf16 elements, the columns from
// cols to ld zero (GEMM operands with 16-byte-aligned leading dimensions:
// ld is a multiple of 8). Each thread writes 8 elements with one 16-byte
// store.
extern "C" __global__ void f32_to_bf16_pad_kernel(bf16_t* out, const float* x, i64 rows, int cols, int xld, int ld) {
    int groups = ld >> 3;
    GRID_STRIDE(g, rows * groups) {
        i64 r = g / groups;
        int c = (int)(g - r * groups) << 3;
        ((rpac_bf16x8*)out)[g] = bf16x8_of(x + r * xld, c, cols);
    }
}
// f32_cat_to_bf16_pad_kernel: the concatenation along columns of nparts
// dense row-major fp32 matrices of rows rows (part j at address parts[2j],
// parts[2j+1] columns wide; cols in all) as rows of ld ≥ cols bf16
// elements, zero from column cols on: a Concat that only GEMMs read goes
// straight to their padded bf16 operand.
__device__ __forceinline__ unsigned cat_bf16(const i64* parts, int nparts, i64 r, int c, int cols) {
    if (c >= cols) return 0u;
    int j = 0, start = 0;
    while (j < nparts - 1 && c >= start + (int)parts[2 * j + 1]) {
        start += (int)parts[2 * j + 1];
        j++;
    }
    const float* x = (const float*)parts[2 * j];
    return f32_to_bf16(x[r * parts[2 * j + 1] + (c - start)]);
}
extern "C" __global__ void f32_cat_to_bf16_pad_kernel(bf16_t* out, const i64* parts, int nparts, i64 rows, int cols, int ld) {
    int groups = ld >> 3;
    GRID_STRIDE(g, rows * groups) {
        i64 r = g / groups;
        int c = (int)(g - r * groups) << 3;
        rpac_bf16x8 v;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v.w[e] = cat_bf16(parts, nparts, r, c + 2 * e, cols) | (cat_bf16(parts, nparts, r, c + 2 * e + 1, cols) << 16);
        }
        ((rpac_bf16x8*)out)[g] = v;
    }
}
extern "C" __global__ void bf16_to_f32_kernel(float* out, const bf16_t* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = bf16_to_f32(x[i]);
}
