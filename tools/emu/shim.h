// A CPU stand-in for the CUDA device environment our kernels use, so that a kernel's indexing,
// barriers and reduction order can be checked on a machine without a GPU (tools/emu/run.py).
// Each CUDA thread is a fiber (its own stack) on the launching host thread, switched at barriers,
// shuffles and votes (and, in a persistent kernel's wait loops, wait_backoff); the blocks of a
// cluster run at once, clusters one after another (emu_launch_resident: the whole grid at once,
// blocks stalling at random, for persistent kernels whose blocks wait for each other); a block's
// __shared__ data lives in its own arena (run.py rewrites each declaration to look it up there),
// so a cluster's blocks can read each other's (distributed shared memory); warp shuffles trade
// values through a per-warp slot array between two warp barriers. A barrier
// that some thread never reaches, or a counter nothing will raise to a waiter's target, is
// reported at once (no fiber can go on: emu_deadlock says who waits for what), not hung on.
// Tensor-core m16n8k16 MMAs are emulated per lane from the warp's gathered fragments (products
// exact, summed in k order onto the accumulator: not the tensor cores' own rounding), the
// last-block and last-warp arrivals with plain counters (one host thread runs every fiber);
// cp.async copies land in shared memory only at the wait that covers their group, bulk copies
// (cp.async.bulk on a page barrier, an mbarrier) at a random later point of the schedule, and
// ldmatrix gathers its fragments from the warp's row addresses.
// Floating point: products and sums in f32 with contraction to fma (the caller compiles with
// -ffp-contract=fast -mfma), so a kernel's bits match across its own row counts here, not
// necessarily the GPU's bits.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))

struct emu_dim3 {
    unsigned int x = 0, y = 0, z = 0;
};
// The running fiber's thread and block index (set by the scheduler before it resumes a fiber).
inline emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

// The dynamic shared memory a block may have (the H200's 227 KiB and the static arrays).
inline constexpr size_t emu_block_dyn_bytes = 228 * 1024;

// A barrier of fibers: the arrival that completes a phase starts the next; the others yield until
// it has. A fiber that exits stops being expected (as an exited GPU thread stops counting).
struct EmuBarrier {
    unsigned int expected, arrived = 0;
    uint64_t phase = 0;
    explicit EmuBarrier(unsigned int n) : expected(n) {}
    void next_phase() {
        arrived = 0;
        phase++;
    }
};

// What one lane publishes to its warp at most: an mma's six fragment words.
inline constexpr size_t emu_slot_bytes = 24;

// One running block: its barrier, warp barriers and exchange slots, shared-memory arena (a buffer
// per __shared__ declaration, by run.py's id, and the dynamic buffer, made when first used) and
// rank in its cluster.
struct EmuBlock {
    EmuBarrier bar;
    std::vector<EmuBarrier> warp_bar;
    std::vector<std::byte> slots;  // [warp][32 lanes of emu_slot_bytes]: each exchange's values
    std::map<int, std::vector<unsigned char>> shared;
    std::vector<unsigned char> dyn;
    unsigned int rank = 0;
    EmuBlock(unsigned int threads) : bar(threads), slots(((threads + 31) / 32) * 32 * emu_slot_bytes) {
        for (unsigned int w = 0; w < (threads + 31) / 32; w++) warp_bar.emplace_back(std::min(32u, threads - 32 * w));
    }
};

// One CUDA thread of the running cluster.
struct EmuFiber {
    jmp_buf ctx;  // where it yielded
    ucontext_t start;
    // Its stack: mapped with an inaccessible lowest page, so overflowing it faults at once
    // instead of writing over another fiber's.
    struct Stack {
        static constexpr size_t bytes = 256 * 1024;  // the kernels' arrays of registers live here at -O1
        static constexpr size_t guard = 4096;
        char* base;
        Stack() {
            void* m = mmap(nullptr, guard + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED || mprotect(m, guard, PROT_NONE) != 0) {
                std::fprintf(stderr, "emu: no memory for a fiber's stack\n");
                std::abort();
            }
            base = static_cast<char*>(m);
        }
        ~Stack() { munmap(base, guard + bytes); }
        Stack(const Stack&) = delete;
        Stack& operator=(const Stack&) = delete;
        char* usable() const { return base + guard; }
    };
    std::unique_ptr<Stack> stack = std::make_unique<Stack>();
    emu_dim3 thread, block;
    EmuBlock* home = nullptr;
    bool started = false, done = false;
    // Asynchronous copies to shared memory (cp.async): each lands at the wait that covers it.
    struct Copy {
        void* dst;
        unsigned char bytes[16];
        size_t n;
    };
    std::vector<Copy> open;                  // issued since the last commit
    std::vector<std::vector<Copy>> groups;  // committed, oldest first
    // What it waits for while yielded, for a deadlock's report: a barrier, or (wait_backoff) a
    // counter or flag `what` short of `target`.
    enum class Wait { none, block_barrier, warp_barrier, cluster_barrier, value } wait = Wait::none;
    const unsigned int* what = nullptr;
    unsigned int target = 0;
};

