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

// d += a·b for one m16n8k16 tile: a = 16×16 bf16 (row), b = 16×8 bf16 (col), d 16×8 f32.
// Fragments (g = lane / 4, t = lane % 4): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..),
// a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..); b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g);
// d0,d1 = (row g, cols 2t, 2t+1), d2,d3 = (row g+8, cols 2t, 2t+1).
__device__ __forceinline__ void pf_mma(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                       unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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

__device__ __forceinline__ size_t pf_split_index(int c, int K, size_t row) {
    const int q = c & 127, t = q >> 5, i = (q & 31) >> 3, hh = (q & 7) >> 2;
    return row * (size_t)(K / 4) + (size_t)(c >> 7) * 32 + (2 * i + hh) * 4 + t;
}

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

// Groups the (row, slot) pairs by expert, rows ascending within an expert:
// order[j] = pair (r·k + s) at sorted position j, pos[pair] = j (-1 for an id outside 0..E),
// and the work tiles (expert, first sorted position, count <= PF_TOK): the shared expert's
// tiles first (expert = E, first = row), then each routed expert's; the rest of the max_tiles
// entries get count 0. grid: 1, block: 1024 (32 warps); E <= 1024. Ranks come from warp ballots
// over rows in order, so the result is deterministic. ids are staged in shared memory when
// rows·k <= 8192 (each is read 2·E/32 times).
extern "C" __global__ void pf_moe_sort(const int* __restrict__ ids, int rows, int k, int E,
                                       int* __restrict__ order, int* __restrict__ pos,
                                       int4* __restrict__ tiles, int max_tiles) {
    __shared__ int cnt[1024];
    __shared__ int off[1024];
    __shared__ int sid[8192];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const bool staged = rows * k <= 8192;
    for (int p = threadIdx.x; p < rows * k; p += blockDim.x) {
        pos[p] = -1;
        if (staged) sid[p] = ids[p];
    }
    __syncthreads();
    const int* id = staged ? sid : ids;
    // Pass 1: count. Warp w takes experts w, w + 32, ...; lane l looks at row chunk + l.
    for (int e = warp; e < E; e += 32) {
        int c = 0;
        for (int r0 = 0; r0 < rows; r0 += WARP) {
            const int r = r0 + lane;
            bool has = false;
            if (r < rows)
                for (int s = 0; s < k; s++) has |= id[r * k + s] == e;
            c += __popc(__ballot_sync(0xffffffffu, has));
        }
        if (lane == 0) cnt[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0, nt = 0;
        for (int r0 = 0; r0 < rows && nt < max_tiles; r0 += PF_TOK) tiles[nt++] = make_int4(E, r0, min(PF_TOK, rows - r0), 0);
        for (int e = 0; e < E; e++) {
            off[e] = acc;
            for (int c0 = 0; c0 < cnt[e] && nt < max_tiles; c0 += PF_TOK) tiles[nt++] = make_int4(e, acc + c0, min(PF_TOK, cnt[e] - c0), 0);
            acc += cnt[e];
        }
        for (; nt < max_tiles; nt++) tiles[nt] = make_int4(0, 0, 0, 0);
    }
    __syncthreads();
    // Pass 2: place, in row order within each expert.
    for (int e = warp; e < E; e += 32) {
        int base = off[e];
        for (int r0 = 0; r0 < rows; r0 += WARP) {
            const int r = r0 + lane;
            int slot = -1;
            if (r < rows)
                for (int s = 0; s < k; s++)
                    if (id[r * k + s] == e) slot = s;
            const unsigned m = __ballot_sync(0xffffffffu, slot >= 0);
            if (slot >= 0) {
                const int j = base + __popc(m & ((1u << lane) - 1u));
                order[j] = r * k + slot;
                pos[r * k + slot] = j;
            }
            base += __popc(m);
        }
    }
}

// Magnitudes of four e2m1 codes (16 bits, nibbles a, b, c, d from the low end) times the
// bf16x2 scale s2, as bf16x2 (a, b) -> p0 and (c, d) -> p1. Byte permutes look up the high and
// low bytes of the bf16 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; the sign is bit 3 of each code.
// Exact: every e2m1·e4m3 product is a bf16.
__device__ __forceinline__ void pf_fp4x4(unsigned x, unsigned s2, unsigned& p0, unsigned& p1) {
    const unsigned m = x & 0x7777u;
    const unsigned hi = __byte_perm(0x3F3F3F00u, 0x40404040u, m);
    const unsigned lo = __byte_perm(0xC0800000u, 0xC0804000u, m);
    const unsigned v0 = __byte_perm(lo, hi, 0x5140u) | ((x << 12) & 0x8000u) | ((x << 24) & 0x80000000u);
    const unsigned v1 = __byte_perm(lo, hi, 0x7362u) | ((x << 4) & 0x8000u) | ((x << 16) & 0x80000000u);
    const __nv_bfloat162 s = *reinterpret_cast<const __nv_bfloat162*>(&s2);
    __nv_bfloat162 r0 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v0), s);
    __nv_bfloat162 r1 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v1), s);
    p0 = *reinterpret_cast<unsigned*>(&r0);
    p1 = *reinterpret_cast<unsigned*>(&r1);
}

