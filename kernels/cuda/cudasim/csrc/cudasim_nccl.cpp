// libnccl stand-in of the CUDA simulator: the subset of NCCL's C ABI that
// rpac binds (ncclGetUniqueId, ncclCommInitRank, ncclAllReduce,
// ncclBroadcast, ncclGroupStart/End, ncclCommAbort/Destroy,
// ncclGetErrorString), installed as libnccl.so.2 beside the simulator.
//
// Device memory on the simulator is host memory, so the ranks' processes
// (on one machine) exchange it through one POSIX shared-memory segment per
// communicator, named by the unique id: a header (each rank's pid,
// barrier generation and the descriptor of its current collective) and
// one staging slot per rank. A collective is executed when it is called
// (a group is therefore a no-op): the ranks first agree on the descriptor
// (kind, count, type, operation, root; a disagreement fails every rank
// with ncclInvalidUsage and a message naming both sides), then move the
// data slot by slot between barriers. Sums are taken in rank order, so
// every rank computes the same bits. A barrier fails with ncclRemoteError
// when a peer's process has exited or aborted its communicator, and with
// ncclInvalidUsage once the communicator is aborted (ncclCommAbort from
// another thread ends a waiting collective).
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
};

enum { tInt8 = 0, tUint8 = 1, tInt32 = 2, tUint32 = 3, tInt64 = 4, tUint64 = 5, tFloat16 = 6, tFloat32 = 7, tFloat64 = 8 };
enum { opSum = 0, opProd = 1, opMax = 2, opMin = 3, opAvg = 4 };
enum { kAllReduce = 1, kBroadcast = 2 };

const int kMaxRanks = 64;
const size_t kSlot = 4 << 20;  // staging bytes per rank and round
const char kMagic[8] = {'r', 'p', 'a', 'c', 'n', 'c', 'c', 'l'};

struct Desc {
    int64_t kind, count, type, op, root, seq;
};

struct Header {
    std::atomic<int32_t> nranks;
    std::atomic<int32_t> joined;
    int32_t pid[kMaxRanks];
    std::atomic<uint64_t> gen[kMaxRanks];
    std::atomic<int32_t> gone[kMaxRanks];  // the rank aborted or destroyed its communicator
    Desc desc[kMaxRanks];
};

struct Comm {
    Header* h;
    char* slots;
    size_t map_len;
    int rank, nranks;
    uint64_t gen;  // this rank's barrier generation
    int64_t seq;   // collectives issued
    std::atomic<int> aborted;
};

void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rpac NCCL stand-in: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

size_t type_size(int64_t t) {
    switch (t) {
        case tInt8: case tUint8: return 1;
        case tFloat16: return 2;
        case tInt32: case tUint32: case tFloat32: return 4;
        case tInt64: case tUint64: case tFloat64: return 8;
    }
    return 0;
}

const char* kind_name(int64_t k) { return k == kAllReduce ? "all-reduce" : "broadcast"; }

void shm_name(const unsigned char* id, char* out) {
    static const char hex[] = "0123456789abcdef";
    strcpy(out, "/rpacnccl-");
    char* p = out + strlen(out);
    for (int i = 8; i < 24; i++) {
        *p++ = hex[id[i] >> 4];
        *p++ = hex[id[i] & 15];
    }
    *p = 0;
}

void pause_briefly() {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, nullptr);
}

