// Precision conversions between float32 and bfloat16 (GEMM inputs).
extern "C" __global__ void f32_to_bf16_kernel(bf16_t* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = f32_to_bf16(x[i]);
}
extern "C" __global__ void bf16_to_f32_kernel(float* out, const bf16_t* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = bf16_to_f32(x[i]);
}
