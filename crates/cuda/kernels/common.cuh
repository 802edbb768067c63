// Shared by every fastdecode kernel module (prepended by the loader, not #included).
//
// Determinism and batch invariance: every kernel assigns the work of one (row, output) pair to a
// fixed set of threads with a fixed reduction order that does not depend on how many rows the
// launch carries, so a row's result is bit-identical whether it is computed alone (serial decode)
// or inside a K-row DFlash verify. No atomics on floats anywhere.
#include <cuda_bf16.h>

#define WARP 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// floor(log2(n)) for n >= 1, at compile time (warp_sum_scatter's lane of a sum: l >> (5 - ilog2(N))).
__host__ __device__ constexpr int ilog2(int n) { return n > 1 ? 1 + ilog2(n / 2) : 0; }

// Σ over the warp of each of v[B..B + N) (N a power of two, 2 <= N <= 32) with warp_sum's bits, the
// sums spread over the lanes: lane l ends with index l >> (5 - log2 N) (so every lane of N = 32
// holds its own). Step o of warp_sum adds the partner's value to the lane's own; here, at the
// first log2 N steps, a lane keeps half of its values (the upper half where bit o of the lane is
// set), sends the partner the other half and adds what it receives for the half it keeps: the same
// sums of the same pairs (a + b == b + a in IEEE), in 31 shuffles for N = 32 instead of 160.
// One template instance per step, so every index is a constant (as a loop, NVVM left the inner
// loop rolled and the array in local memory).
template <int N, int B, int O, int L>
__device__ __forceinline__ float warp_sum_scatter_from(float (&v)[L]) {
    if constexpr (N == 1) {
#pragma unroll
        for (int o = O; o > 0; o >>= 1) v[B] += __shfl_xor_sync(0xffffffffu, v[B], o);
        return v[B];
    } else {
        constexpr int H = N / 2;
        // Chosen by mask (one LOP3 each), not by selects that NVVM may turn into a select of
        // the address.
        const unsigned up = threadIdx.x & O ? 0xffffffffu : 0u;
#pragma unroll
        for (int i = 0; i < H; i++) {
            const unsigned lo = __float_as_uint(v[B + i]), hi = __float_as_uint(v[B + i + H]);
            const float send = __uint_as_float((up & lo) | (~up & hi)), keep = __uint_as_float((up & hi) | (~up & lo));
            v[B + i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
        return warp_sum_scatter_from<H, B, O / 2>(v);
    }
}
template <int N, int B, int L>
__device__ __forceinline__ float warp_sum_scatter(float (&v)[L]) {
    static_assert(N >= 2 && N <= 32 && (N & (N - 1)) == 0, "N: a power of two up to 32");
    return warp_sum_scatter_from<N, B, 16>(v);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#include <cuda_fp16.h>

#define NEG_INF (-__int_as_float(0x7f800000))

// Programmatic dependent launch (device.rs `Launch`): a kernel may start while its predecessor
// still runs. Before pdl_wait() it only loads data no earlier kernel of the stream is still
// writing (weights; KV-cache rows of earlier steps; anything written two kernels back, since the
// predecessor passed its own wait before letting this one start). After the wait it lets its own
// successor start launching.
// Timeline tracing (`-DFD_TRACE`, `fastdecode bench --trace`): thread 0 of every block of a
// traced kernel stamps the global timer and its SM's cycle counter when the block starts (event
// 0), passes pdl_wait (1), reaches a mark (FD_MARK, 3 and up) and ends (2), into this module's
// fd_trace buffer, read back by Gpu::trace_take. A block reserves FD_TRACE_SLOTS records with one
// atomic as it starts (marks past them are dropped), so a mark costs a few stores: an atomic per
// mark put an L2 round trip (~0.8 us, the block's other warps waiting at its next barrier) into
// every traced phase.
// Unused slots keep a zero timestamp and are skipped when read (trace_take zeroes what it read).
#ifdef FD_TRACE
#define FD_TRACE_CAP (1u << 21)
#define FD_TRACE_SLOTS 12u
__device__ unsigned int fd_trace_n;
__device__ unsigned long long fd_trace[3 * FD_TRACE_CAP];
__shared__ unsigned int fd_kind;  // the running kernel's kind, with 0xA5 in the top byte
__shared__ unsigned int fd_next;  // the block's next reserved record
__shared__ unsigned int fd_end;   // one past its last
__device__ __forceinline__ void fd_stamp(unsigned int kind, unsigned int ev) {
    if (threadIdx.x | threadIdx.y | threadIdx.z) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned int i = fd_next;
    const unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (i < fd_end && i < FD_TRACE_CAP) {
        fd_next = i + 1;
        fd_trace[3 * i] = t;
        fd_trace[3 * i + 1] = ((unsigned long long)(kind & 0xffffffu) << 40) | ((unsigned long long)ev << 32) | b;
        fd_trace[3 * i + 2] = clock64();  // the SM's cycle counter: with t, its clock rate
    }
}
struct FdTraceScope {
    unsigned int kind;
    __device__ FdTraceScope(unsigned int k) : kind(k) {
        if (threadIdx.x == 0) {
            fd_kind = 0xA5000000u | k;
            fd_next = atomicAdd(&fd_trace_n, FD_TRACE_SLOTS);
            fd_end = fd_next + FD_TRACE_SLOTS;
        }
        fd_stamp(k, 0);
    }
    __device__ ~FdTraceScope() { fd_stamp(kind, 2); }
};
// kind: a kernel id (top 4 of 24 bits) and a tag (e.g. the GEMV's output rows).
#define FD_TRACE_KERNEL(id, tag) FdTraceScope fd_trace_scope_(((unsigned int)(id) << 20) | ((unsigned int)(tag) & 0xfffffu))
#define FD_MARK(ev) fd_stamp(fd_kind, ev)
#else
#define FD_TRACE_KERNEL(id, tag)
#define FD_MARK(ev)
#endif

// `p`, for reading data an earlier kernel of the stream writes, once this thread has passed
// pdl_wait(): loads through the result depend on this volatile asm, which stays after the wait's.
// Loads through a `const __restrict__` pointer itself are non-coherent loads that NVVM treats as
// invariant and may hoist above the wait: a gate/up kernel serving several rows per block read
// its experts' ids before it, and its K-row verify differed from K steps with programmatic
// launches on (H200; `tools/gpu/sass.py` lists a kernel's loads before its first wait).
template <typename T>
__device__ __forceinline__ const T* after_wait(const T* p) {
    asm volatile("mov.b64 %0, %0;" : "+l"(p) : : "memory");
    return p;
}

__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#ifdef FD_TRACE
    if (threadIdx.x == 0 && (fd_kind >> 24) == 0xA5u) fd_stamp(fd_kind, 1);
#endif
}

// Every thread of the block calls it after the block's global writes that another block will
// read: true, in every thread, in the block whose arrival at `counter` is the total-th. That
// block then sees every arrived block's writes (read them at L2, __ldcg: not through a stale L1).
// One thread's release/acquire atomic after the block barrier (which orders the block's writes
// before it) is all this message passing needs; the sequentially consistent __threadfence() in
// every thread before and after it, which it replaced, cost ~0.8 % of the XS 2.1 decode step
// (2.50 against 2.48 ms/token, H200).
__device__ __forceinline__ bool block_arrives_last(unsigned int* counter, unsigned int total) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
        last = before == total - 1;
    }
    __syncthreads();
    return last;
}

