// Prefill (many rows at once) on the tensor cores: hi/lo activation splits for the dense
// cuBLAS GEMM, the NVFP4 mixture of experts as grouped GEMMs, and flash-style attention.
// CPU twins: fastdecode_cpu::ops::matvec, fastdecode_cpu::layers::{Moe::forward, Attention::attend}.
//
// Precision: the tensor cores multiply bf16 by bf16 into f32. Every f32 operand that is not
// exactly bf16 is split as hi = bf16(x), lo = bf16(x - hi), so x·w = hi·w + lo·w keeps about 16
// mantissa bits (relative error ~1e-5 of the dot), and weights (bf16, or NVFP4, whose e2m1·e4m3
// products are exact in bf16) enter unrounded. Every reduction has a fixed order (mma.sync
// instructions in program order, fixed shuffles, no float atomics), so results are bit-identical
// run to run.

// ---------------------------------------------------------------------------------------------
// Shared helpers

__device__ __forceinline__ unsigned pf_pack(__nv_bfloat16 a, __nv_bfloat16 b) {
    return (unsigned)__bfloat16_as_ushort(a) | ((unsigned)__bfloat16_as_ushort(b) << 16);
}

// hi/lo bf16x2 of (x0, x1): hi = bf16(x), lo = bf16(x - hi); x0 in the low halves.
__device__ __forceinline__ void pf_split2(float x0, float x1, unsigned& hi, unsigned& lo) {
    const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
    hi = pf_pack(h0, h1);
    lo = pf_pack(__float2bfloat16_rn(x0 - __bfloat162float(h0)), __float2bfloat16_rn(x1 - __bfloat162float(h1)));
}

