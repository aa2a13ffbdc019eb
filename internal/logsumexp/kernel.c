// The C loops of package logsumexp (see logsumexp.go for the method),
// written on vectors of LANES float32 (GCC/Clang vector extensions): one
// AVX-512 register, two AVX2 or four SSE/NEON registers, whichever the
// clone is compiled for.
#include <math.h> // INFINITY
#include <stdint.h>
#include <string.h>
#include "kernel.h"

#define LANES 16
#define BLOCK 1024

typedef float vf __attribute__((vector_size(LANES * 4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4)));
typedef uint32_t vu __attribute__((vector_size(LANES * 4)));

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

// Every helper is inlined into each clone: a vector passed between
// functions compiled for different targets would change the ABI.
#define INLINE inline __attribute__((always_inline))

static const float lo = -86.64340f, hi = 88.72283f;

// sel is m ? a : b lane by lane (m: all ones or zero).
static INLINE vf sel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }

static INLINE vf splat(float x) { return x - (vf){0}; }

static INLINE vf load(const float *p) {
	vf v;
	memcpy(&v, p, sizeof v);
	return v;
}

// exp2n is exp(c)·2^(bias-127) lane by lane, for c whose n = round(c/ln2)
// keeps n + bias in 1..254: c = n·ln2 + r, |r| <= ln2/2, exp(r) by its
// Taylor polynomial of degree 7, 2^(n+bias-127) by exponent bits.
static INLINE vf exp2n(vf c, int32_t bias) {
	vf t = c * 1.44269504088896341f + 12582912.0f;  // 1.5·2²³: rounds c/ln2
	vf n = t - 12582912.0f;
	vi k = (vi)t - 0x4B400000;
	vf r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln2 in two parts
	vf p = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
	return p * (vf)((vu)(k + bias) << 23);
}

// vexp is exp lane by lane, branch-free: the argument clamped to [lo, hi],
// 2^(n-1)·2 so that n = 128 stays finite, then 0 below lo and +Inf above
// hi (NaN stays NaN through every step).
static INLINE vf vexp(vf x) {
	vf c = sel(x < lo, splat(lo), x);
	c = sel(c > hi, splat(hi), c);
	vf e = exp2n(c, 126) * 2.0f;
	e = sel(x < lo, splat(0), e);
	return sel(x > hi, splat(INFINITY), e);
}

// vexpneg is vexp for arguments that are at most 0 or NaN (x - max in a
// sum): no clamp, 2ⁿ directly (n >= -125 above lo), and one select for the
// arguments below lo (-Inf included), whose lanes computed garbage.
static INLINE vf vexpneg(vf x) { return sel(x < lo, splat(0), exp2n(x, 127)); }

// exp1 is vexp of one value (the tails).
static INLINE float exp1(float x) {
	vf v = splat(x);
	return vexp(v)[0];
}

CLONES void rpac_exp(float *dst, const float *src, long n) {
	long i = 0;
	for (; i + LANES <= n; i += LANES) {
		vf e = vexp(load(src + i));
		memcpy(dst + i, &e, sizeof e);
	}
	for (; i < n; i++) {
		dst[i] = exp1(src[i]);
	}
}

// vmax is the lane-wise larger of a and b, skipping a NaN b.
static INLINE vf vmax(vf a, vf b) { return sel(b > a, b, a); }

// rpac_max is the largest of x[0..n) ignoring NaNs (x[0] when all are NaN),
// in four independent vectors of maxima.
static INLINE float rpac_max(const float *x, long n) {
	vf m0 = splat(x[0]), m1 = m0, m2 = m0, m3 = m0;
	long i = 0;
	for (; i + 4 * LANES <= n; i += 4 * LANES) {
		m0 = vmax(m0, load(x + i));
		m1 = vmax(m1, load(x + i + LANES));
		m2 = vmax(m2, load(x + i + 2 * LANES));
		m3 = vmax(m3, load(x + i + 3 * LANES));
	}
	for (; i + LANES <= n; i += LANES) {
		m0 = vmax(m0, load(x + i));
	}
	m0 = vmax(vmax(m0, m1), vmax(m2, m3));
	float r = x[0];
	for (; i < n; i++) {
		r = x[i] > r ? x[i] : r;
	}
	for (int l = 0; l < LANES; l++) {
		r = m0[l] > r ? m0[l] : r;
	}
	return r;
}

// sum_block is Σ exp(x[i] - mx) over at most a block: four vectors of
// LANES float32 sums (independent chains), added lane by lane, then the
// tail.
static INLINE float sum_block(const float *x, long n, float mx) {
	vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
	long i = 0;
	for (; i + 4 * LANES <= n; i += 4 * LANES) {
		s0 += vexpneg(load(x + i) - mx);
		s1 += vexpneg(load(x + i + LANES) - mx);
		s2 += vexpneg(load(x + i + 2 * LANES) - mx);
		s3 += vexpneg(load(x + i + 3 * LANES) - mx);
	}
	for (; i + LANES <= n; i += LANES) {
		s0 += vexpneg(load(x + i) - mx);
	}
	vf s = (s0 + s1) + (s2 + s3);
	float r = 0;
	for (int l = 0; l < LANES; l++) {
		r += s[l];
	}
	for (; i < n; i++) {
		r += exp1(x[i] - mx);
	}
	return r;
}

CLONES double rpac_max_sumexp(const float *x, long n, float *max) {
	float mx = rpac_max(x, n);
	double acc = 0;
	for (long i = 0; i < n; i += BLOCK) {
		long b = n - i < BLOCK ? n - i : BLOCK;
		acc += sum_block(x + i, b, mx);
	}
	*max = mx;
	return acc;
}
