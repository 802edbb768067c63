#!/usr/bin/env python3
"""How fast one block per SM streams a GEMV's weights through a ring of shared-memory pages
(issue 44). The persistent step's design has a loader warp per SM filling pages with the next
ops' weights (bulk copies, `cp.async.bulk` completing on an mbarrier) while compute warps drain
them; it only pays if that ring streams as fast as today's GEMVs, which put many warps per SM
on direct 16-byte loads. Here both stream the same bf16 matrices (x in shared memory as f32,
y = W x in f32):

- `plain`: 8 blocks of 256 threads per SM, a warp per row at a time, every lane's 16-byte words
  of the row requested at once (today's GEMV in its simplest form);
- the ring: one block per SM, warp 0's lane 0 the loader (a page = whole rows, PAGES of them in
  the ring, each page's bytes one bulk copy), issuing from the kernel's start while COMPUTE
  warps stage x, then drain each full page and arrive on its `empty` barrier: `rows`, a row a
  warp; `split`, every row split over the warps by columns, their sums added after a barrier;
  `drain`, no compute at all (the ring's own streaming rate).

Shapes: XS 2.1's q|k|v|g (10240 x 2048), o_proj (2048 x 8192) and lm_head (100352 x 2048),
eight copies of each smaller matrix rotated launch after launch so none is read from L2. For each
(kernel, shape, ring configuration) the median of several timings of 16 back-to-back launches
gives ms and TB/s, beside the device-to-device copy of the same bytes (the roofline; its TB/s
counts what it reads and writes). The launches are queued behind a kernel that holds the stream
for 5 ms, so they run back to back whatever the host's pace. The ring's
y is checked against the plain kernel's (f32 sums in another order: relative 1e-3).

    python3 tools/gpu/stream_ring.py [--json FILE]      # on the GPU machine (cuprobe.py)
    python3 tools/gpu/stream_ring.py --compile-only     # here: the kernels compile
"""
import ctypes
import json
import statistics

import cuprobe