// A bulk copy (common.cuh's page_bulk_load) issued and not yet landed: emu_run performs it at a
// random later pass, then completes its bytes on its page barrier.
struct EmuBulkCopy {
    void* dst;
    const void* src;
    unsigned int bytes;
    unsigned long long* bar;
    EmuBlock* home;  // the issuing block (its shared memory names the barrier in a report)
};

// The running cluster (with emu_launch_resident, the whole grid): its blocks, barrier and fibers
// (the first of emu_fibers), the fiber running and the scheduler's context, and whether any fiber
// changed what a waiting fiber could see in the current pass: started, arrived at a barrier,
// ended, or added to a counter (an atomic or a release; see emu_launch_resident). Its bulk copies
// in flight, and the page barriers initialised (for a deadlock's report).
struct EmuCluster {
    std::vector<std::unique_ptr<EmuBlock>> blocks;
    std::unique_ptr<EmuBarrier> bar;
    EmuFiber* fibers = nullptr;
    size_t n_fibers = 0;
    EmuFiber* running = nullptr;
    jmp_buf scheduler;
    bool progress = false, resident = false;
    const std::function<void()>* kernel = nullptr;
    std::vector<EmuBulkCopy> bulk;
    std::vector<const void*> page_barriers;
};
// Every launch's fibers, kept from launch to launch (a stack is mapped once, not per launch).
inline std::vector<EmuFiber> emu_fibers;
inline EmuCluster* emu_cluster;
inline EmuBlock* emu_block;

// Back to the scheduler; returns when the scheduler resumes this fiber.
inline void emu_yield() {
    if (!_setjmp(emu_cluster->running->ctx)) _longjmp(emu_cluster->scheduler, 1);
}
inline void emu_arrive_and_wait(EmuBarrier& b) {
    const uint64_t phase = b.phase;
    emu_cluster->progress = true;
    if (++b.arrived == b.expected) return b.next_phase();
    EmuFiber& f = *emu_cluster->running;
    f.wait = &b == &emu_block->bar          ? EmuFiber::Wait::block_barrier
             : &b == emu_cluster->bar.get() ? EmuFiber::Wait::cluster_barrier
                                            : EmuFiber::Wait::warp_barrier;
    while (b.phase == phase) emu_yield();
    f.wait = EmuFiber::Wait::none;
}
inline void emu_drop(EmuBarrier& b) {
    b.expected--;
    if (b.arrived > 0 && b.arrived == b.expected) b.next_phase();
}

// The names of the __shared__ declarations, by run.py's id (for a deadlock's report).
inline std::map<int, const char*> emu_shared_names;
// The block's buffer for __shared__ declaration `id` (zeroed when first asked for).
template <typename T>
inline T& emu_shared(int id, const char* name = nullptr) {
    if (name) emu_shared_names.emplace(id, name);
    auto& b = emu_block->shared[id];
    if (b.empty()) b.assign(sizeof(T) + 16, 0);
    return *reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(b.data()) + 15) & ~uintptr_t(15));
}
// The block's dynamic shared memory (extern __shared__).
inline unsigned char* emu_dyn_shared() {
    if (emu_block->dyn.empty()) emu_block->dyn.assign(emu_block_dyn_bytes, 0);
    return emu_block->dyn.data();
}

[[noreturn]] inline void emu_unsupported(const char* what) {
    std::fflush(stdout);
    std::fprintf(stderr, "emu: %s is not emulated\n", what);
    std::abort();
}

struct uint4 {
    unsigned int x, y, z, w;
};
struct uint2 {
    unsigned int x, y;
};
struct int4 {
    int x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

template <typename To, typename From>
inline To emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To t;
    std::memcpy(&t, &v, sizeof t);
    return t;
}
inline float __int_as_float(int v) { return emu_bits<float>(v); }
inline float __uint_as_float(unsigned int v) { return emu_bits<float>(v); }
inline unsigned int __float_as_uint(float v) { return emu_bits<unsigned int>(v); }
inline int __float_as_int(float v) { return emu_bits<int>(v); }
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
using std::max;
using std::min;

// bf16 and f16, as stored (the kernels only convert them).
struct __nv_bfloat16 {
    uint16_t x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned int)h.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const unsigned int u = __float_as_uint(f);
    if (std::isnan(f)) return {(uint16_t)((u >> 16) | 0x40)};
    return {(uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
// Each product rounded to bf16 (the kernels multiply only where the products are exact).
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return {__float2bfloat16_rn(__bfloat162float(a.x) * __bfloat162float(b.x)),
            __float2bfloat16_rn(__bfloat162float(a.y) * __bfloat162float(b.y))};
}
using __half = _Float16;
struct __half2 {
    _Float16 x, y;
};
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return (_Float16)f; }
inline __half __ushort_as_half(unsigned short b) { return emu_bits<_Float16>(b); }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half2 __float2half2_rn(float f) { return {(_Float16)f, (_Float16)f}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {(_Float16)(a.x * b.x), (_Float16)(a.y * b.y)}; }

