// Mixture of experts: router (RMSNorm + logits + top-k in one launch), NVFP4 expert GEMVs with
// dequantisation in registers (gate and up fused with SiLU·mul, routed and shared experts in one
// launch; down fused with the routing-weight combine, the shared expert and the residual add).
// CPU twins: fastdecode_cpu::layers::{Moe::route, Moe::forward}.

// Top-k of one row's router logits by one warp: selection by sigmoid(logit) + bias with exact
// ties to the lower index; weights are the pre-bias scores of the chosen experts, summed in
// ascending expert order and renormalised when norm_topk. Lane l holds experts l, l + 32, ...
// (E <= 1024); each round is a butterfly arg-max under a total order (value descending, index
// ascending), so every lane agrees and the result is deterministic. `chosen`/`csc`: k shared slots.
__device__ void warp_topk(const float* __restrict__ logits, const float* __restrict__ bias, int E, int k,
                          int norm_topk, float softcap, int* chosen, float* csc, int* __restrict__ ids,
                          float* __restrict__ wts) {
    const int lane = threadIdx.x % WARP;
    float sel[32], sc[32];
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int e = lane + WARP * j;
        sel[j] = NEG_INF;
        sc[j] = 0.f;
        if (e < E) {
            float x = __ldcg(logits + e);
            if (softcap > 0.f) x = softcap * tanhf(x / softcap);
            sc[j] = 1.f / (1.f + expf(-x));
            sel[j] = sc[j] + bias[e];
        }
    }
    for (int round = 0; round < k; round++) {
        float best = NEG_INF;
        int idx = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < 32; j++)
            if (sel[j] > best) { best = sel[j]; idx = lane + WARP * j; }  // ascending: ties keep the lower index
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const int i = __shfl_xor_sync(0xffffffffu, idx, o);
            if (v > best || (v == best && i < idx)) { best = v; idx = i; }
        }
        if (idx >= E) {
            // Only NaN or -inf keys are left: take the lowest unchosen index rather than the
            // sentinel (the forward's output is garbage then anyway, but memory stays in bounds).
            idx = 0;
            for (int u = 0; u < round; u++)
                if (chosen[u] == idx) { idx++; u = -1; }
        }
#pragma unroll
        for (int j = 0; j < 32; j++)
            if (lane + WARP * j == idx) {
                csc[round] = sc[j];
                sel[j] = NEG_INF;
            }
        if (lane == 0) chosen[round] = idx;
        __syncwarp();
    }
    if (lane != 0) return;
    for (int a = 1; a < k; a++) {  // ascending expert order (insertion sort, k <= 64)
        const int c = chosen[a];
        const float s = csc[a];
        int b = a - 1;
        while (b >= 0 && chosen[b] > c) { chosen[b + 1] = chosen[b]; csc[b + 1] = csc[b]; b--; }
        chosen[b + 1] = c;
        csc[b + 1] = s;
    }
    float total = 0.f;
    for (int i = 0; i < k; i++) total += csc[i];
    for (int i = 0; i < k; i++) {
        ids[i] = chosen[i];
        wts[i] = norm_topk ? csc[i] / total : csc[i];
    }
}

// Router of prefill chunks: logits [rows, E] (from a GEMM) -> ids, wts. grid: rows, block: 32.
extern "C" __global__ void router_topk(const float* __restrict__ logits, const float* __restrict__ bias,
                                       int* __restrict__ ids, float* __restrict__ wts, int E, int k, int norm_topk,
                                       float softcap) {
    __shared__ int chosen[64];
    __shared__ float csc[64];
    const size_t r = blockIdx.x;
    warp_topk(logits + r * E, bias, E, k, norm_topk, softcap, chosen, csc, ids + r * k, wts + r * k);
}

