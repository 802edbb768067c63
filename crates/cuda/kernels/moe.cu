// Mixture of experts: router selection (top-k of the logits, and the normed input), NVFP4 expert GEMVs with
// dequantisation in registers (gate and up fused with SiLU·mul, routed and shared experts in one
// launch; down fused with the routing-weight combine, the shared expert and the residual add).
// CPU twins: fastdecode_cpu::layers::{Moe::route, Moe::forward}.

// The router's second half for up to 16 rows (the logits come from gemv_bf16 with the same
// RMSNorm fused): xn = RMSNorm(x) for the experts, with the very inverse rms the logits used, and
// the top-k of every row. Selection by rank, all experts at once: expert e is chosen when fewer
// than k experts beat it (a larger key, or an equal key at a lower index), the order the CPU
// sorts by. The chosen are then listed in ascending index and weighted by their pre-bias
// scores, summed in that order (renormalised when norm_topk). E <= 1024, k <= 64.
// grid: 1, block: 256.
__device__ __forceinline__ void select_experts(const float* __restrict__ logits, const float* __restrict__ bias,
                                               int* __restrict__ ids, float* __restrict__ wts, int E, int k,
                                               int norm_topk, float softcap, int rows) {
    __shared__ float key[1024], sc[1024];
    __shared__ int chosen[1024];
    __shared__ int count[WARP];
    const int t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    for (int r = 0; r < rows; r++) {
        for (int e = t; e < E; e += 256) {
            float v = logits[(size_t)r * E + e];
            if (softcap > 0.f) v = softcap * tanhf(v / softcap);
            sc[e] = 1.f / (1.f + expf(-v));
            key[e] = sc[e] + bias[e];
        }
        __syncthreads();
        for (int e = t; e < E; e += 256) {
            const float ke = key[e];
            int rank = 0;
            for (int j = 0; j < E; j++) {
                const float kj = key[j];
                rank += (kj > ke) || (kj == ke && j < e);
            }
            chosen[e] = rank < k;
        }
        __syncthreads();
        // List the chosen in ascending index: warp 0, lane l counting experts l·E/32 ... in
        // order, then an exclusive prefix over lanes.
        if (warp == 0) {
            const int per = (E + WARP - 1) / WARP, lo = lane * per, hi = min(E, lo + per);
            int c = 0;
            for (int e = lo; e < hi; e++) c += chosen[e];
            count[lane] = c;
            __syncwarp();
            int at = 0;
            for (int l = 0; l < lane; l++) at += count[l];
            __syncwarp();
            for (int e = lo; e < hi; e++)
                if (chosen[e] && at < k) ids[(size_t)r * k + at++] = e;
            __syncwarp();
            if (lane == 0) {
                // NaN keys rank nowhere: fill up with the lowest unchosen experts, so the ids
                // stay in range (the forward's output is garbage then anyway).
                int n = 0;
                for (int l = 0; l < WARP; l++) n += count[l];
                for (int e = 0; n < k && e < E; e++)
                    if (!chosen[e]) ids[(size_t)r * k + n++] = e;
                float total = 0.f;
                for (int i = 0; i < k; i++) total += sc[ids[(size_t)r * k + i]];
                for (int i = 0; i < k; i++) {
                    const float s = sc[ids[(size_t)r * k + i]];
                    wts[(size_t)r * k + i] = norm_topk ? s / total : s;
                }
            }
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(256) router_select(
    const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm, float eps, const float* __restrict__ logits,
    const float* __restrict__ bias, float* __restrict__ xn, int* __restrict__ ids, float* __restrict__ wts, int E,
    int H, int k, int norm_topk, float softcap, int rows) {
    __shared__ float inv[16], red[8 * 16];
    block_inv_rms(x, H, rows, eps, inv, red);
    for (int i = threadIdx.x; i < rows * H; i += 256)
        xn[i] = __bfloat162float(norm[i % H]) * (x[i] * inv[i / H]);
    select_experts(logits, bias, ids, wts, E, k, norm_topk, softcap, rows);
}

// Router of prefill chunks: logits [rows, E] (from a GEMM) -> ids, wts, with router_select's
// selection (no normed input). grid: rows, block: 256.
extern "C" __global__ void __launch_bounds__(256) router_topk(const float* __restrict__ logits,
                                                              const float* __restrict__ bias, int* __restrict__ ids,
                                                              float* __restrict__ wts, int E, int k, int norm_topk,
                                                              float softcap) {
    select_experts(logits + (size_t)blockIdx.x * E, bias, ids + (size_t)blockIdx.x * k, wts + (size_t)blockIdx.x * k,
                   E, k, norm_topk, softcap, 1);
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
// chunk order (a fixed butterfly within warps, then warps in order), whatever the launch holds.
#define MOE_OB 8

// h[r, s, o] = silu(G_e[o]·xn[r]) · (U_e[o]·xn[r]) for the k routed slots (e = ids[r, s]) and,
// as slot k, the shared expert. h: [rows, k + 1, max(I, Is)].
// grid: (ceil(max(I, Is) / OB), k + 1, rows), block: 32·ceil(H / 1024) (one thread per chunk).
extern "C" __global__ void __launch_bounds__(128) moe_gate_up(
    const float* __restrict__ xn, const int* __restrict__ ids, const uint4* __restrict__ gc,
    const unsigned char* __restrict__ gs, const uint4* __restrict__ uc, const unsigned char* __restrict__ us,
    const uint4* __restrict__ sgc, const unsigned char* __restrict__ sgs, const uint4* __restrict__ suc,
    const unsigned char* __restrict__ sus, float* __restrict__ h, int H, int I, int Is, int k) {
    __shared__ float red[4][MOE_OB][2];
    const int slot = blockIdx.y, r = blockIdx.z, t = threadIdx.x;
    const int lane = t % WARP, warp = t / WARP, nwarps = blockDim.x / WARP;
    const bool sh = slot == k;
    const int width = sh ? Is : I, imax = max(I, Is), C = H / 32;
    const int o0 = blockIdx.x * MOE_OB;
    if (o0 >= width) return;  // the whole block: no barrier is skipped by part of it
    const size_t row0 = sh ? (size_t)o0 : (size_t)ids[r * k + slot] * I + o0;
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
    float xv[32];
    if (on) load_x32(xn + (size_t)r * H + 32 * t, xv);
#pragma unroll
    for (int q = 0; q < MOE_OB; q++) {
        float gp = 0.f, up = 0.f;
        if (on && o0 + q < width) {
            gp = nvfp4_chunk_dot(gw[q], gsv[q], xv);
            up = nvfp4_chunk_dot(uw[q], usv[q], xv);
        }
        gp = warp_sum(gp);
        up = warp_sum(up);
        if (lane == 0) {
            red[warp][q][0] = gp;
            red[warp][q][1] = up;
        }
    }
    __syncthreads();
    if (t < MOE_OB && o0 + t < width) {
        float gv = 0.f, uv = 0.f;
        for (int w = 0; w < nwarps; w++) {
            gv += red[w][t][0];
            uv += red[w][t][1];
        }
        gv *= NVFP4_UNSCALE;
        uv *= NVFP4_UNSCALE;
        h[((size_t)r * (k + 1) + slot) * imax + o0 + t] = silu(gv) * uv;
    }
}

#define DOWN_OB 16

// x[r, o] += scaling · Σ_s w[r, s] · (D_e[o]·h[r, s]) + D_shared[o]·h[r, k]: the routed combine in
// ascending expert order, the shared expert and the residual add in one pass. Thread t owns
// chunk t of the T = k·I/32 + Is/32 (slot, chunk) pairs of an output row: slot t / (I/32) (the
// shared expert's chunks last). Per output, the chunk dots are summed per slot in chunk order,
// then combined in slot order. grid: (ceil(H / OB), rows), block: 32·ceil(T / 32) <= 256.
extern "C" __global__ void __launch_bounds__(256) moe_down(
    const float* __restrict__ h, const int* __restrict__ ids, const float* __restrict__ wts,
    const uint4* __restrict__ dc, const unsigned char* __restrict__ ds, const uint4* __restrict__ sdc,
    const unsigned char* __restrict__ sds, float* __restrict__ x, int H, int I, int Is, int k, float scaling) {
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
    float xv[32];
    if (on) load_x32(h + ((size_t)r * (k + 1) + s) * imax + 32 * c, xv);
#pragma unroll
    for (int q = 0; q < DOWN_OB; q++)
        if (on && o0 + q < H) part[q][t] = nvfp4_chunk_dot(w[q], sv[q], xv);
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
        for (int sl = 0; sl < k; sl++) routed += wts[(size_t)r * k + sl] * slot_sum[t][sl];
        x[(size_t)r * H + o0 + t] += scaling * routed + slot_sum[t][k];
    }
}