template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}
inline long long clock64() { return 0; }
// Atomics: one host thread runs every fiber, so a plain read-modify-write is atomic here. Each
// counts as progress (a waiting fiber may be waiting for it).
inline void emu_changed() {
    if (emu_cluster) emu_cluster->progress = true;
}
template <typename T>
inline T atomicAdd(T* p, T v) {
    const T old = *p;
    *p = old + v;
    emu_changed();
    return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
    const T old = *p;
    *p = std::min(old, v);
    emu_changed();
    return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
    const T old = *p;
    *p = std::max(old, v);
    emu_changed();
    return old;
}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

inline void __syncthreads() { emu_arrive_and_wait(emu_block->bar); }
inline void __syncwarp(unsigned int = 0xffffffffu) { emu_arrive_and_wait(emu_block->warp_bar[threadIdx.x / 32]); }
// Every lane of the warp calls it with the same T (the kernels shuffle, vote and multiply with
// full masks only): publishes this lane's value in the warp's slots, returns read(the warp's
// values, how many lanes) once every lane has published, and leaves when every lane has read, so
// no slot is written again before.
template <typename T, typename Read>
inline auto emu_warp_exchange(const T& mine, Read read) {
    static_assert(sizeof(T) <= emu_slot_bytes && std::is_trivially_copyable_v<T>);
    const unsigned int w = threadIdx.x / 32, l = threadIdx.x % 32;
    std::byte* base = emu_block->slots.data() + w * 32 * emu_slot_bytes;
    std::memcpy(base + l * sizeof(T), &mine, sizeof(T));
    emu_arrive_and_wait(emu_block->warp_bar[w]);
    const auto r = read(std::launder(reinterpret_cast<const T*>(base)), std::min(32u, blockDim.x - 32 * w));
    emu_arrive_and_wait(emu_block->warp_bar[w]);
    return r;
}
// Lane l gets lane src(l)'s v.
template <typename T>
inline T emu_shfl(T v, int src) {
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    const uint64_t got = emu_warp_exchange(b, [&](const uint64_t* warp, unsigned int lanes) {
        if ((unsigned int)src >= lanes) emu_unsupported("a shuffle from a lane past the block's last thread");
        return warp[src];
    });
    T r;
    std::memcpy(&r, &got, sizeof r);
    return r;
}
// The warp's predicates as a mask.
inline unsigned int __ballot_sync(unsigned int, int p) {
    return emu_warp_exchange((uint64_t)(p != 0), [](const uint64_t* warp, unsigned int lanes) {
        unsigned int m = 0;
        for (unsigned int i = 0; i < lanes; i++) m |= (unsigned int)(warp[i] != 0) << i;
        return m;
    });
}
inline int __any_sync(unsigned int mask, int p) { return __ballot_sync(mask, p) != 0; }
inline int __popc(unsigned int v) { return __builtin_popcount(v); }
inline int __clz(unsigned int v) { return v ? __builtin_clz(v) : 32; }
// The lanes of the warp whose v equals this lane's.
inline unsigned int __match_any_sync(unsigned int, int v) {
    return emu_warp_exchange((uint64_t)(uint32_t)v, [&](const uint64_t* warp, unsigned int lanes) {
        unsigned int m = 0;
        for (unsigned int i = 0; i < lanes; i++) m |= (unsigned int)(warp[i] == (uint32_t)v) << i;
        return m;
    });
}

template <typename T>
inline T __shfl_xor_sync(unsigned int, T v, int o) {
    return emu_shfl(v, (int)(threadIdx.x % 32) ^ o);
}
template <typename T>
inline T __shfl_down_sync(unsigned int, T v, int o) {
    const int l = threadIdx.x % 32;
    return emu_shfl(v, l + o < 32 ? l + o : l);
}
template <typename T>
inline T __shfl_sync(unsigned int, T v, int src) {
    return emu_shfl(v, src);
}
template <typename T>
inline T __shfl_up_sync(unsigned int, T v, int o) {
    const int l = threadIdx.x % 32;
    return emu_shfl(v, l >= o ? l - o : l);
}

