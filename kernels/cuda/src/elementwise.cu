// Elementwise ops of the IR table, float32, grid-stride loops.

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, i64 n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

extern "C" __global__ void mul_f32(float* out, const float* a, const float* b, i64 n) {
    GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}

// Scale: alpha*x + beta.
extern "C" __global__ void scale_f32(float* out, const float* x, float alpha, float beta, i64 n) {
    GRID_STRIDE(i, n) out[i] = alpha * x[i] + beta;
}

// GELU (exact, erf form as PyTorch's default) and its gradient.
extern "C" __global__ void gelu_fwd_f32(float* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}
extern "C" __global__ void gelu_bwd_f32(float* dx, const float* dy, const float* x, i64 n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
    }
}

extern "C" __global__ void relu_fwd_f32(float* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
extern "C" __global__ void relu_bwd_f32(float* dx, const float* dy, const float* x, i64 n) {
    GRID_STRIDE(i, n) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

extern "C" __global__ void sigmoid_fwd_f32(float* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = 1.0f / (1.0f + expf(-x[i]));
}
extern "C" __global__ void sigmoid_bwd_f32(float* dx, const float* dy, const float* y, i64 n) {
    GRID_STRIDE(i, n) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

// Precision conversions for bf16 activations and GEMM inputs.
extern "C" __global__ void f32_to_bf16_kernel(bf16_t* out, const float* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = f32_to_bf16(x[i]);
}
extern "C" __global__ void bf16_to_f32_kernel(float* out, const bf16_t* x, i64 n) {
    GRID_STRIDE(i, n) out[i] = bf16_to_f32(x[i]);
}
