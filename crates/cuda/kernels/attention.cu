// Attention: per-head q/k RMSNorm fused with RoPE, KV-cache writes, and split-KV ("flash
// decoding") attention over the cache (GQA, sliding ring or full) with the per-head softplus gate.
// CPU twins: fastdecode_cpu::layers::Attention::{norm_rope_heads, attend}.
//
// Inputs are the rows of one fused projection `qkvg` [rows, width]: q (heads·d) | k (kv·d) |
// v (kv·d) | g (heads). Rows of one launch sit at consecutive positions pos[0], pos[0] + 1, ...

#define ATT_SPLITS 32  // key ranges per (row, kv head): 8 kv heads × 32 keep every SM of an H200 busy
#define ATT_TILE 32    // keys per shared-memory tile: one key per lane when scoring
#define ATT_WARPS 8

struct RopeArgs {
    const float* inv_freq;
    int rot_dim;
    float scaling;
};

// cos and sin (times the rope scaling) of position `pos` for the rot_dim/2 frequencies, spread
// over `n` threads starting at thread index `i0`. Every table of a position is bit-identical.
__device__ __forceinline__ void rope_table(RopeArgs rope, int pos, float* cs, float* sn, int i0, int n) {
    const float p = (float)pos;
    for (int j = i0; j < rope.rot_dim / 2; j += n) {
        const float a = p * rope.inv_freq[j];
        cs[j] = cosf(a) * rope.scaling;
        sn[j] = sinf(a) * rope.scaling;
    }
}

// One warp: dst[0..d) = rope(rmsnorm(src; w)) with the position's table (cs, sn), pairs
// (j, j + rot_dim/2). `tmp` is d floats of the warp's own shared scratch. Queries, keys entering
// the cache and keys recomputed from this launch's rows all go through this one function, so a
// key is bit-identical however it is reached.
__device__ __forceinline__ void warp_norm_rope(const float* __restrict__ src, const __nv_bfloat16* __restrict__ w,
                                               int d, int rot_dim, float eps, const float* cs, const float* sn,
                                               float* tmp, float* dst) {
    const int lane = threadIdx.x % WARP;
    // The row and the norm weight (d <= 128: four each per lane) are loaded into registers at
    // once, before anything is stored: a store may alias a later load as far as the compiler
    // knows, which would turn the loads into a chain of round trips.
    float xv[4], wv[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int i = lane + j * WARP;
        xv[j] = i < d ? src[i] : 0.f;
        wv[j] = i < d ? __bfloat162float(w[i]) : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) ss += xv[j] * xv[j];  // the zero padding adds nothing
    ss = warp_sum(ss);
    const float inv = 1.f / sqrtf(ss / (float)d + eps);
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (lane + j * WARP < d) tmp[lane + j * WARP] = wv[j] * (xv[j] * inv);
    __syncwarp();
    const int half = rot_dim / 2;
    for (int i = lane; i < d; i += WARP) {
        float o = tmp[i];
        if (i < rot_dim) {
            const int j = i < half ? i : i - half;
            o = i < half ? tmp[i] * cs[j] - tmp[i + half] * sn[j] : tmp[i] * cs[j] + tmp[i - half] * sn[j];
        }
        dst[i] = o;
    }
    __syncwarp();
}

// One warp: dst[0..d) = src[0..d), d <= 128, every load issued before any store (which the
// compiler would otherwise have to order, a store possibly aliasing the next load).
__device__ __forceinline__ void warp_copy_row(const float* src, float* dst, int d) {
    const int lane = threadIdx.x % WARP;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = lane + j * WARP < d ? src[lane + j * WARP] : 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (lane + j * WARP < d) dst[lane + j * WARP] = v[j];
}

__device__ __forceinline__ size_t kv_slot(int p, int ring) { return (size_t)(ring > 0 ? p % ring : p); }