// The whole router of up to 16 rows in one launch: xn = RMSNorm(x) (written by block 0 for the
// experts), logits = xn · Wᵀ (one warp per expert, as gemv_bf16), then the last block to finish
// (counted in `counter`, reset afterwards) runs warp_topk for every row.
// grid: ceil(E / 8), block: 256.
extern "C" __global__ void __launch_bounds__(256) router(const float* __restrict__ x,
                                                         const __nv_bfloat16* __restrict__ norm, float eps,
                                                         const __nv_bfloat16* __restrict__ W,
                                                         const float* __restrict__ bias, float* __restrict__ xn,
                                                         float* __restrict__ logits, int* __restrict__ ids,
                                                         float* __restrict__ wts, unsigned int* __restrict__ counter,
                                                         int E, int H, int k, int norm_topk, float softcap, int rows) {
    __shared__ float inv[16], red[8 * 16];
    __shared__ int chosen[8][64];
    __shared__ float csc[8][64];
    __shared__ int is_last;
    block_inv_rms(x, H, rows, eps, inv, red);
    if (rows <= 1) gemv_rows<1>(W, x, norm, inv, logits, E, H, rows, 0);
    else if (rows <= 2) gemv_rows<2>(W, x, norm, inv, logits, E, H, rows, 0);
    else if (rows <= 4) gemv_rows<4>(W, x, norm, inv, logits, E, H, rows, 0);
    else if (rows <= 8) gemv_rows<8>(W, x, norm, inv, logits, E, H, rows, 0);
    else gemv_rows<16>(W, x, norm, inv, logits, E, H, rows, 0);
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < rows * H; i += 256)
            xn[i] = __bfloat162float(norm[i % H]) * (x[i] * inv[i / H]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const int warp = threadIdx.x / WARP;
    for (int r = warp; r < rows; r += 8)
        warp_topk(logits + (size_t)r * E, bias, E, k, norm_topk, softcap, chosen[warp], csc[warp],
                  ids + (size_t)r * k, wts + (size_t)r * k);
    if (threadIdx.x == 0) *counter = 0;
}

// 16-byte code chunks and scale pairs of one NVFP4 row: chunk c covers columns 32c..32c+32.
__device__ __forceinline__ unsigned int scale_pair(const unsigned char* __restrict__ s, int c) {
    return *reinterpret_cast<const unsigned short*>(s + 2 * c);
}

// h[r, s, o] = silu(G_e[o]·xn[r]) · (U_e[o]·xn[r]) for the k routed slots (e = ids[r, s]) and,
// as slot k, the shared expert. One warp per output o; a lane holds up to 4 chunks of each row
// (H <= 4096), all loaded before xn is staged, so the weight reads are in flight at once.
// h: [rows, k + 1, max(I, Is)]. grid: (ceil(max(I, Is) / 8), k + 1, rows), block: 256,
// shared: padded(H) floats.
extern "C" __global__ void __launch_bounds__(256) moe_gate_up(
    const float* __restrict__ xn, const int* __restrict__ ids, const uint4* __restrict__ gc,
    const unsigned char* __restrict__ gs, const uint4* __restrict__ uc, const unsigned char* __restrict__ us,
    const uint4* __restrict__ sgc, const unsigned char* __restrict__ sgs, const uint4* __restrict__ suc,
    const unsigned char* __restrict__ sus, float* __restrict__ h, int H, int I, int Is, int k) {
    extern __shared__ float xs[];
    const int slot = blockIdx.y, r = blockIdx.z;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const bool shared = slot == k;
    const int width = shared ? Is : I, imax = max(I, Is);
    const int o = blockIdx.x * 8 + warp;
    const int C = H / 32;
    uint4 gw[4], uw[4];
    unsigned int gsv[4], usv[4];
    if (o < width) {
        const size_t rowi = shared ? (size_t)o : (size_t)ids[r * k + slot] * I + o;
        const uint4* g = (shared ? sgc : gc) + rowi * C;
        const uint4* u = (shared ? suc : uc) + rowi * C;
        const unsigned char* gsr = (shared ? sgs : gs) + rowi * (H / 16);
        const unsigned char* usr = (shared ? sus : us) + rowi * (H / 16);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = lane + WARP * j;
            if (c < C) {
                gw[j] = load_stream(g + c);
                uw[j] = load_stream(u + c);
                gsv[j] = scale_pair(gsr, c);
                usv[j] = scale_pair(usr, c);
            }
        }
    }
    for (int i = threadIdx.x; i < H; i += 256) xs[padded(i)] = xn[(size_t)r * H + i];
    __syncthreads();
    if (o >= width) return;
    float gv = 0.f, uv = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int c = lane + WARP * j;
        if (c < C) {
            gv += nvfp4_chunk_dot(gw[j], gsv[j], xs + padded(32 * c));
            uv += nvfp4_chunk_dot(uw[j], usv[j], xs + padded(32 * c));
        }
    }
    gv = warp_sum(gv) * NVFP4_UNSCALE;
    uv = warp_sum(uv) * NVFP4_UNSCALE;
    if (lane == 0) h[((size_t)r * (k + 1) + slot) * imax + o] = silu(gv) * uv;
}