// The same for a warp (its lanes' writes ordered before lane 0's atomic by the warp barrier):
// true, in every lane, in the warp whose arrival at `counter` is the total-th.
__device__ __forceinline__ bool warp_arrives_last(unsigned int* counter, unsigned int total) {
    __syncwarp();
    unsigned int last = 0;
    if (threadIdx.x % WARP == 0) {
        unsigned int before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
        last = before == total - 1;
    }
    return __shfl_sync(0xffffffffu, last, 0);
}

// Persistent kernels (issue 44): one block per SM walks a queue of (layer, op, tile) items; a
// loader warp fills a ring of shared-memory pages with the next items' weights while the compute
// warps work. Two kinds of monotonic counter order the work; neither is ever reset (the next
// decode step's targets are simply higher), so no reset can race with a late reader:
//  - dependency counters in global memory, between blocks: an item's producer adds to its op's
//    counter once its outputs are written (counter_release_add), a consumer waits until the
//    counter reaches the item's target (counter_wait_at_least) and only then reads them;
//  - page flags in shared memory, between a block's loader and compute warps: a page's "full"
//    flag counts the times it was filled, its "empty" flag the compute warps' releases of it, so
//    use u of a page waits for full >= u + 1, and its refill for empty >= (u + 1) · (compute warps).
// Values are compared wrap-around (`(int)(v - target) >= 0`): a counter may pass 2^32 as long as
// it stays within 2^31 of the targets it is compared with.
// Every wait loop calls wait_backoff while short of its target: a sleep on the GPU, and in the
// emulator (tools/emu, whose emu_launch_resident runs the whole grid at once) a switch to another
// thread's fiber, so a schedule no grid could finish is reported there as a deadlock instead of
// hanging. The loads and adds themselves are PTX, replaced by host versions in tools/emu/shim.h.
#ifndef FD_WAIT_MAX_NS
#define FD_WAIT_MAX_NS 256  // the longest sleep between two polls of a wait loop
#endif

// A dependency counter's value, with acquire semantics at GPU scope: once it shows the releases
// a thread waited for, that thread's later loads see every write the releasing blocks made before
// their release. Read such data (written by other SMs during this kernel) with __ldcg or plain
// loads, never __ldg, ld.global.nc or through a `const __restrict__` pointer: the non-coherent
// read-only path is not ordered by the acquire (it may serve a stale line) and NVVM treats those
// loads as invariant, free to hoist above the wait (see after_wait). The project reads such data
// at L2 (__ldcg), as block_arrives_last's readers do, so no L1 line from before can answer.
__device__ __forceinline__ unsigned counter_acquire_load(const unsigned* c) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
    return v;
}

