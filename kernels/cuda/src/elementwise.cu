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
extern "C" __global__ void bf16_to_f32_kernel(float* out, const bf16_t* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = bf16_to_f32(x[i]);
}