// exited reports whether process pid has ended (a zombie whose parent has
// not reaped it yet included).
bool exited(int pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    const char* p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

// barrier waits until every rank has reached this rank's next generation.
int barrier(Comm* c, const char* what) {
    uint64_t want = ++c->gen;
    c->h->gen[c->rank].store(want, std::memory_order_release);
    for (int spins = 0;; spins++) {
        int behind = -1;
        for (int r = 0; r < c->nranks; r++) {
            if (c->h->gen[r].load(std::memory_order_acquire) < want) {
                behind = r;
                break;
            }
        }
        if (behind < 0) return ncclSuccess;
        if (c->aborted.load()) {
            warn("rank %d: %s aborted while waiting for rank %d", c->rank, what, behind);
            return ncclInvalidUsage;
        }
        if (spins % 64 == 63) {
            int pid = c->h->pid[behind];
            if (c->h->gone[behind].load()) {
                warn("rank %d: %s: rank %d (pid %d) aborted its communicator", c->rank, what, behind, pid);
                return ncclRemoteError;
            }
            if (exited(pid)) {
                warn("rank %d: %s: rank %d (pid %d) has exited", c->rank, what, behind, pid);
                return ncclRemoteError;
            }
        }
        if (spins < 256) sched_yield(); else pause_briefly();
    }
}

// agree publishes this rank's descriptor and checks that every rank gave
// the same one.
int agree(Comm* c, Desc d) {
    d.seq = ++c->seq;
    c->h->desc[c->rank] = d;
    if (int r = barrier(c, kind_name(d.kind))) return r;
    int res = ncclSuccess;
    for (int r = 0; r < c->nranks; r++) {
        const Desc& o = c->h->desc[r];
        if (o.kind != d.kind || o.count != d.count || o.type != d.type || o.op != d.op || o.root != d.root) {
            warn("rank %d: collective %ld differs between ranks: rank %d calls %s of %ld elements (type %ld, op %ld, root %ld), rank %d %s of %ld elements (type %ld, op %ld, root %ld)",
                 c->rank, (long)d.seq, c->rank, kind_name(d.kind), (long)d.count, (long)d.type, (long)d.op, (long)d.root,
                 r, kind_name(o.kind), (long)o.count, (long)o.type, (long)o.op, (long)o.root);
            res = ncclInvalidUsage;
            break;
        }
    }
    // every rank has read the descriptors before any rank writes the next
    if (int r = barrier(c, kind_name(d.kind))) return r;
    return res;
}

template <typename T>
void reduce(T* out, char* slots, size_t n, int nranks, int64_t op) {
    for (size_t i = 0; i < n; i++) {
        T acc = ((T*)slots)[i];
        for (int r = 1; r < nranks; r++) {
            T v = ((T*)(slots + r * kSlot))[i];
            switch (op) {
                case opSum: case opAvg: acc = acc + v; break;
                case opProd: acc = acc * v; break;
                case opMax: acc = v > acc ? v : acc; break;
                case opMin: acc = v < acc ? v : acc; break;
            }
        }
        if (op == opAvg) acc = acc / (T)nranks;
        out[i] = acc;
    }
}

int reduce_typed(void* out, char* slots, size_t n, int nranks, int64_t type, int64_t op) {
    switch (type) {
        case tInt32: reduce((int32_t*)out, slots, n, nranks, op); return ncclSuccess;
        case tUint32: reduce((uint32_t*)out, slots, n, nranks, op); return ncclSuccess;
        case tInt64: reduce((int64_t*)out, slots, n, nranks, op); return ncclSuccess;
        case tUint64: reduce((uint64_t*)out, slots, n, nranks, op); return ncclSuccess;
        case tFloat32: reduce((float*)out, slots, n, nranks, op); return ncclSuccess;
        case tFloat64: reduce((double*)out, slots, n, nranks, op); return ncclSuccess;
    }
    return ncclInvalidArgument;
}

bool valid_comm(Comm* c) { return c != nullptr && c->h != nullptr; }

}  // namespace

typedef struct { char internal[128]; } ncclUniqueId;

EXPORT const char* ncclGetErrorString(int r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
    }
    return "unknown result code";
}

EXPORT int ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, kMagic, 8);
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0) return ncclSystemError;
    ssize_t got = read(fd, id->internal + 8, 16);
    close(fd);
    return got == 16 ? ncclSuccess : ncclSystemError;
}

