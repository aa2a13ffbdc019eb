// cudasim_kernel.h: the simulation header the CUDA simulator's "NVRTC"
// force-includes when it compiles a kernel source with the host C++
// compiler. It maps the CUDA C++ the kernels use onto host C++: the
// execution-space qualifiers vanish, __shared__ becomes per-block storage
// (thread-local to the OS thread that runs the block), the built-in
// indices read the simulated thread's state, and barriers, warp operations
// and atomics call into the simulator (libcudasim), which runs every CUDA
// thread of a block as its own fiber.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <cmath>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __constant__ static
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

struct rpac_sim_view {
    uint3 threadIdx, blockIdx;
    dim3 blockDim, gridDim;
};

extern "C" {
// constant for a CUDA thread (a fiber runs one thread of one block)
const rpac_sim_view* rpac_sim_self(void) __attribute__((const));
void rpac_sim_barrier(const char* file, int line);
unsigned long long rpac_sim_warp(int op, unsigned mask, unsigned long long v, int arg, int width, const char* file,
                                 int line);
void* rpac_sim_dynamic_shared(void);
}

#define threadIdx (rpac_sim_self()->threadIdx)
#define blockIdx (rpac_sim_self()->blockIdx)
#define blockDim (rpac_sim_self()->blockDim)
#define gridDim (rpac_sim_self()->gridDim)
#define warpSize 32

#define __syncthreads() rpac_sim_barrier(__FILE__, __LINE__)

// Warp operations: a rendezvous of exactly the lanes in the mask.
enum { RPAC_SHFL_IDX = 0, RPAC_SHFL_DOWN = 1, RPAC_SHFL_UP = 2, RPAC_SHFL_XOR = 3, RPAC_ANY = 4, RPAC_ALL = 5,
       RPAC_BALLOT = 6, RPAC_SYNCWARP = 7, RPAC_MMA_SYNC = 8 };

template <class T>
static inline T rpac_warp_t(int op, unsigned mask, T v, int arg, int width, const char* f, int l) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp operand");
    unsigned long long b = 0;
    memcpy(&b, &v, sizeof(T));
    b = rpac_sim_warp(op, mask, b, arg, width, f, l);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <class T>