// Prefill side of the cache: q_out[r, h, :] = norm_rope(q of row r), and k, v of every row into the
// cache at slot(pos[r]). A block takes eight heads (q heads, then kv heads) of one row, a warp
// each, sharing the row's rope table. grid: (ceil((heads + kv_heads) / 8), rows), block: 256.
extern "C" __global__ void __launch_bounds__(256) qk_norm_rope_store(
    const float* __restrict__ qkvg, int width, const __nv_bfloat16* __restrict__ q_norm,
    const __nv_bfloat16* __restrict__ k_norm, const int* __restrict__ pos, const float* __restrict__ inv_freq,
    int rot_dim, float rope_scaling, float eps, int heads, int kv_heads, int d, int ring, float* __restrict__ q_out,
    float* __restrict__ ck, float* __restrict__ cv) {
    __shared__ float tmp[8][128], cs[64], sn[64];
    const RopeArgs rope = {inv_freq, rot_dim, rope_scaling};
    const int warp = threadIdx.x / WARP;
    const int h = blockIdx.x * 8 + warp, r = blockIdx.y, p = pos[r];
    rope_table(rope, p, cs, sn, threadIdx.x, blockDim.x);
    pdl_wait();
    __syncthreads();
    if (h >= heads + kv_heads) return;
    const float* row = qkvg + (size_t)r * width;
    if (h < heads) {
        warp_norm_rope(row + h * d, q_norm, d, rot_dim, eps, cs, sn, tmp[warp], q_out + ((size_t)r * heads + h) * d);
    } else {
        const int kh = h - heads;
        const size_t dst = (kv_slot(p, ring) * kv_heads + kh) * d;
        warp_norm_rope(row + (heads + kh) * d, k_norm, d, rot_dim, eps, cs, sn, tmp[warp], ck + dst);
        warp_copy_row(row + (heads + kv_heads + kh) * d, cv + dst, d);
    }
}

