// libcudasim: a CUDA simulator on the CPU. It exports the subset of the CUDA
// driver API, NVRTC and cuBLASLt that rpac binds at run time, so rpac's
// unchanged binding code (kernels/cuda) and unchanged kernel sources run
// without a GPU:
//
//   * "NVRTC" compiles a kernel source with the host C++ compiler against
//     cudasim_kernel.h into a shared object, returned as the "cubin" (an
//     ELF image) or the "PTX" (the same image as text);
//   * cuModuleLoadData loads that object; cuLaunchKernel runs every block
//     of the grid (blocks spread over worker threads) with every CUDA thread
//     a fiber of its own, so __syncthreads is a real barrier and warp
//     operations are rendezvous of exactly the lanes in their mask;
//   * device memory is host memory with a guard page after each allocation
//     (the last byte of an allocation is the last byte before the guard),
//     filled with NaN when allocated; shared memory is NaN-poisoned for
//     every block; an access outside memory is reported with the kernel,
//     block and thread and becomes the context's sticky error;
//   * a differential mode runs each launch twice, in another block and
//     thread order and with another shared-memory poison, and compares;
//   * cuBLASLt matmuls are computed from their descriptors (layouts,
//     orders, leading dimensions, batches, transposes, epilogues) with fp32
//     accumulation, through OpenBLAS when it can be loaded.
#include <dlfcn.h>
#include <elf.h>
#include <math.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cudasim_abi.h"

#ifndef RPAC_SIM_REV
#define RPAC_SIM_REV 1
#endif

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ---------------------------------------------------------------- errors

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_LAUNCH_FAILED = 719,
};

const char* cuda_error_name(int r) {
    switch (r) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_IMAGE: return "device kernel image is invalid";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
    case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "too many resources requested for launch";
    case CUDA_ERROR_ILLEGAL_INSTRUCTION: return "an illegal instruction was encountered";
    case CUDA_ERROR_MISALIGNED_ADDRESS: return "misaligned address";
    case CUDA_ERROR_LAUNCH_FAILED: return "unspecified launch failure";
    }
    return "unknown error";
}