EXPORT int ncclCommInitRank(Comm** out, int nranks, ncclUniqueId id, int rank) {
    if (!out || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
        warn("ncclCommInitRank: rank %d of %d ranks (at most %d)", rank, nranks, kMaxRanks);
        return ncclInvalidArgument;
    }
    if (memcmp(id.internal, kMagic, 8) != 0) {
        warn("ncclCommInitRank: the unique id was not made by this library's ncclGetUniqueId");
        return ncclInvalidArgument;
    }
    char name[64];
    shm_name((const unsigned char*)id.internal, name);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) {
        warn("ncclCommInitRank: shm_open %s: %s", name, strerror(errno));
        return ncclSystemError;
    }
    size_t len = sizeof(Header) + (size_t)nranks * kSlot;
    if (ftruncate(fd, (off_t)len) != 0) {
        warn("ncclCommInitRank: ftruncate %s: %s", name, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return ncclSystemError;
    Comm* c = new Comm();
    c->h = (Header*)p;
    c->slots = (char*)p + sizeof(Header);
    c->map_len = len;
    c->rank = rank;
    c->nranks = nranks;
    int32_t zero = 0;
    if (!c->h->nranks.compare_exchange_strong(zero, nranks) && zero != nranks) {
        warn("ncclCommInitRank: rank %d says %d ranks, another rank %d", rank, nranks, zero);
        munmap(p, len);
        delete c;
        return ncclInvalidUsage;
    }
    c->h->pid[rank] = (int32_t)getpid();
    c->h->joined.fetch_add(1);
    int r = barrier(c, "ncclCommInitRank");
    if (r == ncclSuccess && rank == 0) shm_unlink(name);  // every rank has it mapped
    if (r != ncclSuccess) {
        munmap(p, len);
        delete c;
        return r;
    }
    *out = c;
    return ncclSuccess;
}

EXPORT int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, Comm* c, void* stream) {
    (void)stream;
    if (!valid_comm(c)) return ncclInvalidArgument;
    size_t es = type_size(type);
    if (es == 0 || type == tFloat16 || op < opSum || op > opAvg) return ncclInvalidArgument;
    if (int r = agree(c, Desc{kAllReduce, (int64_t)count, type, op, 0, 0})) return r;
    size_t per = kSlot / es;
    for (size_t off = 0; off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(c->slots + c->rank * kSlot, (const char*)send + off * es, n * es);
        if (int r = barrier(c, "all-reduce")) return r;
        int rr = reduce_typed((char*)recv + off * es, c->slots, n, c->nranks, type, op);
        if (int r = barrier(c, "all-reduce")) return r;
        if (rr) return rr;
    }
    return ncclSuccess;
}

EXPORT int ncclBroadcast(const void* send, void* recv, size_t count, int type, int root, Comm* c, void* stream) {
    (void)stream;
    if (!valid_comm(c)) return ncclInvalidArgument;
    size_t es = type_size(type);
    if (es == 0 || root < 0 || root >= c->nranks) return ncclInvalidArgument;
    if (int r = agree(c, Desc{kBroadcast, (int64_t)count, type, 0, root, 0})) return r;
    for (size_t off = 0; off < count * es; off += kSlot) {
        size_t n = count * es - off < kSlot ? count * es - off : kSlot;
        if (c->rank == root) memcpy(c->slots + root * kSlot, (const char*)send + off, n);
        if (int r = barrier(c, "broadcast")) return r;
        memmove((char*)recv + off, c->slots + root * kSlot, n);
        if (int r = barrier(c, "broadcast")) return r;
    }
    return ncclSuccess;
}

EXPORT int ncclGroupStart(void) { return ncclSuccess; }
EXPORT int ncclGroupEnd(void) { return ncclSuccess; }

EXPORT int ncclCommAbort(Comm* c) {
    if (!valid_comm(c)) return ncclInvalidArgument;
    c->aborted.store(1);
    c->h->gone[c->rank].store(1);
    return ncclSuccess;  // the mapping stays: a collective may still be waiting on it
}

EXPORT int ncclCommDestroy(Comm* c) {
    if (!valid_comm(c)) return ncclInvalidArgument;
    c->h->gone[c->rank].store(1);
    munmap(c->h, c->map_len);
    c->h = nullptr;
    delete c;
    return ncclSuccess;
}
