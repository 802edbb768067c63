// Mixture of experts: the router (logits of the normed input and the top-k selection), NVFP4 expert GEMVs with
// dequantisation in registers (gate and up fused with SiLU·mul, routed and shared experts in one
// launch; down fused with the routing-weight combine, the shared expert and the residual add), in
// f32 FMAs or on the tensor cores (the default: ops.rs `MoeKernel`).
// CPU twins: fastdecode_cpu::layers::{Moe::route, Moe::forward}.

// One warp: lane i < k holds the i-th of the k chosen experts (distinct, in any order). Lists them
// in ascending index into ids[0..k) with their weights: the pre-bias scores sc, renormalised when
// norm_topk by their sum taken in ascending index. picks: 32 ints of the warp's shared scratch.
__device__ __forceinline__ void warp_list_chosen(int mine, int k, int norm_topk, const float* sc, int* picks,
                                                 int* ids, float* wts) {
    const int lane = threadIdx.x % WARP;
    // Its place in ascending order is the count of smaller chosen ids.
    int place = 0;
    for (int j = 0; j < k; j++) place += __shfl_sync(0xffffffffu, mine, j) < mine;
    if (lane < k) picks[place] = mine;
    __syncwarp();
    float total = 0.f;
    for (int j = 0; j < k; j++) total += sc[picks[j]];
    if (lane < k) {
        const float sv = sc[mine];
        ids[place] = mine;
        wts[place] = norm_topk ? sv / total : sv;
    }
    __syncwarp();
}

// One warp: the k experts of one row of router logits. The key of expert e is
// sigmoid(softcap(logit)) + bias[e]; the k largest keys win, ties to the lower index (the order the
// CPU sorts by), found by k rounds of a warp arg-max over the experts not yet chosen (lane l owns
// experts l, l + 32, ...). They are listed in ascending index into ids[0..k) with their weights
// (the pre-bias scores, renormalised over the chosen when norm_topk, summed in ascending order)
// into wts[0..k). key, sc: E floats each and picks: 32 ints of the warp's shared scratch; ids and
// wts may be shared or global. Every thread of the warp must call it. E <= 1024, k < 32.
__device__ __forceinline__ void warp_select_row(const float* __restrict__ logits, const float* __restrict__ bias,
                                                int E, int k, int norm_topk, float softcap, float* key, float* sc,
                                                int* picks, int* ids, float* wts) {
    const int lane = threadIdx.x % WARP;
    // Eight logits per lane are loaded before any is stored: a store to the scratch may alias the
    // next load as far as the compiler knows, which would make them a chain of L2 round trips.
    for (int e0 = 0; e0 < E; e0 += 8 * WARP) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = e0 + lane + i * WARP;
            v[i] = e < E ? __ldcg(logits + e) : 0.f;  // written by other blocks (the step router): skip L1
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = e0 + lane + i * WARP;
            if (e < E) {
                float u = v[i];
                if (softcap > 0.f) u = softcap * tanhf(u / softcap);
                const float sg = 1.f / (1.f + expf(-u));
                sc[e] = sg;
                key[e] = sg + bias[e];
            }
        }
    }
    __syncwarp();
    unsigned int taken = 0;  // bit i: expert lane + 32 i is chosen
    int mine = -1;           // the expert lane i picked in round i
    for (int round = 0; round < k; round++) {
        float best = NEG_INF;
        int bi = 0x7fffffff;
        for (int i = 0, e = lane; e < E; i++, e += WARP) {
            const float v = key[e];
            // e ascends, so only a strictly larger key replaces the best (NaN never does).
            if (!(taken >> i & 1u) && (v > best || (bi == 0x7fffffff && v == best))) {
                best = v;
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const int j = __shfl_xor_sync(0xffffffffu, bi, o);
            if (v > best || (v == best && j < bi)) {
                best = v;
                bi = j;
            }
        }
        if (bi == 0x7fffffff) break;  // only NaN keys left
        if (bi % WARP == lane) taken |= 1u << (bi / WARP);
        if (lane == round) mine = bi;
    }
    const int got = __popc(__ballot_sync(0xffffffffu, mine >= 0));  // rounds that found a winner
    if (got < k) {
        // Only NaN keys were left: fill up with the lowest unchosen experts, so the ids stay in
        // range (the forward's output is garbage then anyway). Lane 0 lists them serially.
        if (lane < got) picks[lane] = mine;
        __syncwarp();
        if (lane == 0) {
            int n = 0, fill = k - got;
            for (int e = 0; e < E && n < k; e++) {
                bool chosen = false;
                for (int j = 0; j < got; j++) chosen |= picks[j] == e;
                if (chosen || fill > 0) ids[n++] = e;
                if (!chosen && fill > 0) fill--;
            }
            float total = 0.f;
            for (int i = 0; i < k; i++) total += sc[ids[i]];
            for (int i = 0; i < k; i++) wts[i] = norm_topk ? sc[ids[i]] / total : sc[ids[i]];
        }
        __syncwarp();
        return;
    }
    // Lane i (< k) holds round i's expert.
    warp_list_chosen(mine, k, norm_topk, sc, picks, ids, wts);
}