__device__ __forceinline__ unsigned pf_u4(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// ---------------------------------------------------------------------------------------------
// Dense GEMM support (the GEMM itself is cuBLAS, bf16 × bf16 -> f32).

// xs[0, r, :] = bf16(x[r, :]), xs[1, r, :] = bf16(x[r, :] - xs[0, r, :]); n = rows · in elements.
// grid: ceil(n / 256), block: 256.
extern "C" __global__ void pf_split_rows(const float* __restrict__ x, __nv_bfloat16* __restrict__ xs, long long n) {
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    xs[i] = h;
    xs[n + i] = __float2bfloat16_rn(v - __bfloat162float(h));
}

// The uint4 holding column c (c % 4 == 0) of `row` in the grouped expert GEMMs' split layout of
// K-column rows (the layout note under "Mixture of experts" below).
__device__ __forceinline__ size_t pf_split_index(int c, int K, size_t row) {
    const int q = c & 127, t = q >> 5, i = (q & 31) >> 3, hh = (q & 7) >> 2;
    return row * (size_t)(K / 4) + (size_t)(c >> 7) * 32 + (2 * i + hh) * 4 + t;
}

// RMSNorm of each row fused with the split the GEMMs take: v = w ⊙ x / rms(x) (the inverse rms
// as every fused-norm GEMV computes it), out[r, :] = v (when out is set), xs[0, r, :] = bf16(v),
// xs[1, r, :] = bf16(v - xs[0, r, :]) (as pf_split_rows), and, when perm is set, the same hi/lo
// in the grouped expert GEMMs' layout (as pf_split_perm; n % 128 == 0). grid: rows, block: 256.
extern "C" __global__ void __launch_bounds__(256) pf_rms_norm_split(const float* __restrict__ x,
                                                                    const __nv_bfloat16* __restrict__ w,
                                                                    float* __restrict__ out,
                                                                    __nv_bfloat16* __restrict__ xs,
                                                                    uint4* __restrict__ perm, int n, int rows,
                                                                    float eps) {
    __shared__ float inv[16], red[8 * 16];
    const size_t base = (size_t)blockIdx.x * n, total = (size_t)rows * n;
    const float* xr = x + base;
    block_inv_rms(xr, n, 1, eps, inv, red);
    // Four columns per thread: 16-byte loads of x, 8-byte loads of w and stores of hi and lo
    // (n % 4 == 0, so rows stay 16-byte aligned).
    for (int i = 4 * threadIdx.x; i < n; i += 4 * 256) {
        const float4 xv = *reinterpret_cast<const float4*>(xr + i);
        const uint2 wv = *reinterpret_cast<const uint2*>(w + i);
        const float x4[4] = {xv.x, xv.y, xv.z, xv.w};
        const float w4[4] = {__uint_as_float(wv.x << 16), __uint_as_float(wv.x & 0xffff0000u),
                             __uint_as_float(wv.y << 16), __uint_as_float(wv.y & 0xffff0000u)};
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = w4[j] * (x4[j] * inv[0]);
        if (out) *reinterpret_cast<float4*>(out + base + i) = make_float4(v[0], v[1], v[2], v[3]);
        unsigned hi0, lo0, hi1, lo1;
        pf_split2(v[0], v[1], hi0, lo0);
        pf_split2(v[2], v[3], hi1, lo1);
        *reinterpret_cast<uint2*>(xs + base + i) = make_uint2(hi0, hi1);
        *reinterpret_cast<uint2*>(xs + total + base + i) = make_uint2(lo0, lo1);
        if (perm) perm[pf_split_index(i, n, blockIdx.x)] = make_uint4(hi0, hi1, lo0, lo1);
    }
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts.
//
// Activations for the grouped GEMMs are stored "split": each row of K columns (K a multiple of
// 128) as K/4 uint4, each holding hi (4 bf16) then lo (4 bf16) of 4 consecutive columns, ordered
// so that a warp's B fragments for one k step are 4 consecutive uint4 per token. The k order
// inside an mma is a free permutation as long as A and B agree: within a 128-column block, the
// thread with t = lane % 4 owns columns 32t .. 32t+31 (one uint4 of NVFP4 codes per weight row),
// and k step s = 2i + hh (i, hh < 4, 2) uses its columns 32t + 8i + 4hh .. +3 as logical
// k {2t, 2t+1, 2t+8, 2t+9}. uint4 index of (row, column c): row·K/4 + (c/128)·32 + s·4 + t.

// Tokens per MoE tile: PF_NT n8 fragments. Routed experts average rows·k/E tokens (16 at XS
// 2.1 shapes), so 32 keeps most experts in one tile while leaving registers for prefetching.
#define PF_NT 4
#define PF_TOK (PF_NT * 8)


// Split layout of f32 rows x [n, K]. grid: ceil(n·K/4 / 256), block: 256 (thread per uint4).
extern "C" __global__ void pf_split_perm(const float* __restrict__ x, uint4* __restrict__ xs, int n, int K) {
    const long long u = (long long)blockIdx.x * 256 + threadIdx.x;
    if (u >= (long long)n * (K / 4)) return;
    const long long row = u / (K / 4);
    const int uu = (int)(u % (K / 4));
    const int kb = uu >> 5, s = (uu >> 2) & 7, t = uu & 3;
    const int c = kb * 128 + 32 * t + 8 * (s >> 1) + 4 * (s & 1);
    const float4 v = *reinterpret_cast<const float4*>(x + row * K + c);
    uint4 o;
    pf_split2(v.x, v.y, o.x, o.z);
    pf_split2(v.z, v.w, o.y, o.w);
    xs[u] = o;
}

// Groups the (row, slot) pairs by expert, in two launches (both deterministic: integer counts
// and ballot ranks only).
//
// pf_moe_place, one block of PF_PLACE_WARPS warps: cnt[e] = pairs with id e; the pairs sorted by
// expert, and within an expert in (row chunk of 32, slot, row) order -- the "canonical" order, q =
// (r / 32) · 32k + s · 32 + r % 32: order[j] = pair at sorted position j, pos[pair] = j; pairs
// whose id lies outside 0..E get pos -1. A stable counting sort: warp w takes a contiguous run of
// the canonical order, 32 pairs a step; lanes holding the same id find each other with
// __match_any_sync, so a step adds each id's count once (its highest lane) to the warp's own
// histogram row. The rows are then prefixed over the warps and the totals over the experts, and a
// second pass places each pair at base[id] + (its warp's earlier pairs of that id) + (its rank
// among the step's peers). Integer counts only: the same placement every run. (Replaces a warp
// per expert scanning every pair: 64 blocks each reading all ids, ~17 us per layer at 512 rows.)
// grid: 1, block: 32 · PF_PLACE_WARPS. E <= 1024.
#define PF_PLACE_WARPS 8
extern "C" __global__ void __launch_bounds__(32 * PF_PLACE_WARPS) pf_moe_place(
    const int* __restrict__ gids, int rows, int k, int E, int* __restrict__ order, int* __restrict__ pos,
    int* __restrict__ cnt) {
    __shared__ int hist[PF_PLACE_WARPS][1024];
    __shared__ int base[1024];
    __shared__ int wsum[PF_PLACE_WARPS];
    const int t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    const int steps = (rows + WARP - 1) / WARP * k;  // canonical length / 32
    const int per = (steps + PF_PLACE_WARPS - 1) / PF_PLACE_WARPS;
    const int st0 = warp * per, st1 = min(steps, st0 + per);
    for (int i = t; i < PF_PLACE_WARPS * 1024; i += blockDim.x) (&hist[0][0])[i] = 0;
    __syncthreads();
    // The pair of canonical step st at this lane: row r, slot s (r >= rows: none).
    auto pair_at = [&](int st, int& r, int& s) {
        const int chunk = st / k;
        s = st % k;
        r = chunk * WARP + lane;
    };
    // Ids eight steps at a time: their loads in flight together.
    auto ids8 = [&](int st, int id[8]) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int r, s;
            pair_at(st + i, r, s);
            id[i] = st + i < st1 && r < rows ? gids[r * k + s] : -1;
        }
    };
    // Pass 1: this warp's count of every id.
    for (int st = st0; st < st1; st += 8) {
        int id[8];
        ids8(st, id);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (st + i >= st1) break;  // warp-uniform
            const bool valid = id[i] >= 0 && id[i] < E;
            const unsigned peers = __match_any_sync(0xffffffffu, valid ? id[i] : -1);
            if (valid && 31 - __clz(peers) == lane) hist[warp][id[i]] += __popc(peers);
            __syncwarp();
        }
    }
    __syncthreads();
    // Per expert: the warps' counts become exclusive prefixes; the total is the expert's count.
    for (int e = t; e < E; e += blockDim.x) {
        int run = 0;
        for (int w = 0; w < PF_PLACE_WARPS; w++) {
            const int c = hist[w][e];
            hist[w][e] = run;
            run += c;
        }
        base[e] = run;
        cnt[e] = run;
    }
    __syncthreads();
    // Exclusive scan of the counts over the experts: thread t sums its run of four, a warp scan
    // of those sums, then the warps' totals in order.
    {
        const int e0 = 4 * t;
        int c[4], sum = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            c[i] = e0 + i < E ? base[e0 + i] : 0;
            sum += c[i];
        }
        int inc = sum;
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += v;
        }
        if (lane == WARP - 1) wsum[warp] = inc;
        __syncthreads();
        int before = inc - sum;
        for (int w = 0; w < warp; w++) before += wsum[w];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (e0 + i < E) base[e0 + i] = before;
            before += c[i];
        }
    }
    __syncthreads();
    // Pass 2: place every pair.
    for (int st = st0; st < st1; st += 8) {
        int id[8];
        ids8(st, id);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (st + i >= st1) break;
            int r, s;
            pair_at(st + i, r, s);
            const bool valid = id[i] >= 0 && id[i] < E;
            const unsigned peers = __match_any_sync(0xffffffffu, valid ? id[i] : -1);
            if (valid) {
                const int j = base[id[i]] + hist[warp][id[i]] + __popc(peers & ((1u << lane) - 1u));
                order[j] = r * k + s;
                pos[r * k + s] = j;
            } else if (r < rows) {
                pos[r * k + s] = -1;
            }
            __syncwarp();
            if (valid && 31 - __clz(peers) == lane) hist[warp][id[i]] += __popc(peers);
            __syncwarp();
        }
    }
}

