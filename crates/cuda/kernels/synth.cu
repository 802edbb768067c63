// Synthetic weights generated in place, bit-identical to fastdecode_model::synth (CPU twin:
// `runtime_tensor_bytes`). Every element is a pure function of (tensor key, element index).
// Arithmetic uses explicit round-to-nearest intrinsics so the compiler cannot fuse the
// multiply-add that the CPU does in two roundings.

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long bits_at(unsigned long long key, unsigned long long i) {
    return splitmix64(key ^ (i * 0xD1B54A32D192ED03ull));
}

__device__ __forceinline__ float uniform_at(unsigned long long key, unsigned long long i) {
    return __fsub_rn(__fmul_rn((float)(bits_at(key, i) >> 40), 1.0f / 8388608.0f), 1.0f);
}

// kind 0: bf16 c + a·u; kind 1: f32 c + a·u; kind 2: NVFP4 code words; kind 3: scale bytes
// base ± 1. grid-stride over n elements (words for kind 2, bytes for kind 3).
extern "C" __global__ void synth_fill(unsigned long long key, unsigned long long n, int kind, float c, float a,
                                      int base, void* out) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (kind == 0 || kind == 1) {
            const float v = __fadd_rn(c, __fmul_rn(a, uniform_at(key, i)));
            if (kind == 0) ((__nv_bfloat16*)out)[i] = __float2bfloat16_rn(v);
            else ((float*)out)[i] = v;
        } else if (kind == 2) {
            const unsigned long long b = bits_at(key, i);
            unsigned int w = (unsigned int)b;
            for (int j = 0; j < 8; j++)
                if (((w >> (4 * j)) & 15u) == 8u) w &= ~(15u << (4 * j));
            if (i % 2 == 0) w |= 7u << (4 * (int)((b >> 32) & 7));
            ((unsigned int*)out)[i] = w;
        } else {
            ((unsigned char*)out)[i] = (unsigned char)(base + (int)(bits_at(key, i) % 3) - 1);
        }
    }
}