static inline T rpac_shfl_sync(const char* f, int l, unsigned mask, T v, int src, int width = 32) {
    return rpac_warp_t(RPAC_SHFL_IDX, mask, v, src, width, f, l);
}
template <class T>
static inline T rpac_shfl_down_sync(const char* f, int l, unsigned mask, T v, unsigned d, int width = 32) {
    return rpac_warp_t(RPAC_SHFL_DOWN, mask, v, (int)d, width, f, l);
}
template <class T>
static inline T rpac_shfl_up_sync(const char* f, int l, unsigned mask, T v, unsigned d, int width = 32) {
    return rpac_warp_t(RPAC_SHFL_UP, mask, v, (int)d, width, f, l);
}
template <class T>
static inline T rpac_shfl_xor_sync(const char* f, int l, unsigned mask, T v, int m, int width = 32) {
    return rpac_warp_t(RPAC_SHFL_XOR, mask, v, m, width, f, l);
}
static inline void rpac_syncwarp(const char* f, int l, unsigned mask = 0xffffffffu) {
    rpac_sim_warp(RPAC_SYNCWARP, mask, 0, 0, 32, f, l);
}
#define __shfl_sync(...) rpac_shfl_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) rpac_shfl_down_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) rpac_shfl_up_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) rpac_shfl_xor_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __any_sync(mask, pred) ((int)rpac_sim_warp(RPAC_ANY, (mask), (pred) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred) ((int)rpac_sim_warp(RPAC_ALL, (mask), (pred) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __ballot_sync(mask, pred) \
    ((unsigned)rpac_sim_warp(RPAC_BALLOT, (mask), (pred) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __syncwarp(...) rpac_syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)

// Atomics: real atomics (blocks run on several OS threads).
template <class T>
static inline T rpac_atomic_rmw_fp(T* p, T v, int op) {
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    for (;;) {
        T nv = op == 0 ? old + v : (op == 1 ? (v > old ? v : old) : (v < old ? v : old));
        if (__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return old;
    }
}
static inline float atomicAdd(float* p, float v) { return rpac_atomic_rmw_fp(p, v, 0); }
static inline double atomicAdd(double* p, double v) { return rpac_atomic_rmw_fp(p, v, 0); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicMax(int* p, int v) { return rpac_atomic_rmw_fp(p, v, 1); }
static inline int atomicMin(int* p, int v) { return rpac_atomic_rmw_fp(p, v, 2); }
static inline unsigned atomicMax(unsigned* p, unsigned v) { return rpac_atomic_rmw_fp(p, v, 1); }
static inline unsigned atomicMin(unsigned* p, unsigned v) { return rpac_atomic_rmw_fp(p, v, 2); }
template <class T>
static inline T atomicExch(T* p, T v) {
    T old;
    __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
    return old;
}
template <class T>
static inline T atomicCAS(T* p, T cmp, T v) {
    __atomic_compare_exchange(p, &cmp, &v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// Bit casts and the math intrinsics the kernels use.
template <class To, class From>
static inline To rpac_bits(From f) {
    static_assert(sizeof(To) == sizeof(From), "bit cast");
    To t;
    memcpy(&t, &f, sizeof(To));
    return t;
}
static inline float __int_as_float(int i) { return rpac_bits<float>(i); }
static inline float __uint_as_float(unsigned i) { return rpac_bits<float>(i); }
static inline int __float_as_int(float f) { return rpac_bits<int>(f); }
static inline unsigned __float_as_uint(float f) { return rpac_bits<unsigned>(f); }
static inline double __longlong_as_double(long long i) { return rpac_bits<double>(i); }
static inline long long __double_as_longlong(double d) { return rpac_bits<long long>(d); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
// Rounded single operations (never contracted into an FMA; the kernels are
// compiled with -ffp-contract=off as well).
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
using std::isinf;
using std::isnan;
using std::isfinite;

// bfloat16 as cuda_bf16.h has it: conversions round to nearest even.
struct __nv_bfloat16 {
    unsigned short x;
};
static inline __nv_bfloat16 __float2bfloat16(float f) {
    unsigned u = rpac_bits<unsigned>(f);
    __nv_bfloat16 h;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
        h.x = (unsigned short)((u >> 16) | 0x0040u);
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.x = (unsigned short)(u >> 16);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return rpac_bits<float>((unsigned)h.x << 16); }

// rpac_mma (prelude.cuh's tensor-core tiles), simulated: a fragment holds
// the whole 16×16 tile in every lane (element (r, c) at x[r·16 + c]), so
// every lane loads the whole tile and computes the whole product. The
// product is a rendezvous of the warp's 32 lanes (as wmma.mma.sync.aligned
// is warp-collective: a lane that skips it is reported, the operation
// named rpac_mma), and
// rpac_store writes only the lane's share of the tile (the elements e with
// e mod 32 = lane), so a lane that reads the stored tile before the warp
// synchronises sees the poison of the others' elements.
#define RPAC_CUDASIM 1
struct rpac_a_row { unsigned short x[256]; };
struct rpac_a_col { unsigned short x[256]; };
struct rpac_b_row { unsigned short x[256]; };
struct rpac_b_col { unsigned short x[256]; };
struct rpac_acc { float x[256]; };
#define RPAC_ACC_N 256

static inline unsigned rpac_sim_lane(void) {
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return t & 31u;
}
// rpac_sim_tile: element (r, c) of a row-major (row = true) or column-major
// tile at p with leading dimension ldm.
static inline void rpac_sim_tile(unsigned short* x, const unsigned short* p, unsigned ldm, bool row) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) x[r * 16 + c] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
static inline void rpac_load(rpac_a_row& f, const unsigned short* p, unsigned ldm) { rpac_sim_tile(f.x, p, ldm, true); }
static inline void rpac_load(rpac_a_col& f, const unsigned short* p, unsigned ldm) { rpac_sim_tile(f.x, p, ldm, false); }
static inline void rpac_load(rpac_b_row& f, const unsigned short* p, unsigned ldm) { rpac_sim_tile(f.x, p, ldm, true); }
static inline void rpac_load(rpac_b_col& f, const unsigned short* p, unsigned ldm) { rpac_sim_tile(f.x, p, ldm, false); }
static inline void rpac_store(float* p, const rpac_acc& f, unsigned ldm) {
    for (unsigned e = rpac_sim_lane(); e < 256; e += 32) p[(size_t)(e / 16) * ldm + e % 16] = f.x[e];
}
static inline float rpac_sim_bf16(unsigned short h) { return rpac_bits<float>((unsigned)h << 16); }
// d = a·b + c: the 16 products of a row and a column (exact in fp32: bf16
// has 8 significant bits) summed in k order, then c added.
template <class A, class B>
static inline void rpac_sim_mma(const char* file, int line, rpac_acc& d, const A& a, const B& b, const rpac_acc& c) {
    rpac_sim_warp(RPAC_MMA_SYNC, 0xffffffffu, 0, 0, 32, file, line);
    rpac_acc r;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += rpac_sim_bf16(a.x[i * 16 + k]) * rpac_sim_bf16(b.x[k * 16 + j]);
            r.x[i * 16 + j] = s + c.x[i * 16 + j];
        }
    d = r;
}
#define rpac_mma(d, a, b, c) rpac_sim_mma(__FILE__, __LINE__, d, a, b, c)

// Every module has thread-local storage (its __shared__ arrays live
// there); the simulator takes this anchor's block to poison them.
static thread_local char rpac_sim_tls_anchor;
extern "C" __attribute__((visibility("default"))) void* __rpac_tls_anchor(void) { return &rpac_sim_tls_anchor; }

// Kernel entry points: the simulator calls __rpac_entry_NAME(params) with
// CUDA's kernelParams array; __rpac_args_NAME lists the parameter sizes
// (terminated by 0).
template <class... A, size_t... I>
static inline void rpac_call(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_cv<typename std::remove_reference<A>::type>::type*>(a[I])...);
}
template <class... A>
static inline void rpac_invoke(void (*f)(A...), void** a) {
    rpac_call(f, a, std::index_sequence_for<A...>{});
}
template <class... A>
static inline const int* rpac_arg_sizes(void (*)(A...)) {
    static const int s[] = {(int)sizeof(A)..., 0};
    return s;
}
#define RPAC_SIM_ENTRY(name)                                                                                  \
    extern "C" __attribute__((visibility("default"))) void __rpac_entry_##name(void** a) { rpac_invoke(&name, a); } \
    extern "C" __attribute__((visibility("default"))) const int* __rpac_args_##name(void) {                  \
        return rpac_arg_sizes(&name);                                                                         \
    }