// Adds v to a dependency counter with release semantics at GPU scope (a reduction: the thread does
// not wait for the L2 round trip). It publishes this thread's earlier writes, and other threads'
// writes ordered before it by a barrier, so the pattern is: every thread's stores of the outputs;
// then a barrier of the writing threads (__syncwarp() where one warp wrote, __syncthreads() or a
// named barrier of the compute warps where several did); then ONE thread adds. No __threadfence:
// the barrier orders the writes before the release, as block_arrives_last relies on. The add
// must come after the writes it announces are done, never before (a reader could pass early).
__device__ __forceinline__ void counter_release_add(unsigned* c, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" : : "l"(c), "r"(v) : "memory");
}

// The same two for a page flag in shared memory, at CTA scope (the loader and compute warps are
// one block): page_flag_release_add after the loader's page writes are done (its lanes' stores,
// then __syncwarp(), then lane 0; cp.async copies must have been waited for first) or after a
// compute warp's last read of the page (the same order: the release also orders its reads before
// the loader's next writes).
__device__ __forceinline__ unsigned page_flag_acquire_load(const unsigned* f) {
    unsigned v;
    asm volatile("ld.acquire.cta.shared.u32 %0, [%1];"
                 : "=r"(v)
                 : "r"((unsigned)__cvta_generic_to_shared(f))
                 : "memory");
    return v;
}
__device__ __forceinline__ void page_flag_release_add(unsigned* f, unsigned v) {
    asm volatile("red.release.cta.shared.add.u32 [%0], %1;" : : "r"((unsigned)__cvta_generic_to_shared(f)), "r"(v)
                 : "memory");
}

// One turn of a wait loop that saw `what` at `seen`, short of `target`: on the GPU a sleep of ns
// nanoseconds, doubling up to FD_WAIT_MAX_NS, so a waiting warp leaves the issue slots and the
// memory system to the warps doing work; in the emulator a yield of the thread's fiber (shim.h),
// which records what it waits for, for a deadlock's report (hence the unused arguments here).
__device__ __forceinline__ void wait_backoff(const unsigned* what, unsigned seen, unsigned target, unsigned& ns) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(ns);
#endif
    ns = ns < FD_WAIT_MAX_NS / 2 ? 2 * ns : FD_WAIT_MAX_NS;
}

// Waits, in the calling thread, until dependency counter c is at least target; returns the value
// seen. The thread's later loads then see what the releases up to target published.
__device__ __forceinline__ unsigned counter_wait_at_least(const unsigned* c, unsigned target) {
    unsigned ns = 32, v;
    while ((int)((v = counter_acquire_load(c)) - target) < 0) wait_backoff(c, v, target, ns);
    return v;
}
// The same for a page flag in shared memory (shorter sleeps: the loader is on the same SM).
__device__ __forceinline__ unsigned page_flag_wait_at_least(const unsigned* f, unsigned target) {
    unsigned ns = 8, v;
    while ((int)((v = page_flag_acquire_load(f)) - target) < 0) wait_backoff(f, v, target, ns);
    return v;
}

// Warp-wide forms (every lane calls them): lane 0 polls while the other lanes wait at the warp
// barrier, which orders its acquire before their loads (one poll per warp, not 32 at one address).
__device__ __forceinline__ void warp_counter_wait_at_least(const unsigned* c, unsigned target) {
    if (threadIdx.x % WARP == 0) counter_wait_at_least(c, target);
    __syncwarp();
}
__device__ __forceinline__ void warp_page_flag_wait_at_least(const unsigned* f, unsigned target) {
    if (threadIdx.x % WARP == 0) page_flag_wait_at_least(f, target);
    __syncwarp();
}
// After the warp's own writes (or last reads, for a page): the warp barrier orders every lane's
// before lane 0's release.
__device__ __forceinline__ void warp_counter_release_add(unsigned* c, unsigned v) {
    __syncwarp();
    if (threadIdx.x % WARP == 0) counter_release_add(c, v);
}
__device__ __forceinline__ void warp_page_flag_release_add(unsigned* f, unsigned v) {
    __syncwarp();
    if (threadIdx.x % WARP == 0) page_flag_release_add(f, v);
}

