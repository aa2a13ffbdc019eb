// The optimizer step on the GPU: global gradient norm and fused AdamW over
// fp32 master weights.

// Sum of squares of g into *acc (double; zero it first). Launch with
// blockDim.x a multiple of 32.
extern "C" __global__ void sumsq_f32(double* acc, const float* g, i64 n) {
    __shared__ float shared[32];
    float s = 0.0f;
    GRID_STRIDE(i, n) s += g[i] * g[i];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) atomicAdd(acc, (double)s);
}

// x *= s (gradient clipping by the global norm).
extern "C" __global__ void scale_inplace_f32(float* x, float s, i64 n) {
    GRID_STRIDE(i, n) x[i] *= s;
}

// AdamW (decoupled weight decay, PyTorch semantics) with bias corrections
// bc1 = 1 - beta1^t, bc2 = 1 - beta2^t computed on the host.
extern "C" __global__ void adamw_f32(float* p, const float* g, float* m, float* v, i64 n, float lr, float beta1,
                                     float beta2, float eps, float weight_decay, float bc1, float bc2) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] * (1.0f - lr * weight_decay);
        p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}