// The work tiles (expert, first sorted position, count <= PF_TOK) from the counts: the shared
// expert's tiles first (expert = E, first = row), then each routed expert's in expert order;
// the rest of the max_tiles entries get count 0. grid: 1, block: 1024; E <= 1024.
extern "C" __global__ void __launch_bounds__(1024) pf_moe_tiles(const int* __restrict__ cnt, int rows, int E,
                                                                int4* __restrict__ tiles, int max_tiles) {
    __shared__ int wsum[2][32];
    const int e = threadIdx.x, lane = e % WARP, warp = e / WARP;
    const int c = e < E ? cnt[e] : 0;
    const int n = (c + PF_TOK - 1) / PF_TOK;
    // Inclusive scans of (c, n) over the block.
    int sc = c, sn = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, sn, o);
        if (lane >= o) { sc += a; sn += b; }
    }
    if (lane == 31) { wsum[0][warp] = sc; wsum[1][warp] = sn; }
    __syncthreads();
    if (warp == 0) {
        int a = wsum[0][lane], b = wsum[1][lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, a, o), y = __shfl_up_sync(0xffffffffu, b, o);
            if (lane >= o) { a += x; b += y; }
        }
        wsum[0][lane] = a;
        wsum[1][lane] = b;
    }
    __syncthreads();
    const int pre_c = sc - c + (warp > 0 ? wsum[0][warp - 1] : 0);
    const int pre_n = sn - n + (warp > 0 ? wsum[1][warp - 1] : 0);
    const int nsh = (rows + PF_TOK - 1) / PF_TOK;
    const int total = nsh + wsum[1][31];
    for (int i = e; i < nsh && i < max_tiles; i += blockDim.x)
        tiles[i] = make_int4(E, i * PF_TOK, min(PF_TOK, rows - i * PF_TOK), 0);
    for (int i = 0; i < n; i++) {
        const int t = nsh + pre_n + i;
        if (t < max_tiles) tiles[t] = make_int4(e, pre_c + i * PF_TOK, min(PF_TOK, c - i * PF_TOK), 0);
    }
    for (int t = total + e; t < max_tiles; t += blockDim.x) tiles[t] = make_int4(0, 0, 0, 0);
}

// Four e2m1 codes (the low 16 bits of x, nibbles a, b, c, d from the low end) times the bf16x2
// scale s2 (from pf_e4m3x2x2: the e4m3 scale times 2^-8), as bf16x2 (a, b) -> p0 and (c, d) ->
// p1. Byte permutes look up the high and low bytes of the bf16 magnitudes {0, .5, 1, 1.5, 2, 3,
// 4, 6} times 2^8 (which only raises the high bytes), the 2^-8 of the scale cancels it; the sign
// is bit 3 of each code, and one multiply moves two of them at once to bits 15 and 31 (sign bits
// 3, 7 by 2^12 + 2^24; bits 11, 15 by 2^4 + 2^16; no other sign bit lands on 15 or 31): two
// instructions per pair where shifting and masking each took four, in the decode that bounds the
// prefill's expert GEMMs (Nsight: issue-bound, 58-67 % SM throughput). Exact: every product
// (e2m1 · 2^8) · (e4m3 · 2^-8) is the bf16 e2m1 · e4m3, as before the scalings (checked for every
// code and scale byte).
__device__ __forceinline__ void pf_fp4x4(unsigned x, unsigned s2, unsigned& p0, unsigned& p1) {
    const unsigned m = x & 0x7777u;
    const unsigned hi = __byte_perm(0x43434300u, 0x44444444u, m);
    const unsigned lo = __byte_perm(0xC0800000u, 0xC0804000u, m);
    const unsigned sg = x & 0x8888u;
    const unsigned v0 = __byte_perm(lo, hi, 0x5140u) | ((sg * 0x01001000u) & 0x80008000u);
    const unsigned v1 = __byte_perm(lo, hi, 0x7362u) | ((sg * 0x00010010u) & 0x80008000u);
    const __nv_bfloat162 s = *reinterpret_cast<const __nv_bfloat162*>(&s2);
    __nv_bfloat162 r0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v0), s);
    __nv_bfloat162 r1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v1), s);
    p0 = *reinterpret_cast<unsigned*>(&r0);
    p1 = *reinterpret_cast<unsigned*>(&r1);
}

