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

// ---- device-resident training state (kernels/cuda/optim.go) ----

// sumsq_parts_f32: the partial sums of squares of many tensors in one
// launch. Entry e of table (three words: the tensor's address, its length,
// its first block) owns the blocks [first, first + ⌈len/chunk⌉); block b
// finds its entry by binary search and writes part[b] = Σ g[i]² over its
// chunk [k·chunk, +chunk) ∩ [0, len), k = b − first, in double, in a fixed
// order (each thread a strided partial, then a tree): the same every run.
// Entries are in order of first; n is the elements of all of them.
// blockDim.x must be 256.
extern "C" __global__ void sumsq_parts_f32(double* part, const unsigned long long* table, int entries, int chunk, i64 n) {
    __shared__ double sh[256];
    int lo_e = table_entry(table, entries, 3, 2, blockIdx.x);
    const float* g = (const float*)table[3 * lo_e];
    i64 len = (i64)table[3 * lo_e + 1];
    i64 lo = ((i64)blockIdx.x - (i64)table[3 * lo_e + 2]) * chunk;
    i64 hi = lo + chunk < len ? lo + chunk : len;
    double s = 0.0;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double x = (double)g[i];
        s = __dadd_rn(s, __dmul_rn(x, x));
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// sum_part_f64: *out = Σ part[0..n) in a fixed order (one block of 1024
// threads: strided partials, then a tree).
extern "C" __global__ void sum_part_f64(double* out, const double* part, i64 n) {
    __shared__ double sh[1024];
    double s = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s = __dadd_rn(s, part[i]);
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

// axpy_acc_f32: y = a·x (first != 0) or y = y + a·x, each operation
// rounded on its own (no FMA), as the host accumulates micro-batch
// gradients.
extern "C" __global__ void axpy_acc_f32(float* y, const float* x, float a, int first, i64 n) {
    GRID_STRIDE(i, n) {
        float t = __fmul_rn(a, x[i]);
        y[i] = first ? t : __fadd_rn(y[i], t);
    }
}

// adamw_elem: training/optim's AdamW on element i, in double with every
// operation rounded on its own, so it equals the host's update. decay =
// 1 − lr·λ (or 1), step = lr / (1 − b1ᵗ), bc2 = √(1 − b2ᵗ).
__device__ __forceinline__ void adamw_elem(float* p, const float* g, float* m, float* v, i64 i, double decay, double b1,
                                           double b2, double step, double bc2, double eps) {
    double c1 = __dsub_rn(1.0, b1), c2 = __dsub_rn(1.0, b2);
    double gi = (double)g[i];
    double mi = __dadd_rn(__dmul_rn(b1, (double)m[i]), __dmul_rn(c1, gi));
    double vi = __dadd_rn(__dmul_rn(b2, (double)v[i]), __dmul_rn(__dmul_rn(c2, gi), gi));
    m[i] = (float)mi;
    v[i] = (float)vi;
    double denom = __dadd_rn(__ddiv_rn(__dsqrt_rn(vi), bc2), eps);
    p[i] = (float)__dsub_rn(__dmul_rn((double)p[i], decay), __ddiv_rn(__dmul_rn(step, mi), denom));
}

__device__ __forceinline__ double f64_of(unsigned long long bits) { return __longlong_as_double((long long)bits); }

// adamw_f64_f32: adamw_elem over one tensor. The coefficients come as the
// bits of doubles: decay, b1, b2, step, bc2, eps.
extern "C" __global__ void adamw_f64_f32(float* p, const float* g, float* m, float* v, i64 n,
                                         unsigned long long decay_bits, unsigned long long b1_bits,
                                         unsigned long long b2_bits, unsigned long long step_bits,
                                         unsigned long long bc2_bits, unsigned long long eps_bits) {
    double decay = f64_of(decay_bits), b1 = f64_of(b1_bits), b2 = f64_of(b2_bits);
    double step = f64_of(step_bits), bc2 = f64_of(bc2_bits), eps = f64_of(eps_bits);
    GRID_STRIDE(i, n) adamw_elem(p, g, m, v, i, decay, b1, b2, step, bc2, eps);
}

// adamw_multi_f64_f32: adamw_elem over many tensors of one step count in
// one launch. Entry e of table (nine words: the parameter's, gradient's
// and moments' addresses, the length, the first block, whether weight
// decay applies, the address of the parameter's bf16 copy for GEMMs or 0,
// and that copy's row length) owns the blocks [first, first + ⌈len/chunk⌉);
// block b finds its entry and updates [k·chunk, +chunk) ∩ [0, len), k =
// b − first, with decay for the entries that decay and 1 for the others;
// with a copy, it writes each new value there too, rounded as
// f32_to_bf16_pad_kernel rounds it, at its place in rows of cols padded to
// eight (the padding, zeroed when the copy was first made, is not
// touched).
extern "C" __global__ void adamw_multi_f64_f32(const unsigned long long* table, int entries, int chunk, i64 n,
                                               unsigned long long decay_bits, unsigned long long b1_bits,
                                               unsigned long long b2_bits, unsigned long long step_bits,
                                               unsigned long long bc2_bits, unsigned long long eps_bits) {
    const unsigned long long* e = table + 9 * table_entry(table, entries, 9, 5, blockIdx.x);
    double decay = e[6] ? f64_of(decay_bits) : 1.0;
    double b1 = f64_of(b1_bits), b2 = f64_of(b2_bits), step = f64_of(step_bits), bc2 = f64_of(bc2_bits), eps = f64_of(eps_bits);
    i64 len = (i64)e[4];
    i64 lo = ((i64)blockIdx.x - (i64)e[5]) * chunk;
    i64 hi = lo + chunk < len ? lo + chunk : len;
    float* p = (float*)e[0];
    bf16_t* copy = (bf16_t*)e[7];
    i64 cols = (i64)e[8], ld = (cols + 7) & ~7ll;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        adamw_elem(p, (const float*)e[1], (float*)e[2], (float*)e[3], i, decay, b1, b2, step, bc2, eps);
        if (copy) {
            i64 r = i / cols;
            copy[r * ld + (i - r * cols)] = f32_to_bf16(p[i]);
        }
    }
}

// scale_multi_f32: x *= s over the tensors of a sumsq_parts_f32 table (the
// gradients of a clipped step) in one launch, block b over its entry's
// chunk as there.
extern "C" __global__ void scale_multi_f32(const unsigned long long* table, int entries, int chunk, float s, i64 n) {
    int e = table_entry(table, entries, 3, 2, blockIdx.x);
    float* x = (float*)table[3 * e];
    i64 len = (i64)table[3 * e + 1];
    i64 lo = ((i64)blockIdx.x - (i64)table[3 * e + 2]) * chunk;
    i64 hi = lo + chunk < len ? lo + chunk : len;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) x[i] = x[i] * s;
}

// ema_f32: the EMA of the weights, s = d·s + (1 − d)·w, each operation
// rounded on its own (no FMA), as training/control's EMA.Update.
extern "C" __global__ void ema_f32(float* s, const float* w, float d, i64 n) {
    float c = 1.0f - d;
    GRID_STRIDE(i, n) s[i] = __fadd_rn(__fmul_rn(d, s[i]), __fmul_rn(c, w[i]));
}