// x[r, o] += scaling · Σ_s w[r, s] · (D_e[o]·h[r, s]) + D_shared[o]·h[r, k]: the routed combine in
// ascending expert order, the shared expert and the residual add in one pass. A warp's lanes take
// the (slot, chunk) pairs of its output row round-robin, four loads in flight at a time; the
// per-chunk dots are summed per slot in chunk order by lane `slot`, then combined in slot order.
// grid: (ceil(H / 8), rows), block: 256, shared: (k + 1)·padded(max(I, Is)) + 8·T floats,
// T = k·I/32 + Is/32; k < 32.
extern "C" __global__ void __launch_bounds__(256) moe_down(
    const float* __restrict__ h, const int* __restrict__ ids, const float* __restrict__ wts,
    const uint4* __restrict__ dc, const unsigned char* __restrict__ ds, const uint4* __restrict__ sdc,
    const unsigned char* __restrict__ sds, float* __restrict__ x, int H, int I, int Is, int k, float scaling) {
    extern __shared__ float sm[];
    const int r = blockIdx.y;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int o = blockIdx.x * 8 + warp;
    const int imax = max(I, Is), stride = padded(imax);
    const int C = I / 32, Cs = Is / 32, T = k * C + Cs;
    float* hs = sm;
    float* part = sm + (k + 1) * stride + warp * T;
    for (int i = threadIdx.x; i < (k + 1) * imax; i += 256) {
        const int s = i / imax, j = i % imax;
        if (j < (s == k ? Is : I)) hs[s * stride + padded(j)] = h[(size_t)r * (k + 1) * imax + i];
    }
    __syncthreads();
    if (o >= H) return;
    const int* idr = ids + (size_t)r * k;
    for (int base = lane; base < T; base += 4 * WARP) {
        uint4 w[4];
        unsigned int sv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int idx = base + u * WARP;
            if (idx < T) {
                const bool sh = idx >= k * C;
                const int s = sh ? k : idx / C, c = sh ? idx - k * C : idx % C;
                const size_t row = sh ? (size_t)o : (size_t)idr[s] * H + o;
                w[u] = load_stream((sh ? sdc : dc) + row * (sh ? Cs : C) + c);
                sv[u] = scale_pair((sh ? sds : ds) + row * ((sh ? Is : I) / 16), c);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int idx = base + u * WARP;
            if (idx < T) {
                const bool sh = idx >= k * C;
                const int s = sh ? k : idx / C, c = sh ? idx - k * C : idx % C;
                part[idx] = nvfp4_chunk_dot(w[u], sv[u], hs + s * stride + padded(32 * c));
            }
        }
    }
    __syncwarp();
    float ssum = 0.f;
    if (lane <= k) {
        const int n = lane < k ? C : Cs;
        for (int c = 0; c < n; c++) ssum += part[lane * C + c];
    }
    ssum *= NVFP4_UNSCALE;
    float routed = 0.f;
    for (int s = 0; s < k; s++) routed += wts[(size_t)r * k + s] * __shfl_sync(0xffffffffu, ssum, s);
    const float sh = __shfl_sync(0xffffffffu, ssum, k);
    if (lane == 0) x[(size_t)r * H + o] += scaling * routed + sh;
}