// d += a·b for one m16n8k16 tile, called by every lane of the warp with its fragments (layout:
// common.cuh's mma_bf16); `elem` widens a 16-bit element. Products of bf16 or f16 pairs are exact
// in f32; they are added in k order onto d.
inline void emu_mma(float d[4], const std::array<uint32_t, 6>& frag, float (*elem)(uint16_t)) {
    const unsigned int l = threadIdx.x % 32, g = l / 4, t = l % 4;
    float A[16][16], B[16][8];
    emu_warp_exchange(frag, [&](const std::array<uint32_t, 6>* warp, unsigned int) {
        for (unsigned int ln = 0; ln < 32; ln++) {
            const uint32_t* f = warp[ln].data();
            const unsigned int gg = ln / 4, tt = ln % 4;
            for (int h = 0; h < 2; h++) {
                A[gg][2 * tt + h] = elem(f[0] >> (16 * h));
                A[gg + 8][2 * tt + h] = elem(f[1] >> (16 * h));
                A[gg][2 * tt + 8 + h] = elem(f[2] >> (16 * h));
                A[gg + 8][2 * tt + 8 + h] = elem(f[3] >> (16 * h));
                B[2 * tt + h][gg] = elem(f[4] >> (16 * h));
                B[2 * tt + 8 + h][gg] = elem(f[5] >> (16 * h));
            }
        }
        return 0;
    });
    const unsigned int row[4] = {g, g, g + 8, g + 8}, col[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 16; k++) d[i] += A[row[i]][k] * B[k][col[i]];
}
inline float emu_bf16_elem(uint16_t b) { return __uint_as_float((unsigned int)b << 16); }
inline float emu_f16_elem(uint16_t b) { return (float)emu_bits<_Float16>(b); }
inline void mma_bf16(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    emu_mma(d, {a0, a1, a2, a3, b0, b1}, emu_bf16_elem);
}
inline void mma_f16(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    emu_mma(d, {a0, a1, a2, a3, b0, b1}, emu_f16_elem);
}

// Loads after pdl_wait() need no ordering here: every launch runs to its end before the next.
template <typename T>
inline const T* after_wait(const T* p) {
    return p;
}

// The arrivals at a counter (common.cuh): true in the block (warp) that arrives total-th (one host
// thread runs every fiber, so a plain increment is atomic here).
inline bool block_arrives_last(unsigned int* counter, unsigned int total) {
    int& last = emu_shared<int>(-1);
    __syncthreads();
    if (threadIdx.x == 0) last = (*counter)++ == total - 1;
    __syncthreads();
    return last;
}
inline bool warp_arrives_last(unsigned int* counter, unsigned int total) {
    __syncwarp();
    unsigned int last = 0;
    if (threadIdx.x % 32 == 0) last = (*counter)++ == total - 1;
    return __shfl_sync(0xffffffffu, last, 0);
}

// Persistent kernels' counters and page flags (common.cuh): one host thread runs every fiber, so
// plain loads and adds; the memory ordering they give on the GPU is not checked here, their
// targets and waits are. A release counts as progress; wait_backoff yields the fiber (the kernels'
// own wait loops run here), recording what it waits for.
inline unsigned int counter_acquire_load(const unsigned int* c) { return *c; }
inline void counter_release_add(unsigned int* c, unsigned int v) {
    *c += v;
    emu_changed();
}
inline unsigned int page_flag_acquire_load(const unsigned int* f) { return *f; }
inline void page_flag_release_add(unsigned int* f, unsigned int v) {
    *f += v;
    emu_changed();
}
inline void wait_backoff(const unsigned int* what, unsigned int, unsigned int target, unsigned int&) {
    EmuFiber& f = *emu_cluster->running;
    f.wait = EmuFiber::Wait::value;
    f.what = what;
    f.target = target;
    emu_yield();
    f.wait = EmuFiber::Wait::none;
}

// Names for a driver's buffers in a deadlock's report: the n unsigned counters from `base` are
// `name`[0..n).
struct EmuLabel {
    const void* base;
    size_t n;
    const char* name;
};
inline std::vector<EmuLabel> emu_labels;
inline void emu_label(const unsigned int* base, size_t n, const char* name) {
    std::erase_if(emu_labels, [&](const EmuLabel& l) { return l.base == base; });
    emu_labels.push_back({base, n, name});
}

// p by name, for a report: `name`[i] of a driver's label, `__shared__ name`[i] of block `home`'s
// shared memory (elements of `elem` bytes), else its address.
inline std::string emu_where(const void* p, size_t elem, const EmuBlock& home) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (const auto& l : emu_labels) {
        const auto* base = static_cast<const unsigned char*>(l.base);
        if (c >= base && c < base + 4 * l.n) return std::string(l.name) + "[" + std::to_string((c - base) / 4) + "]";
    }
    for (const auto& [id, b] : home.shared) {
        if (c >= b.data() && c < b.data() + b.size()) {
            const uintptr_t first = (reinterpret_cast<uintptr_t>(b.data()) + 15) & ~uintptr_t(15);  // emu_shared's
            const size_t at = (reinterpret_cast<uintptr_t>(c) - first) / elem;
            const auto name = emu_shared_names.find(id);
            return std::string("__shared__ ") + (name != emu_shared_names.end() ? name->second : "?") + "[" +
                   std::to_string(at) + "]";
        }
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
}