// The two e4m3 bytes of sv (low 16 bits) times 2^-8, each as a bf16x2 pair (exact). An e4m3 byte
// placed at bit 7 of an f16 is its value times 2^-8 (subnormals included); widened to f32, its
// top half is the bf16. Both bytes go through one f16x2: a handful of instructions where the
// exponent/subnormal branch per byte took about a dozen.
__device__ __forceinline__ void pf_e4m3x2x2(unsigned sv, unsigned& c0, unsigned& c1) {
    const unsigned x = __byte_perm(sv, 0u, 0x4140u);  // bytes b0, 0, b1, 0
    const unsigned h = ((x & 0x007f007fu) << 7) | ((x & 0x00800080u) << 8);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    c0 = __byte_perm(__float_as_uint(f.x), 0u, 0x3232u);
    c1 = __byte_perm(__float_as_uint(f.y), 0u, 0x3232u);
}

// The expert GEMMs. A block takes one work tile (<= PF_TOK tokens of one expert) and
// PF_MROWS = 256 weight rows (8 warps × 32 rows: two m16 blocks each), and walks K in chunks
// of 128 columns through a PF_MSTAGES-deep cp.async pipeline in shared memory. One stage holds
// the chunk's NVFP4 codes (64 B per row), its e4m3 scales (8 B per row) and the tile's split
// activations (512 B per token, padded to 576 B so that a warp's B fragment reads hit 32
// distinct banks). Weight row i of a warp's two m blocks and token j of its n8 tiles are
// multiplied in k-step order (chunk, step) with fixed mma.sync sequences: bit-deterministic.
#define PF_MW 8
#define PF_MROWS (PF_MW * 32)
#define PF_MSTAGES 3
#define PF_ASTR 36
#define PF_SCALE_U4 (PF_MROWS * 4)
#define PF_ACT_U4 (PF_SCALE_U4 + PF_MROWS / 2)
#define PF_STAGE_U4 (PF_ACT_U4 + PF_TOK * PF_ASTR)
#define PF_MOE_SMEM (PF_MSTAGES * PF_STAGE_U4 * 16)

__device__ __forceinline__ void pf_cp16(void* dst, const void* src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
}
// Weight streams: the L2 fetches the surrounding 256 bytes (the row's next chunks) at once, so
// that DRAM sees 256-byte runs instead of 64-byte pieces of rows K/2 bytes apart.
__device__ __forceinline__ void pf_cp16w(void* dst, const void* src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void pf_cp8(void* dst, const void* src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 8;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void pf_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void pf_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// What one thread copies per chunk: weight code rows (tid / 4) + 64 i at wbase + i · wstride
// (uint4; bit i of wmask clear: row outside the matrix), 16-byte part tid % 4 (folded into
// wbase); scale row tid (ssrc null: outside); activation tokens tid / 32 + 8 i at abase +
// aoff[i] (uint4; -1: past the tile), 16-byte part tid % 32 (folded into abase).
struct PfMoeSrc {
    const uint4* wbase;
    const uint2* ssrc;
    const uint4* abase;
    int wstride, wmask;
    int aoff[4];
};

__device__ __forceinline__ void pf_moe_load(uint4* st, const PfMoeSrc& src, int c) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (src.wmask >> i & 1)
            pf_cp16w(st + ((tid >> 2) + 64 * i) * 4 + (tid & 3), src.wbase + (size_t)i * src.wstride + 4 * c);
    if (src.ssrc) pf_cp8(reinterpret_cast<uint2*>(st + PF_SCALE_U4) + tid, src.ssrc + c);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (src.aoff[i] >= 0)
            pf_cp16(st + PF_ACT_U4 + ((tid >> 5) + 8 * i) * PF_ASTR + (tid & 31), src.abase + src.aoff[i] + 32 * c);
}

// acc[m][nt] = W rows (32 warp + 16 m ..) · tokens (8 nt ..) over K (a multiple of 128).
__device__ __forceinline__ void pf_moe_mainloop(uint4* smem, const PfMoeSrc& src, int K, int ntiles,
                                                float acc[2][PF_NT][4]) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    const int nch = K / 128;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[m][nt][c] = 0.f;
#pragma unroll
    for (int s = 0; s < PF_MSTAGES - 1; s++) {
        if (s < nch) pf_moe_load(smem + s * PF_STAGE_U4, src, s);
        pf_cp_commit();
    }
    for (int ch = 0; ch < nch; ch++) {
        pf_cp_wait<PF_MSTAGES - 2>();
        __syncthreads();
        {
            const int nx = ch + PF_MSTAGES - 1;
            if (nx < nch) pf_moe_load(smem + (nx % PF_MSTAGES) * PF_STAGE_U4, src, nx);
            pf_cp_commit();
        }
        const uint4* st = smem + (ch % PF_MSTAGES) * PF_STAGE_U4;
        const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + PF_SCALE_U4);
        const uint4* as = st + PF_ACT_U4 + g * PF_ASTR + t;
        uint4 cw[2][2];
        unsigned cs[2][2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp * 32 + m * 16 + r * 8 + g;
                cw[m][r] = st[row * 4 + t];
                const unsigned sv = ss[row * 4 + t];
                pf_e4m3x2x2(sv, cs[m][r][0], cs[m][r][1]);
            }
#pragma unroll
        for (int s = 0; s < 8; s++) {
            const int i = s >> 1, hh = s & 1;
            unsigned a[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                pf_fp4x4(pf_u4(cw[m][0], i) >> (16 * hh), cs[m][0][i >> 1], a[m][0], a[m][2]);
                pf_fp4x4(pf_u4(cw[m][1], i) >> (16 * hh), cs[m][1][i >> 1], a[m][1], a[m][3]);
            }
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++)
                if (nt < ntiles) {
                    const uint4 b = as[nt * 8 * PF_ASTR + s * 4];
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        mma_bf16(acc[m][nt], a[m][0], a[m][1], a[m][2], a[m][3], b.x, b.y);
                        mma_bf16(acc[m][nt], a[m][0], a[m][1], a[m][2], a[m][3], b.z, b.w);
                    }
                }
        }
    }
    pf_cp_wait<0>();
}

