// fused_ew_f32: a FusedElementwise node (passes.FuseElementwise): a chain of
// elementwise ops evaluated per element in registers, each step the
// formula of the op it replaces (ew_unary, ew_grad, ew_binary), so only
// the chain's inputs are read and only its output is written.
//
// ins: nin input pointers. view: dims[rank], then one stride row per
// input (0 on broadcast axes). dense[k] != 0: input k has the output's
// shape (read at i, no index arithmetic). prog: four ints per step (kind:
// 0 binary, 1 unary, 2 gradient; op code; first and second register),
// params: three floats per step. Registers 0..nin-1 hold the inputs, nin+j
// step j's result; the last step's is written.
#define FUSED_MAX_REGS 24

extern "C" __global__ void fused_ew_f32(float* out, const unsigned long long* ins, const i64* view, const int* dense,
                                        const int* prog, const float* params, int nin, int nsteps, int rank, i64 n) {
    float r[FUSED_MAX_REGS];
    GRID_STRIDE(i, n) {
        for (int k = 0; k < nin; k++) {
            const float* x = (const float*)ins[k];
            r[k] = dense[k] ? x[i] : x[view_offset_n(i, n, view, view + (1 + k) * rank, rank)];
        }
        for (int j = 0; j < nsteps; j++) {
            const int* s = prog + 4 * j;
            const float* q = params + 3 * j;
            float v;
            switch (s[0]) {
            case 0: v = ew_binary(s[1], r[s[2]], r[s[3]]); break;
            case 1: v = ew_unary(s[1], r[s[2]], q[0], q[1], q[2]); break;
            default: v = ew_grad(s[1], r[s[2]], r[s[3]], q[0], q[1]); break;
            }
            r[nin + j] = v;
        }
        out[i] = r[nin + nsteps - 1];
    }
}
