// Token and position embeddings: gather and its backward (scatter-add).

// out[r, :] = W[ids[r], :] for rows r.
extern "C" __global__ void gather_rows_f32(float* out, const float* W, const int* ids, int rows, int D) {
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* w = W + (i64)ids[r] * D;
    float* o = out + (i64)r * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) o[j] = w[j];
}

// dW[ids[r], :] += dy[r, :] (zero dW first).
extern "C" __global__ void gather_rows_bwd_f32(float* dW, const float* dy, const int* ids, int rows, int D) {
    int r = blockIdx.x;
    if (r >= rows) return;
    float* w = dW + (i64)ids[r] * D;
    const float* d = dy + (i64)r * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) atomicAdd(&w[j], d[j]);
}