// Page barriers (common.cuh's mbarriers): the state in the barrier's own 8 bytes, as the GPU
// keeps it there (in its own layout): the arrivals a phase expects (bits 0..19, 0 until
// initialised), those still to come in the current phase (20..39), the transaction bytes still to
// come (40..61, two's complement: a copy may land before its bytes are expected) and the
// current phase's parity (62). A phase completes when no arrival and no byte is to come; the next
// then expects the same arrivals and no bytes.
struct EmuPageBarrier {
    unsigned int expected, pending;
    int tx;
    unsigned int parity;
    explicit EmuPageBarrier(unsigned long long b)
        : expected(b & 0xfffff),
          pending((b >> 20) & 0xfffff),
          tx((int)((b >> 40) & 0x3fffff) << 10 >> 10),
          parity((b >> 62) & 1) {}
    unsigned long long bits() const {
        return expected | (unsigned long long)pending << 20 | ((unsigned long long)tx & 0x3fffff) << 40 |
               (unsigned long long)parity << 62;
    }
};
[[noreturn]] inline void emu_page_barrier_misuse(const unsigned long long* bar, const char* what) {
    std::fflush(stdout);
    std::fprintf(stderr, "emu: %s on page barrier %s (undefined on the GPU)\n", what,
                 emu_where(bar, 8, *emu_block).c_str());
    std::abort();
}
inline void page_barrier_init(unsigned long long* bar, unsigned int count) {
    if (count == 0 || count > 0xfffff) emu_page_barrier_misuse(bar, "a count of 0 or past 2^20 - 1");
    EmuPageBarrier b(0);
    b.expected = b.pending = count;
    *bar = b.bits();
    emu_cluster->page_barriers.push_back(bar);
    emu_changed();
}
// tx more bytes to come and `arrivals` arrivals on *bar (the phase completing if that was all).
inline void emu_page_barrier_update(unsigned long long* bar, int tx, unsigned int arrivals) {
    EmuPageBarrier b(*bar);
    if (b.expected == 0) emu_page_barrier_misuse(bar, "an arrival, expect or copy before its initialisation");
    if (arrivals > b.pending) emu_page_barrier_misuse(bar, "an arrival past its phase's count");
    b.tx += tx;
    if (b.tx >= 1 << 21 || b.tx < -(1 << 21)) emu_page_barrier_misuse(bar, "transaction bytes past 2^21");
    b.pending -= arrivals;
    if (b.pending == 0 && b.tx == 0) {
        b.pending = b.expected;
        b.parity ^= 1;
    }
    *bar = b.bits();
    emu_changed();
}
inline void page_barrier_arrive_expect_bytes(unsigned long long* bar, unsigned int bytes) {
    emu_page_barrier_update(bar, (int)bytes, 1);
}
inline void page_barrier_arrive(unsigned long long* bar) { emu_page_barrier_update(bar, 0, 1); }
inline bool page_barrier_try_wait_parity(unsigned long long* bar, unsigned int parity) {
    const EmuPageBarrier b(*bar);
    if (b.expected == 0) emu_page_barrier_misuse(bar, "a wait before its initialisation");
    return b.parity != (parity & 1);
}
// Queued, not performed: emu_run lands it before a random later resume of a fiber (reading src
// then), so a read of the page before a wait on the barrier has seen its phase complete gets
// stale bytes in some schedules. The GPU's alignment rules are checked here.
inline void page_bulk_load(void* dst, const void* src, unsigned int bytes, unsigned long long* bar) {
    if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) % 16 != 0 || bytes == 0)
        emu_page_barrier_misuse(bar, "a bulk copy not of 16-byte aligned addresses and a multiple of 16 bytes");
    emu_cluster->bulk.push_back({dst, src, bytes, bar, emu_block});
}
// Lands queued bulk copy i: its bytes, then their completion on its barrier.
inline void emu_bulk_land(EmuCluster& c, size_t i) {
    const EmuBulkCopy b = c.bulk[i];
    c.bulk.erase(c.bulk.begin() + i);
    emu_block = b.home;
    std::memcpy(b.dst, b.src, b.bytes);
    emu_page_barrier_update(b.bar, -(int)b.bytes, 0);
}