std::string fmt(const char* f, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

long env_long(const char* name, long def) {
    const char* s = getenv(name);
    return s && *s ? strtol(s, nullptr, 10) : def;
}

// ---------------------------------------------------------------- state

struct Context {
    int sticky = 0;        // sticky error of the context (0: none)
    std::string detail;    // what the sticky error was
};

std::mutex g_mu;             // guards allocations, modules, the context
bool g_init = false;
Context g_ctx;               // the device's primary context
thread_local Context* t_cur = nullptr;  // the calling thread's current context
std::string g_err_text;      // cuGetErrorString's text for the sticky error

// Configuration (rpacsim_config).
std::atomic<int> cfg_diff{(int)env_long("RPAC_CUDASIM_DIFF", 0)};
std::atomic<int> cfg_verbose{(int)env_long("RPAC_CUDASIM_VERBOSE", 0)};
// no_cubin: nvrtcGetCUBINSize/nvrtcGetCUBIN fail, as with an NVRTC that
// cannot give a cubin (tests the PTX fallback).
std::atomic<int> cfg_no_cubin{(int)env_long("RPAC_CUDASIM_NO_CUBIN", 0)};
std::atomic<long> stat_launches{0}, stat_blocks{0}, stat_gemms{0}, stat_diff_launches{0};
// stat_diff_by_kernel: the differential launches of each kernel, by name
// (rpacsim_stat("diff:NAME")), so a test can tell its kernel was compared.
std::mutex stat_diff_mu;
std::map<std::string, long> stat_diff_by_kernel;
std::atomic<long> stat_cubin_loads{0}, stat_ptx_loads{0};
std::atomic<long> stat_lt_descs{0}, stat_lt_layouts{0}, stat_lt_heuristics{0}, stat_lt_live{0};

// ---------------------------------------------------------------- fragment layouts

// The WMMA fragment layouts (cudasim_kernel.h): for each fragment type, a
// permutation of the tile's 256 positions over (lane, element), entry
// lane·8 + e holding r·16 + c. They are drawn from a seed at cuInit
// (RPAC_CUDASIM_MMA_SEED, else a random one) or by rpacsim_config
// ("mma_seed"); the first kernel to use a fragment prints the seed.
unsigned char g_frag_map[RPAC_FRAG_KINDS][256];
std::atomic<unsigned long> g_mma_seed{0};
std::atomic<bool> g_mma_seed_told{false};

uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// draw_frag_layouts draws every fragment type's layout from seed (a
// Fisher-Yates shuffle each). Called with no launch running.
void draw_frag_layouts(unsigned long seed) {
    uint64_t x = seed;
    for (int k = 0; k < RPAC_FRAG_KINDS; k++) {
        unsigned char* m = g_frag_map[k];
        for (int i = 0; i < 256; i++) m[i] = (unsigned char)i;
        for (int i = 255; i > 0; i--) std::swap(m[i], m[splitmix64(&x) % (uint64_t)(i + 1)]);
    }
    g_mma_seed = seed;
    g_mma_seed_told = false;
}

// initial_mma_seed: RPAC_CUDASIM_MMA_SEED, else one from the clock and
// the process (never 0 by chance alone, but 0 is a seed like any other).
unsigned long initial_mma_seed() {
    const char* s = getenv("RPAC_CUDASIM_MMA_SEED");
    if (s && *s) return strtoul(s, nullptr, 10);
    uint64_t x = (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count() ^ ((uint64_t)getpid() << 32);
    return (unsigned long)(splitmix64(&x) & 0xffffffffull);
}

size_t page_size() {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

void set_sticky(int code, const std::string& detail) {
    // g_mu held by the caller, or a launch that owns the device.
    if (g_ctx.sticky == 0) {
        g_ctx.sticky = code;
        g_ctx.detail = detail;
        g_err_text = std::string(cuda_error_name(code)) + ": " + detail;
        fprintf(stderr, "cudasim: %s\n", g_err_text.c_str());
    }
}

// ---------------------------------------------------------------- memory

// An allocation: [base, base+size) ends where a PROT_NONE guard page begins;
// a guard page also precedes the mapping's data pages.
struct Alloc {
    uintptr_t base;
    size_t size;
    uintptr_t map;
    size_t map_len;
};
std::map<uintptr_t, Alloc> g_allocs;  // by base
long g_alloc_bytes = 0;

// alignment of an allocation of n bytes: the largest power of two up to 16
// dividing n (so the end is flush with the guard page and every element
// is naturally aligned).
size_t alloc_align(size_t n) {
    size_t a = 16;
    while (a > 1 && n % a) a >>= 1;
    return a;
}

// kAllocAlign: the alignment of an allocation's start (cuMemAlloc's on a GPU).
constexpr size_t kAllocAlign = 256;

// guarded_map maps n bytes that start at a multiple of align (a power of
// two) and end as close to a trailing guard page as that allows: flush
// against it when align divides n (there is a guard page in front too);
// returns the data pointer or 0.
uintptr_t guarded_map(size_t n, size_t align, size_t* map_out, size_t* len_out) {
    size_t ps = page_size();
    size_t data_pages = (n + align - 1 + ps - 1) / ps;
    size_t len = (data_pages + 2) * ps;
    void* m = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 0;
    uintptr_t mb = (uintptr_t)m;
    if (mprotect((void*)(mb + ps), data_pages * ps, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, len);
        return 0;
    }
    uintptr_t end = mb + ps + data_pages * ps;
    uintptr_t base = (end - n) & ~(uintptr_t)(align - 1);
    *map_out = mb;
    *len_out = len;
    return base;
}

// An allocation's slack: the bytes from its end to its guard page (fewer
// than kAllocAlign), filled at allocation with quiet NaNs whose payloads
// hash their addresses, so a read there gives NaN and a write, even of a
// value read from another slack, changes them.
uintptr_t slack_end(const Alloc& a) { return a.map + a.map_len - page_size(); }

unsigned char slack_byte(uintptr_t p) {
    uint64_t x = p >> 2;
    uint32_t w = 0xffc00000u | (uint32_t)(splitmix64(&x) & 0x3fffffu);
    return (unsigned char)(w >> (8 * (p & 3)));
}

void fill_slack(const Alloc& a) {
    for (uintptr_t p = a.base + a.size; p < slack_end(a); p++) *(unsigned char*)p = slack_byte(p);
}

// slack_written: how far past the allocation's end the first changed byte
// of its slack lies, or -1.
long slack_written(const Alloc& a) {
    for (uintptr_t p = a.base + a.size; p < slack_end(a); p++)
        if (*(const unsigned char*)p != slack_byte(p)) return (long)(p - a.base - a.size);
    return -1;
}

// find_alloc returns the allocation holding [p, p+n) or nullptr.
const Alloc* find_alloc(uintptr_t p, size_t n) {
    auto it = g_allocs.upper_bound(p);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    const Alloc& a = it->second;
    if (p >= a.base && p + n <= a.base + std::max<size_t>(a.size, 1) && p + n >= p) return &a;
    return nullptr;
}

// describe_addr says where p lies relative to the allocations.
std::string describe_addr(uintptr_t p) {
    for (auto& kv : g_allocs) {
        const Alloc& a = kv.second;
        if (p >= a.map && p < a.map + a.map_len) {
            if (p >= a.base + a.size)
                return fmt("%zu bytes past the end of the %zu-byte allocation at %#lx", (size_t)(p - a.base - a.size),
                           a.size, (unsigned long)a.base);
            if (p < a.base)
                return fmt("%zu bytes before the start of the %zu-byte allocation at %#lx", (size_t)(a.base - p),
                           a.size, (unsigned long)a.base);
            return fmt("inside the %zu-byte allocation at %#lx", a.size, (unsigned long)a.base);
        }
    }
    return "outside every allocation";
}

// ---------------------------------------------------------------- modules

struct Function;
struct Module {
    void* handle = nullptr;
    std::string path;
    uintptr_t tls_size = 0;  // PT_TLS memsz: the module's static __shared__ arrays
    void* (*tls_anchor)() = nullptr;
    std::map<std::string, Function*> fns;
};
struct Function {
    Module* mod;
    std::string name;
    void (*entry)(void**);
    std::vector<int> arg_sizes;
    unsigned max_dyn = 48u << 10;  // dynamic shared memory a launch may have (cuFuncSetAttribute)
};

// kSharedOptin: the most shared memory a block may opt into (sm_90: 227 KiB).
constexpr unsigned kSharedOptin = 227u << 10;

std::string g_lib_dir;  // the folder of this library (cudasim_kernel.h lives there)

void find_lib_dir() {
    Dl_info info;
    if (dladdr((void*)&find_lib_dir, &info) && info.dli_fname) {
        std::string p = info.dli_fname;
        char* real = realpath(p.c_str(), nullptr);
        if (real) {
            p = real;
            free(real);
        }
        size_t s = p.rfind('/');
        g_lib_dir = s == std::string::npos ? "." : p.substr(0, s);
    }
}

// ---------------------------------------------------------------- fibers

struct Fiber;
struct Worker;

#if defined(__x86_64__)
extern "C" void rpac_sim_switch(void** save_sp, void* new_sp);
extern "C" void rpac_sim_fiber_start();
asm(R"(
.text
.globl rpac_sim_switch
.type rpac_sim_switch,@function
rpac_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size rpac_sim_switch, .-rpac_sim_switch
.globl rpac_sim_fiber_start
.type rpac_sim_fiber_start,@function
rpac_sim_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
.size rpac_sim_fiber_start, .-rpac_sim_fiber_start
)");
#endif

// F_FAILED: stopped by a diagnostic (the block ends with its error).
enum FState { F_READY, F_BARRIER, F_WARP, F_EXITED, F_FAILED };

struct Fiber {
    // What the kernel sees (rpac_sim_self): must stay first.
    unsigned tid[3], bid[3], bdim[3], gdim[3];
    Worker* w;
    int lin;  // linear thread index in the block
    FState state;
    // barrier / warp wait
    const char* file;
    int line;
    int op;
    unsigned mask;
    unsigned long long val, result;
    int arg, width;
    // the last warp op this lane completed (to tell a mask mismatch from a
    // lane that exited or moved on)
    const char* last_file;
    int last_line, last_op;
    unsigned last_mask;
#if defined(__x86_64__)
    void* sp;
#else
    ucontext_t uc;
#endif
    char* stack;
};

constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 128 << 10;

struct LaunchJob;

struct Worker {
    std::thread th;
    Fiber fibers[kMaxThreads];
    char* stacks = nullptr;
    char* dyn_shared = nullptr;  // kMaxDyn bytes ending at a guard page
    size_t dyn_cap = 0;
    void* dyn_ptr = nullptr;
#if defined(__x86_64__)
    void* sched_sp = nullptr;
#else
    ucontext_t sched_uc;
#endif
    sigjmp_buf jb;
    volatile bool in_kernel = false;
    Fiber* volatile cur = nullptr;
    char* altstack = nullptr;
    // block state
    int nthreads = 0, live = 0, at_barrier = 0;
    const char* bar_file = nullptr;
    int bar_line = 0;
    uint64_t ready[kMaxThreads / 64];
    unsigned warp_arrived[kMaxThreads / 32];  // lanes waiting at a warp op
    unsigned warp_exited[kMaxThreads / 32];   // lanes that have exited
    bool reverse = false;
    std::string error;  // a block's failure
    int error_code = 0;
    // fault info from the signal handler
    volatile uintptr_t fault_addr = 0;
    volatile int fault_sig = 0, fault_write = -1;
    volatile uintptr_t fault_pc = 0;
};

thread_local Worker* t_worker __attribute__((tls_model("initial-exec"))) = nullptr;

void set_ready(Worker* w, int i) { w->ready[i >> 6] |= 1ull << (i & 63); }
void clear_ready(Worker* w, int i) { w->ready[i >> 6] &= ~(1ull << (i & 63)); }
int next_ready(Worker* w) {
    int words = (w->nthreads + 63) >> 6;
    if (!w->reverse) {
        for (int k = 0; k < words; k++)
            if (w->ready[k]) return k * 64 + __builtin_ctzll(w->ready[k]);
    } else {
        for (int k = words - 1; k >= 0; k--)
            if (w->ready[k]) return k * 64 + 63 - __builtin_clzll(w->ready[k]);
    }
    return -1;
}

struct LaunchJob {
    Function* fn;
    unsigned grid[3], block[3];
    unsigned shared;
    void** args;
    long nblocks;
    bool reverse;
    unsigned char poison;
    std::atomic<long> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::string error;
    int error_code = 0;
};

void yield_to_sched(Fiber* f) {
    Worker* w = f->w;
#if defined(__x86_64__)
    rpac_sim_switch(&f->sp, w->sched_sp);
#else
    swapcontext(&f->uc, &w->sched_uc);
#endif
}

thread_local LaunchJob* t_cur_job = nullptr;

void fiber_main(Fiber* f) {
    t_cur_job->fn->entry(t_cur_job->args);
    Worker* w = f->w;
    f->state = F_EXITED;
    w->live--;
    yield_to_sched(f);
    abort();  // never resumed
}

#if !defined(__x86_64__)
void fiber_main_uc(unsigned lo, unsigned hi) {
    fiber_main((Fiber*)(((uintptr_t)hi << 32) | lo));
}
#endif

void fiber_init(Worker* w, Fiber* f) {
#if defined(__x86_64__)
    uintptr_t top = ((uintptr_t)f->stack + kStack) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)(top - 64);
    uint32_t csr[2];
    asm volatile("stmxcsr %0" : "=m"(csr[0]));
    asm volatile("fnstcw %0" : "=m"(csr[1]));
    csr[1] &= 0xffff;
    memcpy(&sp[0], csr, 8);
    sp[1] = 0;                      // r15
    sp[2] = 0;                      // r14
    sp[3] = (uint64_t)&fiber_main;  // r13
    sp[4] = (uint64_t)f;            // r12
    sp[5] = 0;                      // rbx
    sp[6] = 0;                      // rbp
    sp[7] = (uint64_t)&rpac_sim_fiber_start;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = kStack;
    f->uc.uc_link = nullptr;
    uintptr_t p = (uintptr_t)f;
    makecontext(&f->uc, (void (*)())fiber_main_uc, 2, (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
#endif
    (void)w;
}

const char* op_name(int op) {
    static const char* n[] = {"__shfl_sync", "__shfl_down_sync", "__shfl_up_sync", "__shfl_xor_sync",
                              "__any_sync",  "__all_sync",       "__ballot_sync",  "__syncwarp",
                              "rpac_mma"};
    return op >= 0 && op < 9 ? n[op] : "warp op";
}

std::string where(Fiber* f) {
    return fmt("block (%u,%u,%u) thread (%u,%u,%u)", f->bid[0], f->bid[1], f->bid[2], f->tid[0], f->tid[1], f->tid[2]);
}

void block_error(Worker* w, int code, const std::string& msg) {
    if (w->error_code == 0) {
        w->error_code = code;
        w->error = msg;
    }
}

// gone_lane describes lane l (of the warp at base), which has exited or
// moved on while f waits for it at a warp op: when it completed the same op
// at the same line with another mask, the masks disagree.
std::string gone_lane(Worker* w, Fiber* f, int base, int l, unsigned mask, const char* what) {
    Fiber* o = &w->fibers[base + l];
    if (o->last_file == f->file && o->last_line == f->line && o->last_op == f->op && o->last_mask != mask)
        return fmt("%s at %s:%d in %s: mismatched masks: lane %d ran it with mask %#x, this lane with mask %#x",
                   op_name(f->op), f->file, f->line, where(f).c_str(), l, o->last_mask, mask);
    return fmt("%s at %s:%d in %s: lane %d of mask %#x %s", op_name(f->op), f->file, f->line, where(f).c_str(), l,
               mask, what);
}

float bf16_value(unsigned short h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// mma_complete computes the warp's product once all 32 lanes wait at it:
// the tiles a and b gathered from every lane's elements through their
// layouts, and each lane's elements of a·b + c through the accumulator's
// (each the 16 exact products of a row and a column summed in k order,
// then c added). The lanes' fragments stay put while they wait.
void mma_complete(Worker* w, int base) {
    float A[256], B[256];
    const unsigned char* acc = g_frag_map[RPAC_FRAG_ACC];
    for (int l = 0; l < 32; l++) {
        const rpac_sim_mma_args* q = (const rpac_sim_mma_args*)(uintptr_t)w->fibers[base + l].val;
        const unsigned char* ma = g_frag_map[q->a_kind] + l * 8;
        const unsigned char* mb = g_frag_map[q->b_kind] + l * 8;
        for (int e = 0; e < 8; e++) {
            A[ma[e]] = bf16_value(q->a[e]);
            B[mb[e]] = bf16_value(q->b[e]);
        }
    }
    for (int l = 0; l < 32; l++) {
        const rpac_sim_mma_args* q = (const rpac_sim_mma_args*)(uintptr_t)w->fibers[base + l].val;
        for (int e = 0; e < 8; e++) {
            int i = acc[l * 8 + e] >> 4, j = acc[l * 8 + e] & 15;
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += A[i * 16 + k] * B[k * 16 + j];
            q->d[e] = s + q->c[e];
        }
    }
}

// try_complete_warp checks whether the warp op lane f waits at can complete
// and completes it (every lane of the mask arrived at the same op).
void try_complete_warp(Worker* w, Fiber* f) {
    int warp = f->lin >> 5;
    int base = warp * 32;
    unsigned mask = f->mask;
    int lanes = std::min(32, w->nthreads - base);
    w->warp_arrived[warp] |= 1u << (f->lin & 31);
    if ((w->warp_arrived[warp] & mask) != mask && !(w->warp_exited[warp] & mask) &&
        (lanes == 32 || !(mask >> lanes))) return;  // others still to come
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        if (l >= lanes) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        fmt("%s at %s:%d in %s: mask %#x names lane %d, which does not exist (the block has %d threads)",
                            op_name(f->op), f->file, f->line, where(f).c_str(), mask, l, w->nthreads));
            return;
        }
        Fiber* o = &w->fibers[base + l];
        if (o->state == F_EXITED) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION, gone_lane(w, f, base, l, mask, "has exited"));
            return;
        }
        if (o->state != F_WARP) return;  // not arrived yet (running, or at a barrier: a deadlock shows later)
        if (o->op != f->op || o->line != f->line || o->file != f->file || o->mask != mask) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        fmt("%s at %s:%d (mask %#x) in %s: lane %d waits at %s at %s:%d (mask %#x) instead",
                            op_name(f->op), f->file, f->line, mask, where(f).c_str(), l, op_name(o->op), o->file,
                            o->line, o->mask));
            return;
        }
    }
    // Every lane arrived: compute each lane's result.
    if (f->op == RPAC_MMA_SYNC) mma_complete(w, base);
    unsigned long long vals[32];
    for (int l = 0; l < 32; l++) vals[l] = (mask >> l & 1) ? w->fibers[base + l].val : 0;
    unsigned any = 0, all = 1, ballot = 0;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1) {
            if (vals[l]) ballot |= 1u << l;
        }
    any = ballot != 0;
    all = ballot == mask;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        Fiber* o = &w->fibers[base + l];
        int width = o->width;
        if (width <= 0 || width > 32 || (width & (width - 1))) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        fmt("%s at %s:%d: width %d is not a power of two up to 32", op_name(o->op), o->file, o->line,
                            width));
            return;
        }
        int seg = l & ~(width - 1);
        int src = l;
        switch (o->op) {
        case 0: src = seg + (o->arg & (width - 1)); break;
        case 1: src = (l - seg) + o->arg < width ? l + o->arg : l; break;
        case 2: src = (l - seg) - o->arg >= 0 ? l - o->arg : l; break;
        case 3: src = seg + (((l - seg) ^ o->arg) & (width - 1)); if (((l - seg) ^ o->arg) >= width) src = l; break;
        }
        if (o->op <= 3) {
            if (!(mask >> src & 1)) {
                block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                            fmt("%s at %s:%d in %s: lane %d reads lane %d, which is not in mask %#x", op_name(o->op),
                                o->file, o->line, where(o).c_str(), l, src, mask));
                return;
            }
            o->result = vals[src];
        } else if (o->op == 4) {
            o->result = any;
        } else if (o->op == 5) {
            o->result = all;
        } else if (o->op == 6) {
            o->result = ballot;
        } else {
            o->result = 0;
        }
    }
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1) {
            Fiber* o = &w->fibers[base + l];
            o->last_file = o->file;
            o->last_line = o->line;
            o->last_op = o->op;
            o->last_mask = o->mask;
            o->state = F_READY;
            set_ready(w, base + l);
        }
    w->warp_arrived[warp] &= ~mask;
}