// The whole block (exactly 256 threads): the same selection as warp_select_row for one row, with short
// dependency chains. Every warp takes the maximum key of its experts (e = 32 w + lane + 256 j); at
// least one expert of each of the 8 warps reaches the smallest of those maxima M, so when k <= 8
// only experts with key >= M can be among the k best. Those candidates are listed in ascending
// index and each one's rank among them counted (ties to the lower index); the k of rank < k are
// the choice, listed and weighted as warp_select_row does (same sums in the same order, same bits).
// NaN keys (or an empty warp) leave M unusable: then every expert is a candidate, and if fewer
// than k keys are numbers warp 0 falls back to warp_select_row. E <= 1024, k < 32. The 8 µs rank
// count over all E² pairs and the ~5 µs single-warp selection it replaces were measured in the
// decode step's trace (bench --trace).
struct BlockSelect {
    float key[1024], sc[1024], ckey[1024];
    int cand[1024];
    float wmax[8];
    int wcount[8];
    int slot[32];
};

__device__ __forceinline__ void block_select_row(const float* __restrict__ logits, const float* __restrict__ bias,
                                                 int E, int k, int norm_topk, float softcap, BlockSelect& b,
                                                 int* picks, int* ids, float* wts) {
    const int t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    // Keys: every thread's (up to four) logits loaded before any is stored.
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = t + 256 * j < E ? __ldcg(logits + t + 256 * j) : 0.f;
    float mx = NEG_INF;
    bool nan = false;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int e = t + 256 * j;
        if (e < E) {
            float u = v[j];
            if (softcap > 0.f) u = softcap * tanhf(u / softcap);
            const float sg = 1.f / (1.f + expf(-u));
            const float key = sg + bias[e];
            b.sc[e] = sg;
            b.key[e] = key;
            mx = fmaxf(mx, key);
            nan |= key != key;
        }
    }
    mx = warp_max(mx);
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) b.wmax[warp] = nan ? __int_as_float(0x7fc00000) : mx;
    __syncthreads();
    // The bound: the least warp maximum, or -inf (every number a candidate) when it is unusable.
    float M = __int_as_float(0x7f800000);
    bool usable = k <= 8;
#pragma unroll
    for (int w = 0; w < 8; w++) {
        const float m = b.wmax[w];
        usable &= m == m && m != NEG_INF;
        M = fminf(M, m);
    }
    if (!usable) M = NEG_INF;
    // Candidates in ascending index: per 256-expert round, a ballot per warp and the warps' counts.
    int n = 0;
    for (int e0 = 0; e0 < E; e0 += 256) {
        const int e = e0 + t;
        const bool c = e < E && b.key[e] >= M;  // NaN keys never
        const unsigned int m = __ballot_sync(0xffffffffu, c);
        if (lane == 0) b.wcount[warp] = __popc(m);
        __syncthreads();
        int before = n;
        for (int w = 0; w < warp; w++) before += b.wcount[w];
        if (c) {
            const int at = before + __popc(m & ((1u << lane) - 1u));
            b.cand[at] = e;
            b.ckey[at] = b.key[e];
        }
        for (int w = 0; w < 8; w++) n += b.wcount[w];
        __syncthreads();
    }
    if (n < k) {
        // Fewer numbers than k: NaN keys involved; the warp routine fills up as the CPU does.
        if (warp == 0) warp_select_row(logits, bias, E, k, norm_topk, softcap, b.key, b.sc, picks, ids, wts);
        return;
    }
    // Rank among the candidates (the list ascends by index, so an equal key ranks first if earlier).
    for (int i = t; i < n; i += 256) {
        const float ke = b.ckey[i];
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const float kj = b.ckey[j];
            rank += (kj > ke) | ((kj == ke) & (j < i));
        }
        if (rank < k) b.slot[rank] = b.cand[i];
    }
    __syncthreads();
    // Lane i < k of warp 0 holds the expert of rank i.
    if (warp == 0) warp_list_chosen(lane < k ? b.slot[lane] : -1, k, norm_topk, b.sc, picks, ids, wts);
}