__device__ __forceinline__ float pf_silu(float v) { return v / (1.f + expf(-v)); }

// h = silu(G_e x) · (U_e x) for one tile of tokens and 128 intermediate rows per block (warp w
// takes rows 16w .. 16w+15 of gate, its m block 0, and of up, its m block 1), written split
// (hi/lo) for the down projection: routed pairs at their sorted position in h [rows·k, I], the
// shared expert's rows in hs [rows, Is]. G, U: NVFP4 [E, I, H]; shared SG, SU: [Is, H].
// xs: split xn [rows, H]. grid: (max(I, Is) / 128, max_tiles), block: 256, PF_MOE_SMEM bytes.
extern "C" __global__ void __launch_bounds__(256, 2) pf_moe_gate_up(
    const unsigned* __restrict__ gc, const unsigned char* __restrict__ gs,
    const unsigned* __restrict__ uc, const unsigned char* __restrict__ us,
    const unsigned* __restrict__ sgc, const unsigned char* __restrict__ sgs,
    const unsigned* __restrict__ suc, const unsigned char* __restrict__ sus,
    const uint4* __restrict__ xs, const int* __restrict__ order, const int4* __restrict__ tiles,
    __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ hs, int E, int H, int I, int Is, int k) {
    extern __shared__ uint4 pf_smem[];
    const int4 tile = tiles[blockIdx.y];
    const bool shared = tile.x == E;
    const int width = shared ? Is : I;
    const int o0 = blockIdx.x * 128;
    if (tile.z == 0 || o0 >= width) return;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
    const int ntiles = (tile.z + 7) / 8;
    PfMoeSrc src;
    const size_t ebase = shared ? 0 : (size_t)tile.x * I;
    {
        // Stage row ri: warp ri / 32, gate (ri % 32 < 16) or up, output row o0 + 16 (ri / 32) +
        // ri % 16; this thread's rows ri = tid / 4 + 64 i are 32 i output rows apart.
        const int ri = tid >> 2;
        const size_t o = ebase + o0 + 16 * (ri >> 5) + (ri & 15);
        const unsigned* cb = (ri & 16) ? (shared ? suc : uc) : (shared ? sgc : gc);
        src.wbase = reinterpret_cast<const uint4*>(cb + o * (H / 8)) + (tid & 3);
        src.wstride = 32 * (H / 32);
        src.wmask = 15;
    }
    src.abase = xs + (tid & 31);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int j = (tid >> 5) + 8 * i;
        src.aoff[i] = j < tile.z ? (shared ? tile.y + j : order[tile.y + j] / k) * (H / 4) : -1;
    }
    {
        // Scale row tid: the same stage row mapping.
        const size_t o = ebase + o0 + 16 * (tid >> 5) + (tid & 15);
        const unsigned char* sb = (tid & 16) ? (shared ? sus : us) : (shared ? sgs : gs);
        src.ssrc = reinterpret_cast<const uint2*>(sb + o * (H / 16));
    }
    float acc[2][PF_NT][4];
    pf_moe_mainloop(pf_smem, src, H, ntiles, acc);
    __nv_bfloat16* out = shared ? hs : h;
#pragma unroll
    for (int nt = 0; nt < PF_NT; nt++) {
        if (nt >= ntiles) break;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int j = nt * 8 + 2 * t + (c & 1);
            if (j >= tile.z) continue;
            const int o = o0 + warp * 16 + g + (c >> 1) * 8;
            const float v = pf_silu(acc[0][nt][c]) * acc[1][nt][c];
            const __nv_bfloat16 hi = __float2bfloat16_rn(v);
            const size_t u = pf_split_index(o, width, (size_t)(tile.y + j));
            out[u * 8 + (o & 3)] = hi;
            out[u * 8 + 4 + (o & 3)] = __float2bfloat16_rn(v - __bfloat162float(hi));
        }
    }
}

// y = D_e h for one tile of tokens and 256 hidden rows per block (warp w: rows 32w .. 32w+31),
// unweighted: routed pairs at their sorted position in y [rows·k + rows, H], the shared
// expert's rows after them (row rows·k + r). D: NVFP4 [E, H, I]; SD: [H, Is].
// grid: (ceil(H / 256), max_tiles), block: 256, PF_MOE_SMEM bytes.
extern "C" __global__ void __launch_bounds__(256, 2) pf_moe_down(
    const unsigned* __restrict__ dc, const unsigned char* __restrict__ ds,
    const unsigned* __restrict__ sdc, const unsigned char* __restrict__ sds,
    const uint4* __restrict__ h, const uint4* __restrict__ hs, const int4* __restrict__ tiles,
    float* __restrict__ y, int E, int H, int I, int Is, int pairs) {
    extern __shared__ uint4 pf_smem[];
    const int4 tile = tiles[blockIdx.y];
    if (tile.z == 0) return;
    const bool shared = tile.x == E;
    const int K = shared ? Is : I;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
    const int ntiles = (tile.z + 7) / 8;
    const int o0 = blockIdx.x * PF_MROWS;
    const size_t ebase = shared ? 0 : (size_t)tile.x * H;
    const unsigned* cb = shared ? sdc : dc;
    const unsigned char* sb = shared ? sds : ds;
    const uint4* hb = shared ? hs : h;
    PfMoeSrc src;
    src.wbase = reinterpret_cast<const uint4*>(cb + (ebase + o0 + (tid >> 2)) * (K / 8)) + (tid & 3);
    src.wstride = 64 * (K / 32);
    src.wmask = 0;
    src.abase = hb + (tid & 31);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (o0 + (tid >> 2) + 64 * i < H) src.wmask |= 1 << i;
        const int j = (tid >> 5) + 8 * i;
        src.aoff[i] = j < tile.z ? (tile.y + j) * (K / 4) : -1;
    }
    src.ssrc = o0 + tid < H ? reinterpret_cast<const uint2*>(sb + (ebase + o0 + tid) * (K / 16)) : nullptr;
    float acc[2][PF_NT][4];
    pf_moe_mainloop(pf_smem, src, K, ntiles, acc);
    const size_t ybase = shared ? (size_t)pairs + tile.y : (size_t)tile.y;