// lane_exited: a lane that exits while lanes of its warp wait for it at a
// warp op is an error.
void lane_exited(Worker* w, Fiber* f) {
    int warp = f->lin >> 5, base = warp * 32;
    unsigned bit = 1u << (f->lin & 31);
    w->warp_exited[warp] |= bit;
    unsigned waiting = w->warp_arrived[warp];
    for (int l = 0; waiting && l < 32; l++) {
        if (!(waiting >> l & 1)) continue;
        Fiber* o = &w->fibers[base + l];
        if (o->mask & bit) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION, gone_lane(w, o, base, f->lin & 31, o->mask, "has exited"));
            return;
        }
    }
}

void try_complete_barrier(Worker* w) {
    if (w->at_barrier == 0 || w->at_barrier < w->live) return;
    // every live thread waits: release them (checking they wait at one barrier)
    for (int i = 0; i < w->nthreads; i++) {
        Fiber* f = &w->fibers[i];
        if (f->state != F_BARRIER) continue;
        if (f->line != w->bar_line || f->file != w->bar_file) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        fmt("divergent __syncthreads: %s waits at %s:%d while other threads wait at %s:%d",
                            where(f).c_str(), f->file, f->line, w->bar_file, w->bar_line));
            return;
        }
        f->state = F_READY;
        set_ready(w, i);
    }
    w->at_barrier = 0;
}

std::string deadlock_report(Worker* w) {
    std::string s = "deadlock: no thread of the block can go on:";
    int shown = 0;
    for (int i = 0; i < w->nthreads && shown < 6; i++) {
        Fiber* f = &w->fibers[i];
        if (f->state == F_BARRIER) {
            s += fmt(" %s waits at __syncthreads %s:%d;", where(f).c_str(), f->file, f->line);
            shown++;
        } else if (f->state == F_WARP) {
            s += fmt(" %s waits at %s %s:%d (mask %#x);", where(f).c_str(), op_name(f->op), f->file, f->line, f->mask);
            shown++;
        }
    }
    return s;
}