// An e4m3 byte as a bf16x2 pair (exact).
__device__ __forceinline__ unsigned pf_e4m3x2(unsigned b) {
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    const unsigned mag = e ? (((e + 120u) << 7) | (m << 4)) : (__float_as_uint((float)m * 0.001953125f) >> 16);
    const unsigned v = mag | ((b & 0x80u) << 8);
    return v | (v << 16);
}

// acc[m][nt] += W_m · Xᵀ for two 16-row NVFP4 weight blocks (codes cm / scales sm point at row
// 0 of block m; rows have K/8 words and K/16 scales) against ntiles (<= PF_NT, warp-uniform) n8
// tiles of split activations; xrow[nt] is the split row (K/4 uint4) of token g of tile nt.
// Weight codes are read straight into registers (each warp reads its rows once; one 128-column
// block is prefetched ahead), activations through L1/L2 (every warp of a block reads the same),
// one k step ahead so that their latency overlaps the current step's decode and mma.
__device__ __forceinline__ void pf_nvfp4_mma(const unsigned* __restrict__ c0, const unsigned char* __restrict__ s0,
                                             const unsigned* __restrict__ c1, const unsigned char* __restrict__ s1,
                                             int K, const uint4* const xrow[PF_NT], int ntiles, float acc[2][PF_NT][4]) {
    const int lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const int KB = K / 128;
    // [block m][row g, row g + 8]
    const uint4* wp[2][2];
    const unsigned short* sp[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        wp[0][r] = reinterpret_cast<const uint4*>(c0 + (size_t)(g + 8 * r) * (K / 8)) + t;
        wp[1][r] = reinterpret_cast<const uint4*>(c1 + (size_t)(g + 8 * r) * (K / 8)) + t;
        sp[0][r] = reinterpret_cast<const unsigned short*>(s0 + (size_t)(g + 8 * r) * (K / 16)) + t;
        sp[1][r] = reinterpret_cast<const unsigned short*>(s1 + (size_t)(g + 8 * r) * (K / 16)) + t;
    }
    uint4 w[2][2];
    unsigned short sc[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            w[m][r] = __ldg(wp[m][r]);
            sc[m][r] = __ldg(sp[m][r]);
        }
    // B of the next k step; steps are numbered kb·8 + s across blocks.
    uint4 bn[PF_NT];
#pragma unroll
    for (int nt = 0; nt < PF_NT; nt++)
        if (nt < ntiles) bn[nt] = __ldg(xrow[nt] + t);
    for (int kb = 0; kb < KB; kb++) {
        uint4 cw[2][2];
        unsigned cs[2][2][2];  // [m][r][word pair]: bf16x2 scales
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                cw[m][r] = w[m][r];
                cs[m][r][0] = pf_e4m3x2(sc[m][r] & 0xffu);
                cs[m][r][1] = pf_e4m3x2(sc[m][r] >> 8);
            }
        if (kb + 1 < KB) {
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    w[m][r] = __ldg(wp[m][r] + 4 * (kb + 1));
                    sc[m][r] = __ldg(sp[m][r] + 4 * (kb + 1));
                }
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
            uint4 b[PF_NT];
            const int next = kb * 8 + s + 1;
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++) {
                b[nt] = bn[nt];
                if (nt < ntiles && next < KB * 8) bn[nt] = __ldg(xrow[nt] + next * 4 + t);
            }
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++)
                if (nt < ntiles) {
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        pf_mma(acc[m][nt], a[m][0], a[m][1], a[m][2], a[m][3], b[nt].x, b[nt].y);
                        pf_mma(acc[m][nt], a[m][0], a[m][1], a[m][2], a[m][3], b[nt].z, b[nt].w);
                    }
                }
        }
    }
}