// The whole router of a step's rows in one launch, each row on blocks of its own (blockIdx.y): its
// logits = RMSNorm(x)·Wᵀ (the persistent GEMV, one warp per expert row), its xn = RMSNorm(x) for
// the experts (a slice per block, with the very inverse rms the logits used), then the last of
// the row's blocks to finish (counted in counter[row], reset afterwards) selects its experts. A
// row's blocks run the one-row code whatever the launch holds, so every row gets its one-row
// bits. (Multi-row GEMV blocks, one warp per expert row over all rows, and a top-k launch after
// them took 18.2 + 4.5 us per layer of an 8-row verify on 32 blocks, against 6.5 for one row:
// H200, Nsight Compute; docs/decode-experiments.md, "Kept".) grid: (any, rows) (persistent per row), block: 256.
extern "C" __global__ void __launch_bounds__(256) router(
    const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm, float eps,
    const __nv_bfloat16* __restrict__ W, const float* __restrict__ bias, float* __restrict__ xn,
    float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ wts, unsigned int* __restrict__ counter,
    int E, int H, int k, int norm_topk, float softcap) {
    FD_TRACE_KERNEL(4, 0);
    __shared__ float inv[16], red[8 * 16];
    __shared__ float bias_s[1024];
    __shared__ BlockSelect sel;
    __shared__ int picks[32];
    const int r = blockIdx.y;
    x += (size_t)r * H;
    xn += (size_t)r * H;
    logits += (size_t)r * E;
    // The bias is a weight: fetched before the wait, by every block (which one ends last is not
    // known yet).
    for (int e = threadIdx.x; e < E; e += blockDim.x) bias_s[e] = bias[e];
    // A row of up to 4096: the normed row is staged in shared memory once per block (as
    // gemv_bf16_1s does, NormWords), so the GEMV's chunks read neither x nor the norm weight
    // through L1 after the wait. Same values, same sums, same bits as the generic path.
    // Read as float4s by the GEMV: a plain float array is only 4-byte aligned, and when the
    // layout of this kernel's shared variables moved it put xs at an odd word (a
    // misaligned-address fault, found by compute-sanitizer).
    __shared__ __align__(16) float xs[8 * 256 * 2];
    if (H <= 8 * 256 * 2) {
        const NormWords<2> nw = norm_words_load<2>(norm, H);
        gemv_persistent<1>(W, xs, nullptr, inv, logits, E, H, 1, 0, [&] {
            block_inv_rms(x, H, 1, eps, inv, red);
            norm_words_stage<2>(nw, x, inv[0], H, xs);
            __syncthreads();
        });
        FD_MARK(6);
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) xn[i] = xs[i];
    } else {
        gemv_persistent<1>(W, x, norm, inv, logits, E, H, 1, 0, [&] { block_inv_rms(x, H, 1, eps, inv, red); });
        FD_MARK(6);
        // Every block writes a slice of xn (all blocks hold the same inverse rms), so no block's
        // serial loop delays the selection.
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
            xn[i] = __bfloat162float(norm[i]) * (x[i] * inv[0]);
    }
    if (!block_arrives_last(&counter[r], gridDim.x)) return;
    FD_MARK(7);
    block_select_row(logits, bias_s, E, k, norm_topk, softcap, sel, picks, ids + (size_t)r * k, wts + (size_t)r * k);
    FD_MARK(5);
    if (threadIdx.x == 0) counter[r] = 0;
}

// Router of prefill chunks: logits [rows, E] (from a GEMM) -> ids, wts [rows, k], a block per row
// with the decode router's bounded block selection (a warp per row running k arg-max rounds took
// ~5 us a row; the block ~2 us): the same code as the decode router's, so the same bits.
// grid: rows, block: 256. E <= 1024, k < 32.
extern "C" __global__ void __launch_bounds__(256) router_topk(const float* __restrict__ logits,
                                                             const float* __restrict__ bias, int* __restrict__ ids,
                                                             float* __restrict__ wts, int E, int k, int norm_topk,
                                                             float softcap, int rows) {
    __shared__ BlockSelect sel;
    __shared__ int picks[32];
    FD_TRACE_KERNEL(9, 0);
    pdl_wait();
    const int r = blockIdx.x;
    if (r >= rows) return;
    block_select_row(logits + (size_t)r * E, bias, E, k, norm_topk, softcap, sel, picks, ids + (size_t)r * k,
                     wts + (size_t)r * k);
}

// The two scale bytes of 16-byte code chunk c (columns 32c..32c+32) of an NVFP4 row.
__device__ __forceinline__ unsigned int scale_pair(const unsigned char* __restrict__ s, int c) {
    return *reinterpret_cast<const unsigned short*>(s + 2 * c);
}

// 32 activations (one code chunk's worth) into registers: 8 16-byte loads.
__device__ __forceinline__ void load_x32(const float* __restrict__ x, float out[32]) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
        out[4 * i] = v.x;
        out[4 * i + 1] = v.y;
        out[4 * i + 2] = v.z;
        out[4 * i + 3] = v.w;
    }
}

// The expert GEMVs are "transposed": thread t of a block owns code chunk t (32 columns) of the
// rows it streams and keeps that chunk's 32 activations in registers for all of them, so each
// activation is read once per block instead of once per row; a block streams OB consecutive
// rows with all their loads in flight at once. A row's dot is the per-chunk products summed in
// a fixed order (a butterfly within warps, then warps in order), whatever the launch holds.
// Few rows per block keep each thread's serial NVFP4 decoding short: 4 gate/up rows and 8 down
// rows per block took the XS 2.1 decode step from 3.09 to 2.88 ms against 8 and 16 (H200).
#define MOE_OB 4

