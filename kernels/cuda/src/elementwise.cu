// Precision conversions between float32 and bfloat16 (GEMM inputs).
extern "C" __global__ void f32_to_bf16_kernel(bf16_t* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = f32_to_bf16(x[i]);
}
// f32_to_bf16_pad_kernel: x is rows×cols fp32 (dense, row-major); out gets
// it as rows of ld ≥ cols bf16 elements, the columns from cols to ld zero
// (GEMM operands with 16-byte-aligned leading dimensions).
extern "C" __global__ void f32_to_bf16_pad_kernel(bf16_t* out, const float* x, i64 rows, int cols, int ld) {
    GRID_STRIDE(i, rows * ld) {
        i64 r = i / ld;
        int c = (int)(i - r * ld);
        out[i] = c < cols ? f32_to_bf16(x[r * cols + c]) : (bf16_t)0;
    }
}
extern "C" __global__ void bf16_to_f32_kernel(float* out, const bf16_t* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = bf16_to_f32(x[i]);
}
