#!/usr/bin/env python3
"""How fast one block per SM streams a GEMV's weights through a ring of shared-memory pages
(issue 44). The persistent step's design has a loader warp per SM filling pages with the next
ops' weights (bulk copies, `cp.async.bulk` completing on an mbarrier) while compute warps drain
them; it only pays if that ring streams as fast as today's GEMVs, which put many warps per SM
on direct 16-byte loads. Here both stream the same bf16 matrices (x in shared memory as f32,
y = W x in f32):

- `plain`: 8 blocks of 256 threads per SM, a warp per row at a time, every lane's 16-byte words
  of the row requested at once (today's GEMV in its simplest form);
- `tiles`: one block per SM, a loader warp and compute warps; the rows in groups (dealt over the
  blocks), each group streamed as tiles of its rows by some columns: a page, one bulk copy a row
  issued by the loader's lanes at once, completing on the page's mbarrier. Each compute warp owns
  a few rows of the group, keeps their sums in registers across the tiles and releases a page when
  its reads are done: no barrier between compute warps, x read once a word for all its rows.
  (A first ring, pages of whole rows drained a row a warp or split over the warps by columns,
  lost 5-50 %: a page held fewer rows than there were warps, so most warps waited.) `solo` leaves
  warps 4, 8, 12 idle so the loader has its scheduler alone; `drain`: the same ring, the compute
  warps only releasing pages (the ring's own streaming rate).

Shapes: XS 2.1's q|k|v|g (10240 x 2048), o_proj (2048 x 8192) and lm_head (100352 x 2048),
eight copies of each smaller matrix rotated launch after launch so none is read from L2. For each
(kernel, shape, ring configuration) the median of several timings of 16 back-to-back launches
gives ms and TB/s, beside the device-to-device copy of the same bytes (the roofline; its TB/s
counts what it reads and writes). The launches are queued behind a kernel that holds the stream
for 5 ms, so they run back to back whatever the host's pace. The tiles'
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

constexpr int MOST_ROWS_A_WARP = 4;

// One op's share of a ring of tiles: `group`-row groups of a rows x cols matrix dealt
// round-robin over the blocks, each streamed as cols / tile_cols tiles of `group` rows by
// `tile_cols` columns: a page. `k` counts the pages a block's ring has used, carried from op to
// op (tools/gpu/ring_chain.py streams two through one ring).
struct Op {
    const unsigned short* w;
    float* y;
    int rows, cols, group, tile_cols;
};

// The loader warp's part: each page filled by one bulk copy a row, issued by the loader's lanes
// at once, completing on the page's `full` barrier once the compute warps have released its
// previous use on `empty`.
__device__ void load_op(const Op& op, unsigned char* pages_base, unsigned page_bytes, int pages,
                        unsigned long long* full, unsigned long long* empty, int& k) {
    const int lane = threadIdx.x % WARP, groups = (op.rows + op.group - 1) / op.group;
    const int tiles = op.cols / op.tile_cols;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int n = min(op.group, op.rows - g * op.group);
        for (int t = 0; t < tiles; t++, k++) {
            const int p = k % pages;
            if (k >= pages) mbar_wait(&empty[p], (k / pages - 1) & 1);
            if (lane == 0) mbar_expect(&full[p], n * op.tile_cols * 2);
            __syncwarp();
            if (lane < n)
                bulk_copy(pages_base + (size_t)p * page_bytes + lane * op.tile_cols * 2,
                          op.w + (size_t)(g * op.group + lane) * op.cols + t * op.tile_cols, op.tile_cols * 2,
                          &full[p]);
        }
    }
}

// A compute warp's part: it owns the rows cw, cw + compute, ... of a group and keeps their sums
// in registers across the group's tiles (no barrier between compute warps: each only arrives on
// the page's `empty` barrier when its reads are done); lane l's words of a tile row are l,
// l + 32, ..., and x's eight values for a word are read once for all the warp's rows. `work`
// false: the pages are only waited for and released (the ring's own streaming rate).
__device__ void compute_op(const Op& op, const float* xs, const unsigned char* pages_base, unsigned page_bytes,
                           int pages, unsigned long long* full, unsigned long long* empty, int cw, int compute,
                           int& k, bool work) {
    const int lane = threadIdx.x % WARP, groups = (op.rows + op.group - 1) / op.group;
    const int tiles = op.cols / op.tile_cols, words = op.tile_cols / 8;
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const int n = min(op.group, op.rows - g * op.group);
        float acc[MOST_ROWS_A_WARP] = {};
        for (int t = 0; t < tiles; t++, k++) {
            const int p = k % pages;
            mbar_wait(&full[p], (k / pages) & 1);
            const uint4* page = reinterpret_cast<const uint4*>(pages_base + (size_t)p * page_bytes);
            for (int j = lane; work && j < words; j += WARP) {
                float xv[8];
                const float4* x4 = reinterpret_cast<const float4*>(xs + t * op.tile_cols + j * 8);
                const float4 a = x4[0], b = x4[1];
                xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
#pragma unroll
                for (int q = 0; q < MOST_ROWS_A_WARP; q++) {
                    const int r = cw + q * compute;
                    if (r < n) acc[q] += dot8(page[r * words + j], xv);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[p]);  // its reads of the page are done
        }
#pragma unroll
        for (int q = 0; q < MOST_ROWS_A_WARP; q++) {
            const int r = cw + q * compute;
            if (r < n) {
                const float s = warp_sum(acc[q]);
                if (lane == 0) op.y[g * op.group + r] = s;
            }
        }
    }
}

// One block per SM, a loader warp (warp 0) and compute warps on a ring of `pages` pages of
// `group` x `cols` tiles (load_op, compute_op). `solo`: warps 4, 8, 12 stay idle, so the loader
// has its scheduler (warp % 4) alone; `work` 0: the compute warps only release each page.
// Dynamic shared memory: the pages, then x.
template <int COLS>
__device__ void tile_rows(const unsigned short* w, const float* x, float* y, int rows, int group, int cols,
                          int pages, int solo, int work, unsigned char* dyn) {
    __shared__ unsigned long long full[16], empty[16];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
    const bool idle = solo && warp != 0 && warp % 4 == 0;
    const int compute = solo ? warps - warps / 4 : warps - 1;
    const int cw = solo ? warp - warp / 4 - 1 : warp - 1;  // solo: warps 1 2 3 5 6 7 ... are 0 1 2 3 4 5 ...
    const unsigned page_bytes = group * cols * 2;
    float* xs = reinterpret_cast<float*>(dyn + (size_t)pages * page_bytes);
    if (threadIdx.x == 0) {
        for (int p = 0; p < pages; p++) mbar_init(&full[p], 1), mbar_init(&empty[p], compute);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (idle) return;
    const Op op = {w, y, rows, COLS, group, cols};
    int k = 0;
    if (warp == 0) {
        load_op(op, dyn, page_bytes, pages, full, empty, k);
        return;
    }
    for (int i = cw * WARP + lane; i < COLS; i += compute * WARP) xs[i] = x[i];
    asm volatile("bar.sync 1, %0;" ::"r"(compute * WARP) : "memory");  // the compute warps only
    compute_op(op, xs, dyn, page_bytes, pages, full, empty, cw, compute, k, work);
}

#define TILES(COLS)                                                                                           \
    extern "C" __global__ void tiles_##COLS(const unsigned short* w, const float* x, float* y, int rows,       \
                                            int group, int cols, int pages, int solo, int work) {              \
        extern __shared__ __align__(128) unsigned char dyn[];                                                 \
        tile_rows<COLS>(w, x, y, rows, group, cols, pages, solo, work, dyn);                                  \
    }
TILES(2048)
TILES(8192)
"""

