// fused_ew_f32: a FusedElementwise node (passes.FuseElementwise): a chain of
// elementwise ops evaluated per element in registers, each step the
// formula of the op it replaces (ew_unary, ew_grad, ew_binary), so only
// the chain's inputs are read and only its output is written.
//
// ins: nin input pointers. view: dims[rank], then one stride row per
// input (0 on broadcast axes). dense[k] != 0: input k has the output's
// shape (read at i, no index arithmetic). prog: four ints per step (kind:
// 0 binary, 1 unary, 2 gradient, 3 dropout; op code, or for a dropout the
// slot of its stream key among k0..k7; first and second register),
// params: three floats per step (a dropout's: its scale, its threshold's
// bits, 1 when it keeps everything). Registers 0..nin-1 hold the inputs,
// nin+j step j's result; the last step's is written. A dropout step draws
// for element i exactly what dropout_f32 draws for element i of its key.
//
// The registers live in shared memory, a column per thread (R[k][t]: the
// threads of a warp touch 32 consecutive words), since an array indexed by
// values known only at run time would sit in local memory; the steps and
// parameters are copied to shared memory once per block. blockDim.x ≤
// FUSED_THREADS.
#define FUSED_MAX_REGS 24
#define FUSED_MAX_STEPS 16
#define FUSED_THREADS 256

extern "C" __global__ void fused_ew_f32(float* out, const unsigned long long* ins, const i64* view, const int* dense,
                                        const int* prog, const float* params, int nin, int nsteps, int rank, i64 n,
                                        unsigned long long k0, unsigned long long k1, unsigned long long k2,
                                        unsigned long long k3, unsigned long long k4, unsigned long long k5,
                                        unsigned long long k6, unsigned long long k7) {
    __shared__ float R[FUSED_MAX_REGS][FUSED_THREADS];
    __shared__ int sprog[4 * FUSED_MAX_STEPS];
    __shared__ float sparams[3 * FUSED_MAX_STEPS];
    for (int e = threadIdx.x; e < 4 * nsteps; e += blockDim.x) sprog[e] = prog[e];
    for (int e = threadIdx.x; e < 3 * nsteps; e += blockDim.x) sparams[e] = params[e];
    __syncthreads();
    float* r = &R[0][threadIdx.x];  // register k at r[k * FUSED_THREADS]
#define FR(k) r[(k) * FUSED_THREADS]
    GRID_STRIDE(i, n) {
        for (int k = 0; k < nin; k++) {
            const float* x = (const float*)ins[k];
            FR(k) = dense[k] ? x[i] : x[view_offset_n(i, n, view, view + (1 + k) * rank, rank)];
        }
        for (int j = 0; j < nsteps; j++) {
            const int* s = sprog + 4 * j;
            const float* q = sparams + 3 * j;
            float v;
            switch (s[0]) {
            case 0: v = ew_binary(s[1], FR(s[2]), FR(s[3])); break;
            case 1: v = ew_unary(s[1], FR(s[2]), q[0], q[1], q[2]); break;
            case 2: v = ew_grad(s[1], FR(s[2]), FR(s[3]), q[0], q[1]); break;
            default: {
                unsigned long long key = s[1] == 0 ? k0 : s[1] == 1 ? k1 : s[1] == 2 ? k2 : s[1] == 3 ? k3
                                       : s[1] == 4 ? k4 : s[1] == 5 ? k5 : s[1] == 6 ? k6 : k7;
                unsigned long long thresh = q[2] != 0.0f ? 1ull << 32 : (unsigned long long)__float_as_uint(q[1]);
                v = FR(s[2]) * dropout_scale(key, i, thresh, q[0]);
                break;
            }
            }
            FR(nin + j) = v;
        }
        out[i] = FR(nin + nsteps - 1);
    }
#undef FR
}
