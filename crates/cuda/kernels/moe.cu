// Mixture of experts: the router (logits of the normed input and the top-k selection), NVFP4 expert GEMVs with
// dequantisation in registers (gate and up fused with SiLU·mul, routed and shared experts in one
// launch; down fused with the routing-weight combine, the shared expert and the residual add).
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

#ifndef FD_ROUTER_G
#define FD_ROUTER_G 1
#endif
// The whole router of up to R rows in one launch: logits = RMSNorm(x)·Wᵀ (the persistent GEMV,
// one warp per expert row), xn = RMSNorm(x) for the experts (a slice per block, with the very
// inverse rms the logits used), then the last block to finish (counted in `counter`, reset afterwards)
// selects every row's experts. One entry point per R, as gemv_bf16. grid: any (persistent),
// block: 256.
template <int R>
__device__ __forceinline__ void router_body(const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm,
                                            float eps, const __nv_bfloat16* __restrict__ W,
                                            const float* __restrict__ bias, float* __restrict__ xn,
                                            float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ wts,
                                            unsigned int* __restrict__ counter, int E, int H, int k, int norm_topk,
                                            float softcap, int rows) {
    __shared__ float inv[16], red[8 * 16];
    __shared__ float bias_s[1024];
    __shared__ BlockSelect sel;
    __shared__ int picks[32];
    // The bias is a weight: fetched before the wait, by every block (which one ends last is not
    // known yet).
    for (int e = threadIdx.x; e < E; e += blockDim.x) bias_s[e] = bias[e];
    bool staged = false;
    if constexpr (R == 1) {
        // One row of up to 4096: the normed row is staged in shared memory once per block (as
        // gemv_bf16_1s does, NormWords), so the GEMV's chunks read neither x nor the norm weight
        // through L1 after the wait. Same values, same sums, same bits as the generic path.
        // Read as float4s by the GEMV: a plain float array is only 4-byte aligned, and when
        // the layout of this kernel's shared variables moved it put xs at an odd word (a
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
            staged = true;
        }
    }
    if (!staged) {
        // One expert row per warp: the router's few rows (E) would leave most warps idle in
        // groups, and its 1 MB of weights is no L1 burden.
        gemv_rows<R, FD_ROUTER_G>(W, x, norm, inv, logits, E, H, rows, 0,
                                  [&] { block_inv_rms(x, H, rows, eps, inv, red); });
        FD_MARK(6);
        // Every block writes a slice of xn (all blocks hold the same inverse rms), so no block's
        // serial loop delays the selection.
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * H; i += gridDim.x * blockDim.x)
            xn[i] = __bfloat162float(norm[i % H]) * (x[i] * inv[i / H]);
    }
    // Several rows: router_topk selects them, a block per row in parallel (ops.rs launches it
    // next); here the last block's row-by-row selection cost ~2 us a row (1.30 ms of an 8-row
    // verify against 0.39 for one row, H200 bench --profile).
    if constexpr (R > 1) return;
    if (!block_arrives_last(counter, gridDim.x)) return;
    FD_MARK(7);
    // The last block selects, row by row.
    for (int r = 0; r < rows; r++) {
        block_select_row(logits + (size_t)r * E, bias_s, E, k, norm_topk, softcap, sel, picks, ids + (size_t)r * k,
                         wts + (size_t)r * k);
        __syncthreads();
    }
    FD_MARK(5);
    if (threadIdx.x == 0) *counter = 0;
}

#define ROUTER_ENTRY(R)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) router_##R(                                           \
        const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm, float eps,                     \
        const __nv_bfloat16* __restrict__ W, const float* __restrict__ bias, float* __restrict__ xn,        \
        float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ wts,                         \
        unsigned int* __restrict__ counter, int E, int H, int k, int norm_topk, float softcap, int rows) {  \
        FD_TRACE_KERNEL(4, 0);                                                                              \
        router_body<R>(x, norm, eps, W, bias, xn, logits, ids, wts, counter, E, H, k, norm_topk, softcap, rows); \
    }
ROUTER_ENTRY(1)
ROUTER_ENTRY(2)
ROUTER_ENTRY(4)
ROUTER_ENTRY(8)
ROUTER_ENTRY(16)

// Router of prefill chunks and of multi-row steps: logits [rows, E] (from a GEMM, or router_R)
// -> ids, wts [rows, k], a block per row with the decode router's bounded block selection (a warp
// per row running k arg-max rounds took ~5 us a row; the block ~2 us): the same code as the
// one-row router's, so the same bits. grid: rows, block: 256. E <= 1024, k < 32.
extern "C" __global__ void __launch_bounds__(256) router_topk(const float* __restrict__ logits,
                                                             const float* __restrict__ bias, int* __restrict__ ids,
                                                             float* __restrict__ wts, int E, int k, int norm_topk,
                                                             float softcap, int rows) {
    __shared__ BlockSelect sel;
    __shared__ int picks[32];
    FD_TRACE_KERNEL(9, 0);
    pdl_wait();  // in a step, the logits are router_R's
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