// h[r, s, o] = silu(G_e[o]·xn[r]) · (U_e[o]·xn[r]) for the k routed slots (e = ids[r, s]) and,
// as slot k, the shared expert. h: [rows, k + 1, max(I, Is)].
// grid: (ceil(max(I, Is) / OB), k + 1, rows), block: 32·ceil(H / 1024) (one thread per chunk).
extern "C" __global__ void __launch_bounds__(128) moe_gate_up(
    const float* __restrict__ xn, const int* __restrict__ ids, const uint4* __restrict__ gc,
    const unsigned char* __restrict__ gs, const uint4* __restrict__ uc, const unsigned char* __restrict__ us,
    const uint4* __restrict__ sgc, const unsigned char* __restrict__ sgs, const uint4* __restrict__ suc,
    const unsigned char* __restrict__ sus, float* __restrict__ h, int H, int I, int Is, int k) {
    FD_TRACE_KERNEL(5, 0);
    __shared__ float wsum[MOE_OB][2][4];  // per warp (block <= 128 threads)
    const int slot = blockIdx.y, r = blockIdx.z, t = threadIdx.x;
    const bool sh = slot == k;
    const int width = sh ? Is : I, imax = max(I, Is), C = H / 32;
    const int o0 = blockIdx.x * MOE_OB;
    if (o0 >= width) {  // the whole block: no barrier is skipped by part of it
        pdl_wait();
        return;
    }
    // The routed slots' expert comes from the router, this kernel's predecessor.
    if (!sh) pdl_wait();
    const size_t row0 = sh ? (size_t)o0 : (size_t)after_wait(ids)[r * k + slot] * I + o0;
    const uint4* g = (sh ? sgc : gc) + row0 * C;
    const uint4* u = (sh ? suc : uc) + row0 * C;
    const unsigned char* gsr = (sh ? sgs : gs) + row0 * (H / 16);
    const unsigned char* usr = (sh ? sus : us) + row0 * (H / 16);
    const bool on = t < C;
    uint4 gw[MOE_OB], uw[MOE_OB];
    unsigned int gsv[MOE_OB], usv[MOE_OB];
#pragma unroll
    for (int q = 0; q < MOE_OB; q++) {
        if (on && o0 + q < width) {
            gw[q] = load_stream(g + (size_t)q * C + t);
            uw[q] = load_stream(u + (size_t)q * C + t);
            gsv[q] = scale_pair(gsr + (size_t)q * (H / 16), t);
            usv[q] = scale_pair(usr + (size_t)q * (H / 16), t);
        }
    }
    if (sh) pdl_wait();  // the shared expert's weights were fetched before the wait
    float xv[32];
    if (on) load_x32(after_wait(xn) + (size_t)r * H + 32 * t, xv);
    FD_MARK(3);
    // Per-chunk dots summed by a butterfly within each warp, then the warps in order.
    const int lane = t % WARP, warp = t / WARP;
#pragma unroll
    for (int q = 0; q < MOE_OB; q++) {
        float gv = 0.f, uv = 0.f;
        if (on && o0 + q < width) {
            gv = nvfp4_chunk_dot(gw[q], gsv[q], xv);
            uv = nvfp4_chunk_dot(uw[q], usv[q], xv);
        }
        if (q == 0) FD_MARK(4);
        gv = warp_sum(gv);
        uv = warp_sum(uv);
        if (lane == 0) {
            wsum[q][0][warp] = gv;
            wsum[q][1][warp] = uv;
        }
    }
    __syncthreads();
    if (t < MOE_OB && o0 + t < width) {
        float gv = 0.f, uv = 0.f;
        for (int w = 0; w < (int)blockDim.x / WARP; w++) {
            gv += wsum[t][0][w];
            uv += wsum[t][1][w];
        }
        gv *= NVFP4_UNSCALE;
        uv *= NVFP4_UNSCALE;
        h[((size_t)r * (k + 1) + slot) * imax + o0 + t] = silu(gv) * uv;
    }
}

// The same h on the tensor cores (`FASTDECODE_MOE=mma2`, the default): a warp owns a
// 16-output tile of gate and of up over a slice of NC·128 input columns, as m16n8k16 f16 products
// with f32 sums. The weights are exact in f16: an NVFP4 code placed in an f16's high byte (value ·
// 2^-14, as nvfp4_word_dot makes it) times its e4m3 block scale · 2^7 is e2m1 · e4m3 · 2^-7 with
// at most five significant bits, far inside f16's range. The activations are exact too, as three
// f16 terms (hi, mid, lo: 33 bits) of the slice scaled by a power of two that puts its largest
// magnitude in [2^14, 2^15), staged once per warp in shared memory; they are the B operand's
// columns 0..2 (columns 3..7 zero), so each product is exact and a row's sums never involve
// another row. Per code: a share of the shift-and-mask words, a byte permute and half an HMUL2
// (about 2 instructions, against about 6 for the f32 kernel's decode, conversion and fma; with
// staging and bookkeeping 5.0 (NC = 2) and 4.0 (NC = 4) per code against 6.25, ptxas for sm_90a).
// Thread (g, t) of a warp (g = lane / 4, t = lane % 4) streams output rows g and g + 8 of the
// tile, 16-byte words u = 4·NC·warp + 4c + t (c < NC) of each; the 8 codes of a 32-bit word feed
// two mma steps, and the k-slots of the fragments map to columns in the order of the f16 pairs
// the decode makes ((0, 4), (1, 5), (2, 6), (3, 7) of each word), which the staged activations
// follow. The warps' sums are added in warp order. Same h as moe_gate_up; grid (ceil(max(I, Is) /
// 16), k + 1, rows), blocks of 32·ceil(H / (128·NC)) <= 256 threads.
#define MMA_WORD_STRIDE 80  // bytes per staged 16-byte word (64 + 16 of padding)
// Bytes per staged term of a warp's NC·4 words: ≡ 64 (mod 128), so the B loads of a quarter warp
// (terms 0 and 1, four words each) hit eight distinct 16-byte bank groups.
#define MMA_TERM_STRIDE(NC) (4 * (NC) * MMA_WORD_STRIDE + ((4 * (NC) * MMA_WORD_STRIDE) % 128 == 0 ? 64 : 0))