__device__ __forceinline__ float pf_silu(float v) { return v / (1.f + expf(-v)); }

// h = silu(G_e x) · (U_e x) for one tile of tokens and 64 intermediate rows per block (warp w
// takes rows 16w .. 16w+15 of gate and of up), written split (hi/lo) for the down projection:
// routed pairs at their sorted position in h [rows·k, I], the shared expert's rows in hs [rows, Is].
// G, U: NVFP4 [E, I, H]; shared SG, SU: [Is, H]. xs: split xn [rows, H].
// grid: (max(I, Is) / 64, max_tiles), block: 128.
extern "C" __global__ void __launch_bounds__(128, 3) pf_moe_gate_up(
    const unsigned* __restrict__ gc, const unsigned char* __restrict__ gs,
    const unsigned* __restrict__ uc, const unsigned char* __restrict__ us,
    const unsigned* __restrict__ sgc, const unsigned char* __restrict__ sgs,
    const unsigned* __restrict__ suc, const unsigned char* __restrict__ sus,
    const uint4* __restrict__ xs, const int* __restrict__ order, const int4* __restrict__ tiles,
    __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ hs, int E, int H, int I, int Is, int k) {
    const int4 tile = tiles[blockIdx.y];
    const bool shared = tile.x == E;
    const int width = shared ? Is : I;
    const int o0 = blockIdx.x * 64;
    if (tile.z == 0 || o0 >= width) return;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    const int ntiles = (tile.z + 7) / 8;
    const uint4* xrow[PF_NT];
#pragma unroll
    for (int nt = 0; nt < PF_NT; nt++) {
        // Tokens past the tile's count read row `tile.y` (valid); their results are dropped.
        const int j = nt * 8 + g < tile.z ? nt * 8 + g : 0;
        const int row = shared ? tile.y + j : order[tile.y + j] / k;
        xrow[nt] = xs + (size_t)row * (H / 4);
    }
    const size_t wrow = (shared ? 0 : (size_t)tile.x * I) + o0 + warp * 16;
    const unsigned* c0 = (shared ? sgc : gc) + wrow * (H / 8);
    const unsigned* c1 = (shared ? suc : uc) + wrow * (H / 8);
    const unsigned char* s0 = (shared ? sgs : gs) + wrow * (H / 16);
    const unsigned char* s1 = (shared ? sus : us) + wrow * (H / 16);
    float acc[2][PF_NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[m][nt][c] = 0.f;
    pf_nvfp4_mma(c0, s0, c1, s1, H, xrow, ntiles, acc);
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

// y = D_e h for one tile of tokens and 128 hidden rows per block (warp w: rows 32w .. 32w+31),
// unweighted: routed pairs at their sorted position in y [rows·k + rows, H], the shared
// expert's rows after them (row rows·k + r). D: NVFP4 [E, H, I]; SD: [H, Is].
// grid: (H / 128, max_tiles), block: 128.
extern "C" __global__ void __launch_bounds__(128, 3) pf_moe_down(
    const unsigned* __restrict__ dc, const unsigned char* __restrict__ ds,
    const unsigned* __restrict__ sdc, const unsigned char* __restrict__ sds,
    const uint4* __restrict__ h, const uint4* __restrict__ hs, const int4* __restrict__ tiles,
    float* __restrict__ y, int E, int H, int I, int Is, int pairs) {
    const int4 tile = tiles[blockIdx.y];
    if (tile.z == 0) return;
    const bool shared = tile.x == E;
    const int K = shared ? Is : I;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    const int ntiles = (tile.z + 7) / 8;
    const uint4* src = shared ? hs : h;
    const uint4* xrow[PF_NT];
#pragma unroll
    for (int nt = 0; nt < PF_NT; nt++) {
        const int j = nt * 8 + g < tile.z ? nt * 8 + g : 0;
        xrow[nt] = src + (size_t)(tile.y + j) * (K / 4);
    }
    const int o0 = blockIdx.x * 128 + warp * 32;
    const size_t wrow = (shared ? 0 : (size_t)tile.x * H) + o0;
    const unsigned* c0 = (shared ? sdc : dc) + wrow * (K / 8);
    const unsigned char* s0 = (shared ? sds : ds) + wrow * (K / 16);
    float acc[2][PF_NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[m][nt][c] = 0.f;
    pf_nvfp4_mma(c0, s0, c0 + 16 * (K / 8), s0 + 16 * (K / 16), K, xrow, ntiles, acc);
    const size_t ybase = shared ? (size_t)pairs + tile.y : (size_t)tile.y;
#pragma unroll
    for (int nt = 0; nt < PF_NT; nt++) {
        if (nt >= ntiles) break;
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int j = nt * 8 + 2 * t + (c & 1);
                if (j < tile.z) y[(ybase + j) * H + o0 + 16 * m + g + (c >> 1) * 8] = acc[m][nt][c];
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
// position % ring (ring 0: the position). A block takes 64 query rows (16 per warp) of one head
// and walks the union of their key ranges in tiles of 32 keys with an online softmax; q, k, P
// and v are split hi/lo and each product is hi·hi + hi·lo + lo·hi (the lo·lo term is below f32
// rounding). K and V tiles are staged in shared memory as bf16 hi/lo (V transposed for the
// B fragments of P·V); rows are padded so that the fragment reads hit 32 distinct banks.
// Keys at slots >= slots (a caller error) read as zeros rather than out of bounds.

#define PF_KT 32  // keys per tile

template <int D>
__device__ __forceinline__ void pf_attend(const float* __restrict__ q, const float* __restrict__ ck,
                                          const float* __restrict__ cv, const float* __restrict__ gl,
                                          const int* __restrict__ pos, float* __restrict__ out,
                                          int rows, int heads, int kv_heads, int window, int ring, int slots) {
    __shared__ __align__(16) __nv_bfloat16 ks[2][PF_KT][D + 8];
    __shared__ __align__(16) __nv_bfloat16 vt[2][D][PF_KT + 8];
    __shared__ int range[2];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, kvh = h / (heads / kv_heads);
    // Later rows see more keys (causal): the last row block starts first.
    const int r0 = (gridDim.x - 1 - blockIdx.x) * 64 + warp * 16;
    const int ra = r0 + g, rb = r0 + g + 8;
    // Visible key ranges of this thread's two rows (empty for rows past the end).
    const int big = 0x7fffffff;
    int lo_a = big, hi_a = -1, lo_b = big, hi_b = -1;
    if (ra < rows) { hi_a = pos[ra]; lo_a = window > 0 ? max(0, hi_a - window + 1) : 0; }
    if (rb < rows) { hi_b = pos[rb]; lo_b = window > 0 ? max(0, hi_b - window + 1) : 0; }
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
    // Q fragments, split, for the whole head dim.
    unsigned qh[D / 16][4], ql[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const int row = (f & 1) ? rb : ra;
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
    for (int kt = kmin; kt <= kmax; kt += PF_KT) {
        __syncthreads();
        for (int e = threadIdx.x; e < PF_KT * D / 4; e += blockDim.x) {
            const int key = e / (D / 4), d = (e % (D / 4)) * 4;
            const int kp = kt + key;
            const long long slot = ring > 0 ? kp % ring : kp;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (kp <= kmax && slot < slots) {
                const size_t at = ((size_t)slot * kv_heads + kvh) * D + d;
                kv = *reinterpret_cast<const float4*>(ck + at);
                vv = *reinterpret_cast<const float4*>(cv + at);
            }
            unsigned h0, l0, h1, l1;
            pf_split2(kv.x, kv.y, h0, l0);
            pf_split2(kv.z, kv.w, h1, l1);
            *reinterpret_cast<uint2*>(&ks[0][key][d]) = make_uint2(h0, h1);
            *reinterpret_cast<uint2*>(&ks[1][key][d]) = make_uint2(l0, l1);
            const float vf[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const __nv_bfloat16 vh = __float2bfloat16_rn(vf[j]);
                vt[0][d + j][key] = vh;
                vt[1][d + j][key] = __float2bfloat16_rn(vf[j] - __bfloat162float(vh));
            }
        }
        __syncthreads();
        if (kt > whi || kt + PF_KT - 1 < wlo) continue;  // no row of this warp sees the tile
        float s[PF_KT / 8][4];
#pragma unroll
        for (int n = 0; n < PF_KT / 8; n++) {
#pragma unroll
            for (int c = 0; c < 4; c++) s[n][c] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const int key = n * 8 + g, d = kk * 16 + 2 * t;
                const unsigned bh0 = *reinterpret_cast<const unsigned*>(&ks[0][key][d]);
                const unsigned bh1 = *reinterpret_cast<const unsigned*>(&ks[0][key][d + 8]);
                const unsigned bl0 = *reinterpret_cast<const unsigned*>(&ks[1][key][d]);
                const unsigned bl1 = *reinterpret_cast<const unsigned*>(&ks[1][key][d + 8]);
                pf_mma(s[n], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], bh0, bh1);
                pf_mma(s[n], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], bl0, bl1);
                pf_mma(s[n], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], bh0, bh1);
            }
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
                const int d = n * 8 + g, key = j * 16 + 2 * t;
                const unsigned bh0 = *reinterpret_cast<const unsigned*>(&vt[0][d][key]);
                const unsigned bh1 = *reinterpret_cast<const unsigned*>(&vt[0][d][key + 8]);
                const unsigned bl0 = *reinterpret_cast<const unsigned*>(&vt[1][d][key]);
                const unsigned bl1 = *reinterpret_cast<const unsigned*>(&vt[1][d][key + 8]);
                pf_mma(o_acc[n], ph[0], ph[1], ph[2], ph[3], bh0, bh1);
                pf_mma(o_acc[n], ph[0], ph[1], ph[2], ph[3], bl0, bl1);
                pf_mma(o_acc[n], pl[0], pl[1], pl[2], pl[3], bh0, bh1);
            }
        }
    }
    // out = gate · O / l.
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = half ? rb : ra;
        if (row >= rows) continue;
        const float l = half ? l_b : l_a;
        const float x = gl[(size_t)row * heads + h];
        const float gate = x > 20.f ? x : log1pf(expf(x));
        const float f = l > 0.f ? gate / l : 0.f;
        float* o = out + ((size_t)row * heads + h) * D;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<float2*>(o + n * 8 + 2 * t) = make_float2(o_acc[n][2 * half] * f, o_acc[n][2 * half + 1] * f);
    }
}

// grid: (ceil(rows / 64), heads), block: 128.
#define PF_ATTEND(DIM)                                                                                        \
    extern "C" __global__ void __launch_bounds__(128) pf_attend_d##DIM(                                      \
        const float* __restrict__ q, const float* __restrict__ ck, const float* __restrict__ cv,             \
        const float* __restrict__ gl, const int* __restrict__ pos, float* __restrict__ out, int rows,        \
        int heads, int kv_heads, int window, int ring, int slots) {                                          \
        pf_attend<DIM>(q, ck, cv, gl, pos, out, rows, heads, kv_heads, window, ring, slots);                 \
    }
PF_ATTEND(32)
PF_ATTEND(64)
PF_ATTEND(128)