#pragma unroll
    for (int nt = 0; nt < PF_NT; nt++) {
        if (nt >= ntiles) break;
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int j = nt * 8 + 2 * t + (c & 1);
                const int o = o0 + warp * 32 + 16 * m + g + (c >> 1) * 8;
                if (j < tile.z && o < H) y[(ybase + j) * H + o] = acc[m][nt][c];
            }
    }
}

// x[r, o] += scaling · Σ_s wts[r, s] · y[pos[r, s], o] + y[rows·k + r, o]: slots in ascending
// expert order as the CPU sums them. grid: (ceil(H / 256), rows), block: 256.
extern "C" __global__ void pf_moe_combine(const float* __restrict__ y, const int* __restrict__ pos,
                                          const float* __restrict__ wts, float* __restrict__ x,
                                          int H, int k, int rows, float scaling) {
    const int o = blockIdx.x * 256 + threadIdx.x, r = blockIdx.y;
    if (o >= H) return;
    float routed = 0.f;
    for (int s = 0; s < k; s++) {
        const int j = pos[r * k + s];
        if (j >= 0) routed += wts[r * k + s] * y[(size_t)j * H + o];
    }
    x[(size_t)r * H + o] += scaling * routed + y[((size_t)rows * k + r) * H + o];
}

// ---------------------------------------------------------------------------------------------
// Attention.
//
// out[r, h, :] = softplus(g[r, h]) · Σ_j softmax_j(q·k_j / sqrt(D)) v_j over key positions
// max(0, pos[r] - window + 1) ..= pos[r] (window 0: from 0), read from the cache at slot
// position % ring (ring 0: the position). q, k, P and v are split hi/lo and each product is
// hi·hi + hi·lo + lo·hi (the lo·lo term is below f32 rounding).
//
// pf_attn_split first writes the caches as bf16 hi/lo rows ([slot, kv head, hi|lo, D]). A block
// of pf_attend then takes gb query heads of one kv group (sharing its keys) times rb blocks of
// 16 query rows, one warp each (gb·rb <= 8 warps), and walks the union of their key ranges in
// tiles of 32 keys with an online softmax; the tiles stream through a PF_ASTAGES-deep cp.async
// pipeline in shared memory (rows padded to D + 8 bf16 so that ldmatrix hits distinct banks),
// and the B fragments come from ldmatrix (K) and ldmatrix.trans (V). Keys past the block's
// range or at slots >= slots (a caller error) read as zeros rather than out of bounds.

#define PF_KT 32  // keys per tile
#define PF_ASTAGES 3

// Split f32 rows x [n / D, D] into bf16 [n / D, 2, D]: hi then lo, for the elements off ..
// off + n (whole rows). grid: ceil(n / 4 / 256), block: 256.
extern "C" __global__ void pf_attn_split(const float* __restrict__ ck, const float* __restrict__ cv,
                                         __nv_bfloat16* __restrict__ kx, __nv_bfloat16* __restrict__ vx,
                                         long long off, long long n, int D) {
    const long long i = ((long long)blockIdx.x * 256 + threadIdx.x) * 4;
    if (i >= n) return;
    const long long u = off + i;
    const long long row = u / D;
    const int d = (int)(u % D);
    const float4 a = *reinterpret_cast<const float4*>(ck + u);
    const float4 b = *reinterpret_cast<const float4*>(cv + u);
    unsigned h0, l0, h1, l1;
    pf_split2(a.x, a.y, h0, l0);
    pf_split2(a.z, a.w, h1, l1);
    *reinterpret_cast<uint2*>(kx + row * 2 * D + d) = make_uint2(h0, h1);
    *reinterpret_cast<uint2*>(kx + row * 2 * D + D + d) = make_uint2(l0, l1);
    pf_split2(b.x, b.y, h0, l0);
    pf_split2(b.z, b.w, h1, l1);
    *reinterpret_cast<uint2*>(vx + row * 2 * D + d) = make_uint2(h0, h1);
    *reinterpret_cast<uint2*>(vx + row * 2 * D + D + d) = make_uint2(l0, l1);
}