// The f16 pairs (codes (0, 4), (1, 5), (2, 6), (3, 7)) of a word times the pair's scale, exact.
__device__ __forceinline__ void nvfp4_word_pairs(unsigned int word, unsigned int s2, unsigned int out[4]) {
    const unsigned int ev = ((word << 4) & 0x80808080u) | ((word << 1) & 0x0e0e0e0eu);
    const unsigned int od = (word & 0x80808080u) | ((word >> 3) & 0x0e0e0e0eu);
    const unsigned int hb[4] = {__byte_perm(ev, 0, 0x2404), __byte_perm(od, 0, 0x2404), __byte_perm(ev, 0, 0x3414),
                                __byte_perm(od, 0, 0x3414)};
    const __half2 s = *reinterpret_cast<const __half2*>(&s2);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&hb[j]), s);
        out[j] = *reinterpret_cast<const unsigned int*>(&v);
    }
}

// A word's two block scales (bytes 0, 1 of s01) as f16 pairs (s0, s0) and (s1, s1), times 2^7.
__device__ __forceinline__ void e4m3_pair_x128(unsigned int s01, unsigned int& s00, unsigned int& s11) {
    unsigned int f;
    asm("{.reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t;}" : "=r"(f) : "r"(s01));
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&f), __float2half2_rn(128.f));
    const unsigned int w = *reinterpret_cast<const unsigned int*>(&v);
    s00 = __byte_perm(w, 0, 0x1010);
    s11 = __byte_perm(w, 0, 0x3232);
}

// One warp: its slice's 4·NC activations per lane (lane l: columns 4·NC·l ..) scaled by the power of
// two that puts the slice's largest magnitude in [2^14, 2^15), split into three exact f16 terms
// (hi, mid, lo) and staged in shared memory in the operands' pair order; returns the power of two
// that turns a sum of (weight pairs · 2^-7) · (terms) back into the dot.
template <int NC>
__device__ __forceinline__ float mma_stage_terms(const float* v, unsigned char* xs) {
    const int lane = threadIdx.x % WARP;
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 4 * NC; j++) m = fmaxf(m, fabsf(v[j]));
    m = warp_max(m);
    // The slice's binary exponent e (clamped so both powers below are normal floats).
    const int e = min(127, max(-100, (int)((__float_as_uint(m) >> 23) & 0xffu) - 127));
    const float up_s = __uint_as_float((unsigned int)(127 + 14 - e) << 23);
    {
        // The lane's 8-column groups w: f16 terms in pair order 0, 4, 1, 5, 2, 6, 3, 7.
#pragma unroll
        for (int w = 0; w < NC / 2; w++) {
            __half hi[8], mid[8], lo[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int src = 8 * w + (j % 2 == 0 ? j / 2 : j / 2 + 4);
                const float a = v[src] * up_s;
                hi[j] = __float2half_rn(a);
                const float r1 = a - __half2float(hi[j]);
                mid[j] = __float2half_rn(r1);
                lo[j] = __float2half_rn(r1 - __half2float(mid[j]));
            }
            const int q8 = NC / 2 * lane + w;  // the slice's 8-column group
            const int off = q8 / 4 * MMA_WORD_STRIDE + 16 * (q8 % 4);
            *reinterpret_cast<uint4*>(xs + off) = *reinterpret_cast<const uint4*>(hi);
            *reinterpret_cast<uint4*>(xs + MMA_TERM_STRIDE(NC) + off) = *reinterpret_cast<const uint4*>(mid);
            *reinterpret_cast<uint4*>(xs + 2 * MMA_TERM_STRIDE(NC) + off) = *reinterpret_cast<const uint4*>(lo);
        }
    }
    __syncwarp();
    return __uint_as_float((unsigned int)(127 + e - 7) << 23);
}

