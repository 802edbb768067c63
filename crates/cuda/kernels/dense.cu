// Dense building blocks: embedding gather, bf16 GEMV (y = x·Wᵀ, optionally of the
// RMS-normalised x), SwiGLU, argmax. (RMSNorm of prefill rows: prefill.cu's pf_rms_norm_split.)
// CPU twins: fastdecode_cpu::ops::{rms_norm, matvec, silu, argmax} and TargetModel::embed_row.

// x[r, :] = embed[tokens[r], :]  (bf16 -> f32). grid: rows, block: 256.
extern "C" __global__ void embed_rows(const __nv_bfloat16* __restrict__ embed, const int* __restrict__ tokens,
                                      float* __restrict__ x, int hidden) {
    FD_TRACE_KERNEL(1, 0);
    pdl_wait();
    const int r = blockIdx.x;
    const __nv_bfloat16* src = embed + (size_t)tokens[r] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) x[(size_t)r * hidden + i] = __bfloat162float(src[i]);
}

// y[r, o] (+)= Σ_i W[o, i] · x'[r, i] for r < rows <= R, W bf16 [out, in], in % 8 == 0, where
// x' = x, or when `norm` is set x' = norm ⊙ x / rms(x) (the RMSNorm fused into the GEMV: each
// block computes the rows' rms itself, identically). One entry point per R (1, 2, 4, 8, 16), so
// a single-row decode step is not held to the registers of 16 accumulators per thread, and per
// G, the weight rows a warp streams at once (gemv_rows; dense.rs picks G from the output count).
// grid: at most ceil(out / 8) (persistent: any size), block: 256.
template <int R, int G, int RS = 1>
__device__ __forceinline__ void gemv_bf16_body(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                               const __nv_bfloat16* __restrict__ norm, float eps,
                                               float* __restrict__ y, int out, int in, int rows, int accumulate) {
    __shared__ float inv[16], red[8 * 16];
    gemv_rows<R, G, false, RS>(W, x, norm, inv, nullptr, y, out, in, rows, accumulate, [&] {
        if (norm) block_inv_rms<R>(x, in, rows, eps, inv, red);
    });
}

// The same with the rows' x' = norm ⊙ x / rms(x) staged in shared memory, so the inner loop
// reads it there instead of forming it anew for every weight row: the same value
// (norm[i]·(x[i]·inv)), the same bits. With weight rows in groups (G > 1), in k-blocks of
// GEMV_KB chunks (gemv_persistent_grouped, which also stages plain rows; shared:
// 32·GEMV_KB·rows bytes); one weight row per warp, whole rows once per block (norm required;
// shared: 4·rows·in bytes). The launcher sizes it.
template <int R, int G>
__device__ __forceinline__ void gemv_bf16_staged_body(const __nv_bfloat16* __restrict__ W,
                                                      const float* __restrict__ x,
                                                      const __nv_bfloat16* __restrict__ norm, float eps,
                                                      float* __restrict__ y, int out, int in, int rows,
                                                      int accumulate) {
    extern __shared__ __align__(16) float xs[];  // read as float4s
    __shared__ float inv[16], red[8 * 16];
    if constexpr (G > 1) {
        gemv_rows<R, G, true>(W, x, norm, inv, xs, y, out, in, rows, accumulate, [&] {
            if (norm) block_inv_rms<R>(x, in, rows, eps, inv, red);
        });
    } else {
        gemv_rows<R, 1, false>(W, xs, nullptr, inv, nullptr, y, out, in, rows, accumulate, [&] {
            block_inv_rms<R>(x, in, rows, eps, inv, red);
            for (int i = threadIdx.x; i < rows * in; i += blockDim.x)
                xs[i] = __bfloat162float(norm[i % in]) * (x[i] * inv[i / in]);
            __syncthreads();
        });
    }
}

