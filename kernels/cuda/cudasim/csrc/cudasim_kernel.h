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

#include "cudasim_abi.h"

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

// Warp operations (cudasim_abi.h's codes): a rendezvous of exactly the
// lanes in the mask.
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

// rpac_mma (prelude.cuh's tensor-core tiles), simulated as WMMA is: a
// fragment holds 8 of the tile's 256 elements in each of the warp's 32
// lanes. Which lane's element e is which tile position is the simulator's
// fragment layout, one per fragment type (rpac_sim_frag_map: entry
// lane·8 + e is r·16 + c), drawn at random per run from a seed the
// simulator prints (RPAC_CUDASIM_MMA_SEED repeats it), since the WMMA API
// leaves the mapping opaque: a kernel that assumes one fails. Fragments of
// one type share one layout, so a kernel may learn it through a product
// (flash.cu's fa_row_ids). rpac_load reads, and rpac_store writes, only
// the calling lane's elements, after checking WMMA's rules (a 32-byte
// aligned pointer; ldm a multiple of 8 for bf16, of 4 for fp32); a lane
// that reads a stored tile before the warp synchronises sees the poison
// of the other lanes' elements. The product is a rendezvous of the warp's
// 32 lanes (as wmma.mma.sync.aligned is warp-collective: a lane that
// skips it is reported, the operation named rpac_mma) at which the
// simulator gathers every lane's operands and gives each lane its
// elements of a·b + c.
#define RPAC_CUDASIM 1
struct rpac_a_row { unsigned short x[8]; };
struct rpac_a_col { unsigned short x[8]; };
struct rpac_b_row { unsigned short x[8]; };
struct rpac_b_col { unsigned short x[8]; };
struct rpac_acc { float x[8]; };
#define RPAC_ACC_N 8

// The fragment types (cudasim_abi.h), by which the layouts go.
static inline int rpac_sim_kind(const rpac_a_row&) { return RPAC_FRAG_A_ROW; }
static inline int rpac_sim_kind(const rpac_a_col&) { return RPAC_FRAG_A_COL; }
static inline int rpac_sim_kind(const rpac_b_row&) { return RPAC_FRAG_B_ROW; }
static inline int rpac_sim_kind(const rpac_b_col&) { return RPAC_FRAG_B_COL; }
static inline int rpac_sim_kind(const rpac_acc&) { return RPAC_FRAG_ACC; }

extern "C" {
// the fragment layout of a kind: 256 tile positions r·16 + c, lane-major
const unsigned char* rpac_sim_frag_map(int kind) __attribute__((const));
// reports a broken WMMA rule at file:line and ends the block (never returns)
void rpac_sim_wmma_fail(const char* op, const void* p, unsigned ldm, unsigned ldm_multiple, const char* file,
                        int line) __attribute__((noreturn));
}

static inline unsigned rpac_sim_lane(void) {
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return t & 31u;
}
// rpac_sim_wmma_rules: WMMA's loads and stores need a 256-bit aligned
// pointer and ldm a multiple of 16 bytes.
static inline void rpac_sim_wmma_rules(const char* op, const void* p, unsigned ldm, unsigned multiple,
                                       const char* file, int line) {
    if (((uintptr_t)p & 31u) != 0 || ldm % multiple != 0) rpac_sim_wmma_fail(op, p, ldm, multiple, file, line);
}
// rpac_sim_load: the lane's elements of the tile at p, element (r, c) at
// p[r·ldm + c] in a row fragment, at p[c·ldm + r] in a col one.
template <class F>
static inline void rpac_sim_load(const char* file, int line, F& f, const unsigned short* p, unsigned ldm) {
    rpac_sim_wmma_rules("rpac_load", p, ldm, 8, file, line);
    int kind = rpac_sim_kind(f);
    bool row = kind == RPAC_FRAG_A_ROW || kind == RPAC_FRAG_B_ROW;
    const unsigned char* m = rpac_sim_frag_map(kind) + rpac_sim_lane() * 8;
    for (int e = 0; e < 8; e++) {
        unsigned r = m[e] >> 4, c = m[e] & 15u;
        f.x[e] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}
#define rpac_load(f, p, ldm) rpac_sim_load(__FILE__, __LINE__, f, p, ldm)
// rpac_sim_store: the lane's elements into the row-major fp32 tile at p.
static inline void rpac_sim_store(const char* file, int line, float* p, const rpac_acc& f, unsigned ldm) {
    rpac_sim_wmma_rules("rpac_store", p, ldm, 4, file, line);
    const unsigned char* m = rpac_sim_frag_map(RPAC_FRAG_ACC) + rpac_sim_lane() * 8;
    for (int e = 0; e < 8; e++) p[(size_t)(m[e] >> 4) * ldm + (m[e] & 15u)] = f.x[e];
}
#define rpac_store(p, f, ldm) rpac_sim_store(__FILE__, __LINE__, p, f, ldm)
// d = a·b + c (the simulator computes it at the rendezvous: the 16 exact
// bf16 products of a row and a column summed in k order, then c added).
template <class A, class B>
static inline void rpac_sim_mma(const char* file, int line, rpac_acc& d, const A& a, const B& b, const rpac_acc& c) {
    rpac_acc r;
    rpac_sim_mma_args q = {a.x, b.x, rpac_sim_kind(a), rpac_sim_kind(b), c.x, r.x};
    rpac_sim_warp(RPAC_MMA_SYNC, 0xffffffffu, (unsigned long long)(uintptr_t)&q, 0, 32, file, line);
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