// A page ring filled by bulk copies (sm_90; tools/gpu/stream_ring.py and ring_chain.py measured
// it faster than a loader's lane stores): each page has a "full" and an "empty" page barrier (an
// mbarrier, an unsigned long long in shared memory). Use u of a page (u = 0, 1, ...) is its
// barriers' phase u, awaited with parity u & 1:
//  - the loader, for use u >= 1, waits for phase u - 1 of "empty" (every compute warp's release of
//    the page's previous use); then one lane arrives on "full" expecting the tile's bytes
//    (page_barrier_arrive_expect_bytes) and its lanes issue a bulk copy each (page_bulk_load, one
//    tile row a lane), whose bytes complete on "full" (in either order: bytes may complete before
//    they are expected, the arrival still to come holds the phase open);
//  - a compute warp waits for phase u of "full" (the arrival and every expected byte), reads the
//    page, and after its last read (__syncwarp(), then lane 0) arrives on "empty".
// "full" counts 1 arrival a phase, "empty" one per compute warp (page_barrier_init, by one thread
// before the block's first barrier). The expected bytes must be exactly those the copies bring:
// more and the phase never completes (a hang; the emulator reports it as a deadlock naming the
// barrier), fewer and it completes before the last copy lands. An arrival past a phase's count
// is undefined (the emulator aborts on it). The PTX is replaced by host versions in
// tools/emu/shim.h, which land each bulk copy at a random later point, so a read of a page before
// its wait sees stale data there too.
__device__ __forceinline__ void page_barrier_init(unsigned long long* bar, unsigned count) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(b), "r"(count) : "memory");
    // The async proxy (the bulk copies' complete_tx) must see the initialised barrier.
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
}
// One arrival on `bar`, and `bytes` more for its current phase to wait for (page_bulk_load's).
__device__ __forceinline__ void page_barrier_arrive_expect_bytes(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 : : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
// One arrival on `bar`, with release semantics at CTA scope: the thread's earlier reads and writes
// (and its warp's, ordered before it by a __syncwarp) come before whatever the waiter does next.
__device__ __forceinline__ void page_barrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" : : "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}
// Whether the phase of `bar` with parity `parity` has completed (acquire at CTA scope: then the
// page's bytes and the arriving threads' accesses are seen). The hardware suspends the thread for
// a while before answering no.
__device__ __forceinline__ bool page_barrier_try_wait_parity(unsigned long long* bar, unsigned parity) {
    unsigned done;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity)
                 : "memory");
    return done;
}
// Waits, in the calling thread, until the phase of `bar` with parity `parity` has completed
// (wait_backoff between tries, given the barrier and the parity: the emulator yields there).
__device__ __forceinline__ void page_barrier_wait_parity(unsigned long long* bar, unsigned parity) {
    unsigned ns = 8;
    while (!page_barrier_try_wait_parity(bar, parity))
        wait_backoff(reinterpret_cast<const unsigned*>(bar), parity, parity, ns);
}
// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) by the copy
// engine, completing those bytes on `bar` (whose phase must expect them). The issuing thread goes
// on at once; the data is there only once a wait on `bar` has seen the phase complete.
__device__ __forceinline__ void page_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :
                 : "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes),
                   "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}

// d += a·b for one m16n8k16 tile: a = 16×16 bf16 (row), b = 16×8 bf16 (col), d 16×8 f32.
// Fragments (g = lane / 4, t = lane % 4): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..),
// a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..); b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g);
// d0,d1 = (row g, cols 2t, 2t+1), d2,d3 = (row g+8, cols 2t, 2t+1).
__device__ __forceinline__ void mma_bf16(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The same with f16 a and b (moe.cu's NVFP4 expert GEMVs).
__device__ __forceinline__ void mma_f16(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                        unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Eight bf16 from one 16-byte word, widened by a shift (bf16 is the top half of an f32).
__device__ __forceinline__ void unpack_bf16x8(uint4 raw, float out[8]) {
    const unsigned int u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// Weights are read once per token: stream them past L1 so activations keep the cache.
// FD_WEIGHT_LOAD picks the load flavour (a tuning knob: FASTDECODE_NVRTC_DEFINES=-DFD_WEIGHT_LOAD=n):
// 0 non-coherent, no L1 allocation, 256-byte L2 prefetch; 1 evict-first (.cs); 2 plain __ldg.
#ifndef FD_WEIGHT_LOAD
#define FD_WEIGHT_LOAD 0
#endif
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
#if FD_WEIGHT_LOAD == 0
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
#elif FD_WEIGHT_LOAD == 1
    return __ldcs(p);
#else
    return __ldg(p);
#endif
}

// 1 / rms of `rows` rows of x (width n, n % 4 == 0) into inv[0..rows) (shared memory), with a
// fixed partition over the first 256 threads of the block (thread t takes float4s t, t + 256,
// ...) and a fixed reduction, so every block of every launch computes bit-identical values
// whatever `rows` or the block size (>= 256) is. `red` is shared scratch of 8 · 16 floats;
// rows <= R <= 16 (R: the most rows the caller's kernel passes). A thread requests its float4
// of every row at once and then adds each row's squares in the same order as a one-row call:
// requested row after row, the rows' loads were one round trip each, after the kernel's wait
// (an 8-row q|k|v|g launch of 2048 columns: sixteen, a fifth of its stall samples; H200,
// Nsight Compute). Every thread of the block must call it; it ends with a barrier.
template <int R = 1>
__device__ __forceinline__ void block_inv_rms(const float* __restrict__ x, int n, int rows, float eps,
                                              float* inv, float* red) {
    const int t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    if (t < 256) {
        float s[R];
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = 0.f;
        for (int i = t; i < n / 4; i += 256) {
            float4 v[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows) v[r] = reinterpret_cast<const float4*>(x + (size_t)r * n)[i];
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < rows) {
                    s[r] += v[r].x * v[r].x;
                    s[r] += v[r].y * v[r].y;
                    s[r] += v[r].z * v[r].z;
                    s[r] += v[r].w * v[r].w;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < rows) {
                const float w = warp_sum(s[r]);
                if (lane == 0) red[warp * 16 + r] = w;
            }
        }
    }
    __syncthreads();
    if (t < rows) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w * 16 + t];
        inv[t] = 1.f / sqrtf(s / (float)n + eps);
    }
    __syncthreads();
}

