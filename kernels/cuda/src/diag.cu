// Diagnostics the controllers read, reduced on the device so that only
// their counts cross the bus.

// sat_count_f32: *count += the rows of mu [rows, R] whose largest
// membership exceeds thr (compared in double, as the host's
// control.SatFraction compares; thr comes as the bits of a double). Integer sums: the count is exact in any
// order, so the atomics leave a step bit-reproducible.
extern "C" __global__ void sat_count_f32(unsigned long long* count, const float* mu, int R,
                                         unsigned long long thr_bits, i64 rows) {
    double thr = __longlong_as_double((long long)thr_bits);
    unsigned int c = 0;
    GRID_STRIDE(t, rows) {
        const float* m = mu + t * R;
        float mx = m[0];
        for (int r = 1; r < R; r++) mx = fmaxf(mx, m[r]);
        if ((double)mx > thr) c++;
    }
    for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(count, (unsigned long long)c);
}