template <int NC>
__device__ __forceinline__ void moe_gate_up_mma_body(
    const float* __restrict__ xn, const int* __restrict__ ids, const uint4* __restrict__ gc,
    const unsigned char* __restrict__ gs, const uint4* __restrict__ uc, const unsigned char* __restrict__ us,
    const uint4* __restrict__ sgc, const unsigned char* __restrict__ sgs, const uint4* __restrict__ suc,
    const unsigned char* __restrict__ sus, float* __restrict__ h, int H, int I, int Is, int k) {
    FD_TRACE_KERNEL(5, 1);
    __shared__ __align__(16) unsigned char xs_all[8][3 * MMA_TERM_STRIDE(NC)];
    __shared__ float red[8][16][2];
    const int slot = blockIdx.y, r = blockIdx.z;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
    const bool sh = slot == k;
    const int width = sh ? Is : I, imax = max(I, Is), C = H / 32, HS = H / 16;
    const int o0 = blockIdx.x * 16;
    if (o0 >= width) {  // the whole block: no barrier is skipped by part of it
        pdl_wait();
        return;
    }
    if (!sh) pdl_wait();
    const size_t base = sh ? 0 : (size_t)after_wait(ids)[r * k + slot] * I;
    const uint4* gp = sh ? sgc : gc;
    const uint4* up = sh ? suc : uc;
    const unsigned char* gsp = sh ? sgs : gs;
    const unsigned char* usp = sh ? sus : us;
    uint4 gw[2][NC], uw[2][NC];
    unsigned int gsv[2][NC], usv[2][NC];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int o = o0 + g + 8 * hh;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int u = 4 * NC * warp + 4 * c + t;
            gw[hh][c] = uw[hh][c] = make_uint4(0, 0, 0, 0);
            gsv[hh][c] = usv[hh][c] = 0;
            if (o < width && u < C) {
                const size_t row = base + o;
                gw[hh][c] = load_stream(gp + row * C + u);
                uw[hh][c] = load_stream(up + row * C + u);
                gsv[hh][c] = scale_pair(gsp + row * HS, u);
                usv[hh][c] = scale_pair(usp + row * HS, u);
            }
        }
    }
    if (sh) pdl_wait();  // the shared expert's weights were fetched before the wait
    // Stage this warp's slice: lane l takes its 4·NC columns from 4·NC·l.
    unsigned char* xs = xs_all[warp];
    const int col0 = (128 * NC) * warp + 4 * NC * lane;
    float v[4 * NC];
    {
        const float* xr = after_wait(xn) + (size_t)r * H;
#pragma unroll
        for (int q = 0; q < NC; q++) {
            const float4 a = col0 + 4 * q < H ? *reinterpret_cast<const float4*>(xr + col0 + 4 * q)
                                              : make_float4(0.f, 0.f, 0.f, 0.f);
            v[4 * q] = a.x;
            v[4 * q + 1] = a.y;
            v[4 * q + 2] = a.z;
            v[4 * q + 3] = a.w;
        }
    }
    const float down_s = mma_stage_terms<NC>(v, xs);
    FD_MARK(3);
    // Two accumulators per matrix (the word's first and second mma step) halve the chains.
    float ga[4] = {0.f, 0.f, 0.f, 0.f}, gb[4] = {0.f, 0.f, 0.f, 0.f};
    float ua[4] = {0.f, 0.f, 0.f, 0.f}, ub[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < NC; c++) {
        unsigned int gs0[2], gs1[2], us0[2], us1[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            e4m3_pair_x128(gsv[hh][c], gs0[hh], gs1[hh]);
            e4m3_pair_x128(usv[hh][c], us0[hh], us1[hh]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 b = make_uint4(0, 0, 0, 0);
            if (g < 3)
                b = *reinterpret_cast<const uint4*>(xs + g * MMA_TERM_STRIDE(NC) + (4 * c + t) * MMA_WORD_STRIDE + 16 * i);
            unsigned int pa[4], pb[4];
            const unsigned int* gwa = reinterpret_cast<const unsigned int*>(&gw[0][c]);
            const unsigned int* gwb = reinterpret_cast<const unsigned int*>(&gw[1][c]);
            nvfp4_word_pairs(gwa[i], i < 2 ? gs0[0] : gs1[0], pa);
            nvfp4_word_pairs(gwb[i], i < 2 ? gs0[1] : gs1[1], pb);
            mma_f16(ga, pa[0], pb[0], pa[1], pb[1], b.x, b.y);
            mma_f16(gb, pa[2], pb[2], pa[3], pb[3], b.z, b.w);
            const unsigned int* uwa = reinterpret_cast<const unsigned int*>(&uw[0][c]);
            const unsigned int* uwb = reinterpret_cast<const unsigned int*>(&uw[1][c]);
            nvfp4_word_pairs(uwa[i], i < 2 ? us0[0] : us1[0], pa);
            nvfp4_word_pairs(uwb[i], i < 2 ? us0[1] : us1[1], pb);
            mma_f16(ua, pa[0], pb[0], pa[1], pb[1], b.x, b.y);
            mma_f16(ub, pa[2], pb[2], pa[3], pb[3], b.z, b.w);
        }
    }
    FD_MARK(4);
    // Columns 2t, 2t + 1 of rows g, g + 8: lane t = 0 holds the hi and mid sums, lane t = 1 the lo.
    float tot[2][2];  // [row g / g + 8][gate / up]
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const float gp0 = ga[2 * hh] + gb[2 * hh], gp1 = ga[2 * hh + 1] + gb[2 * hh + 1];
        const float up0 = ua[2 * hh] + ub[2 * hh], up1 = ua[2 * hh + 1] + ub[2 * hh + 1];
        const float glo = __shfl_down_sync(0xffffffffu, gp0, 1);
        const float ulo = __shfl_down_sync(0xffffffffu, up0, 1);
        tot[hh][0] = ((gp0 + gp1) + glo) * down_s;
        tot[hh][1] = ((up0 + up1) + ulo) * down_s;
    }
    if (t == 0) {
        red[warp][g][0] = tot[0][0];
        red[warp][g][1] = tot[0][1];
        red[warp][g + 8][0] = tot[1][0];
        red[warp][g + 8][1] = tot[1][1];
    }
    __syncthreads();
    if (threadIdx.x < 16 && o0 + threadIdx.x < width) {
        float gv = 0.f, uv = 0.f;
        for (int w = 0; w < (int)blockDim.x / WARP; w++) {
            gv += red[w][threadIdx.x][0];
            uv += red[w][threadIdx.x][1];
        }
        h[((size_t)r * (k + 1) + slot) * imax + o0 + threadIdx.x] = silu(gv) * uv;
    }
}

// NC = 2 chunks of 128 columns per warp (widths up to 2048 in blocks of at most 8 warps). NC = 4
// (widths up to 4096, half the warps, twice the chain each) served the serial step 1.5 % faster
// and the verify slower; the verify is what the DFlash track ranks (docs/decode-experiments.md).
#define MOE_GATE_UP_MMA_ARGS                                                                                  \
    const float *__restrict__ xn, const int *__restrict__ ids, const uint4 *__restrict__ gc,                  \
        const unsigned char *__restrict__ gs, const uint4 *__restrict__ uc, const unsigned char *__restrict__ us, \
        const uint4 *__restrict__ sgc, const unsigned char *__restrict__ sgs, const uint4 *__restrict__ suc,  \
        const unsigned char *__restrict__ sus, float *__restrict__ h, int H, int I, int Is, int k
