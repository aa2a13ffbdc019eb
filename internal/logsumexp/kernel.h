// exp(src[i]) into dst[i], i < n.
void rpac_exp(float *dst, const float *src, long n);
// Σ exp(x[i] - max) over i < n (n > 0), the maximum (NaNs skipped) into *max.
double rpac_max_sumexp(const float *x, long n, float *max);
