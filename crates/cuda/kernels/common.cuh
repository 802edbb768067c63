// Shared by every fastdecode kernel module (prepended by the loader, not #included).
//
// Determinism and batch invariance: every kernel assigns the work of one (row, output) pair to a
// fixed set of threads with a fixed reduction order that does not depend on how many rows the
// launch carries, so a row's result is bit-identical whether it is computed alone (serial decode)
// or inside a K-row DFlash verify. No atomics on floats anywhere.
#include <cuda_bf16.h>

#define WARP 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of BLOCK threads (a multiple of 32) with a fixed tree; `scratch` holds
// BLOCK/32 floats. Every thread gets the result.
template <int BLOCK>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = 0.f;
    if (warp == 0) {
        t = lane < BLOCK / WARP ? scratch[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) scratch[0] = t;
    }
    __syncthreads();
    t = scratch[0];
    __syncthreads();
    return t;
}

// Eight bf16 values from one 16-byte load, widened to f32.
__device__ __forceinline__ void load8_bf16(const __nv_bfloat16* p, float out[8]) {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
