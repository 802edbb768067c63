// Mixture of experts: router selection, NVFP4 expert GEMVs with dequantisation in registers
// (gate and up fused with SiLU·mul; down fused with the routing-weight combine, the shared expert
// and the residual add), and SiLU·mul for the dense MLP.
// CPU twins: fastdecode_cpu::layers::{Moe::route, Moe::forward, Mlp::forward}.

// e2m1 magnitudes; bit 3 of a code is the sign.
__device__ __constant__ float E2M1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};

__device__ __forceinline__ float e4m3(unsigned int b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const float mag = e == 0 ? ldexpf((float)m / 8.f, -6) : ldexpf(1.f + (float)m / 8.f, e - 7);
    return (b & 0x80) ? -mag : mag;
}

// Dot of one NVFP4 weight row (codes: in/8 words, scales: in/16 bytes) with x (length in),
// lane-strided over words then a fixed butterfly sum. Dequantisation happens in registers.
__device__ __forceinline__ float nvfp4_dot(const unsigned int* __restrict__ codes,
                                           const unsigned char* __restrict__ scales,
                                           const float* __restrict__ x, int in, int lane) {
    float acc = 0.f;
    for (int wi = lane; wi < in / 8; wi += WARP) {
        const unsigned int word = codes[wi];
        const float s = e4m3(scales[wi / 2]);
        const float* xs = x + wi * 8;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const unsigned int c = (word >> (4 * j)) & 15u;
            const float v = (c & 8u) ? -E2M1[c & 7u] : E2M1[c & 7u];
            acc += (s * v) * xs[j];
        }
    }
    return warp_sum(acc);
}

__device__ __forceinline__ float silu(float v) { return v / (1.f + expf(-v)); }

// Router: logits [rows, E] -> ids [rows, k] (ascending expert index) and weights [rows, k].
// Selection by sigmoid(logit) + bias, exact ties to the lower index; weights are the pre-bias
// scores of the chosen experts (summed in ascending expert order), renormalised when norm_topk.
// grid: rows, block: 256; E <= 1024, k <= 64. Each of the k rounds is a block arg-max with a
// fixed reduction tree (value descending, then index ascending), so the result is deterministic.
extern "C" __global__ void router_topk(const float* __restrict__ logits, const float* __restrict__ bias,
                                       int* __restrict__ ids, float* __restrict__ wts,
                                       int E, int k, int norm_topk, float softcap) {
    __shared__ float sel[1024];
    __shared__ float sc[1024];
    __shared__ float bv[256];
    __shared__ int bi[256];
    __shared__ int chosen[64];
    const float* l = logits + (size_t)blockIdx.x * E;
    const int t = threadIdx.x;
    // Strides and the reduction follow blockDim.x (a power of two up to 256), so a launch with
    // fewer threads still reads only initialised shared memory.
    const int nt = blockDim.x;
    for (int e = t; e < E; e += nt) {
        float x = l[e];
        if (softcap > 0.f) x = softcap * tanhf(x / softcap);
        const float s = 1.f / (1.f + expf(-x));
        sc[e] = s;
        sel[e] = s + bias[e];
    }
    __syncthreads();
    const float NEG_INF = -__int_as_float(0x7f800000);
    for (int round = 0; round < k; round++) {
        float best = NEG_INF;
        int idx = 0x7fffffff;
        for (int e = t; e < E; e += nt) {
            if (sel[e] > best) { best = sel[e]; idx = e; }  // ascending scan: ties keep the lower index
        }
        bv[t] = best;
        bi[t] = idx;
        __syncthreads();
        for (int s = nt / 2; s > 0; s >>= 1) {
            if (t < s) {
                const float v = bv[t + s];
                const int j = bi[t + s];
                if (v > bv[t] || (v == bv[t] && j < bi[t])) { bv[t] = v; bi[t] = j; }
            }
            __syncthreads();
        }
        if (t == 0) {
            // NaN scores never compare greater: fall back to the lowest unchosen index rather
            // than index with the "none" sentinel (the forward's output is garbage then anyway).
            int c = bi[0];
            if (c >= E) {
                c = 0;
                for (int u = 0; u < round; u++)
                    if (chosen[u] == c) { c++; u = -1; }
            }
            chosen[round] = c;
            sel[c] = NEG_INF;
        }
        __syncthreads();
    }
    if (t != 0) return;
    for (int a = 1; a < k; a++) {  // ascending expert order (insertion sort, k <= 64)
        const int c = chosen[a];
        int b = a - 1;
        while (b >= 0 && chosen[b] > c) { chosen[b + 1] = chosen[b]; b--; }
        chosen[b + 1] = c;
    }
    float total = 0.f;
    for (int i = 0; i < k; i++) total += sc[chosen[i]];
    for (int i = 0; i < k; i++) {
        ids[(size_t)blockIdx.x * k + i] = chosen[i];
        wts[(size_t)blockIdx.x * k + i] = norm_topk ? sc[chosen[i]] / total : sc[chosen[i]];
    }
}