SRC = r"""
#define WARP 32

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Eight bf16 of a 16-byte word dotted with x[0..8).
__device__ float dot8(uint4 w, const float* x) {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = fmaf(__uint_as_float(u[i] << 16), x[2 * i], s);
        s = fmaf(__uint_as_float(u[i] & 0xffff0000u), x[2 * i + 1], s);
    }
    return s;
}

__device__ uint4 load_weights(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// Holds the stream for `ns` nanoseconds, so the launches queued behind it run back to back
// (none waits for the host to issue it).
extern "C" __global__ void hold(unsigned long long ns) {
    const unsigned long long t0 = now();
    while (now() - t0 < ns) {
    }
}

// Random bf16 in [-1, 1) from a hash of the index (no host copy of 400 MB).
extern "C" __global__ void fill(unsigned* w, unsigned long long words, unsigned seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < words;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        const unsigned lo = 0x3f80u | (h & 0x7fu), hi = 0xbf80u | ((h >> 16) & 0x7fu);  // 1.x and -1.x
        w[i] = (h & 0x100u ? hi : lo) | ((h & 0x200u ? lo : hi) << 16);
    }
}

// COLS / 256 words a lane per row (COLS a multiple of 256), all requested before any is used.
template <int COLS>
__device__ void plain_rows(const unsigned short* w, const float* xs, float* y, int rows) {
    constexpr int N = COLS / 256;
    const int lane = threadIdx.x % WARP;
    const int warps = gridDim.x * (blockDim.x / WARP), first = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    for (int r = first; r < rows; r += warps) {
        const uint4* row = reinterpret_cast<const uint4*>(w + (size_t)r * COLS);
        uint4 v[N];
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = load_weights(row + i * WARP + lane);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < N; i++) s += dot8(v[i], xs + (i * WARP + lane) * 8);
        s = warp_sum(s);
        if (lane == 0) y[r] = s;
    }
}

#define PLAIN(COLS)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) plain_##COLS(const unsigned short* w, const float* x,    \
                                                                    float* y, int rows) {                    \
        __shared__ float xs[COLS];                                                                            \
        for (int i = threadIdx.x; i < COLS; i += blockDim.x) xs[i] = x[i];                                    \
        __syncthreads();                                                                                      \
        plain_rows<COLS>(w, xs, y, rows);                                                                     \
    }
PLAIN(2048)
PLAIN(8192)

__device__ unsigned smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ void mbar_init(unsigned long long* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(b)), "r"(count) : "memory");
}
__device__ void mbar_expect(unsigned long long* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(b)), "r"(bytes) : "memory");
}
__device__ void mbar_arrive(unsigned long long* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(b)) : "memory");
}
__device__ void mbar_wait(unsigned long long* b, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem(b)), "r"(parity) : "memory");
}
__device__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem(dst)), "l"(src), "r"(bytes), "r"(smem(bar)) : "memory");
}

// One block per SM: warp 0's lane 0 loads pages of `page_rows` rows (chunks dealt round-robin
// over the blocks) from the start, warps 1..COMPUTE stage x meanwhile and compute: `mode` 1 a
// row a warp, 2 every row split over the warps by columns (their sums added after a barrier of
// the compute warps), 0 nothing (they only release each page: the ring's streaming rate alone);
// dynamic shared memory: the pages, then x.
template <int COLS>
__device__ void ring_rows(const unsigned short* w, const float* x, float* y, int rows, int page_rows, int pages,
                          int mode, unsigned char* dyn) {
    __shared__ unsigned long long full[16], empty[16];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, compute = blockDim.x / WARP - 1;
    const unsigned page_bytes = page_rows * COLS * 2;
    float* xs = reinterpret_cast<float*>(dyn + (size_t)pages * page_bytes);
    if (threadIdx.x == 0) {
        for (int p = 0; p < pages; p++) mbar_init(&full[p], 1), mbar_init(&empty[p], compute);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int chunks = (rows + page_rows - 1) / page_rows;
    if (warp == 0) {
        if (lane == 0) {
            int k = 0;
            for (int c = blockIdx.x; c < chunks; c += gridDim.x, k++) {
                const int p = k % pages;
                if (k >= pages) mbar_wait(&empty[p], (k / pages - 1) & 1);
                const int n = min(page_rows, rows - c * page_rows);
                mbar_expect(&full[p], n * COLS * 2);
                bulk_copy(dyn + (size_t)p * page_bytes, w + (size_t)c * page_rows * COLS, n * COLS * 2, &full[p]);
            }
        }
        return;
    }
    for (int i = threadIdx.x - WARP; i < COLS; i += blockDim.x - WARP) xs[i] = x[i];
    asm volatile("bar.sync 1, %0;" ::"r"(compute * WARP) : "memory");  // the compute warps only
    __shared__ float part[2][8][16];  // split: each row's sums by compute warp, two pages' worth
    const int cw = warp - 1, slice = COLS / 8 / compute;  // split: a warp's 16-byte words of a row
    int k = 0;
    for (int c = blockIdx.x; c < chunks; c += gridDim.x, k++) {
        const int p = k % pages, n = min(page_rows, rows - c * page_rows);
        mbar_wait(&full[p], (k / pages) & 1);
        const uint4* page = reinterpret_cast<const uint4*>(dyn + (size_t)p * page_bytes);
        if (mode == 1) {  // a row a warp
            for (int r = cw; r < n; r += compute) {
                float s = 0.f;
#pragma unroll 8
                for (int i = lane; i < COLS / 8; i += WARP) s += dot8(page[r * (COLS / 8) + i], xs + i * 8);
                s = warp_sum(s);
                if (lane == 0) y[c * page_rows + r] = s;
            }
        } else if (mode == 2) {  // every row split over the warps by columns, summed after a barrier
            for (int r = 0; r < n; r++) {
                float s = 0.f;
                for (int i = cw * slice + lane; i < (cw + 1) * slice; i += WARP)
                    s += dot8(page[r * (COLS / 8) + i], xs + i * 8);
                s = warp_sum(s);
                if (lane == 0) part[k & 1][r][cw] = s;
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[p]);  // its reads of the page are done
        if (mode == 2) {
            asm volatile("bar.sync 1, %0;" ::"r"(compute * WARP) : "memory");
            if (cw == 0 && lane < n) {
                float s = 0.f;
                for (int w = 0; w < compute; w++) s += part[k & 1][lane][w];
                y[c * page_rows + lane] = s;
            }
        }
    }
}

#define RING(COLS)                                                                                            \
    extern "C" __global__ void ring_##COLS(const unsigned short* w, const float* x, float* y, int rows,        \
                                           int page_rows, int pages, int mode) {                               \
        extern __shared__ __align__(128) unsigned char dyn[];                                                 \
        ring_rows<COLS>(w, x, y, rows, page_rows, pages, mode, dyn);                                          \
    }
RING(2048)
RING(8192)
"""