// run_block runs one block of the job on worker w; false on a failure
// (w->error set).
bool run_block(Worker* w, LaunchJob* job, long lin_block) {
    unsigned gx = job->grid[0], gy = job->grid[1];
    unsigned bx = job->block[0], by = job->block[1], bz = job->block[2];
    unsigned b0 = (unsigned)(lin_block % gx), b1 = (unsigned)((lin_block / gx) % gy),
             b2 = (unsigned)(lin_block / ((long)gx * gy));
    int n = (int)(bx * by * bz);
    w->nthreads = n;
    w->live = n;
    w->at_barrier = 0;
    w->bar_file = nullptr;
    w->bar_line = 0;
    w->reverse = job->reverse;
    memset(w->ready, 0, sizeof w->ready);
    memset(w->warp_arrived, 0, sizeof w->warp_arrived);
    memset(w->warp_exited, 0, sizeof w->warp_exited);
    // shared memory: static (the module's TLS block) and dynamic, poisoned
    Module* m = job->fn->mod;
    if (m->tls_anchor) {
        m->tls_anchor();
        void* tls = nullptr;
        if (dlinfo(m->handle, RTLD_DI_TLS_DATA, &tls) == 0 && tls && m->tls_size) memset(tls, job->poison, m->tls_size);
    }
    if (job->shared) {
        uintptr_t end = (uintptr_t)w->dyn_shared + w->dyn_cap;
        uintptr_t p = (end - job->shared) & ~(uintptr_t)(alloc_align(job->shared) - 1);
        memset((void*)p, job->poison, end - p);
        w->dyn_ptr = (void*)p;
    } else {
        w->dyn_ptr = (void*)((uintptr_t)w->dyn_shared + w->dyn_cap);  // any access faults
    }
    for (int i = 0; i < n; i++) {
        Fiber* f = &w->fibers[i];
        f->w = w;
        f->lin = i;
        f->tid[0] = i % bx;
        f->tid[1] = (i / bx) % by;
        f->tid[2] = i / (bx * by);
        f->bid[0] = b0;
        f->bid[1] = b1;
        f->bid[2] = b2;
        memcpy(f->bdim, job->block, sizeof f->bdim);
        memcpy(f->gdim, job->grid, sizeof f->gdim);
        f->state = F_READY;
        f->last_file = nullptr;
        f->last_line = 0;
        f->last_op = -1;
        f->last_mask = 0;
        fiber_init(w, f);
        set_ready(w, i);
    }
    w->error.clear();
    w->error_code = 0;
    w->fault_addr = 0;
    w->fault_sig = 0;
    if (sigsetjmp(w->jb, 1) != 0) {
        // a fault in a fiber (signal handler jumped here)
        w->in_kernel = false;
        Fiber* f = w->cur;
        std::string who = f ? where(f) : std::string("?");
        std::string at;
        Dl_info di;
        if (w->fault_pc && dladdr((void*)w->fault_pc, &di) && di.dli_sname)
            at = fmt(" in %s+%#lx", di.dli_sname, (unsigned long)(w->fault_pc - (uintptr_t)di.dli_saddr));
        if (w->fault_sig == SIGFPE) {
            block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        fmt("arithmetic exception (integer division by zero?) in kernel %s %s%s",
                            job->fn->name.c_str(), who.c_str(), at.c_str()));
        } else {
            std::lock_guard<std::mutex> lk(g_mu);
            const char* rw = w->fault_write == 1 ? "write" : (w->fault_write == 0 ? "read" : "access");
            block_error(w, CUDA_ERROR_ILLEGAL_ADDRESS,
                        fmt("invalid %s of address %#lx (%s) by kernel %s %s%s", rw, (unsigned long)w->fault_addr,
                            describe_addr(w->fault_addr).c_str(), job->fn->name.c_str(), who.c_str(), at.c_str()));
        }
        return false;
    }
    for (;;) {
        if (w->error_code) return false;
        int i = next_ready(w);
        if (i < 0) {
            if (w->live == 0) return true;
            try_complete_barrier(w);
            if (w->error_code) return false;
            if (next_ready(w) >= 0) continue;
            block_error(w, CUDA_ERROR_LAUNCH_FAILED,
                        fmt("kernel %s: %s", job->fn->name.c_str(), deadlock_report(w).c_str()));
            return false;
        }
        Fiber* f = &w->fibers[i];
        clear_ready(w, i);
        w->cur = f;
        w->in_kernel = true;
#if defined(__x86_64__)
        rpac_sim_switch(&w->sched_sp, f->sp);
#else
        swapcontext(&w->sched_uc, &f->uc);
#endif
        w->in_kernel = false;
        w->cur = nullptr;
        if (f->state == F_WARP) {
            try_complete_warp(w, f);
        } else if (f->state == F_BARRIER) {
            try_complete_barrier(w);
        } else if (f->state == F_EXITED) {
            lane_exited(w, f);
            try_complete_barrier(w);
        }
    }
}

// ---------------------------------------------------------------- workers

std::mutex g_pool_mu;
std::condition_variable g_pool_cv, g_done_cv;
std::vector<Worker*> g_workers;
LaunchJob* g_job = nullptr;
long g_job_gen = 0;
int g_busy = 0;

void worker_setup(Worker* w) {
    size_t ps = page_size();
    // fiber stacks, each above a guard page
    size_t per = kStack + ps;
    w->stacks = (char*)mmap(nullptr, per * kMaxThreads, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    for (int i = 0; i < kMaxThreads; i++) {
        char* s = w->stacks + i * per;
        mprotect(s, ps, PROT_NONE);
        w->fibers[i].stack = s + ps;
    }
    // dynamic shared memory: the opt-in's most, flush against a guard page
    size_t map, len;
    w->dyn_cap = kSharedOptin;
    uintptr_t p = guarded_map(w->dyn_cap, alloc_align(w->dyn_cap), &map, &len);
    w->dyn_shared = (char*)p;
    // an alternate signal stack, so a fault on a fiber stack can be handled
    size_t alt = 64 << 10;
    w->altstack = (char*)mmap(nullptr, alt, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    stack_t ss;
    ss.ss_sp = w->altstack;
    ss.ss_size = alt;
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
}

void worker_loop(Worker* w) {
    t_worker = w;
    worker_setup(w);
    long seen = 0;
    for (;;) {
        LaunchJob* job;
        {
            std::unique_lock<std::mutex> lk(g_pool_mu);
            g_pool_cv.wait(lk, [&] { return g_job_gen != seen; });
            seen = g_job_gen;
            job = g_job;
        }
        t_cur_job = job;
        for (;;) {
            if (job->failed.load()) break;
            long k = job->next.fetch_add(1);
            if (k >= job->nblocks) break;
            long b = job->reverse ? job->nblocks - 1 - k : k;
            if (!run_block(w, job, b)) {
                std::lock_guard<std::mutex> lk(job->mu);
                if (!job->failed.exchange(true)) {
                    job->error = w->error;
                    job->error_code = w->error_code;
                }
                break;
            }
        }
        t_cur_job = nullptr;
        std::lock_guard<std::mutex> lk(g_pool_mu);
        if (--g_busy == 0) g_done_cv.notify_all();
    }
}

struct sigaction g_old_segv, g_old_bus, g_old_fpe;

void on_fault(int sig, siginfo_t* si, void* uctx) {
    Worker* w = t_worker;
    if (w && w->in_kernel) {
        w->in_kernel = false;
        w->fault_sig = sig;
        w->fault_addr = (uintptr_t)si->si_addr;
#if defined(__x86_64__)
        ucontext_t* uc = (ucontext_t*)uctx;
        w->fault_write = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
        w->fault_pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#else
        w->fault_write = -1;
        w->fault_pc = 0;
#endif
        siglongjmp(w->jb, 1);
    }
    struct sigaction* old = sig == SIGSEGV ? &g_old_segv : (sig == SIGBUS ? &g_old_bus : &g_old_fpe);
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction) {
            old->sa_sigaction(sig, si, uctx);
            return;
        }
    } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    // default action
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_handlers() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigfillset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
    sigaction(SIGFPE, &sa, &g_old_fpe);
}

int n_workers() {
    long n = env_long("RPAC_CUDASIM_THREADS", 0);
    if (n <= 0) n = std::min<long>(8, std::max<unsigned>(1, std::thread::hardware_concurrency()));
    return (int)n;
}

void ensure_workers() {
    if (!g_workers.empty()) return;
    int n = n_workers();
    for (int i = 0; i < n; i++) {
        Worker* w = new Worker();
        g_workers.push_back(w);
        w->th = std::thread(worker_loop, w);
        w->th.detach();
    }
}

// run_job runs every block of the job on the workers and waits.
void run_job(LaunchJob* job) {
    std::unique_lock<std::mutex> lk(g_pool_mu);
    ensure_workers();
    g_job = job;
    g_busy = (int)g_workers.size();
    g_job_gen++;
    g_pool_cv.notify_all();
    g_done_cv.wait(lk, [] { return g_busy == 0; });
    g_job = nullptr;
}

}  // namespace

// ---------------------------------------------------------------- kernel ABI

EXPORT const void* rpac_sim_self(void) {
    Worker* w = t_worker;
    return w ? (const void*)w->cur : nullptr;
}

EXPORT void rpac_sim_barrier(const char* file, int line) {
    Worker* w = t_worker;
    Fiber* f = w->cur;
    f->state = F_BARRIER;
    f->file = file;
    f->line = line;
    if (w->at_barrier == 0) {
        w->bar_file = file;
        w->bar_line = line;
    }
    w->at_barrier++;
    yield_to_sched(f);
}