__device__ __forceinline__ void pf_cp16z(void* dst, const void* src, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void pf_ldsm4(unsigned s, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}
__device__ __forceinline__ void pf_ldsm4t(unsigned s, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}

// Shared memory of one pipeline stage: K then V, each [hi|lo][PF_KT][D + 8] bf16.
template <int D>
__device__ __forceinline__ constexpr int pf_astage() { return 2 * 2 * PF_KT * (D + 8); }

template <int D>
__device__ __forceinline__ void pf_attend(const float* __restrict__ q, const __nv_bfloat16* __restrict__ kx,
                                          const __nv_bfloat16* __restrict__ vx, const float* __restrict__ gl,
                                          int gstride, const int* __restrict__ pos, float* __restrict__ out,
                                          __nv_bfloat16* __restrict__ xs, int rows,
                                          int heads, int kv_heads, int window, int ring, int slots, int gb, int rb) {
    extern __shared__ __align__(16) __nv_bfloat16 pf_asmem[];
    __shared__ int range[2];
    constexpr int DP = D + 8;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    const int kvh = blockIdx.x, G = heads / kv_heads;
    const int h = kvh * G + blockIdx.z * gb + warp % gb;
    // Later rows see more keys (causal): the last row blocks (of every kv group) start first.
    const int r0 = ((gridDim.y - 1 - blockIdx.y) * rb + warp / gb) * 16;
    const int ra = r0 + g, rb8 = r0 + g + 8;
    const int big = 0x7fffffff;
    int lo_a = big, hi_a = -1, lo_b = big, hi_b = -1;
    if (ra < rows) { hi_a = pos[ra]; lo_a = window > 0 ? max(0, hi_a - window + 1) : 0; }
    if (rb8 < rows) { hi_b = pos[rb8]; lo_b = window > 0 ? max(0, hi_b - window + 1) : 0; }
    int wlo = min(lo_a, lo_b), whi = max(hi_a, hi_b);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }
    if (threadIdx.x == 0) { range[0] = big; range[1] = -1; }
    __syncthreads();
    if (lane == 0) { atomicMin(&range[0], wlo); atomicMax(&range[1], whi); }
    __syncthreads();
    const int kmin = range[0], kmax = range[1];
    const int ntile = kmax >= kmin ? (kmax - kmin) / PF_KT + 1 : 0;
    // Loads one tile into a stage: per key, 4 rows (K hi, K lo, V hi, V lo) of D / 8 16-byte parts.
    auto load = [&](int it) {
        __nv_bfloat16* st = pf_asmem + (it % PF_ASTAGES) * pf_astage<D>();
        const int kt = kmin + it * PF_KT;
        constexpr int PER_KEY = 4 * (D / 8);
        for (int e = threadIdx.x; e < PF_KT * PER_KEY; e += blockDim.x) {
            const int key = e / PER_KEY, rem = e % PER_KEY;
            const int which = rem / (D / 8), part = rem % (D / 8);  // which: K hi, K lo, V hi, V lo
            const int kp = kt + key;
            const long long slot = ring > 0 ? kp % ring : kp;
            const bool ok = kp <= kmax && slot < slots;
            const __nv_bfloat16* base = which < 2 ? kx : vx;
            const __nv_bfloat16* src = ok ? base + ((size_t)slot * kv_heads + kvh) * 2 * D + (which & 1) * D + part * 8 : base;
            pf_cp16z(st + ((which >> 1) * 2 + (which & 1)) * PF_KT * DP + key * DP + part * 8, src, ok);
        }
    };
    // Q fragments, split, for the whole head dim.
    unsigned qh[D / 16][4], ql[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const int row = (f & 1) ? rb8 : ra;
            const int col = kk * 16 + 2 * t + (f >> 1) * 8;
            float2 v = make_float2(0.f, 0.f);
            if (row < rows) v = *reinterpret_cast<const float2*>(q + ((size_t)row * heads + h) * D + col);
            pf_split2(v.x, v.y, qh[kk][f], ql[kk][f]);
        }
    float o_acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) o_acc[n][c] = 0.f;
    const float ninf = -__int_as_float(0x7f800000);
    float m_a = ninf, m_b = ninf, l_a = 0.f, l_b = 0.f;
    const float scale = rsqrtf((float)D);
    // ldmatrix lane roles: matrix mi = lane / 8 (hi/lo = mi / 2, second half = mi % 2), row lane % 8.
    const int mi = lane >> 3, mr = lane & 7;
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(pf_asmem);
#pragma unroll
    for (int s = 0; s < PF_ASTAGES - 1; s++) {
        if (s < ntile) load(s);
        pf_cp_commit();
    }
    for (int it = 0; it < ntile; it++) {
        pf_cp_wait<PF_ASTAGES - 2>();
        __syncthreads();
        if (it + PF_ASTAGES - 1 < ntile) load(it + PF_ASTAGES - 1);
        pf_cp_commit();
        const int kt = kmin + it * PF_KT;
        if (kt > whi || kt + PF_KT - 1 < wlo) continue;  // no row of this warp sees the tile
        // Shared addresses of this lane's ldmatrix rows in the stage's K and V.
        // K: matrix mi = (hi/lo mi / 2, dims + 8 (mi % 2)), row = key; V: (hi/lo, keys + 8 (mi % 2)).
        const int sto = (it % PF_ASTAGES) * pf_astage<D>() + (mi >> 1) * PF_KT * DP;
        const unsigned ks = smem0 + (unsigned)(sto + mr * DP + (mi & 1) * 8) * 2;
        const unsigned vs = smem0 + (unsigned)(sto + 2 * PF_KT * DP + ((mi & 1) * 8 + mr) * DP) * 2;
        float s[PF_KT / 8][4];
#pragma unroll
        for (int n = 0; n < PF_KT / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[n][c] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int n = 0; n < PF_KT / 8; n++) {
                unsigned bh0, bh1, bl0, bl1;
                pf_ldsm4(ks + (n * 8 * DP + kk * 16) * 2, bh0, bh1, bl0, bl1);
                mma_bf16(s[n], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], bh0, bh1);
                mma_bf16(s[n], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], bl0, bl1);
                mma_bf16(s[n], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], bh0, bh1);
            }
        // Mask, then the online softmax (row max and sum over the 4 lanes sharing a row).
        float mx_a = ninf, mx_b = ninf;