SHAPES = {"qkvg": (10240, 2048), "o_proj": (2048, 8192), "lm_head": (100352, 2048)}
# (bytes a page, pages, compute warps, mode): the ring configurations timed (at most 16 pages and 8
# rows a page, fewer pages where they and x would not fit in a block's shared memory).
MODES = {0: "drain", 1: "rows", 2: "split"}
RINGS = [(16384, 12, 8, 1), (32768, 6, 8, 1), (16384, 12, 8, 2), (32768, 6, 8, 2), (16384, 12, 4, 2),
         (8192, 16, 8, 2), (16384, 12, 8, 0), (32768, 6, 8, 0)]
COPIES = 8  # rotated matrices of the smaller shapes, so a launch never finds its weights in L2
LAUNCHES = 16


class Events:
    """Wall time of work queued on the default stream between two CUDA events, behind a kernel
    that holds the stream while the host queues it (so the GPU never waits for the host)."""

    def __init__(self, cu, hold):
        self.cu, self.hold, self.a, self.b = cu, hold, ctypes.c_void_p(), ctypes.c_void_p()
        cuprobe.check(cu.cuEventCreate(ctypes.byref(self.a), 0), "cuEventCreate")
        cuprobe.check(cu.cuEventCreate(ctypes.byref(self.b), 0), "cuEventCreate")

    def time_ms(self, queue):
        ns = ctypes.c_uint64(5_000_000)
        ptrs = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
        cuprobe.check(self.cu.cuLaunchKernel(self.hold, 1, 1, 1, 1, 1, 1, 0, None, ptrs, None), "hold")
        cuprobe.check(self.cu.cuEventRecord(self.a, None), "cuEventRecord")
        queue()
        cuprobe.check(self.cu.cuEventRecord(self.b, None), "cuEventRecord")
        cuprobe.check(self.cu.cuEventSynchronize(self.b), "cuEventSynchronize")
        ms = ctypes.c_float()
        cuprobe.check(self.cu.cuEventElapsedTime(ctypes.byref(ms), self.a, self.b), "cuEventElapsedTime")
        return ms.value


def launch_async(gpu, f, grid, block, args, shared=0):
    ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
    cuprobe.check(gpu.cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, None, ptrs, None), "cuLaunchKernel")