EXPORT unsigned long long rpac_sim_warp(int op, unsigned mask, unsigned long long v, int arg, int width,
                                        const char* file, int line) {
    Worker* w = t_worker;
    Fiber* f = w->cur;
    int lane = f->lin & 31;
    if (!(mask >> lane & 1)) {
        block_error(w, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                    fmt("%s at %s:%d in %s: the calling lane %d is not in mask %#x", op_name(op), file, line,
                        where(f).c_str(), lane, mask));
    }
    f->state = F_WARP;
    f->op = op;
    f->mask = mask;
    f->val = v;
    f->arg = arg;
    f->width = width;
    f->file = file;
    f->line = line;
    yield_to_sched(f);
    return f->result;
}

EXPORT const unsigned char* rpac_sim_frag_map(int kind) {
    if (!g_mma_seed_told.load(std::memory_order_relaxed) && !g_mma_seed_told.exchange(true))
        fprintf(stderr, "cudasim: WMMA fragment layouts from seed %lu (RPAC_CUDASIM_MMA_SEED=%lu repeats them)\n",
                g_mma_seed.load(), g_mma_seed.load());
    return g_frag_map[kind >= 0 && kind < RPAC_FRAG_KINDS ? kind : 0];
}

// rpac_sim_wmma_fail reports a load or store that breaks WMMA's rules and
// ends the block with the error.
EXPORT void rpac_sim_wmma_fail(const char* op, const void* p, unsigned ldm, unsigned multiple, const char* file,
                               int line) {
    Worker* w = t_worker;
    Fiber* f = w->cur;
    std::string why;
    if ((uintptr_t)p & 31u) why = fmt("pointer %p is not 32-byte aligned", p);
    if (ldm % multiple)
        why += fmt("%sldm %u is not a multiple of %u (%d-bit elements)", why.empty() ? "" : "; ", ldm, multiple,
                   multiple == 8 ? 16 : 32);
    block_error(w, CUDA_ERROR_MISALIGNED_ADDRESS,
                fmt("%s at %s:%d in %s: %s (WMMA needs a 32-byte aligned pointer and ldm a multiple of 16 bytes)", op,
                    file, line, where(f).c_str(), why.c_str()));
    f->state = F_FAILED;
    yield_to_sched(f);
    abort();  // never resumed
}

EXPORT void* rpac_sim_dynamic_shared(void) { return t_worker ? t_worker->dyn_ptr : nullptr; }

// ---------------------------------------------------------------- driver API

#define NEED_CTX()                                                       \
    do {                                                                 \
        if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;                  \
        if (!t_cur) return CUDA_ERROR_INVALID_CONTEXT;                   \
        if (g_ctx.sticky) return g_ctx.sticky;                           \
    } while (0)

EXPORT int cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_init) {
        find_lib_dir();
        install_handlers();
        draw_frag_layouts(initial_mma_seed());
        g_init = true;
    }
    return CUDA_SUCCESS;
}

EXPORT int cuDriverGetVersion(int* v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 12080;
    return CUDA_SUCCESS;
}

EXPORT int cuDeviceGetCount(int* n) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    *n = 1;
    return CUDA_SUCCESS;
}

EXPORT int cuDeviceGet(int* dev, int ordinal) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

EXPORT int cuDeviceGetName(char* name, int len, int dev) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0 || !name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, len, "rpac CUDA simulator (CPU)");
    return CUDA_SUCCESS;
}

EXPORT int cuDeviceGetAttribute(int* v, int attr, int dev) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case 75: *v = 9; break;                 // compute capability major
    case 76: *v = 0; break;                 // minor
    case 16: *v = n_workers(); break;       // multiprocessors: the worker threads
    case 1: *v = 1024; break;               // max threads per block
    case 2: *v = 1024; break;               // max block dim x
    case 3: *v = 1024; break;               // y
    case 4: *v = 64; break;                 // z
    case 5: *v = 2147483647; break;         // max grid x
    case 6: *v = 65535; break;
    case 7: *v = 65535; break;
    case 8: *v = 48 << 10; break;           // shared memory per block
    case 97: *v = kSharedOptin; break;      // ... with the opt-in (cuFuncSetAttribute)
    case 10: *v = 32; break;                // warp size
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT int cuDeviceTotalMem_v2(size_t* bytes, int dev) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    long pages = sysconf(_SC_PHYS_PAGES);
    *bytes = (size_t)pages * page_size() / 2;
    return CUDA_SUCCESS;
}

EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &g_ctx;
    return CUDA_SUCCESS;
}

EXPORT int cuCtxSetCurrent(void* ctx) {
    if (!g_init) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != nullptr && ctx != &g_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    t_cur = (Context*)ctx;
    return CUDA_SUCCESS;
}

EXPORT int cuCtxSynchronize(void) {
    NEED_CTX();
    return CUDA_SUCCESS;
}

// --- streams and events: every launch and copy runs when it is called, so
// a stream is only a handle and an event is complete once recorded; the
// calls check their handles as the driver does.

namespace {
struct Stream {
    uint32_t magic = 0x5354524d;  // "STRM"
};
struct Event {
    uint32_t magic = 0x45564e54;  // "EVNT"
};
bool valid_stream(void* s) { return s == nullptr || ((Stream*)s)->magic == 0x5354524d; }
bool valid_event(void* e) { return e != nullptr && ((Event*)e)->magic == 0x45564e54; }
}  // namespace