SHAPES = {"qkvg": (10240, 2048), "o_proj": (2048, 8192), "lm_head": (100352, 2048)}
# (rows a group, columns a tile, pages, warps a block, solo loader, compute on): the tile
# configurations timed (at most 16 pages, fewer where they and x would not fit in a block's
# shared memory; a warp's rows at most MOST_ROWS_A_WARP).
TILES = [(16, 512, 12, 9, 0, 1), (32, 256, 12, 9, 0, 1), (8, 1024, 12, 9, 0, 1), (16, 512, 12, 16, 1, 1),
         (24, 512, 8, 16, 1, 1), (32, 512, 6, 16, 1, 1), (16, 512, 12, 9, 0, 0), (32, 512, 6, 9, 0, 0)]
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
        for group, tile_cols, pages, warps, solo, work in TILES:
            page_bytes = group * tile_cols * 2
            pages = min(pages, (most_shared - 1024 - cols * 4) // page_bytes)
            shared = pages * page_bytes + cols * 4
            tiles = gpu.function(mod, f"tiles_{cols}", shared)
            tile_args = lambda m: [m, x, y_ring, ctypes.c_int(rows), ctypes.c_int(group), ctypes.c_int(tile_cols),
                                   ctypes.c_int(pages), ctypes.c_int(solo), ctypes.c_int(work)]
            ms, tbs = timed(lambda m: launch_async(gpu, tiles, sms, 32 * warps, tile_args(m), shared))
            r = {"shape": name, "kernel": "tiles" if work else "drain", "group": group, "tile_cols": tile_cols,
                 "pages": pages, "warps": warps, "solo": solo, "ms": ms, "tb_s": tbs}
            if work:  # the last launch read mats[(LAUNCHES - 1) % copies]: checked against plain on the same
                m = mats[(LAUNCHES - 1) % copies]
                gpu.launch(plain, 8 * sms, 256, [m, x, y_plain, ctypes.c_int(rows)])
                a, b = gpu.read(y_plain, ctypes.c_float, rows), gpu.read(y_ring, ctypes.c_float, rows)
                r["max_rel_diff"] = max(abs(p - q) / max(1.0, abs(p)) for p, q in zip(a, b))
            results.append(r)
        for r in results[-len(TILES) - 2:]:
            conf = (f"{r['group']}x{r['tile_cols']} x {r['pages']}, {r['warps']} warps{' solo' if r['solo'] else ''}"
                    if "pages" in r else "")
            print(f"{name:8} {r['kernel']:6} {conf:30} {r['ms'] * 1e3:8.1f} us {r['tb_s']:5.2f} TB/s"
                  + (f"  max rel diff {r['max_rel_diff']:.1e}" if "max_rel_diff" in r else ""))
        for p in mats + [x, y_plain, y_ring, dst]:
            gpu.cu.cuMemFree_v2(p)
    bad = [r for r in results if r.get("max_rel_diff", 0) > 1e-3]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sms": sms, "results": results, "wrong": len(bad)}, f, indent=1)
    if bad:
        raise SystemExit(f"{len(bad)} tile configurations disagree with the plain kernel")


if __name__ == "__main__":
    main()