// A normed row staged in shared memory by a whole block (256 threads), xs[i] = norm[i]·(x[i]·inv)
// (the value gemv_chunk forms, so the bits match), with the norm weight (a weight) requested
// before the kernel's wait: thread t holds the packed 16-byte words t, t + 256, ... (elements
// 8t..8t+8, ...), W of them, for rows of up to 2048·W. Requested after the wait, the weight was
// one more round trip after the rms of x on the critical path: staging the router's row this way
// took the XS 2.1 decode step from 2.489 to 2.414 ms/token, the q|k|v|g GEMV's 0.7 % more (H200).
template <int W>
struct NormWords {
    uint4 w[W];
};
template <int W>
__device__ __forceinline__ NormWords<W> norm_words_load(const __nv_bfloat16* __restrict__ norm, int n) {
    NormWords<W> nw;
#pragma unroll
    for (int j = 0; j < W; j++) {
        const int i = 8 * (threadIdx.x + 256 * j);
        nw.w[j] = i < n ? *reinterpret_cast<const uint4*>(norm + i) : make_uint4(0, 0, 0, 0);
    }
    return nw;
}
template <int W>
__device__ __forceinline__ void norm_words_stage(const NormWords<W>& nw, const float* __restrict__ x, float inv, int n,
                                                 float* xs) {
#pragma unroll
    for (int j = 0; j < W; j++) {
        const int i = 8 * (threadIdx.x + 256 * j);
        if (i < n) {
            float w[8];
            unpack_bf16x8(nw.w[j], w);
            const float4 a = *reinterpret_cast<const float4*>(x + i);
            const float4 b = *reinterpret_cast<const float4*>(x + i + 4);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 8; e++) xs[i + e] = w[e] * (xv[e] * inv);
        }
    }
}

// NVFP4, decoded with bit tricks instead of tables: an e2m1 nibble (sign, 2 exponent bits, 1
// mantissa bit) placed at bit 9 of an f16 is the value times 2^-14; an e4m3 byte placed at bit 7
// is the value times 2^-8. Both are exact, so products match the CPU's e4m3 · e2m1 exactly.
#define NVFP4_UNSCALE 4194304.f  // 2^22 = 2^14 · 2^8

__device__ __forceinline__ float e4m3_scaled(unsigned int b) {
    const unsigned short bits = (unsigned short)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
    return __half2float(__ushort_as_half(bits));
}

// Σ_j e2m1(code_j) · x_j · 2^-14 over the 8 codes of `word` (code j ↔ x[j]), in a fixed order.
// Each code's f16 lies wholly in its high byte (sign at bit 7, magnitude at bits 1..3; the low
// byte is zero), so the high bytes of all even codes are made at once, and of all odd codes, and
// each pair (j, j + 4) is then one byte permute. Shifting and masking each pair apart took 18
// integer instructions per 8 codes in moe_gate_up's SASS, this 15 (7 % fewer instructions in
// all; the XS 2.1 step 2.318 -> 2.244 ms on the H200). The halves equal the per-pair ones for
// all 2^32 words (checked on the CPU) and are summed in the same order: the same bits.
__device__ __forceinline__ float nvfp4_word_dot(unsigned int word, const float* x) {
    const unsigned int ev = ((word << 4) & 0x80808080u) | ((word << 1) & 0x0e0e0e0eu);  // codes 0, 2, 4, 6
    const unsigned int od = (word & 0x80808080u) | ((word >> 3) & 0x0e0e0e0eu);         // codes 1, 3, 5, 7
    const unsigned int hb[4] = {__byte_perm(ev, 0, 0x2404), __byte_perm(od, 0, 0x2404), __byte_perm(ev, 0, 0x3414),
                                __byte_perm(od, 0, 0x3414)};
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {  // codes j (low half) and j + 4 (high)
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hb[j]));
        s += f.x * x[j];
        s += f.y * x[j + 4];
    }
    return s;
}

// Dot of 32 NVFP4 codes (one 16-byte word: two scale groups) with x[0..32), scales s0, s1.
__device__ __forceinline__ float nvfp4_chunk_dot(uint4 c, unsigned int s01, const float* x) {
    const float g0 = nvfp4_word_dot(c.x, x) + nvfp4_word_dot(c.y, x + 8);
    const float g1 = nvfp4_word_dot(c.z, x + 16) + nvfp4_word_dot(c.w, x + 24);
    return e4m3_scaled(s01 & 0xffu) * g0 + e4m3_scaled((s01 >> 8) & 0xffu) * g1;
}


__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

// softplus as the CPU computes it (linear above 20, where log1p(exp(x)) == x in f32).
__device__ __forceinline__ float softplus(float v) { return v > 20.f ? v : log1pf(expf(v)); }