// Single-row variant for in <= 12288: the (normalised) row is staged in shared memory once per
// block, so the inner loop reads it there instead of re-reading x and the norm weight through L1
// for every weight row. x' is computed exactly as gemv_chunk does, so the bits match the others.
// shared: 4·in bytes.
#ifndef FD_GEMV_MINB
#define FD_GEMV_MINB 1
#endif
extern "C" __global__ void __launch_bounds__(256, FD_GEMV_MINB) gemv_bf16_1s(
    const __nv_bfloat16* __restrict__ W, const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm,
    float eps, float* __restrict__ y, int out, int in, int rows, int accumulate) {
    FD_TRACE_KERNEL(2, out);
    extern __shared__ float xs[];
    __shared__ float inv[16], red[8 * 16];
    const bool pre = norm && in <= 8 * 256;  // one word a thread; wider rows read it after the wait
    NormWords<1> nw;
    if (pre) nw = norm_words_load<1>(norm, in);
    gemv_persistent<1>(W, xs, nullptr, inv, y, out, in, 1, accumulate, [&] {
        if (norm) block_inv_rms(x, in, 1, eps, inv, red);
        if (pre) {
            norm_words_stage<1>(nw, x, inv[0], in, xs);
        } else if (!norm && in <= 4 * 256 * 8) {
            // A plain row (o_proj's, 8192 wide): every thread's float4s requested at once, one
            // round trip where the scalar loop's batches of 16 loads took two (-0.8 %, H200).
            float4 v[8];
            const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (4 * (threadIdx.x + 256 * j) < in) v[j] = x4[threadIdx.x + 256 * j];
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (4 * (threadIdx.x + 256 * j) < in) reinterpret_cast<float4*>(xs)[threadIdx.x + 256 * j] = v[j];
        } else {
            for (int i = threadIdx.x; i < in; i += 256)
                xs[i] = norm ? __bfloat162float(norm[i]) * (x[i] * inv[0]) : x[i];
        }
        __syncthreads();
    });
}

#ifndef FD_GEMV_ROWS_MINB
#define FD_GEMV_ROWS_MINB 1  // resident blocks per SM the multi-row entries are compiled for
#endif
// An entry NAME running BODY<R, ...> (the body's other template arguments: G, and RS where given).
#define GEMV_ENTRY(NAME, BODY, R, ...)                                                                      \
    extern "C" __global__ void __launch_bounds__(256, R == 1 ? FD_GEMV_MINB : FD_GEMV_ROWS_MINB) NAME(     \
        const __nv_bfloat16* __restrict__ W, const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm, \
        float eps, float* __restrict__ y, int out, int in, int rows, int accumulate) {                      \
        FD_TRACE_KERNEL(2, out);                                                                            \
        BODY<R, __VA_ARGS__>(W, x, norm, eps, y, out, in, rows, accumulate);                                \
    }