// Two e4m3 bytes (bits 0..15 of s01) as f16 pairs (s0, s0) and (s1, s1), times 2^7 (moe.cu's
// e4m3_pair_x128, a cvt.rn.f16x2.e4m3x2 there): every e4m3 value and its 2^7 multiple are f16s.
inline float emu_e4m3(unsigned int b) {
    const unsigned int e = (b >> 3) & 15, m = b & 7;
    const float v = e == 0 ? std::ldexp((float)m, -9) : (e == 15 && m == 7) ? NAN : std::ldexp(1.f + m / 8.f, (int)e - 7);
    return b & 0x80 ? -v : v;
}
inline void e4m3_pair_x128(unsigned int s01, unsigned int& s00, unsigned int& s11) {
    const uint16_t lo = emu_bits<uint16_t>((_Float16)(emu_e4m3(s01 & 0xff) * 128.f));
    const uint16_t hi = emu_bits<uint16_t>((_Float16)(emu_e4m3((s01 >> 8) & 0xff) * 128.f));
    s00 = (unsigned int)lo << 16 | lo;
    s11 = (unsigned int)hi << 16 | hi;
}

// Shared memory addresses (what __cvta_generic_to_shared gives and ldmatrix and cp.async take):
// offsets into the running block's dynamic shared memory (the kernels take them of nothing else).
inline size_t __cvta_generic_to_shared(const void* p) {
    const auto* c = static_cast<const unsigned char*>(p);
    unsigned char* dyn = emu_dyn_shared();
    if (c < dyn || c >= dyn + emu_block_dyn_bytes) emu_unsupported("a shared address outside dynamic shared memory");
    return (size_t)(c - dyn);
}
inline unsigned char* emu_shared_at(unsigned int s) { return emu_dyn_shared() + s; }

// Asynchronous copies (cp.async): n bytes (zeros when !ok) read at once, landing in shared
// memory only at the wait that covers their group, so a read before it sees the old bytes.
inline void emu_cp(void* dst, const void* src, size_t n, bool ok = true) {
    EmuFiber::Copy c{dst, {}, n};
    if (ok) std::memcpy(c.bytes, src, n);
    emu_cluster->running->open.push_back(c);
}
inline void pf_cp16(void* dst, const void* src) { emu_cp(dst, src, 16); }
inline void pf_cp16w(void* dst, const void* src) { emu_cp(dst, src, 16); }
inline void pf_cp8(void* dst, const void* src) { emu_cp(dst, src, 8); }
inline void pf_cp16z(void* dst, const void* src, bool ok) { emu_cp(dst, src, 16, ok); }
inline void pf_cp_commit() {
    EmuFiber& f = *emu_cluster->running;
    f.groups.push_back(std::move(f.open));
    f.open.clear();
}
// cp.async.wait_group N: every committed group but the newest N has landed.
template <int N>
inline void pf_cp_wait() {
    EmuFiber& f = *emu_cluster->running;
    while (f.groups.size() > (size_t)N) {
        for (const auto& c : f.groups.front()) std::memcpy(c.dst, c.bytes, c.n);
        f.groups.erase(f.groups.begin());
    }
}

