// Dense building blocks: embedding gather, RMSNorm, bf16 GEMV (y = x·Wᵀ), argmax.
// CPU twins: fastdecode_cpu::ops::{rms_norm, matvec, argmax} and TargetModel::embed_row.

// x[r, :] = embed[tokens[r], :]  (bf16 -> f32). grid: rows, block: 256.
extern "C" __global__ void embed_rows(const __nv_bfloat16* __restrict__ embed, const int* __restrict__ tokens,
                                      float* __restrict__ x, int hidden) {
    const int r = blockIdx.x;
    const __nv_bfloat16* src = embed + (size_t)tokens[r] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) x[(size_t)r * hidden + i] = __bfloat162float(src[i]);
}

// out[r, :] = w * x[r, :] * rsqrt(mean(x[r, :]^2) + eps). grid: rows, block: 256 (fixed: the
// reduction tree depends on it, never on the row count).
extern "C" __global__ void rms_norm_rows(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                         float* __restrict__ out, int n, float eps) {
    __shared__ float scratch[8];
    const float* xr = x + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += 256) ss += xr[i] * xr[i];
    ss = block_sum<256>(ss, scratch);
    const float inv = rsqrtf(ss / (float)n + eps);
    float* o = out + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += 256) o[i] = __bfloat162float(w[i]) * (xr[i] * inv);
}

#define GEMV_MAX_ROWS 16

// y[r, o] (+)= sum_i W[o, i] * x[r, i] for r < rows (rows <= 16), W bf16 [out, in], in % 8 == 0.
// One warp per output o: lane l reads 16 bytes at i = 8l + 256j, accumulates in f32 in j order,
// then a fixed butterfly reduction. The weights are read once for all rows; each row's sum has
// the same order whatever `rows` is. grid: ceil(out / 8), block: 256.
extern "C" __global__ void gemv_bf16(const __nv_bfloat16* __restrict__ W, const float* __restrict__ x,
                                     float* __restrict__ y, int out, int in, int rows, int accumulate) {
    const int o = blockIdx.x * 8 + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (o >= out) return;
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; r++) acc[r] = 0.f;
    const __nv_bfloat16* wrow = W + (size_t)o * in;
    for (int i = lane * 8; i < in; i += WARP * 8) {
        float w[8];
        load8_bf16(wrow + i, w);
#pragma unroll
        for (int r = 0; r < GEMV_MAX_ROWS; r++) {
            if (r < rows) {
                const float4 a = *reinterpret_cast<const float4*>(x + (size_t)r * in + i);
                const float4 b = *reinterpret_cast<const float4*>(x + (size_t)r * in + i + 4);
                float s = acc[r];
                s += w[0] * a.x; s += w[1] * a.y; s += w[2] * a.z; s += w[3] * a.w;
                s += w[4] * b.x; s += w[5] * b.y; s += w[6] * b.z; s += w[7] * b.w;
                acc[r] = s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; r++) {
        if (r < rows) {
            const float s = warp_sum(acc[r]);
            if (lane == 0) {
                float* dst = y + (size_t)r * out + o;
                *dst = accumulate ? *dst + s : s;
            }
        }
    }
}

// out[r] = argmax(logits[r, :]); ties go to the lowest index (as the CPU's argmax).
// grid: rows, block: 256.
extern "C" __global__ void argmax_rows(const float* __restrict__ logits, int vocab, int* __restrict__ out) {
    __shared__ float sv[256];
    __shared__ int si[256];
    const float* l = logits + (size_t)blockIdx.x * vocab;
    float best = -__int_as_float(0x7f800000);  // -inf
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += 256) {
        const float v = l[i];
        if (v > best) { best = v; bi = i; }  // strictly greater: the first (lowest) index wins
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float v = sv[threadIdx.x + s];
            const int j = si[threadIdx.x + s];
            if (v > sv[threadIdx.x] || (v == sv[threadIdx.x] && j < si[threadIdx.x])) {
                sv[threadIdx.x] = v;
                si[threadIdx.x] = j;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0x7fffffff ? 0 : si[0];
}
