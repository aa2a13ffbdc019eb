// Token and position embeddings: the gather (its backward is
// gather_grad_csr_f32 in graph.cu).

// out[r, :] = W[ids[r], :] for rows r.
extern "C" __global__ void gather_rows_f32(float* out, const float* W, const int* ids, int rows, int D) {
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* w = W + (i64)ids[r] * D;
    float* o = out + (i64)r * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) o[j] = w[j];
}