// bf16 GEMV building blocks (used by dense.cu's gemv_bf16 and moe.cu's router).
// One 16-byte chunk of a weight row (8 bf16 at columns 8c..8c+8) into the R row accumulators.
// Rows past `rows` repeat the last row (their results are discarded), so every row's arithmetic
// is the same whatever R the launch picked.
template <int R>
__device__ __forceinline__ void gemv_chunk(uint4 wv, int c, const float* __restrict__ x,
                                           const __nv_bfloat16* __restrict__ norm, const float* inv,
                                           int in, int rows, float acc[R]) {
    float w[8], nw[8];
    unpack_bf16x8(wv, w);
    if (norm) unpack_bf16x8(*reinterpret_cast<const uint4*>(norm + 8 * c), nw);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int rr = r < rows ? r : rows - 1;
        // Plain loads: x may be global (L1-cached) or a shared-memory copy.
        const float4 a = *reinterpret_cast<const float4*>(x + (size_t)rr * in + 8 * c);
        const float4 b = *reinterpret_cast<const float4*>(x + (size_t)rr * in + 8 * c + 4);
        float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        if (norm) {
#pragma unroll
            for (int j = 0; j < 8; j++) xv[j] = nw[j] * (xv[j] * inv[rr]);
        }
        float s = acc[r];
#pragma unroll
        for (int j = 0; j < 8; j++) s += w[j] * xv[j];
        acc[r] = s;
    }
}

// Persistent, double-buffered GEMV for R rows. The weights are cut into units of 256 16-byte
// chunks (one row segment; a 2048-wide bf16 row is one unit): warp w of the grid takes rows w,
// w + warps, ... and their segments in order, lane l taking chunks l, l + 32, ... of a segment,
// and issues the next unit's eight loads before computing the current one, so HBM always has a
// warp's next 4 KiB in flight. The first unit is loaded before the caller's prologue (`ready`,
// e.g. the RMSNorm of x) so the two overlap. Each row's sum runs over its chunks in one fixed order
// and ends in a fixed butterfly: it never depends on R, the grid, or which warp ran it.
template <int R, typename Prologue>
__device__ __forceinline__ void gemv_persistent(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                                const __nv_bfloat16* __restrict__ norm, const float* inv,
                                                float* __restrict__ y, int out, int in, int rows, int accumulate,
                                                Prologue ready) {
    const int lane = threadIdx.x % WARP;
    const int nw = gridDim.x * (blockDim.x / WARP);
    const int nc = in / 8, nseg = (nc + 8 * WARP - 1) / (8 * WARP);
    const uint4* Wv = reinterpret_cast<const uint4*>(W);
    auto load = [&](uint4* buf, int o, int seg) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int c = seg * 8 * WARP + lane + u * WARP;
            buf[u] = c < nc ? load_stream(Wv + (size_t)o * nc + c) : make_uint4(0, 0, 0, 0);
        }
    };
    int o = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, seg = 0;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    // The unit after (o, seg) in this warp's order.
    auto advance = [&](int& oo, int& ss) {
        if (++ss == nseg) {
            ss = 0;
            oo += nw;
        }
    };
    // When accumulating, lane 0 reads the row's old y as the row begins, so the round trip
    // overlaps the row's dot instead of following it (always after the wait: y may be the
    // predecessor's output).
    float old[R];
    auto consume = [&](const uint4* buf, int oo, int ss) {
        if (accumulate && ss == 0 && lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) old[r] = r < rows ? y[(size_t)r * out + oo] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int c = ss * 8 * WARP + lane + u * WARP;
            if (c < nc) gemv_chunk<R>(buf[u], c, x, norm, inv, in, rows, acc);
        }
        if (ss == nseg - 1) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float s = warp_sum(acc[r]);
                if (lane == 0 && r < rows) y[(size_t)r * out + oo] = accumulate ? old[r] + s : s;
                acc[r] = 0.f;
            }
        }
    };
    // Two buffers used in turn (no register copies between them): while one is consumed the
    // other's loads are in flight.
    uint4 a[8], b[8];
    if (o < out) load(a, o, 0);
    pdl_wait();
    ready();
    while (o < out) {
        int o1 = o, s1 = seg;
        advance(o1, s1);
        if (o1 < out) load(b, o1, s1);
        consume(a, o, seg);
        o = o1;
        seg = s1;
        if (o >= out) break;
        advance(o1, s1);
        if (o1 < out) load(a, o1, s1);
        consume(b, o, seg);
        o = o1;
        seg = s1;
    }
}