extern "C" __global__ void __launch_bounds__(256) moe_gate_up_mma2(MOE_GATE_UP_MMA_ARGS) {
    moe_gate_up_mma_body<2>(xn, ids, gc, gs, uc, us, sgc, sgs, suc, sus, h, H, I, Is, k);
}


#define DOWN_OB 8

// x[r, o] += scaling · Σ_s w[r, s] · (D_e[o]·h[r, s]) + D_shared[o]·h[r, k]: the routed combine in
// ascending expert order, the shared expert and the residual add in one pass. Thread t owns
// chunk t of the T = k·I/32 + Is/32 (slot, chunk) pairs of an output row: slot t / (I/32) (the
// shared expert's chunks last). Per output, the chunk dots are summed per slot in chunk order,
// then combined in slot order. grid: (ceil(H / OB), rows), block: 32·ceil(T / 32) <= 256.
extern "C" __global__ void __launch_bounds__(256) moe_down(
    const float* __restrict__ h, const int* __restrict__ ids, const float* __restrict__ wts,
    const uint4* __restrict__ dc, const unsigned char* __restrict__ ds, const uint4* __restrict__ sdc,
    const unsigned char* __restrict__ sds, float* __restrict__ x, int H, int I, int Is, int k, float scaling) {
    FD_TRACE_KERNEL(6, 0);
    __shared__ float part[DOWN_OB][256];
    __shared__ float slot_sum[DOWN_OB][33];
    const int r = blockIdx.y, t = threadIdx.x;
    const int imax = max(I, Is);
    const int C = I / 32, Cs = Is / 32, T = k * C + Cs;
    const int o0 = blockIdx.x * DOWN_OB;
    const bool on = t < T;
    const bool sh = t >= k * C;
    const int s = sh ? k : t / max(C, 1), c = sh ? t - k * C : t % max(C, 1);
    const int cw = sh ? Cs : C;
    size_t row0 = 0;
    if (on) row0 = sh ? (size_t)o0 : (size_t)ids[(size_t)r * k + s] * H + o0;
    const uint4* wp = (sh ? sdc : dc) + row0 * cw + c;
    const unsigned char* sp = (sh ? sds : ds) + row0 * (cw * 2);
    uint4 w[DOWN_OB];
    unsigned int sv[DOWN_OB];
#pragma unroll
    for (int q = 0; q < DOWN_OB; q++) {
        if (on && o0 + q < H) {
            w[q] = load_stream(wp + (size_t)q * cw);
            sv[q] = scale_pair(sp + (size_t)q * (cw * 2), c);
        }
    }
    // The ids and routing weights (the router's, two kernels back) and the expert weights are
    // read before the wait; h is the predecessor's.
    __shared__ float w_slot[32];
    if (t < k) w_slot[t] = wts[(size_t)r * k + t];
    pdl_wait();
    // The residual this block adds to, read now so that the round trip overlaps the dots.
    const float x_old = t < DOWN_OB && o0 + t < H ? x[(size_t)r * H + o0 + t] : 0.f;
    float xv[32];
    if (on) load_x32(after_wait(h) + ((size_t)r * (k + 1) + s) * imax + 32 * c, xv);
#pragma unroll
    for (int q = 0; q < DOWN_OB; q++)
        if (on && o0 + q < H) part[q][t] = nvfp4_chunk_dot(w[q], sv[q], xv);
    FD_MARK(3);
    __syncthreads();
    // Per (output, slot): the slot's chunks in order.
    for (int i = t; i < DOWN_OB * (k + 1); i += blockDim.x) {
        const int q = i / (k + 1), sl = i % (k + 1);
        if (o0 + q < H) {
            const int n = sl < k ? C : Cs;
            float acc = 0.f;
            for (int j = 0; j < n; j++) acc += part[q][sl * C + j];
            slot_sum[q][sl] = acc * NVFP4_UNSCALE;
        }
    }
    __syncthreads();
    if (t < DOWN_OB && o0 + t < H) {
        float routed = 0.f;
        for (int sl = 0; sl < k; sl++) routed += w_slot[sl] * slot_sum[t][sl];
        x[(size_t)r * H + o0 + t] = x_old + (scaling * routed + slot_sum[t][k]);
    }
}

