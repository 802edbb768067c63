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
template <int R, int G>
__device__ __forceinline__ void gemv_bf16_body(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                               const __nv_bfloat16* __restrict__ norm, float eps,
                                               float* __restrict__ y, int out, int in, int rows, int accumulate) {
    __shared__ float inv[16], red[8 * 16];
    gemv_rows<R, G>(W, x, norm, inv, y, out, in, rows, accumulate, [&] {
        if (norm) block_inv_rms(x, in, rows, eps, inv, red);
    });
}

// The same with the rows' x' = norm ⊙ x / rms(x) staged in shared memory once per block (as
// gemv_bf16_1s does for one row), so the inner loop reads it there instead of forming it anew
// for every weight row: the same value (norm[i]·(x[i]·inv)), the same bits. norm required.
// shared: 4·rows·in bytes (the launcher sizes it).
template <int R, int G>
__device__ __forceinline__ void gemv_bf16_staged_body(const __nv_bfloat16* __restrict__ W,
                                                      const float* __restrict__ x,
                                                      const __nv_bfloat16* __restrict__ norm, float eps,
                                                      float* __restrict__ y, int out, int in, int rows,
                                                      int accumulate) {
    extern __shared__ __align__(16) float xs[];  // read as float4s
    __shared__ float inv[16], red[8 * 16];
    gemv_rows<R, G>(W, xs, nullptr, inv, y, out, in, rows, accumulate, [&] {
        block_inv_rms(x, in, rows, eps, inv, red);
        for (int i = threadIdx.x; i < rows * in; i += blockDim.x)
            xs[i] = __bfloat162float(norm[i % in]) * (x[i] * inv[i / in]);
        __syncthreads();
    });
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

#define GEMV_ENTRY(NAME, BODY, R, G)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, FD_GEMV_MINB) NAME(                                   \
        const __nv_bfloat16* __restrict__ W, const float* __restrict__ x, const __nv_bfloat16* __restrict__ norm, \
        float eps, float* __restrict__ y, int out, int in, int rows, int accumulate) {                      \
        FD_TRACE_KERNEL(2, out);                                                                            \
        BODY<R, G>(W, x, norm, eps, y, out, in, rows, accumulate);                                          \
    }
#define GEMV_ENTRIES(R)                                                   \
    GEMV_ENTRY(gemv_bf16_##R, gemv_bf16_body, R, 1)                       \
    GEMV_ENTRY(gemv_bf16_##R##_g2, gemv_bf16_body, R, 2)                  \
    GEMV_ENTRY(gemv_bf16_##R##_g4, gemv_bf16_body, R, 4)                  \
    GEMV_ENTRY(gemv_bf16_##R##s_g1, gemv_bf16_staged_body, R, 1)          \
    GEMV_ENTRY(gemv_bf16_##R##s_g2, gemv_bf16_staged_body, R, 2)          \
    GEMV_ENTRY(gemv_bf16_##R##s_g4, gemv_bf16_staged_body, R, 4)
GEMV_ENTRY(gemv_bf16_1, gemv_bf16_body, 1, 1)
GEMV_ENTRIES(2)
GEMV_ENTRIES(4)
GEMV_ENTRIES(8)
GEMV_ENTRIES(16)

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