// The multi-row GEMV (2 <= R <= 16 rows of x, a verify block): a warp streams G consecutive
// weight rows at once, so each 16-byte chunk of every row of x' is read once per G weight rows.
// With one weight row per warp (gemv_persistent), R rows read 32R bytes of x through L1 for
// every 16 bytes of weights, and L1 (128 B/clock/SM) capped the GEMV far below HBM's rate: the
// q|k|v|g GEMV of an 8-row verify took 2.96 ms per forward against 0.65 for one row (H200,
// bench --profile). Per (weight row, x row) the arithmetic is gemv_persistent's exactly: the
// lane's chunks c ≡ lane (mod 32) in ascending order, each chunk's eight products one fma chain
// onto the accumulator, the same butterfly (as warp_sum_scatter), then the old y added
// (accumulate); so every row gives the same bits as a one-row launch. Units are (task, block of
// U·32 chunks), double-buffered like gemv_persistent's, a task being a group of G weight rows over
// one of RS equal sets of the R rows of x (RS = 2: each warp's reads of x serve G weight rows for
// half of the rows, where RS = 1 with G / 2 weight rows gives as many tasks; dense.cu's `_g4h`).
//
// With KB > 0 the rows' x' (norm ⊙ x · inv, or x where norm is null) is staged in shared memory
// `xs` by the whole block, KB chunks (8·KB columns) at a time: the block's warps take groups in
// rounds and walk their units in step, restaging at each k-block boundary between two barriers
// (once per launch where the row fits in one k-block, as XS 2.1's 2048-wide rows do). A warp's
// 16-byte reads are consecutive there (each row's first halves of the k-block's chunks, then
// their second halves: no bank conflicts). Staged or not, x' has the same value (the same
// expression), so the same bits. dense.rs stages normed rows only: plain ones (an 8192-wide
// o_proj in four k-blocks) gained little at 8 rows and lost at 4 (H200, BENCHMARKS, sixteenth
// measurement). The plain path stays because the build with it timed the serial step at the
// old speed and the build without it (norm required) 2 % slower, though the one-row step runs
// neither; still 1.1 % with modules loaded eagerly (seventeenth measurement): not understood.
template <int R, int G, int U, int KB, int RS, typename Prologue>
__device__ __forceinline__ void gemv_persistent_grouped(const __nv_bfloat16* __restrict__ W,
                                                        const float* __restrict__ x,
                                                        const __nv_bfloat16* __restrict__ norm, const float* inv,
                                                        float* xs, float* __restrict__ y, int out, int in,
                                                        int rows, int accumulate, Prologue ready) {
    constexpr int RR = R / RS;  // rows of x a warp's task sums
    constexpr int N = G * RR, NS = N < WARP ? N : WARP, SETS = N / NS;  // sums per scatter, scatters
    static_assert(R % RS == 0 && N % NS == 0 && SETS <= 2, "G·R/RS: a power of two up to 64");
    static_assert(KB % (U * WARP) == 0, "a k-block is whole units");
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    // The group's sum this lane ends with in scatter `h` (warp_sum_scatter), and whether it is the
    // lane that stores it (the first of the lanes holding it).
    constexpr int shift = 5 - ilog2(NS);  // lanes per sum: 2^shift = 32 / NS
    const int mine = lane >> shift;
    const bool owner = (lane & ((1 << shift) - 1)) == 0;
    const int nw = gridDim.x * warps;
    const int nc = in / 8, nblk = (nc + U * WARP - 1) / (U * WARP);
    // A task: a group of G weight rows over one of the RS sets of RR rows of x, (group, set) =
    // (task / RS, task % RS). R is the next power of two of `rows`, so every set has a row.
    const int groups = (out + G - 1) / G, tasks = groups * RS;
    const uint4* Wv = reinterpret_cast<const uint4*>(W);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* xs4 = reinterpret_cast<float4*>(xs);
    auto load = [&](uint4 (&buf)[G][U], int task, int blk) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int o = task / RS * G + g;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = blk * U * WARP + lane + u * WARP;
                buf[g][u] = o < out && c < nc ? load_stream(Wv + (size_t)o * nc + c) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    // k-block kb of the rows' x' into xs: float4 (r, h, c) at (2r + h)·KB + c.
    int staged = -1;
    auto stage = [&](int kb) {
        if (kb == staged) return;
        staged = kb;
        __syncthreads();  // every warp is done with the previous k-block
        // SB float4s a thread requested at once, then stored: one L2 round trip per SB (xs may
        // alias x as far as the compiler knows, which would order each load after the previous
        // store). More would hold registers beside the weights in flight.
        constexpr int SB = 4;
        for (int i0 = 0; i0 < rows * 2 * KB; i0 += SB * blockDim.x) {
            float4 v[SB];
            uint4 nw[SB];
#pragma unroll
            for (int j = 0; j < SB; j++) {
                const int i = i0 + j * blockDim.x + threadIdx.x;
                const int r = i / (2 * KB), h = (i / KB) % 2, c = kb * KB + i % KB;
                const bool in_range = i < rows * 2 * KB && c < nc;
                v[j] = in_range ? x4[((size_t)r * in + 8 * c) / 4 + h] : make_float4(0.f, 0.f, 0.f, 0.f);
                if (norm) nw[j] = in_range ? *reinterpret_cast<const uint4*>(norm + 8 * c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < SB; j++) {
                const int i = i0 + j * blockDim.x + threadIdx.x;
                if (i >= rows * 2 * KB) break;
                const int r = i / (2 * KB), h = (i / KB) % 2;
                if (norm) {
                    float nwv[8];
                    unpack_bf16x8(nw[j], nwv);
                    v[j] = make_float4(nwv[4 * h] * (v[j].x * inv[r]), nwv[4 * h + 1] * (v[j].y * inv[r]),
                                       nwv[4 * h + 2] * (v[j].z * inv[r]), nwv[4 * h + 3] * (v[j].w * inv[r]));
                }
                xs4[(2 * r + h) * KB + i % KB] = v[j];
            }
        }
        __syncthreads();
    };
    int task = blockIdx.x * warps + warp, blk = 0;
    float acc[N];  // sum i = g·RR + r: weight row g of the group, row r of the task's set
#pragma unroll
    for (int i = 0; i < N; i++) acc[i] = 0.f;
    auto advance = [&](int& gg, int& bb) {
        if (++bb == nblk) {
            bb = 0;
            gg += nw;
        }
    };
    // Staged, a warp keeps walking (and meeting the block's barriers) while any warp of its
    // block's round has a task.
    auto running = [&](int gg) { return KB > 0 ? gg - warp < tasks : gg < tasks; };
    float old[SETS];
    auto consume = [&](const uint4 (&buf)[G][U], int gg, int bb) {
        if constexpr (KB > 0) {
            stage(bb * U * WARP / KB);
            if (gg >= tasks) return;
        }
        const int grp = gg / RS, r0 = gg % RS * RR;
        if (accumulate && bb == 0) {
#pragma unroll
            for (int h = 0; h < SETS; h++) {
                const int i = h * NS + mine, g = i / RR, r = r0 + i % RR, o = grp * G + g;
                old[h] = owner && r < rows && o < out ? y[(size_t)r * out + o] : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = bb * U * WARP + lane + u * WARP;
            if (c < nc) {
                float w[G][8], nwv[8];
#pragma unroll
                for (int g = 0; g < G; g++) unpack_bf16x8(buf[g][u], w[g]);
                if (KB == 0 && norm) unpack_bf16x8(*reinterpret_cast<const uint4*>(norm + 8 * c), nwv);
#pragma unroll
                for (int r = 0; r < RR; r++) {
                    const int rr = r0 + r < rows ? r0 + r : rows - 1;
                    const float4 a = KB > 0 ? xs4[(2 * rr) * KB + c % KB] : x4[((size_t)rr * in + 8 * c) / 4];
                    const float4 b = KB > 0 ? xs4[(2 * rr + 1) * KB + c % KB] : x4[((size_t)rr * in + 8 * c) / 4 + 1];
                    float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    if (KB == 0 && norm) {
#pragma unroll
                        for (int j = 0; j < 8; j++) xv[j] = nwv[j] * (xv[j] * inv[rr]);
                    }
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float s = acc[g * RR + r];
#pragma unroll
                        for (int j = 0; j < 8; j++) s += w[g][j] * xv[j];
                        acc[g * RR + r] = s;
                    }
                }
            }
        }
        if (bb == nblk - 1) {
            float s[SETS];
            s[0] = warp_sum_scatter<NS, 0>(acc);
            if constexpr (SETS == 2) s[1] = warp_sum_scatter<NS, NS>(acc);
#pragma unroll
            for (int h = 0; h < SETS; h++) {
                const int i = h * NS + mine, g = i / RR, r = r0 + i % RR, o = grp * G + g;
                if (owner && r < rows && o < out) y[(size_t)r * out + o] = accumulate ? old[h] + s[h] : s[h];
            }
#pragma unroll
            for (int i = 0; i < N; i++) acc[i] = 0.f;
        }
    };
    uint4 a[G][U], b[G][U];
    if (task < tasks) load(a, task, 0);
    pdl_wait();
    ready();
    while (running(task)) {
        int t1 = task, b1 = blk;
        advance(t1, b1);
        if (t1 < tasks) load(b, t1, b1);
        consume(a, task, blk);
        task = t1;
        blk = b1;
        if (!running(task)) break;
        advance(t1, b1);
        if (t1 < tasks) load(a, t1, b1);
        consume(b, task, blk);
        task = t1;
        blk = b1;
    }
}

#ifndef FD_GEMV_U
#define FD_GEMV_U 2  // 16-byte chunks per weight row a multi-row warp has in flight per buffer
#endif
#define GEMV_KB 256  // chunks of a staged k-block (2048 columns); dense.rs sizes the shared memory
template <int R, int G, bool STAGED, int RS = 1, typename Prologue>
__device__ __forceinline__ void gemv_rows(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                          const __nv_bfloat16* __restrict__ norm, const float* inv, float* xs,
                                          float* __restrict__ y, int out, int in, int rows, int accumulate,
                                          Prologue ready) {
    if constexpr (G == 1) {
        gemv_persistent<R>(W, x, norm, inv, y, out, in, rows, accumulate, ready);
    } else {
        gemv_persistent_grouped<R, G, FD_GEMV_U, STAGED ? GEMV_KB : 0, RS>(W, x, norm, inv, xs, y, out, in, rows,
                                                                           accumulate, ready);
    }
}