// Split-KV decode attention. Block (kv head, split, row) owns the keys of one of ATT_SPLITS
// equal ranges (a multiple of ATT_TILE keys) of the row's visible window, max(0, p - window + 1)
// ..= p, for all heads of the kv head's group (one warp per head, so heads/kv_heads <= 8). Keys of
// earlier launches come from the cache; keys of this launch's rows are normalised from `qkvg` on
// the fly (so no row waits on another's cache write), and block (kvh, 0, r) writes row r's own
// k/v into the cache. Each block leaves (max, sum, Σ p·v) per head in `part`; the last block of a
// (row, kv head) to finish (counted in `counters`, reset afterwards) merges the splits in split
// order, applies the softplus gate and writes out[r, h, :]. The ranges depend only on the row's
// own position, so a row's bits never depend on the launch's other rows.
// Shared: (G·d + TILE·(d+1) + TILE·d + 2·WARPS·d + d) floats. d % 32 == 0, d <= 128.
extern "C" __global__ void __launch_bounds__(256) attend_decode(
    const float* __restrict__ qkvg, int width, const __nv_bfloat16* __restrict__ q_norm,
    const __nv_bfloat16* __restrict__ k_norm, const int* __restrict__ pos, const float* __restrict__ inv_freq,
    int rot_dim, float rope_scaling, float eps, float* __restrict__ ck, float* __restrict__ cv, int ring, int window, int heads, int kv_heads, int d,
    float* __restrict__ part, unsigned int* __restrict__ counters, float* __restrict__ out) {
    FD_TRACE_KERNEL(3, kv_heads);
    extern __shared__ float sm[];
    __shared__ int is_last;
    const RopeArgs rope = {inv_freq, rot_dim, rope_scaling};
    const int G = heads / kv_heads;
    float* qs = sm;                        // [G][d]
    // [TILE][d + 4]: a lane reads its key's row 16 bytes at a time; with the padded stride the
    // eight lanes of each quarter-warp phase hit distinct banks.
    float* ks = qs + G * d;
    float* vs = ks + ATT_TILE * (d + 4);   // [TILE][d]
    float* tmp = vs + ATT_TILE * d;        // [WARPS][d]
    float* cs = tmp + ATT_WARPS * d;       // [d / 2]: this row's rope table
    float* sn = cs + d / 2;
    float* kcs = sn + d / 2;               // [WARPS][d]: per-warp tables of other positions
    const int kvh = blockIdx.x, split = blockIdx.y, r = blockIdx.z;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int p = pos[r], p0 = pos[0];
    const int koff = heads * d, voff = koff + kv_heads * d, goff = voff + kv_heads * d;
    const float* row = qkvg + (size_t)r * width;
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int n = p - lo + 1;
    const int per = ((n + ATT_SPLITS - 1) / ATT_SPLITS + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    // Splits past the window's end have no keys: they do nothing, and the merge skips them.
    const int used = (n + per - 1) / per;
    if (split >= used) {
        pdl_wait();  // lets the successor start once every block has passed here
        return;
    }
    const int beg = lo + split * per, end = min(lo + (split + 1) * per, p + 1);
    const float scale = 1.f / sqrtf((float)d);

    // Cached keys of a tile: warp w copies keys w, w + 8, w + 16, w + 24, lane l dims 4l..4l+4,
    // into registers first. The first tile is fetched before the queries are normalised and each
    // next tile while the current one is scored, so the loads overlap the work.
    float4 kr[ATT_TILE / ATT_WARPS], vr[ATT_TILE / ATT_WARPS];
    auto fetch = [&](int t0) {
        const int nt = min(ATT_TILE, end - t0);
#pragma unroll
        for (int q = 0; q < ATT_TILE / ATT_WARPS; q++) {
            const int j = warp + ATT_WARPS * q, kp = t0 + j;
            if (j < nt && kp < p0 && 4 * lane < d) {
                const size_t s = (kv_slot(kp, ring) * kv_heads + kvh) * d + 4 * lane;
                kr[q] = *reinterpret_cast<const float4*>(ck + s);
                vr[q] = *reinterpret_cast<const float4*>(cv + s);
            }
        }
    };
    fetch(beg);  // earlier steps' keys: no kernel of this step writes them before this one
    rope_table(rope, p, cs, sn, threadIdx.x, blockDim.x);  // constants only: before the wait too
    pdl_wait();
    __syncthreads();

    if (warp < G)
        warp_norm_rope(row + (kvh * G + warp) * d, q_norm, d, rope.rot_dim, eps, cs, sn, tmp + warp * d,
                       qs + warp * d);
    if (split == 0 && warp == ATT_WARPS - 1) {
        const size_t dst = (kv_slot(p, ring) * kv_heads + kvh) * d;
        warp_norm_rope(row + koff + kvh * d, k_norm, d, rope.rot_dim, eps, cs, sn, tmp + warp * d, ck + dst);
        warp_copy_row(row + voff + kvh * d, cv + dst, d);
    }
    __syncthreads();
    FD_MARK(3);

    float mx = NEG_INF, ls = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int t0 = beg; t0 < end; t0 += ATT_TILE) {
        const int nt = min(ATT_TILE, end - t0);
#pragma unroll
        for (int q = 0; q < ATT_TILE / ATT_WARPS; q++) {
            const int j = warp + ATT_WARPS * q, kp = t0 + j;
            if (j < nt && kp < p0 && 4 * lane < d) {
                *reinterpret_cast<float4*>(ks + j * (d + 4) + 4 * lane) = kr[q];
                *reinterpret_cast<float4*>(vs + j * d + 4 * lane) = vr[q];
            }
        }
        // Keys of this launch's rows: normalised and rotated here, as the cache writer does.
        for (int j = warp; j < nt; j += ATT_WARPS) {
            const int kp = t0 + j;
            if (kp >= p0) {
                const float* src = qkvg + (size_t)(kp - p0) * width;
                float* kc = kcs + warp * d;
                rope_table(rope, kp, kc, kc + d / 2, lane, WARP);
                __syncwarp();
                warp_norm_rope(src + koff + kvh * d, k_norm, d, rope.rot_dim, eps, kc, kc + d / 2, tmp + warp * d,
                               ks + j * (d + 4));
                warp_copy_row(src + voff + kvh * d, vs + j * d, d);
            }
        }
        __syncthreads();
        FD_MARK(6);
        if (t0 + ATT_TILE < end) fetch(t0 + ATT_TILE);
        if (warp < G) {
            float s = NEG_INF;
            if (lane < nt) {
                const float4* q = reinterpret_cast<const float4*>(qs + warp * d);
                const float4* k = reinterpret_cast<const float4*>(ks + lane * (d + 4));
                // Four interleaved partial sums (a 128-long dependent chain would stall), 16-byte
                // loads: the query is a broadcast, the key a row of its own.
                float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
#pragma unroll 8
                for (int i = 0; i < d / 4; i++) {
                    const float4 a = q[i], b = k[i];
                    d0 += a.x * b.x;
                    d1 += a.y * b.y;
                    d2 += a.z * b.z;
                    d3 += a.w * b.w;
                }
                s = ((d0 + d1) + (d2 + d3)) * scale;
            }
            const float mn = fmaxf(mx, warp_max(s));
            const float corr = expf(mx - mn);  // 0 on the first tile (mx = -inf, mn finite)
            const float pj = lane < nt ? expf(s - mn) : 0.f;
            ls = ls * corr + warp_sum(pj);
            FD_MARK(7);
#pragma unroll
            for (int c = 0; c < 4; c++) acc[c] *= corr;
#pragma unroll 4
            for (int j = 0; j < nt; j++) {
                const float pw = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (lane + WARP * c < d) acc[c] += pw * vs[j * d + lane + WARP * c];
            }
            mx = mn;
        }
        __syncthreads();
    }

    FD_MARK(4);
    const int pw = d + 2;
    if (warp < G) {
        float* pp = part + (((size_t)r * heads + kvh * G + warp) * ATT_SPLITS + split) * pw;
        if (lane == 0) {
            pp[0] = mx;
            pp[1] = ls;
        }
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (lane + WARP * c < d) pp[2 + lane + WARP * c] = acc[c];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[r * kv_heads + kvh], 1u) == (unsigned int)(used - 1);
    __syncthreads();
    FD_MARK(5);
    if (!is_last) return;
    __threadfence();
    static_assert(ATT_SPLITS == WARP, "the merge gives each lane one split");
    if (warp < G) {
        const int h = kvh * G + warp;
        const float gate = softplus(row[goff + h]);  // loaded alongside the partials
        const float* pb = part + ((size_t)r * heads + h) * ATT_SPLITS * pw;
        // Lane s holds split s's max and sum (one 8-byte load, aligned as pw is even: one round
        // trip, not two): the maxima and the weighted sum reduce in a fixed butterfly, then each
        // lane adds its dims over the splits in split order.
        const float2 ml = lane < used ? __ldcg(reinterpret_cast<const float2*>(pb + lane * pw))
                                      : make_float2(NEG_INF, 0.f);
        const float ms = ml.x;
        const float M = warp_max(ms);
        const float wgt = ms == NEG_INF ? 0.f : expf(ms - M);  // unused splits weigh nothing
        const float L = warp_sum(lane < used ? ml.y * wgt : 0.f);
        float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
        for (int s = 0; s < used; s++) {
            const float ws = __shfl_sync(0xffffffffu, wgt, s);
#pragma unroll
            for (int c = 0; c < 4; c++)
                if (lane + WARP * c < d) o[c] += __ldcg(pb + s * pw + 2 + lane + WARP * c) * ws;
        }
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (lane + WARP * c < d) out[((size_t)r * heads + h) * d + lane + WARP * c] = o[c] / L * gate;
    }
    if (threadIdx.x == 0) counters[r * kv_heads + kvh] = 0;
}