// The down GEMV and combine of moe_down on the tensor cores (the default; not with `FASTDECODE_MOE=f32`), with
// moe_gate_up_mma's operands: warp (slot, slice) of a block (16-output tile, row) takes output
// rows g, g + 8 of the tile over NC chunks of 128 columns of its slot's h (staged as three f16
// terms); the slices' sums are added in order per slot, then combined as moe_down does: the routed
// slots weighted in ascending slot order, scaled, the shared expert and the residual added.
// block: 32·(k + 1)·S <= 320 threads, S = ceil(max(I, Is) / (128·NC)) slices per slot. Only NC = 4
// is instantiated: with 2 a thread's fixed work (staging, the combine) outweighed its halved
// decoding (984 instructions for 128 codes against 1448 for 256, ptxas for sm_90a).
template <int NC>
__device__ __forceinline__ void moe_down_mma_body(const float* __restrict__ h, const int* __restrict__ ids,
                                                  const float* __restrict__ wts, const uint4* __restrict__ dc,
                                                  const unsigned char* __restrict__ ds,
                                                  const uint4* __restrict__ sdc,
                                                  const unsigned char* __restrict__ sds, float* __restrict__ x,
                                                  int H, int I, int Is, int k, float scaling) {
    FD_TRACE_KERNEL(6, 1);
    constexpr int MAXW = 10;  // warps per block at most (the launch bound)
    __shared__ __align__(16) unsigned char xs_all[MAXW][3 * MMA_TERM_STRIDE(NC)];
    __shared__ float red[MAXW][16];
    __shared__ float w_slot[32];
    const int r = blockIdx.y;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
    const int imax = max(I, Is), S = (imax + 128 * NC - 1) / (128 * NC);
    const int s = warp / S, slice = warp % S;
    const bool sh = s == k;
    const int width = sh ? Is : I, C = width / 32, HS = width / 16;
    const int o0 = blockIdx.x * 16;
    // The ids and routing weights (the router's, two kernels back) and the expert weights are
    // read before the wait; h is the predecessor's.
    const size_t base = sh ? 0 : (size_t)ids[(size_t)r * k + s] * H;
    const uint4* wp = sh ? sdc : dc;
    const unsigned char* sp = sh ? sds : ds;
    uint4 cw[2][NC];
    unsigned int sv[2][NC];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int o = o0 + g + 8 * hh;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int u = 4 * NC * slice + 4 * c + t;
            cw[hh][c] = make_uint4(0, 0, 0, 0);
            sv[hh][c] = 0;
            if (o < H && u < C) {
                const size_t row = base + o;
                cw[hh][c] = load_stream(wp + row * C + u);
                sv[hh][c] = scale_pair(sp + row * HS, u);
            }
        }
    }
    if (threadIdx.x < k) w_slot[threadIdx.x] = wts[(size_t)r * k + threadIdx.x];
    pdl_wait();
    const float x_old = threadIdx.x < 16 && o0 + threadIdx.x < H ? x[(size_t)r * H + o0 + threadIdx.x] : 0.f;
    unsigned char* xs = xs_all[warp];
    const int col0 = 128 * NC * slice + 4 * NC * lane;
    float v[4 * NC];
    {
        const float* hr = after_wait(h) + ((size_t)r * (k + 1) + s) * imax;
#pragma unroll
        for (int q = 0; q < NC; q++) {
            const float4 a = col0 + 4 * q < width ? *reinterpret_cast<const float4*>(hr + col0 + 4 * q)
                                                  : make_float4(0.f, 0.f, 0.f, 0.f);
            v[4 * q] = a.x;
            v[4 * q + 1] = a.y;
            v[4 * q + 2] = a.z;
            v[4 * q + 3] = a.w;
        }
    }
    const float down_s = mma_stage_terms<NC>(v, xs);
    FD_MARK(3);
    float da[4] = {0.f, 0.f, 0.f, 0.f}, db[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < NC; c++) {
        unsigned int s0[2], s1[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) e4m3_pair_x128(sv[hh][c], s0[hh], s1[hh]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 b = make_uint4(0, 0, 0, 0);
            if (g < 3)
                b = *reinterpret_cast<const uint4*>(xs + g * MMA_TERM_STRIDE(NC) + (4 * c + t) * MMA_WORD_STRIDE +
                                                    16 * i);
            unsigned int pa[4], pb[4];
            nvfp4_word_pairs(reinterpret_cast<const unsigned int*>(&cw[0][c])[i], i < 2 ? s0[0] : s1[0], pa);
            nvfp4_word_pairs(reinterpret_cast<const unsigned int*>(&cw[1][c])[i], i < 2 ? s0[1] : s1[1], pb);
            mma_f16(da, pa[0], pb[0], pa[1], pb[1], b.x, b.y);
            mma_f16(db, pa[2], pb[2], pa[3], pb[3], b.z, b.w);
        }
    }
    FD_MARK(4);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const float p0 = da[2 * hh] + db[2 * hh], p1 = da[2 * hh + 1] + db[2 * hh + 1];
        const float lo = __shfl_down_sync(0xffffffffu, p0, 1);
        if (t == 0) red[warp][g + 8 * hh] = ((p0 + p1) + lo) * down_s;
    }
    __syncthreads();
    if (threadIdx.x < 16 && o0 + threadIdx.x < H) {
        const int q = threadIdx.x;
        float routed = 0.f, shared = 0.f;
        for (int sl = 0; sl <= k; sl++) {
            float acc = 0.f;
            for (int j = 0; j < S; j++) acc += red[sl * S + j][q];
            if (sl < k)
                routed += w_slot[sl] * acc;
            else
                shared = acc;
        }
        x[(size_t)r * H + o0 + q] = x_old + (scaling * routed + shared);
    }
}

#define MOE_DOWN_MMA_ARGS                                                                                         \
    const float *__restrict__ h, const int *__restrict__ ids, const float *__restrict__ wts,                      \
        const uint4 *__restrict__ dc, const unsigned char *__restrict__ ds, const uint4 *__restrict__ sdc,        \
        const unsigned char *__restrict__ sds, float *__restrict__ x, int H, int I, int Is, int k, float scaling
extern "C" __global__ void __launch_bounds__(320) moe_down_mma4(MOE_DOWN_MMA_ARGS) {
    moe_down_mma_body<4>(h, ids, wts, dc, ds, sdc, sds, x, H, I, Is, k, scaling);
}