// h[r, s, o] = silu(G_e[o]·x[r]) · (U_e[o]·x[r]) with e = ids[r, s] (ids null: expert 0, the
// shared expert). G, U: NVFP4 [E, I, H]. grid: (ceil(I / 8), rows · slots), block: 256.
extern "C" __global__ void nvfp4_gate_up(const unsigned int* __restrict__ gc, const unsigned char* __restrict__ gs,
                                         const unsigned int* __restrict__ uc, const unsigned char* __restrict__ us,
                                         const float* __restrict__ x, const int* __restrict__ ids,
                                         float* __restrict__ h, int I, int H, int slots) {
    const int o = blockIdx.x * 8 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (o >= I) return;
    const int rs = blockIdx.y, r = rs / slots;
    const size_t e = ids ? (size_t)ids[rs] : 0;
    const size_t row = e * I + o;
    const float* xr = x + (size_t)r * H;
    const float gv = nvfp4_dot(gc + row * (H / 8), gs + row * (H / 16), xr, H, lane);
    const float uv = nvfp4_dot(uc + row * (H / 8), us + row * (H / 16), xr, H, lane);
    if (lane == 0) h[(size_t)rs * I + o] = silu(gv) * uv;
}

// x[r, o] += scaling · Σ_s w[r, s] · (D_e[o]·h[r, s]) + D_shared[o]·hs[r]: the routed combine
// (slots in ascending expert order), the shared expert and the residual add in one pass.
// D: NVFP4 [E, H, I]; Dsh: [H, Is]. grid: (ceil(H / 8), rows), block: 256.
extern "C" __global__ void nvfp4_down_combine(const unsigned int* __restrict__ dc, const unsigned char* __restrict__ ds,
                                              const unsigned int* __restrict__ shc, const unsigned char* __restrict__ shs,
                                              const float* __restrict__ h, const float* __restrict__ hs,
                                              const int* __restrict__ ids, const float* __restrict__ wts,
                                              float* __restrict__ x, int H, int I, int Is, int slots, float scaling) {
    const int o = blockIdx.x * 8 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (o >= H) return;
    const int r = blockIdx.y;
    float routed = 0.f;
    for (int s = 0; s < slots; s++) {
        const size_t rs = (size_t)r * slots + s;
        const size_t row = (size_t)ids[rs] * H + o;
        const float y = nvfp4_dot(dc + row * (I / 8), ds + row * (I / 16), h + rs * I, I, lane);
        routed += wts[rs] * y;
    }
    const float sh = nvfp4_dot(shc + (size_t)o * (Is / 8), shs + (size_t)o * (Is / 16), hs + (size_t)r * Is, Is, lane);
    if (lane == 0) x[(size_t)r * H + o] += scaling * routed + sh;
}

// a[i] = silu(g[i]) · u[i] (dense SwiGLU). grid: ceil(n / 256), block: 256.
extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ a, int n) {
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) a[i] = silu(g[i]) * u[i];
}