#pragma unroll
        for (int n = 0; n < PF_KT / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int kp = kt + n * 8 + 2 * t + (c & 1);
                const bool ok = c < 2 ? (kp >= lo_a && kp <= hi_a) : (kp >= lo_b && kp <= hi_b);
                s[n][c] = ok ? s[n][c] * scale : ninf;
                if (c < 2) mx_a = fmaxf(mx_a, s[n][c]); else mx_b = fmaxf(mx_b, s[n][c]);
            }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o));
        }
        const float nm_a = fmaxf(m_a, mx_a), nm_b = fmaxf(m_b, mx_b);
        // A row that has seen no key yet keeps m = -inf: its p are all 0 and nothing rescales.
        const float al_a = nm_a == ninf ? 1.f : expf(m_a - nm_a);
        const float al_b = nm_b == ninf ? 1.f : expf(m_b - nm_b);
        float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
        for (int n = 0; n < PF_KT / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float mm = c < 2 ? nm_a : nm_b;
                const float p = s[n][c] == ninf ? 0.f : expf(s[n][c] - mm);
                s[n][c] = p;
                if (c < 2) sum_a += p; else sum_b += p;
            }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, o);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, o);
        }
        l_a = l_a * al_a + sum_a;
        l_b = l_b * al_b + sum_b;
        m_a = nm_a;
        m_b = nm_b;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o_acc[n][0] *= al_a;
            o_acc[n][1] *= al_a;
            o_acc[n][2] *= al_b;
            o_acc[n][3] *= al_b;
        }
        // O += P·V: the S accumulators of key fragments 2j, 2j+1 are the A fragment of k step j.
#pragma unroll
        for (int j = 0; j < PF_KT / 16; j++) {
            unsigned ph[4], pl[4];
            pf_split2(s[2 * j][0], s[2 * j][1], ph[0], pl[0]);
            pf_split2(s[2 * j][2], s[2 * j][3], ph[1], pl[1]);
            pf_split2(s[2 * j + 1][0], s[2 * j + 1][1], ph[2], pl[2]);
            pf_split2(s[2 * j + 1][2], s[2 * j + 1][3], ph[3], pl[3]);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                unsigned bh0, bh1, bl0, bl1;
                pf_ldsm4t(vs + (j * 16 * DP + n * 8) * 2, bh0, bh1, bl0, bl1);
                mma_bf16(o_acc[n], ph[0], ph[1], ph[2], ph[3], bh0, bh1);
                mma_bf16(o_acc[n], ph[0], ph[1], ph[2], ph[3], bl0, bl1);
                mma_bf16(o_acc[n], pl[0], pl[1], pl[2], pl[3], bh0, bh1);
            }
        }
    }
    pf_cp_wait<0>();
    // out = gate · O / l.
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = half ? rb8 : ra;
        if (row >= rows) continue;
        const float l = half ? l_b : l_a;
        const float x = gl[(size_t)row * gstride + h];
        const float gate = x > 20.f ? x : log1pf(expf(x));
        const float f = l > 0.f ? gate / l : 0.f;
        const size_t at = ((size_t)row * heads + h) * D;
        if (xs) {
            // Straight into the split the o_proj GEMM takes (as pf_split_rows would make it).
            const size_t total = (size_t)rows * heads * D;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                unsigned hi, lo;
                pf_split2(o_acc[n][2 * half] * f, o_acc[n][2 * half + 1] * f, hi, lo);
                *reinterpret_cast<unsigned*>(xs + at + n * 8 + 2 * t) = hi;
                *reinterpret_cast<unsigned*>(xs + total + at + n * 8 + 2 * t) = lo;
            }
        } else {
            float* o = out + at;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2*>(o + n * 8 + 2 * t) = make_float2(o_acc[n][2 * half] * f, o_acc[n][2 * half + 1] * f);
        }
    }
}

// kx, vx: pf_attn_split of the caches; gl: the gate logits, row r at gl + r · gstride (the tail
// of the fused projection rows, so no copy is needed). The output goes to out (f32), or, when xs
// is set, to xs as the hi/lo split [2, rows, heads · D] the next GEMM takes. gb heads of a kv
// group × rb blocks of 16 rows per block.
// grid: (kv_heads, ceil(rows / (16 rb)), heads / kv_heads / gb), block: 32 gb rb (<= 256),
// dynamic shared memory PF_ASTAGES · 256 · (D + 8) bytes.
#define PF_ATTEND(DIM)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 1) pf_attend_d##DIM(                                   \
        const float* __restrict__ q, const __nv_bfloat16* __restrict__ kx,                                   \
        const __nv_bfloat16* __restrict__ vx, const float* __restrict__ gl, int gstride,                     \
        const int* __restrict__ pos, float* __restrict__ out, __nv_bfloat16* __restrict__ xs, int rows,      \
        int heads, int kv_heads, int window, int ring, int slots, int gb, int rb) {                          \
        pf_attend<DIM>(q, kx, vx, gl, gstride, pos, out, xs, rows, heads, kv_heads, window, ring, slots, gb, \
                       rb);                                                                                  \
    }
PF_ATTEND(32)
PF_ATTEND(64)
PF_ATTEND(128)