// Plain weight rows in pairs only for R = 2: wider launches take them in fours over half of the
// rows each (`_g4h`, below).
#define GEMV_ENTRIES(R)                                                   \
    GEMV_ENTRY(gemv_bf16_##R, gemv_bf16_body, R, 1)                       \
    GEMV_ENTRY(gemv_bf16_##R##_g4, gemv_bf16_body, R, 4)                  \
    GEMV_ENTRY(gemv_bf16_##R##s_g1, gemv_bf16_staged_body, R, 1)          \
    GEMV_ENTRY(gemv_bf16_##R##s_g2, gemv_bf16_staged_body, R, 2)          \
    GEMV_ENTRY(gemv_bf16_##R##s_g4, gemv_bf16_staged_body, R, 4)
GEMV_ENTRY(gemv_bf16_1, gemv_bf16_body, 1, 1)
GEMV_ENTRY(gemv_bf16_2_g2, gemv_bf16_body, 2, 2)
GEMV_ENTRIES(2)
GEMV_ENTRIES(4)
GEMV_ENTRIES(8)
GEMV_ENTRIES(16)

// Weight rows in fours over half of the rows of x each (`_g4h`): as many warp tasks as pairs of
// weight rows over all rows (an o_proj's 2048 outputs: 1024 for 1056 resident warps), but each
// 16-byte chunk of x read through L1 serves four weight rows, not two. The pairs' plain 8-row
// launch spent a quarter of its stall samples waiting for x through L1, at 60 % of its throughput
// (H200, Nsight Compute, BENCHMARKS twentieth measurement). A row's sums are the same either way.
#define GEMV_HALVES_ENTRY(R) GEMV_ENTRY(gemv_bf16_##R##_g4h, gemv_bf16_body, R, 4, 2)
GEMV_HALVES_ENTRY(4)
GEMV_HALVES_ENTRY(8)
GEMV_HALVES_ENTRY(16)

// The same y on the tensor cores (`FASTDECODE_DENSE=mma`): for 1..16 rows, every row count
// giving a row the same bits, because a row's sums never involve another row. The weights are
// the A operand of m16n8k16 bf16 products as they are stored. Each row of x' (the value the f32
// kernels form) is three exact bf16 terms, hi + mid + lo (24 significant bits: x' itself), the
// B operand's columns 3r, 3r + 1, 3r + 2; each product is exact, the sums are f32, and an mma's
// column depends on that column alone. A warp owns a tile of 16 outputs over a slice of `ks`
// input columns (blockIdx.y), in chunks of 32: thread (g, t) (g = lane / 4, t = lane % 4) loads
// the 16-byte words of columns 32c + 8t .. + 8 of outputs g and g + 8, and their four 32-bit
// pairs feed two mma steps whose k-slots map to those columns in order, which the staged terms
// follow (a lane's 16 bytes of a chunk are its column's eight values). Two accumulators (the
// chunk's first and second step) halve the chains. A slice's column sums are added per row as
// (hi + mid) + lo; with several slices each warp leaves its part in `partial`, and the last of
// a tile's warps to arrive (warp_arrives_last: a counter per tile, which it resets) adds the
// slices in order, then the old y (accumulate). The slicing depends on the shape only
// (dense.rs), never on the row count.
// grid (ceil(ceil(out / 16) / 8), slices), block 256; shared: staged terms
// (ceil(ks / 32) · NQ · 512 bytes) then the warps' sums (8 · 16 · (8·NQ + 1) floats), mma_bf16 (common.cuh) the product.

// The bf16 term `term` (0 hi, 1 mid, 2 lo) of v: hi = bf16(v), mid = bf16(v - hi),
// lo = bf16(v - hi - mid), each difference exact in f32.
__device__ __forceinline__ __nv_bfloat16 bf16_term(float v, int term) {
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    if (term == 0) return hi;
    const float r1 = v - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
    if (term == 1) return mid;
    return __float2bfloat16_rn(r1 - __bfloat162float(mid));
}

#ifndef GEMV_MMA_P
#define GEMV_MMA_P 8  // chunks (1 KiB of a warp's weights each) in flight per warp
#endif
template <int R>
__device__ __forceinline__ void gemv_mma_body(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                              const __nv_bfloat16* __restrict__ norm, float eps,
                                              float* __restrict__ y, int out, int in, int rows, int accumulate,
                                              int ks, float* __restrict__ partial,
                                              unsigned int* __restrict__ counters) {
    constexpr int NQ = (3 * R + 7) / 8, NC = 8 * NQ;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float inv[16], red[8 * 16];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, t = lane % 4;
    const int S = gridDim.y, s = blockIdx.y, k0 = s * ks, kn = min(in, k0 + ks) - k0, nch = (kn + 31) / 32;
    const int tiles = (out + 15) / 16, tile = blockIdx.x * 8 + warp, o0 = tile * 16;
    unsigned char* xs = smem;
    float* dsh = reinterpret_cast<float*>(smem + (size_t)nch * NQ * 512) + warp * 16 * (NC + 1);
    const bool live = tile < tiles;
    const int oa = o0 + lane / 4, ob = oa + 8;
    auto load = [&](int c, uint4& a, uint4& b) {
        const int k = 32 * c + 8 * t;
        const bool kv = live && k < kn;
        const uint4 z = make_uint4(0, 0, 0, 0);
        a = kv && oa < out ? load_stream(reinterpret_cast<const uint4*>(W + (size_t)oa * in + k0 + k)) : z;
        b = kv && ob < out ? load_stream(reinterpret_cast<const uint4*>(W + (size_t)ob * in + k0 + k)) : z;
    };
    uint4 wa[GEMV_MMA_P], wb[GEMV_MMA_P];
    // The first chunks are requested before the wait, in a block of their own: issued in the
    // wait's block, ptxas scheduled them after it (tools/gpu/sass.py counted none before it).
    if (live) {
#pragma unroll
        for (int u = 0; u < GEMV_MMA_P; u++) load(u, wa[u], wb[u]);
    } else {
#pragma unroll
        for (int u = 0; u < GEMV_MMA_P; u++) wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    if (norm) block_inv_rms<R>(x, in, rows, eps, inv, red);
    // Stage the slice's terms: item (r, c, t') of a row's eight columns 32c + 8t' .. + 8 writes
    // the lane-(g·4 + t') word of chunk c, column group q, for each column 3r + term = 8q + g.
    for (int i = threadIdx.x; i < rows * nch * 4; i += blockDim.x) {
        const int r = i / (nch * 4), c = (i / 4) % nch, tt = i % 4, k = 32 * c + 8 * tt;
        float v[8];
        if (k < kn) {
            const float4 a = *reinterpret_cast<const float4*>(x + (size_t)r * in + k0 + k);
            const float4 b = *reinterpret_cast<const float4*>(x + (size_t)r * in + k0 + k + 4);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float nw[8];
            if (norm) unpack_bf16x8(*reinterpret_cast<const uint4*>(norm + k0 + k), nw);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = norm ? nw[e] * (xv[e] * inv[r]) : xv[e];
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = 0.f;
        }
#pragma unroll
        for (int term = 0; term < 3; term++) {
            const int n = 3 * r + term, q = n / 8, g = n % 8;
            __align__(16) __nv_bfloat16 h[8];
#pragma unroll
            for (int e = 0; e < 8; e++) h[e] = bf16_term(v[e], term);
            *reinterpret_cast<uint4*>(xs + ((size_t)(c * NQ + q) * WARP + g * 4 + tt) * 16) =
                *reinterpret_cast<const uint4*>(h);
        }
    }
    __syncthreads();
    // A warp past the last tile runs on zero weights (its loads stay before the wait: with a
    // return here the compiler sank them after it) and stores nothing.
    float da[NQ][4], db[NQ][4];
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int j = 0; j < 4; j++) da[q][j] = db[q][j] = 0.f;
    for (int c0 = 0; c0 < nch; c0 += GEMV_MMA_P) {
#pragma unroll
        for (int u = 0; u < GEMV_MMA_P; u++) {
            const int c = c0 + u;
            if (c < nch) {
#pragma unroll
                for (int q = 0; q < NQ; q++) {
                    const uint4 b = *reinterpret_cast<const uint4*>(xs + ((size_t)(c * NQ + q) * WARP + lane) * 16);
                    mma_bf16(da[q], wa[u].x, wb[u].x, wa[u].y, wb[u].y, b.x, b.y);
                    mma_bf16(db[q], wa[u].z, wb[u].z, wa[u].w, wb[u].w, b.z, b.w);
                }
                if (c + GEMV_MMA_P < nch) load(c + GEMV_MMA_P, wa[u], wb[u]);
            }
        }
    }
    if (!live) return;
    // Thread (g, t) holds outputs g and g + 8 of columns 8q + 2t, 8q + 2t + 1.
#pragma unroll
    for (int q = 0; q < NQ; q++) {
        const int g = lane / 4, n = 8 * q + 2 * t;
        dsh[g * (NC + 1) + n] = da[q][0] + db[q][0];
        dsh[g * (NC + 1) + n + 1] = da[q][1] + db[q][1];
        dsh[(g + 8) * (NC + 1) + n] = da[q][2] + db[q][2];
        dsh[(g + 8) * (NC + 1) + n + 1] = da[q][3] + db[q][3];
    }
    __syncwarp();
    for (int i = lane; i < 16 * rows; i += WARP) {
        const int ol = i % 16, r = i / 16, o = o0 + ol;
        const float* d = dsh + ol * (NC + 1) + 3 * r;
        const float part = (d[0] + d[1]) + d[2];
        if (o >= out) continue;
        if (S == 1)
            y[(size_t)r * out + o] = accumulate ? y[(size_t)r * out + o] + part : part;
        else
            partial[((size_t)s * rows + r) * out + o] = part;
    }
    if (S == 1 || !warp_arrives_last(counters + tile, S)) return;
    for (int i = lane; i < 16 * rows; i += WARP) {
        const int ol = i % 16, r = i / 16, o = o0 + ol;
        if (o >= out) continue;
        float total = __ldcg(partial + (size_t)r * out + o);
        for (int s2 = 1; s2 < S; s2++) total += __ldcg(partial + ((size_t)s2 * rows + r) * out + o);
        y[(size_t)r * out + o] = accumulate ? y[(size_t)r * out + o] + total : total;
    }
    if (lane == 0) counters[tile] = 0;
}

#define GEMV_MMA_ENTRY(R)                                                                                    \
    extern "C" __global__ void __launch_bounds__(256) gemv_mma_##R(                                          \
        const __nv_bfloat16* __restrict__ W, const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm, \
        float eps, float* __restrict__ y, int out, int in, int rows, int accumulate, int ks,                 \
        float* __restrict__ partial, unsigned int* __restrict__ counters) {                                  \
        FD_TRACE_KERNEL(2, out);                                                                             \
        gemv_mma_body<R>(W, x, norm, eps, y, out, in, rows, accumulate, ks, partial, counters);              \
    }
GEMV_MMA_ENTRY(1)
GEMV_MMA_ENTRY(2)
GEMV_MMA_ENTRY(4)
GEMV_MMA_ENTRY(8)
GEMV_MMA_ENTRY(16)

// The same y with the input's columns owned by the threads, for inputs of at most 2048 columns
// (q|k|v|g and lm_head on XS 2.1; dense.rs decides by shape): thread c of the block (256 threads)
// owns chunk c (columns 8c .. 8c + 8) and keeps the rows' x' there in registers for the whole
// launch, so x is read once per block, never again per weight row. The row-owned kernels above
// read a lane's chunk of every row of x' (through L1 or shared memory) once per G weight rows,
// and at 8 rows those reads, not the FMAs or the weights, bound them (32 bytes of x' per 4 weight
// bytes through a 128 B/clock SRAM). Here a block takes tiles of T consecutive weight rows
// (persistent: tile b, b + grid, ...), each thread one 16-byte chunk of each, with the next
// tile's chunks in flight while it computes. Per (weight row, row of x): the thread's eight
// products one fma chain from zero, the warp's 32 chains summed by warp_sum's butterfly
// (warp_sum_scatter), the block's eight warps added in warp order, then the old y (accumulate).
// That order depends on neither T nor the row count, so every row gives its one-row bits; it is
// not the row-owned kernels' order (theirs chain a lane's chunks 32 apart), so a matrix takes
// this kernel for every row count or for none.
// grid: any (persistent), block: 256; T·R a power of two <= 64.
template <int R, int T>
__device__ __forceinline__ void gemv_cols_body(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                               const __nv_bfloat16* __restrict__ norm, float eps,
                                               float* __restrict__ y, int out, int in, int rows, int accumulate) {
    constexpr int N = T * R, NS = N < WARP ? N : WARP, SETS = N / NS;  // sum i: weight row i / R, row i % R
    static_assert(N >= 2 && N <= 64 && (N & (N - 1)) == 0, "T·R: a power of two from 2 to 64");
    __shared__ float inv[16], red[8 * 16];
    __shared__ float part[2][8][N];  // the warps' sums of a tile, by the tile's parity
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, c = threadIdx.x;
    const int nc = in / 8, tiles = (out + T - 1) / T;
    const bool has = c < nc;
    const uint4* Wv = reinterpret_cast<const uint4*>(W);
    auto load = [&](uint4 (&buf)[T], int tile) {
#pragma unroll
        for (int t = 0; t < T; t++) {
            const int o = tile * T + t;
            buf[t] = has && o < out ? load_stream(Wv + (size_t)o * nc + c) : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 a[T], b[T];
    int tile = blockIdx.x;
    if (tile < tiles) load(a, tile);
    // The norm weight is a weight: requested before the wait too.
    const uint4 nraw = norm && has ? *reinterpret_cast<const uint4*>(norm + 8 * c) : make_uint4(0, 0, 0, 0);
    pdl_wait();
    // The rows' x' of this thread's chunk: norm·(x·inv), the expression of the other kernels.
    float xv[R][8];
    {
        float4 lo[R], hi[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const bool live = has && r < rows;
            const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * in + 8 * c);
            lo[r] = live ? xr[0] : make_float4(0.f, 0.f, 0.f, 0.f);
            hi[r] = live ? xr[1] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (norm) block_inv_rms<R>(x, in, rows, eps, inv, red);
        float nw[8];
        unpack_bf16x8(nraw, nw);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float v[8] = {lo[r].x, lo[r].y, lo[r].z, lo[r].w, hi[r].x, hi[r].y, hi[r].z, hi[r].w};
            const float ir = norm && r < rows ? inv[r] : 0.f;
#pragma unroll
            for (int e = 0; e < 8; e++) xv[r][e] = norm ? nw[e] * (v[e] * ir) : v[e];
        }
    }
    // Thread i < N adds up sum i of a tile and stores it.
    const int ti = threadIdx.x / R, ri = threadIdx.x % R;
    constexpr int shift = 5 - ilog2(NS);  // lanes per scattered sum
    const int mine = lane >> shift;
    const bool owner = (lane & ((1 << shift) - 1)) == 0;
    int parity = 0;
    auto consume = [&](const uint4 (&buf)[T], int tl) {
        const int oi = tl * T + ti;
        const bool st = threadIdx.x < N && oi < out && ri < rows;
        const float old = accumulate && st ? y[(size_t)ri * out + oi] : 0.f;
        float acc[N];
#pragma unroll
        for (int t = 0; t < T; t++) {
            float w[8];
            unpack_bf16x8(buf[t], w);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) s += w[e] * xv[r][e];
                acc[t * R + r] = s;
            }
        }
        float s[SETS];
        s[0] = warp_sum_scatter<NS, 0>(acc);
        if constexpr (SETS == 2) s[1] = warp_sum_scatter<NS, NS>(acc);
        if (owner) {
#pragma unroll
            for (int h = 0; h < SETS; h++) part[parity][warp][h * NS + mine] = s[h];
        }
        // One barrier a tile: a warp writes this parity's sums again only after the next
        // tile's barrier, which every reader of these passes after reading them.
        __syncthreads();
        if (st) {
            float tot = part[parity][0][threadIdx.x];
#pragma unroll
            for (int w = 1; w < 8; w++) tot += part[parity][w][threadIdx.x];
            y[(size_t)ri * out + oi] = accumulate ? old + tot : tot;
        }
        parity ^= 1;
    };
    while (tile < tiles) {
        int t1 = tile + gridDim.x;
        if (t1 < tiles) load(b, t1);
        consume(a, tile);
        tile = t1;
        if (tile >= tiles) break;
        t1 = tile + gridDim.x;
        if (t1 < tiles) load(a, t1);
        consume(b, tile);
        tile = t1;
    }
}

// Eight weight rows a tile at every row count: T·R sums per thread and two tiles of chunks in
// registers beside the rows' x' (gemv_cols_8: 255 registers, no spills).
GEMV_ENTRY(gemv_cols_1, gemv_cols_body, 1, 8)
GEMV_ENTRY(gemv_cols_2, gemv_cols_body, 2, 8)
GEMV_ENTRY(gemv_cols_4, gemv_cols_body, 4, 8)
GEMV_ENTRY(gemv_cols_8, gemv_cols_body, 8, 8)

// a[r, i] = silu(gu[r, i]) · gu[r, n + i]: gu holds a fused gate|up projection of width 2n.
// grid: (ceil(n / 256), rows), block: 256.
extern "C" __global__ void silu_mul(const float* __restrict__ gu, float* __restrict__ a, int n) {
    FD_TRACE_KERNEL(8, 0);
    pdl_wait();
    const int i = blockIdx.x * 256 + threadIdx.x, r = blockIdx.y;
    if (i < n) a[(size_t)r * n + i] = silu(gu[(size_t)r * 2 * n + i]) * gu[(size_t)r * 2 * n + n + i];
}

// out[r] = argmax(logits[r, :]); ties go to the lowest index (as the CPU's argmax).
// grid: rows, block: 1024.
extern "C" __global__ void __launch_bounds__(1024) argmax_rows(const float* __restrict__ logits, int vocab,
                                                               int* __restrict__ out) {
    FD_TRACE_KERNEL(7, 0);
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* l = logits + (size_t)blockIdx.x * vocab;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += 1024) {
        const float v = l[i];
        if (v > best) { best = v; bi = i; }  // strictly greater: the first (lowest) index wins
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const int j = __shfl_xor_sync(0xffffffffu, bi, o);
        if (v > best || (v == best && j < bi)) { best = v; bi = j; }
    }
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        best = sv[lane];
        bi = si[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const int j = __shfl_xor_sync(0xffffffffu, bi, o);
            if (v > best || (v == best && j < bi)) { best = v; bi = j; }
        }
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

// taps[(r·T + t)·H + i] = x[r·H + i] for r < rows: a layer's output rows into tap slot t of the
// tapped hidden states (rows × T × H), which the DFlash drafter reads. A kernel rather than a
// copy per row, so a step with taps stays one graph of kernels with programmatic launches.
// H % 4 == 0. grid: rows, block: 256.
extern "C" __global__ void copy_taps(const float* __restrict__ x, float* __restrict__ taps, int H, int T, int t) {
    FD_TRACE_KERNEL(10, 0);
    pdl_wait();
    const int r = blockIdx.x;
    const float4* src = reinterpret_cast<const float4*>(x + (size_t)r * H);
    float4* dst = reinterpret_cast<float4*>(taps + ((size_t)r * T + t) * H);
    for (int i = threadIdx.x; i < H / 4; i += blockDim.x) dst[i] = src[i];
}

// y[q, :] = w[q mod W, :] ⊙ x[q, :] · inv_rms(x[q, :]) for q < rows rows of n: RMSNorm of each row
// with the W weight vectors in turn (the drafter's aux norms, row q being tap q mod T of a
// context row; W = 1 for one norm). The value per element is fastdecode_cpu::ops::rms_norm's,
// w · (x · inv); the sum of squares is a block reduction. n % 4 == 0. grid: rows, block: 256.
extern "C" __global__ void __launch_bounds__(256) rms_norm_rows(const float* __restrict__ x,
                                                                const __nv_bfloat16* __restrict__ w,
                                                                float* __restrict__ y, int n, int W, float eps) {
    FD_TRACE_KERNEL(11, 0);
    __shared__ float inv[16], red[8 * 16];
    pdl_wait();
    const int q = blockIdx.x;
    const float* xr = x + (size_t)q * n;
    block_inv_rms(xr, n, 1, eps, inv, red);
    const __nv_bfloat16* wr = w + (size_t)(q % W) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[(size_t)q * n + i] = __bfloat162float(wr[i]) * (xr[i] * inv[0]);
}