// ldmatrix .x4 (.trans): lane i gives the shared address of row i % 8 of 8x8 matrix i / 8 (eight
// 16-bit elements); lane l receives, of matrix m, elements (l / 4, 2(l % 4)) and (l / 4, 2(l % 4)
// + 1), or with .trans (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4), as r_m's low and high halves.
inline void emu_ldmatrix(unsigned int s, unsigned int (&r)[4], bool trans) {
    const unsigned int l = threadIdx.x % 32;
    emu_warp_exchange((uint64_t)s, [&](const uint64_t* warp, unsigned int) {
        auto elem = [&](int m, int row, int col) {
            uint16_t v;
            std::memcpy(&v, emu_shared_at((unsigned int)warp[8 * m + row]) + 2 * col, 2);
            return (unsigned int)v;
        };
        for (int m = 0; m < 4; m++) {
            const int a = l / 4, b = 2 * (l % 4);
            r[m] = trans ? elem(m, b, a) | elem(m, b + 1, a) << 16 : elem(m, a, b) | elem(m, a, b + 1) << 16;
        }
        return 0;
    });
}
inline void pf_ldsm4(unsigned s, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    unsigned int r[4];
    emu_ldmatrix(s, r, false);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
inline void pf_ldsm4t(unsigned s, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    unsigned int r[4];
    emu_ldmatrix(s, r, true);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

// Clusters (__cluster_dims__): the block's rank, a barrier of all the cluster's threads, and a
// float at p's place in block `rank`'s copy of the same shared buffer.
inline unsigned int cluster_rank() { return emu_block->rank; }
inline void cluster_barrier() {
    if (emu_cluster->resident) emu_unsupported("a cluster barrier in a grid-resident launch");
    emu_arrive_and_wait(*emu_cluster->bar);
}
inline float cluster_load(const float* p, unsigned int rank) {
    const auto* c = reinterpret_cast<const unsigned char*>(p);
    for (auto& [id, b] : emu_block->shared) {
        if (c >= b.data() && c < b.data() + b.size()) {
            const auto& ob = emu_cluster->blocks[rank]->shared.at(id);
            float v;
            std::memcpy(&v, ob.data() + (c - b.data()), sizeof v);
            return v;
        }
    }
    emu_unsupported("cluster_load of an address outside shared memory");
}

// A fiber's life: the kernel, then out of its barriers, then back to the scheduler for good.
inline void emu_fiber_main() {
    EmuFiber& f = *emu_cluster->running;
    (*emu_cluster->kernel)();
    emu_drop(f.home->bar);
    emu_drop(f.home->warp_bar[f.thread.x / 32]);
    emu_drop(*emu_cluster->bar);
    f.done = true;
    emu_cluster->progress = true;
    _longjmp(emu_cluster->scheduler, 1);
}

// Where fiber f waits, in words, for a deadlock's report.
inline std::string emu_wait_text(const EmuFiber& f) {
    char buf[256];
    switch (f.wait) {
        case EmuFiber::Wait::block_barrier: return "at the block's barrier (__syncthreads)";
        case EmuFiber::Wait::warp_barrier: return "at the warp's barrier (__syncwarp, a shuffle or a vote)";
        case EmuFiber::Wait::cluster_barrier: return "at the cluster's barrier";
        case EmuFiber::Wait::none: return "nowhere known (it yielded outside a barrier or wait loop)";
        case EmuFiber::Wait::value: break;
    }
    const bool page_barrier = std::find(emu_cluster->page_barriers.begin(), emu_cluster->page_barriers.end(),
                                        (const void*)f.what) != emu_cluster->page_barriers.end();
    if (page_barrier) {
        // wait_backoff's target is the parity of the phase awaited (common.cuh's page_barrier_wait_parity).
        const EmuPageBarrier b(*reinterpret_cast<const unsigned long long*>(f.what));
        std::snprintf(buf, sizeof buf,
                      " to complete its phase of parity %u (the current one: %u of %u arrivals and %d bytes to come)",
                      f.target, b.pending, b.expected, b.tx);
        return "for page barrier " + emu_where(f.what, 8, *f.home) + buf;
    }
    std::snprintf(buf, sizeof buf, " to reach %u (it is %u)", f.target, *f.what);
    return "for " + emu_where(f.what, 4, *f.home) + buf;
}

// No fiber can go on: every live one waits, at a barrier or for a value, and the last pass (every
// live fiber resumed) changed nothing any of them waits on. Reports who waits for what (threads
// of a block with the same wait as one line) and aborts the run.
[[noreturn]] inline void emu_deadlock(const EmuCluster& c) {
    std::fflush(stdout);  // what the driver printed so far, before the reason
    std::fprintf(stderr, "emu: deadlock: every live thread waits and none can go on%s\n",
                 c.resident ? " (grid-resident launch)" : "");
    bool value_wait = false;
    int lines = 0;
    for (size_t i = 0; i < c.n_fibers;) {
        const EmuFiber& f = c.fibers[i];
        if (f.done) {
            i++;
            continue;
        }
        const std::string what = emu_wait_text(f);
        size_t j = i + 1;
        while (j < c.n_fibers && !c.fibers[j].done && c.fibers[j].home == f.home && emu_wait_text(c.fibers[j]) == what)
            j++;
        value_wait |= f.wait == EmuFiber::Wait::value;
        if (lines++ < 48)
            std::fprintf(stderr, "  block (%u, %u, %u) threads %u..%u wait %s\n", f.block.x, f.block.y, f.block.z,
                         f.thread.x, c.fibers[j - 1].thread.x, what.c_str());
        i = j;
    }
    if (lines > 48) std::fprintf(stderr, "  (%d more lines)\n", lines - 48);
    if (value_wait && !c.resident)
        std::fprintf(stderr, "  (a wait for another block's counter needs emu_launch_resident: emu_launch runs a "
                             "grid's clusters one after another)\n");
    std::abort();
}

// Runs c's fibers, made for the blocks `blocks` (x, y, z) of `threads` threads each, until every
// one has returned: each pass resumes every live fiber once, in a new random order, so a read of
// another thread's write with no barrier (or wait) between them gets the old value in some pass,
// whichever thread comes first. With `stalls`, some passes leave a random quarter of the blocks
// out (a slow SM), only after a pass that made progress. Bulk copies in flight land between
// resumes, at random. A pass with every fiber resumed in which none made progress (and no copy
// was left to land) is a deadlock: the same pass would repeat for ever (emu_deadlock).
inline void emu_run(EmuCluster& c, const std::vector<emu_dim3>& blocks, unsigned int threads, std::minstd_rand& rng,
                    bool stalls) {
    const size_t n = blocks.size() * threads;
    if (emu_fibers.size() < n) emu_fibers.resize(n);
    c.fibers = emu_fibers.data();
    c.n_fibers = n;
    c.blocks.clear();
    for (unsigned int q = 0; q < blocks.size(); q++) {
        c.blocks.push_back(std::make_unique<EmuBlock>(threads));
        c.blocks.back()->rank = c.resident ? 0 : q;
    }
    c.bar = std::make_unique<EmuBarrier>((unsigned int)n);
    // Copies still in flight when the last launch's threads had all ended (a kernel that never
    // waited for them) are dropped with it.
    c.bulk.clear();
    c.page_barriers.clear();
    for (size_t i = 0; i < n; i++) {
        EmuFiber& f = c.fibers[i];
        f.thread = {(unsigned int)(i % threads), 0, 0};
        f.block = blocks[i / threads];
        f.home = c.blocks[i / threads].get();
        f.started = f.done = false;
        f.wait = EmuFiber::Wait::none;
        f.open.clear();
        f.groups.clear();
        getcontext(&f.start);
        f.start.uc_stack = {f.stack->usable(), 0, EmuFiber::Stack::bytes};
        f.start.uc_link = nullptr;
        makecontext(&f.start, emu_fiber_main, 0);
    }
    std::vector<unsigned int> order(n);
    std::vector<char> stalled(blocks.size(), 0);
    bool stall = false;
    for (unsigned int live = 1; live;) {
        live = 0;
        c.progress = false;
        for (unsigned int i = 0; i < n; i++) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        for (auto& s : stalled) s = stall && rng() % 4 == 0;
        bool skipped = false;
        for (unsigned int i : order) {
            EmuFiber& f = c.fibers[i];
            if (f.done) continue;
            live++;
            if (stalled[i / threads]) {
                skipped = true;
                continue;
            }
            // Before a quarter of the resumes, a bulk copy in flight (any of them: the copy engine
            // keeps no order) lands, so a copy lands some resumes after its issue, or passes.
            if (!c.bulk.empty() && rng() % 4 == 0) emu_bulk_land(c, rng() % c.bulk.size());
            threadIdx = f.thread;
            blockIdx = f.block;
            emu_block = f.home;
            c.running = &f;
            if (!_setjmp(c.scheduler)) {
                if (f.started) _longjmp(f.ctx, 1);
                f.started = true;
                c.progress = true;
                setcontext(&f.start);
            }
        }
        // The copies in flight after a pass that changed nothing else land: a copy always lands
        // before the waits for it can be a deadlock.
        while (!c.progress && !c.bulk.empty()) emu_bulk_land(c, 0);
        if (live && !c.progress && !skipped) emu_deadlock(c);
        stall = stalls && c.progress;
    }
}

// Runs kernel() over a grid of gx × gy × gz blocks of `threads` threads in clusters of `cluster`
// blocks along x: a cluster's threads at once as fibers (emu_run, in an order seeded by EMU_SEED,
// default 1), clusters one after another. A barrier some thread never reaches is reported (a
// deadlock), and the run aborted.
template <typename F>
inline void emu_launch(unsigned int gx, unsigned int threads, F kernel, unsigned int cluster = 1, unsigned int gy = 1,
                       unsigned int gz = 1) {
    gridDim = {gx, gy, gz};
    blockDim = {threads, 1, 1};
    const std::function<void()> body = kernel;
    EmuCluster c;
    c.kernel = &body;
    emu_cluster = &c;
    static std::minstd_rand order_rng(std::getenv("EMU_SEED") ? std::atoi(std::getenv("EMU_SEED")) : 1);
    for (unsigned int z = 0; z < gz; z++)
        for (unsigned int y = 0; y < gy; y++)
            for (unsigned int c0 = 0; c0 < gx; c0 += cluster) {
                std::vector<emu_dim3> blocks;
                for (unsigned int q = 0; q < cluster; q++) blocks.push_back({c0 + q, y, z});
                emu_run(c, blocks, threads, order_rng, false);
            }
    emu_cluster = nullptr;
}

// Runs kernel() over a grid of gx blocks of `threads` threads with the whole grid resident, as a
// persistent kernel's grid (one block per SM) is on the GPU: every thread of every block a fiber
// at once, so a block may wait for a counter a later block releases (common.cuh's
// counter_wait_at_least; its wait loop yields here). The order is seeded by `seed`, and blocks
// stall at random (emu_run). A state in which no thread can go on is reported as a deadlock with
// what each waits for, and the run aborted. __syncthreads is per block as ever; no clusters.
template <typename F>
inline void emu_launch_resident(unsigned int gx, unsigned int threads, F kernel, uint64_t seed) {
    gridDim = {gx, 1, 1};
    blockDim = {threads, 1, 1};
    const std::function<void()> body = kernel;
    EmuCluster c;
    c.kernel = &body;
    c.resident = true;
    emu_cluster = &c;
    std::minstd_rand rng((uint32_t)(seed ^ (seed >> 32)) | 1);
    std::vector<emu_dim3> blocks;
    for (unsigned int b = 0; b < gx; b++) blocks.push_back({b, 0, 0});
    emu_run(c, blocks, threads, rng, true);
    emu_cluster = nullptr;
}
