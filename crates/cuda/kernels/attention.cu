// Attention: per-head q/k RMSNorm fused with RoPE, KV-cache writes, and decode attention over
// the cache (GQA, sliding ring or full) with the per-head softplus gate.
// CPU twins: fastdecode_cpu::layers::Attention::{norm_rope_heads, attend}.

// In place: each head vector x[r, h, :] = rope(rmsnorm(x[r, h, :]; w), pos[r]).
// grid: (heads, rows), block: 128 (fixed). Dims rot_dim/2.. pair (j, j + rot_dim/2).
extern "C" __global__ void qk_norm_rope(float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                        const int* __restrict__ pos, const float* __restrict__ inv_freq,
                                        int heads, int d, int rot_dim, float scaling, float eps) {
    __shared__ float scratch[4];
    __shared__ float v[512];
    float* xh = x + ((size_t)blockIdx.y * heads + blockIdx.x) * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += 128) ss += xh[i] * xh[i];
    ss = block_sum<128>(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += 128) v[i] = __bfloat162float(w[i]) * (xh[i] * inv);
    __syncthreads();
    const int half = rot_dim / 2;
    const float p = (float)pos[blockIdx.y];
    for (int i = threadIdx.x; i < d; i += 128) {
        float o = v[i];
        if (i < rot_dim) {
            const int j = i < half ? i : i - half;
            const float a = p * inv_freq[j];
            const float c = cosf(a) * scaling, s = sinf(a) * scaling;
            o = i < half ? v[i] * c - v[i + half] * s : v[i] * c + v[i - half] * s;
        }
        xh[i] = o;
    }
}

// cache[slot(pos[r]), :] = src[r, :] for k and v; slot = pos % ring (ring 0: slot = pos).
// grid: rows, block: 256.
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                                    float* __restrict__ ck, float* __restrict__ cv,
                                    const int* __restrict__ pos, int ring, int kvd) {
    const int p = pos[blockIdx.x];
    const size_t dst = (size_t)(ring > 0 ? p % ring : p) * kvd, src = (size_t)blockIdx.x * kvd;
    for (int i = threadIdx.x; i < kvd; i += 256) {
        ck[dst + i] = k[src + i];
        cv[dst + i] = v[src + i];
    }
}

// out[r, h, :] = softplus(g[r, h]) · Σ_j softmax_j(q·k_j / sqrt(d)) v_j over the keys a query at
// pos[r] sees: positions max(0, pos - window + 1) ..= pos (window 0 = all), read from the cache at
// slot (position % ring) (ring 0 = position). Scores live in dynamic shared memory (one float per
// key); keys are visited in position order by a fixed mapping, so the sums never depend on the
// launch's row count. grid: (heads, rows), block: 128, shared: 4·max_keys bytes.
extern "C" __global__ void attend(const float* __restrict__ q, const float* __restrict__ ck,
                                  const float* __restrict__ cv, const float* __restrict__ g,
                                  const int* __restrict__ pos, float* __restrict__ out,
                                  int heads, int kv_heads, int d, int window, int ring) {
    extern __shared__ float scores[];
    __shared__ float scratch[4];
    const int h = blockIdx.x, r = blockIdx.y;
    const int kvh = h / (heads / kv_heads);
    const int p = pos[r];
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int n = p - lo + 1;
    const float* qh = q + ((size_t)r * heads + h) * d;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const float scale = rsqrtf((float)d);
    // Scores: warp w takes keys w, w+4, ...; lanes split the head dim, fixed butterfly sum.
    for (int j = warp; j < n; j += 4) {
        const int kp = lo + j;
        const size_t slot = ring > 0 ? kp % ring : kp;
        const float* kk = ck + (slot * kv_heads + kvh) * d;
        float s = 0.f;
        for (int i = lane; i < d; i += WARP) s += qh[i] * kk[i];
        s = warp_sum(s);
        if (lane == 0) scores[j] = s * scale;
    }
    __syncthreads();
    float m = -__int_as_float(0x7f800000);
    for (int j = threadIdx.x; j < n; j += 128) m = fmaxf(m, scores[j]);
    m = warp_max(m);
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    m = fmaxf(fmaxf(scratch[0], scratch[1]), fmaxf(scratch[2], scratch[3]));
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += 128) {
        const float e = expf(scores[j] - m);
        scores[j] = e;
        sum += e;
    }
    sum = block_sum<128>(sum, scratch);
    for (int j = threadIdx.x; j < n; j += 128) scores[j] = scores[j] / sum;
    __syncthreads();
    const float gl = g[(size_t)r * heads + h];
    const float gate = gl > 20.f ? gl : log1pf(expf(gl));
    // Output: warp w sums keys w, w+4, ... (lane owns dims lane, lane+32, ...), then the four
    // partial sums are added in warp order: a fixed order independent of the launch's rows.
    __shared__ float part[4][512];
    float acc[16];
#pragma unroll
    for (int c = 0; c < 16; c++) acc[c] = 0.f;
    for (int j = warp; j < n; j += 4) {
        const int kp = lo + j;
        const size_t slot = ring > 0 ? kp % ring : kp;
        const float* vv = cv + (slot * kv_heads + kvh) * d;
        const float pj = scores[j];
#pragma unroll
        for (int c = 0; c < 16; c++) {
            const int i = lane + 32 * c;
            if (i < d) acc[c] += pj * vv[i];
        }
    }
#pragma unroll
    for (int c = 0; c < 16; c++) {
        const int i = lane + 32 * c;
        if (i < d) part[warp][i] = acc[c];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += 128)
        out[((size_t)r * heads + h) * d + i] = (((part[0][i] + part[1][i]) + part[2][i]) + part[3][i]) * gate;
}