def main():
    ap = cuprobe.parser(__doc__, "timings of 16 launches each (the median is reported)")
    args = ap.parse_args()
    if cuprobe.compiled_only(args, SRC, "stream_ring.cu"):
        return
    gpu = cuprobe.Gpu()
    sms = gpu.attribute(16)
    most_shared = gpu.attribute(97)  # a block's shared memory when asked for (opt-in)
    mod = gpu.module(SRC, "stream_ring.cu")
    fill = gpu.function(mod, "fill")
    ev = Events(gpu.cu, gpu.function(mod, "hold"))
    results = []
    for name, (rows, cols) in SHAPES.items():
        nbytes = rows * cols * 2
        copies = 1 if nbytes > 200e6 else COPIES
        mats = [gpu.alloc(nbytes) for _ in range(copies)]
        for i, m in enumerate(mats):
            gpu.launch(fill, 4 * sms, 256, [m, ctypes.c_uint64(nbytes // 4), ctypes.c_uint(i + 1)])
        x, y_plain, y_ring = gpu.alloc(cols * 4), gpu.alloc(rows * 4), gpu.alloc(rows * 4)
        gpu.launch(fill, 4, 256, [x, ctypes.c_uint64(cols), ctypes.c_uint(99)])  # bf16 pairs read as f32: finite
        dst = gpu.alloc(nbytes)

        def timed(queue_one):
            t = [ev.time_ms(lambda: [queue_one(mats[i % copies]) for i in range(LAUNCHES)]) / LAUNCHES
                 for _ in range(args.launches)]
            ms = statistics.median(t)
            return ms, nbytes / (ms * 1e-3) / 1e12

        def copy(m):
            cuprobe.check(gpu.cu.cuMemcpyDtoDAsync_v2(dst, m, ctypes.c_size_t(nbytes), None), "cuMemcpyDtoD")

        ms, tbs = timed(copy)
        results.append({"shape": name, "kernel": "copy", "ms": ms, "tb_s": 2 * tbs})  # it reads and writes
        plain = gpu.function(mod, f"plain_{cols}")
        ms, tbs = timed(lambda m: launch_async(gpu, plain, 8 * sms, 256, [m, x, y_plain, ctypes.c_int(rows)]))
        results.append({"shape": name, "kernel": "plain", "ms": ms, "tb_s": tbs})
        ring = None
        for page_bytes, pages, compute, mode in RINGS:
            page_rows = max(1, page_bytes // (cols * 2))
            pages = min(pages, (most_shared - 1024 - cols * 4) // (page_rows * cols * 2))
            shared = pages * page_rows * cols * 2 + cols * 4
            ring = gpu.function(mod, f"ring_{cols}", shared)
            ring_args = lambda m: [m, x, y_ring, ctypes.c_int(rows), ctypes.c_int(page_rows), ctypes.c_int(pages),
                                   ctypes.c_int(mode)]
            ms, tbs = timed(lambda m: launch_async(gpu, ring, sms, 32 * (1 + compute), ring_args(m), shared))
            if mode == 0:
                results.append({"shape": name, "kernel": "drain", "page_bytes": page_rows * cols * 2,
                                "pages": pages, "compute_warps": compute, "ms": ms, "tb_s": tbs})
                continue
            # The last launch read mats[(LAUNCHES - 1) % copies]: check it against plain on the same.
            m = mats[(LAUNCHES - 1) % copies]
            gpu.launch(plain, 8 * sms, 256, [m, x, y_plain, ctypes.c_int(rows)])
            a, b = gpu.read(y_plain, ctypes.c_float, rows), gpu.read(y_ring, ctypes.c_float, rows)
            worst = max(abs(p - q) / max(1.0, abs(p)) for p, q in zip(a, b))
            results.append({"shape": name, "kernel": MODES[mode], "page_bytes": page_rows * cols * 2, "pages": pages,
                            "compute_warps": compute, "ms": ms, "tb_s": tbs, "max_rel_diff": worst})
        for r in results[-len(RINGS) - 2:]:
            conf = f"{r['page_bytes']} B x {r['pages']}, {r['compute_warps']} warps" if "pages" in r else ""
            print(f"{name:8} {r['kernel']:6} {conf:28} {r['ms'] * 1e3:8.1f} us {r['tb_s']:5.2f} TB/s"
                  + (f"  max rel diff {r['max_rel_diff']:.1e}" if "max_rel_diff" in r else ""))
        for p in mats + [x, y_plain, y_ring, dst]:
            gpu.cu.cuMemFree_v2(p)
    bad = [r for r in results if r.get("max_rel_diff", 0) > 1e-3]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sms": sms, "results": results, "wrong": len(bad)}, f, indent=1)
    if bad:
        raise SystemExit(f"{len(bad)} ring configurations disagree with the plain kernel")


if __name__ == "__main__":
    main()