EXPORT int cuStreamCreate(void** s, unsigned flags) {
    NEED_CTX();
    if (!s || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    *s = new Stream;
    return CUDA_SUCCESS;
}

EXPORT int cuStreamDestroy_v2(void* s) {
    NEED_CTX();
    if (s == nullptr || !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    ((Stream*)s)->magic = 0;
    delete (Stream*)s;
    return CUDA_SUCCESS;
}

EXPORT int cuStreamSynchronize(void* s) {
    NEED_CTX();
    return valid_stream(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT int cuStreamWaitEvent(void* s, void* e, unsigned flags) {
    NEED_CTX();
    if (!valid_stream(s) || !valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT int cuEventCreate(void** e, unsigned flags) {
    NEED_CTX();
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    (void)flags;
    *e = new Event;
    return CUDA_SUCCESS;
}

EXPORT int cuEventRecord(void* e, void* s) {
    NEED_CTX();
    return valid_event(e) && valid_stream(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT int cuEventDestroy_v2(void* e) {
    NEED_CTX();
    if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    ((Event*)e)->magic = 0;
    delete (Event*)e;
    return CUDA_SUCCESS;
}

EXPORT int cuMemAlloc_v2(uint64_t* ptr, size_t bytes) {
    NEED_CTX();
    if (!ptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t map, len;
    uintptr_t p = guarded_map(bytes, kAllocAlign, &map, &len);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    memset((void*)p, 0xff, bytes);  // NaN (float and double), -1 (integers)
    Alloc a{p, bytes, map, len};
    fill_slack(a);
    std::lock_guard<std::mutex> lk(g_mu);
    g_allocs[p] = a;
    g_alloc_bytes += (long)bytes;
    *ptr = p;
    return CUDA_SUCCESS;
}

EXPORT int cuMemFree_v2(uint64_t ptr) {
    NEED_CTX();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_allocs.find(ptr);
    if (it == g_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    long past = slack_written(it->second);
    if (past >= 0)
        set_sticky(CUDA_ERROR_ILLEGAL_ADDRESS,
                   fmt("the %zu-byte allocation at %#lx was written %ld bytes past its end (found when it was freed)",
                       it->second.size, (unsigned long)ptr, past));
    munmap((void*)it->second.map, it->second.map_len);
    g_alloc_bytes -= (long)it->second.size;
    g_allocs.erase(it);
    return CUDA_SUCCESS;
}

static int check_range(uint64_t p, size_t n, const char* what) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (find_alloc(p, n)) return CUDA_SUCCESS;
    fprintf(stderr, "cudasim: %s of %zu bytes at %#lx: %s\n", what, n, (unsigned long)p,
            describe_addr(p + (n ? n - 1 : 0)).c_str());
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT int cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
    NEED_CTX();
    if (int r = check_range(dst, n, "cuMemcpyHtoD")) return r;
    if (n) memcpy((void*)dst, src, n);
    return CUDA_SUCCESS;
}

EXPORT int cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
    NEED_CTX();
    if (int r = check_range(src, n, "cuMemcpyDtoH")) return r;
    if (n) memcpy(dst, (void*)src, n);
    return CUDA_SUCCESS;
}

EXPORT int cuMemsetD8_v2(uint64_t dst, unsigned char v, size_t n) {
    NEED_CTX();
    if (int r = check_range(dst, n, "cuMemsetD8")) return r;
    if (n) memset((void*)dst, v, n);
    return CUDA_SUCCESS;
}

EXPORT int cuGetErrorString(int r, const char** s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    if (r != 0 && r == g_ctx.sticky) {
        *s = g_err_text.c_str();
        return CUDA_SUCCESS;
    }
    *s = cuda_error_name(r);
    return CUDA_SUCCESS;
}

// --- modules

namespace {

size_t elf_size(const unsigned char* img) {
    const Elf64_Ehdr* eh = (const Elf64_Ehdr*)img;
    size_t end = eh->e_shoff + (size_t)eh->e_shnum * eh->e_shentsize;
    const Elf64_Phdr* ph = (const Elf64_Phdr*)(img + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) end = std::max<size_t>(end, ph[i].p_offset + ph[i].p_filesz);
    return std::max<size_t>(end, eh->e_phoff + (size_t)eh->e_phnum * eh->e_phentsize);
}

const char kPTXMagic[] = "// rpac-cudasim module\n";

std::string b64(const unsigned char* p, size_t n) {
    static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string s;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = p[i] << 16 | (i + 1 < n ? p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        s += t[v >> 18 & 63];
        s += t[v >> 12 & 63];
        s += i + 1 < n ? t[v >> 6 & 63] : '=';
        s += i + 2 < n ? t[v & 63] : '=';
        if ((i / 3) % 19 == 18) s += '\n';
    }
    return s;
}

std::string unb64(const char* s) {
    std::string out;
    unsigned v = 0;
    int bits = 0;
    for (; *s; s++) {
        int c = *s;
        int d = c >= 'A' && c <= 'Z' ? c - 'A'
                : c >= 'a' && c <= 'z' ? c - 'a' + 26
                : c >= '0' && c <= '9' ? c - '0' + 52
                : c == '+' ? 62
                : c == '/' ? 63 : -1;
        if (d < 0) continue;
        v = v << 6 | d;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += (char)(v >> bits & 0xff);
        }
    }
    return out;
}

std::string module_dir() {
    const char* d = getenv("RPAC_CUDASIM_CACHE");
    std::string dir = d && *d ? d : g_lib_dir + "/modules";
    mkdir(dir.c_str(), 0755);
    return dir;
}

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

bool write_file(const std::string& path, const void* p, size_t n) {
    std::string tmp = path + fmt(".tmp%d", (int)getpid());
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) return false;
    bool ok = fwrite(p, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
        unlink(tmp.c_str());
        return false;
    }
    return true;
}

bool read_file(const std::string& path, std::string* out) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return false;
    char buf[65536];
    size_t n;
    out->clear();
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
    fclose(f);
    return true;
}

struct TLSFind {
    uintptr_t addr;
    uintptr_t size;
};
int tls_cb(struct dl_phdr_info* info, size_t, void* data) {
    TLSFind* t = (TLSFind*)data;
    if (info->dlpi_addr != t->addr) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS) t->size = info->dlpi_phdr[i].p_memsz;
    return 1;
}

}  // namespace

EXPORT int cuModuleLoadData(void** mod, const void* image) {
    NEED_CTX();
    if (!mod || !image) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char* img = (const unsigned char*)image;
    std::string bytes;
    if (memcmp(img, "\x7f" "ELF", 4) == 0) {
        bytes.assign((const char*)img, elf_size(img));
        stat_cubin_loads++;
    } else if (strncmp((const char*)img, kPTXMagic, strlen(kPTXMagic)) == 0) {
        bytes = unb64((const char*)img + strlen(kPTXMagic));
        if (bytes.size() < 64 || memcmp(bytes.data(), "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
        stat_ptx_loads++;
    } else {
        fprintf(stderr, "cudasim: cuModuleLoadData: the image is neither the simulator's object nor its PTX stand-in "
                        "(real PTX or a real cubin cannot run here)\n");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    std::string path = module_dir() + fmt("/mod-%016llx.so", (unsigned long long)fnv(bytes.data(), bytes.size()));
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || (size_t)st.st_size != bytes.size()) {
        if (!write_file(path, bytes.data(), bytes.size())) return CUDA_ERROR_INVALID_IMAGE;
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cudasim: loading %s: %s\n", path.c_str(), dlerror());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    Module* m = new Module();
    m->handle = h;
    m->path = path;
    m->tls_anchor = (void* (*)())dlsym(h, "__rpac_tls_anchor");
    struct link_map* lm = nullptr;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
        TLSFind t{lm->l_addr, 0};
        dl_iterate_phdr(tls_cb, &t);
        m->tls_size = t.size;
    }
    *mod = m;
    return CUDA_SUCCESS;
}

EXPORT int cuModuleGetFunction(void** fn, void* mod, const char* name) {
    NEED_CTX();
    if (!fn || !mod || !name) return CUDA_ERROR_INVALID_VALUE;
    Module* m = (Module*)mod;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = m->fns.find(name);
    if (it != m->fns.end()) {
        *fn = it->second;
        return CUDA_SUCCESS;
    }
    void* e = dlsym(m->handle, (std::string("__rpac_entry_") + name).c_str());
    void* a = dlsym(m->handle, (std::string("__rpac_args_") + name).c_str());
    if (!e || !a) return CUDA_ERROR_NOT_FOUND;
    Function* f = new Function();
    f->mod = m;
    f->name = name;
    f->entry = (void (*)(void**))e;
    for (const int* s = ((const int* (*)())a)(); *s; s++) f->arg_sizes.push_back(*s);
    m->fns[name] = f;
    *fn = f;
    return CUDA_SUCCESS;
}

namespace {

// The allocations a launch's pointer arguments point into.
// tableScanLimit: the largest allocation whose words touched_allocs reads
// as possible device pointers (the kernels' pointer tables are a few KiB).
constexpr size_t tableScanLimit = 1 << 20;

// touched_allocs lists the allocations a launch can reach: those its
// pointer arguments point into and, one level down, those whose addresses
// appear as aligned 64-bit words in a reached allocation of at most
// tableScanLimit bytes (tables of pointers, such as the optimizer's and
// the lazy Concat's). A word that only looks like an address adds an
// allocation the kernel does not touch, which compares equal.
std::vector<Alloc> touched_allocs(Function* f, void** args) {
    std::vector<Alloc> out;
    std::lock_guard<std::mutex> lk(g_mu);
    auto add = [&](uint64_t v) {
        const Alloc* a = find_alloc(v, 1);
        if (a && std::find_if(out.begin(), out.end(), [&](const Alloc& b) { return b.base == a->base; }) == out.end())
            out.push_back(*a);
    };
    for (size_t i = 0; i < f->arg_sizes.size(); i++) {
        if (f->arg_sizes[i] != 8) continue;
        uint64_t v;
        memcpy(&v, args[i], 8);
        add(v);
    }
    size_t direct = out.size();
    for (size_t i = 0; i < direct; i++) {
        if (out[i].size > tableScanLimit) continue;
        uintptr_t base = out[i].base;
        for (size_t off = 0; off + 8 <= out[i].size; off += 8) {
            uint64_t v;
            memcpy(&v, (const void*)(base + off), 8);
            add(v);
        }
    }
    return out;
}

// slack_check: a launch's pointer arguments' allocations with a written
// slack (a write past the end the guard page does not catch, the start
// being 256-byte aligned) fail it.
int slack_check(Function* f, void** args, std::string* err) {
    std::lock_guard<std::mutex> lk(g_mu);
    for (size_t i = 0; i < f->arg_sizes.size(); i++) {
        if (f->arg_sizes[i] != 8) continue;
        uint64_t v;
        memcpy(&v, args[i], 8);
        const Alloc* a = find_alloc(v, 1);
        long past = a ? slack_written(*a) : -1;
        if (past < 0) continue;
        *err = fmt("kernel %s: invalid write %ld bytes past the end of the %zu-byte allocation at %#lx (argument %zu; "
                   "found after the launch in the slack before its guard page)",
                   f->name.c_str(), past, a->size, (unsigned long)a->base, i);
        fill_slack(*a);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    return 0;
}

int launch_once(Function* f, const unsigned grid[3], const unsigned block[3], unsigned shared, void** args,
                bool reverse, unsigned char poison, std::string* err) {
    LaunchJob job;
    job.fn = f;
    memcpy(job.grid, grid, sizeof job.grid);
    memcpy(job.block, block, sizeof job.block);
    job.shared = shared;
    job.args = args;
    job.nblocks = (long)grid[0] * grid[1] * grid[2];
    job.reverse = reverse;
    job.poison = poison;
    run_job(&job);
    stat_blocks += job.nblocks;
    if (job.failed.load()) {
        // every diagnostic names the kernel
        *err = job.error.find("kernel " + f->name) == std::string::npos ? "kernel " + f->name + ": " + job.error
                                                                          : job.error;
        return job.error_code ? job.error_code : CUDA_ERROR_LAUNCH_FAILED;
    }
    return 0;
}

}  // namespace

// cuFuncSetAttribute: only CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8),
// up to the opt-in's most.
EXPORT int cuFuncSetAttribute(void* fnp, int attr, int value) {
    NEED_CTX();
    Function* f = (Function*)fnp;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (attr != 8 || value < 0 || (unsigned)value > kSharedOptin) return CUDA_ERROR_INVALID_VALUE;
    f->max_dyn = (unsigned)value;
    return CUDA_SUCCESS;
}

EXPORT int cuLaunchKernel(void* fnp, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, void* stream, void** params, void** extra) {
    NEED_CTX();
    Function* f = (Function*)fnp;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (stream != nullptr || extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || gx > 2147483647u || gy > 65535 ||
        gz > 65535 || bx > 1024 || by > 1024 || bz > 64 || (unsigned long)bx * by * bz > 1024) {
        fprintf(stderr, "cudasim: launch of %s: grid (%u,%u,%u) block (%u,%u,%u) exceeds the device's limits\n",
                f->name.c_str(), gx, gy, gz, bx, by, bz);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (shared > f->max_dyn) {
        fprintf(stderr, "cudasim: launch of %s: %u bytes of dynamic shared memory (%u allowed: 48 KiB without the opt-in)\n",
                f->name.c_str(), shared, f->max_dyn);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!params && !f->arg_sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
    // Copy the parameters, as the driver does at launch.
    std::vector<std::vector<unsigned char>> vals(f->arg_sizes.size());
    std::vector<void*> args(f->arg_sizes.size() + 1);
    for (size_t i = 0; i < vals.size(); i++) {
        vals[i].resize(std::max(8, f->arg_sizes[i]));
        memcpy(vals[i].data(), params[i], f->arg_sizes[i]);
        args[i] = vals[i].data();
    }
    stat_launches++;
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    std::string err;
    int r;
    if (cfg_diff.load()) {
        stat_diff_launches++;
        {
            std::lock_guard<std::mutex> dl(stat_diff_mu);
            stat_diff_by_kernel[f->name]++;
        }
        std::vector<Alloc> as = touched_allocs(f, args.data());
        std::vector<std::string> before(as.size()), first(as.size());
        for (size_t i = 0; i < as.size(); i++) before[i].assign((const char*)as[i].base, as[i].size);
        r = launch_once(f, grid, block, shared, args.data(), false, 0xff, &err);
        if (r == 0) {
            for (size_t i = 0; i < as.size(); i++) {
                first[i].assign((const char*)as[i].base, as[i].size);
                memcpy((void*)as[i].base, before[i].data(), as[i].size);
            }
            r = launch_once(f, grid, block, shared, args.data(), true, 0x7f, &err);
        }
        if (r == 0) {
            for (size_t i = 0; i < as.size() && r == 0; i++) {
                const char* now = (const char*)as[i].base;
                if (memcmp(now, first[i].data(), as[i].size) == 0) continue;
                size_t k = 0;
                while (now[k] == first[i][k]) k++;
                k &= ~(size_t)3;
                uint32_t a, b;
                memcpy(&a, first[i].data() + k, 4);
                memcpy(&b, now + k, 4);
                float fa, fb;
                memcpy(&fa, &a, 4);
                memcpy(&fb, &b, 4);
                err = fmt("differential run of kernel %s grid (%u,%u,%u) block (%u,%u,%u): the %zu-byte allocation at "
                          "%#lx differs at byte %zu (%#010x = %g in block/thread order, %#010x = %g in reverse order "
                          "with another shared-memory poison): a race or a read of uninitialised shared memory",
                          f->name.c_str(), gx, gy, gz, bx, by, bz, as[i].size, (unsigned long)as[i].base, k, a, fa, b,
                          fb);
                r = CUDA_ERROR_LAUNCH_FAILED;
            }
        }
    } else {
        r = launch_once(f, grid, block, shared, args.data(), false, 0xff, &err);
    }
    if (r == 0) r = slack_check(f, args.data(), &err);
    if (r != 0) {
        std::lock_guard<std::mutex> lk(g_mu);
        set_sticky(r, err);
    }
    return CUDA_SUCCESS;  // launches are asynchronous: the error shows from the next call on
}

// ---------------------------------------------------------------- NVRTC

namespace {

enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
};

struct Program {
    std::string src, name, log, image;
    bool real_arch = false;  // sm_NN: a "cubin" is available
    bool compiled = false;
};

// entry_names lists the kernels (extern "C" __global__ void NAME(...)).
std::vector<std::string> entry_names(const std::string& s) {
    std::vector<std::string> out;
    size_t p = 0;
    while ((p = s.find("__global__", p)) != std::string::npos) {
        size_t q = p + 10;
        while (q < s.size() && isspace((unsigned char)s[q])) q++;
        if (s.compare(q, 17, "__launch_bounds__") == 0) {  // skip (...)
            size_t close = s.find(')', q);
            q = close == std::string::npos ? s.size() : close + 1;
            while (q < s.size() && isspace((unsigned char)s[q])) q++;
        }
        if (s.compare(q, 4, "void") == 0) {
            q += 4;
            while (q < s.size() && isspace((unsigned char)s[q])) q++;
            size_t b = q;
            while (q < s.size() && (isalnum((unsigned char)s[q]) || s[q] == '_')) q++;
            size_t e = q;
            while (q < s.size() && isspace((unsigned char)s[q])) q++;
            if (e > b && q < s.size() && s[q] == '(') out.push_back(s.substr(b, e - b));
        }
        p += 10;
    }
    return out;
}

// rewrite_dynamic_shared turns `extern __shared__ T name[];` into a pointer
// to the block's dynamic shared memory.
std::string rewrite_dynamic_shared(const std::string& s) {
    std::string out;
    size_t p = 0;
    for (;;) {
        size_t k = s.find("extern", p);
        if (k == std::string::npos) break;
        size_t q = k + 6;
        while (q < s.size() && isspace((unsigned char)s[q])) q++;
        if (s.compare(q, 10, "__shared__") != 0) {
            out.append(s, p, q - p);
            p = q;
            continue;
        }
        size_t semi = s.find(';', q);
        std::string decl = s.substr(q + 10, semi - q - 10);
        size_t br = decl.find('[');
        std::string head = decl.substr(0, br);
        while (!head.empty() && isspace((unsigned char)head.back())) head.pop_back();
        size_t ne = head.size(), nb = ne;
        while (nb > 0 && (isalnum((unsigned char)head[nb - 1]) || head[nb - 1] == '_')) nb--;
        std::string name = head.substr(nb), type = head.substr(0, nb);
        out.append(s, p, k - p);
        out += type + "* " + name + " = (" + type + "*)rpac_sim_dynamic_shared();";
        p = semi + 1;
    }
    out.append(s, p, std::string::npos);
    return out;
}

std::string g_cxx_version;

int compile_program(Program* pr, const std::vector<std::string>& opts) {
    std::string hdr = g_lib_dir + "/cudasim_kernel.h";
    std::string hdr_text, abi_text;
    if (!read_file(hdr, &hdr_text) || !read_file(g_lib_dir + "/cudasim_abi.h", &abi_text)) {
        pr->log = "cudasim: the simulation header " + hdr + " or the cudasim_abi.h it includes is missing";
        return NVRTC_ERROR_COMPILATION;
    }
    hdr_text += abi_text;  // both key the module cache
    std::string src = rewrite_dynamic_shared(pr->src);
    src += "\n// simulator entry points\n";
    for (auto& e : entry_names(pr->src)) src += "RPAC_SIM_ENTRY(" + e + ")\n";
    const char* cxx = getenv("RPAC_CUDASIM_CXX");
    std::string compiler = cxx && *cxx ? cxx : "g++";
    std::string flags = "-std=c++17 -O2 -g -fPIC -shared -w -fno-strict-aliasing -ffp-contract=off";
    uint64_t key = fnv(src.data(), src.size());
    key = fnv(hdr_text.data(), hdr_text.size(), key);
    key = fnv(compiler.data(), compiler.size(), key);
    key = fnv(flags.data(), flags.size(), key);
    std::string dir = module_dir();
    std::string out = dir + fmt("/obj-%016llx.so", (unsigned long long)key);
    if (!read_file(out, &pr->image)) {
        std::string cu = dir + fmt("/src-%016llx-%d.cc", (unsigned long long)key, (int)getpid());
        std::string logf = cu + ".log";
        std::string tmp = out + fmt(".tmp%d", (int)getpid());
        if (!write_file(cu, src.data(), src.size())) {
            pr->log = "cudasim: cannot write " + cu;
            return NVRTC_ERROR_COMPILATION;
        }
        std::string cmd = compiler + " " + flags + " -include '" + hdr + "' -x c++ '" + cu + "' -o '" + tmp + "' >'" +
                          logf + "' 2>&1";
        int rc = system(cmd.c_str());
        std::string log;
        read_file(logf, &log);
        unlink(logf.c_str());
        if (rc != 0) {
            pr->log = "cudasim: " + cmd + " failed (status " + std::to_string(rc) + "):\n" + log;
            unlink(tmp.c_str());
            return NVRTC_ERROR_COMPILATION;
        }
        unlink(cu.c_str());
        rename(tmp.c_str(), out.c_str());
        if (!read_file(out, &pr->image)) {
            pr->log = "cudasim: compiled object " + out + " is missing";
            return NVRTC_ERROR_COMPILATION;
        }
        pr->log = log;
    }
    (void)opts;
    return NVRTC_SUCCESS;
}

}  // namespace

EXPORT int nvrtcVersion(int* major, int* minor) {
    // Not a CUDA version: the simulator's own, so caches of real PTX and of
    // the simulator's objects never mix.
    *major = 0;
    *minor = RPAC_SIM_REV;
    return NVRTC_SUCCESS;
}

EXPORT const char* nvrtcGetErrorString(int r) {
    switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    }
    return "NVRTC_ERROR_UNKNOWN";
}

EXPORT int nvrtcCreateProgram(void** prog, const char* src, const char* name, int nh, const char* const*,
                              const char* const*) {
    if (!prog || !src) return NVRTC_ERROR_INVALID_INPUT;
    if (nh != 0) return NVRTC_ERROR_INVALID_INPUT;  // the kernels are self-contained
    if (g_lib_dir.empty()) find_lib_dir();
    Program* p = new Program();
    p->src = src;
    p->name = name ? name : "default_program";
    *prog = p;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcDestroyProgram(void** prog) {
    if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
    delete (Program*)*prog;
    *prog = nullptr;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcCompileProgram(void* prog, int nopts, const char* const* opts) {
    Program* p = (Program*)prog;
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    std::vector<std::string> o;
    bool arch = false;
    for (int i = 0; i < nopts; i++) {
        std::string s = opts[i];
        o.push_back(s);
        std::string a;
        if (s.rfind("--gpu-architecture=", 0) == 0) a = s.substr(19);
        else if (s.rfind("-arch=", 0) == 0) a = s.substr(6);
        else if (s.rfind("--std=", 0) == 0 || s.rfind("-std=", 0) == 0 || s.rfind("-D", 0) == 0 ||
                 s.rfind("--fmad", 0) == 0 || s == "-lineinfo" || s == "--device-debug" || s == "-G")
            continue;
        else {
            p->log = "nvrtc (cudasim): unknown option " + s;
            return NVRTC_ERROR_INVALID_OPTION;
        }
        if (a.rfind("sm_", 0) == 0) p->real_arch = true;
        else if (a.rfind("compute_", 0) != 0) {
            p->log = "nvrtc (cudasim): invalid architecture " + a;
            return NVRTC_ERROR_INVALID_OPTION;
        }
        arch = true;
    }
    if (!arch) p->real_arch = false;
    int r = compile_program(p, o);
    p->compiled = r == NVRTC_SUCCESS;
    return r;
}

EXPORT int nvrtcGetProgramLogSize(void* prog, size_t* n) {
    Program* p = (Program*)prog;
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    *n = p->log.size() + 1;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetProgramLog(void* prog, char* log) {
    Program* p = (Program*)prog;
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(log, p->log.c_str(), p->log.size() + 1);
    return NVRTC_SUCCESS;
}

static std::string ptx_text(Program* p) {
    return std::string(kPTXMagic) + b64((const unsigned char*)p->image.data(), p->image.size()) + "\n";
}

EXPORT int nvrtcGetPTXSize(void* prog, size_t* n) {
    Program* p = (Program*)prog;
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    *n = ptx_text(p).size() + 1;
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetPTX(void* prog, char* out) {
    Program* p = (Program*)prog;
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    std::string t = ptx_text(p);
    memcpy(out, t.c_str(), t.size() + 1);
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetCUBINSize(void* prog, size_t* n) {
    Program* p = (Program*)prog;
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    if (cfg_no_cubin.load()) return NVRTC_ERROR_INVALID_INPUT;
    *n = p->real_arch ? p->image.size() : 0;  // as NVRTC: no cubin for a virtual architecture
    return NVRTC_SUCCESS;
}

EXPORT int nvrtcGetCUBIN(void* prog, char* out) {
    Program* p = (Program*)prog;
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    if (cfg_no_cubin.load()) return NVRTC_ERROR_INVALID_INPUT;
    if (!p->real_arch) return NVRTC_ERROR_INVALID_INPUT;
    memcpy(out, p->image.data(), p->image.size());
    return NVRTC_SUCCESS;
}

// ---------------------------------------------------------------- simulator controls

EXPORT int rpacsim_version(void) { return RPAC_SIM_REV; }

// rpacsim_config sets a simulator setting: "diff" (differential mode 0/1),
// "verbose", "no_cubin" (1: NVRTC gives no cubin), "clear_sticky" (1:
// forget the context's sticky error; returns it), "mma_seed" (draws the
// WMMA fragment layouts from this seed; between launches). Returns the previous
// value, or -1 for an unknown key.
EXPORT long rpacsim_config(const char* key, long v) {
    std::string k = key;
    if (k == "no_cubin") return cfg_no_cubin.exchange((int)v);
    if (k == "clear_sticky") {
        // tests of deliberately broken kernels: forget the sticky error (a
        // real context would have to be destroyed and made again)
        std::lock_guard<std::mutex> lk(g_mu);
        long old = g_ctx.sticky;
        if (v) {
            g_ctx.sticky = 0;
            g_ctx.detail.clear();
            g_err_text.clear();
        }
        return old;
    }
    if (k == "diff") return cfg_diff.exchange((int)v);
    if (k == "mma_seed") {
        long old = (long)g_mma_seed.load();
        draw_frag_layouts((unsigned long)v);
        return old;
    }
    if (k == "verbose") return cfg_verbose.exchange((int)v);
    return -1;
}

// rpacsim_stat reads a counter: "allocs" (live allocations), "alloc_bytes",
// "launches", "blocks", "gemms", "diff_launches" ("diff:NAME": those of
// kernel NAME; "diff:PREFIX*": of every kernel whose name starts with
// PREFIX), "cubin_loads" and
// "ptx_loads" (modules loaded from each), "sticky" (the sticky error code),
// "lt_descs", "lt_layouts" (cuBLASLt matmul descriptors and matrix layouts
// created), "lt_live" (descriptors and layouts not yet destroyed) and
// "lt_heuristics" (cublasLtMatmulAlgoGetHeuristic calls), "mma_seed" (the
// seed of the WMMA fragment layouts).
EXPORT long rpacsim_stat(const char* key) {
    std::string k = key;
    std::lock_guard<std::mutex> lk(g_mu);
    if (k == "allocs") return (long)g_allocs.size();
    if (k == "alloc_bytes") return g_alloc_bytes;
    if (k == "launches") return stat_launches.load();
    if (k == "blocks") return stat_blocks.load();
    if (k == "gemms") return stat_gemms.load();
    if (k == "diff_launches") return stat_diff_launches.load();
    if (k.rfind("diff:", 0) == 0) {
        std::lock_guard<std::mutex> dl(stat_diff_mu);
        std::string name = k.substr(5);
        if (!name.empty() && name.back() == '*') {  // every kernel whose name starts so
            name.pop_back();
            long n = 0;
            for (auto& [kernel, c] : stat_diff_by_kernel)
                if (kernel.rfind(name, 0) == 0) n += c;
            return n;
        }
        auto it = stat_diff_by_kernel.find(name);
        return it == stat_diff_by_kernel.end() ? 0 : it->second;
    }
    if (k == "cubin_loads") return stat_cubin_loads.load();
    if (k == "ptx_loads") return stat_ptx_loads.load();
    if (k == "lt_descs") return stat_lt_descs.load();
    if (k == "lt_layouts") return stat_lt_layouts.load();
    if (k == "lt_heuristics") return stat_lt_heuristics.load();
    if (k == "lt_live") return stat_lt_live.load();
    if (k == "sticky") return g_ctx.sticky;
    if (k == "mma_seed") return (long)g_mma_seed.load();
    return -1;
}

// ---------------------------------------------------------------- cuBLASLt
#include "cudasim_blas.inc"
