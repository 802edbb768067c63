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

// A head row and its norm weight in a warp's registers (lane l holds elements l, l + 32, l + 64,
// l + 96; d <= 128, zeros past d), loaded at once: a store may alias a later load as far as the
// compiler knows, which would turn the loads into a chain of round trips.
struct HeadRow {
    float x[4], w[4];
};
__device__ __forceinline__ HeadRow warp_load_head(const float* __restrict__ src, const __nv_bfloat16* __restrict__ w,
                                                  int d) {
    const int lane = threadIdx.x % WARP;
    HeadRow hr;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int i = lane + j * WARP;
        hr.x[j] = i < d ? src[i] : 0.f;
        hr.w[j] = i < d ? __bfloat162float(w[i]) : 0.f;
    }
    return hr;
}

// One warp: dst[0..d) = rope(rmsnorm(row; w)) of a loaded head row with the position's table (cs,
// sn), pairs (j, j + rot_dim/2). `tmp` is d floats of the warp's own shared scratch. Queries, keys
// entering the cache and keys recomputed from this launch's rows all go through this one
// function, so a key is bit-identical however it is reached.
__device__ __forceinline__ void warp_norm_rope_loaded(const HeadRow& hr, int d, int rot_dim, float eps,
                                                      const float* cs, const float* sn, float* tmp, float* dst) {
    const int lane = threadIdx.x % WARP;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) ss += hr.x[j] * hr.x[j];  // the zero padding adds nothing
    ss = warp_sum(ss);
    const float inv = 1.f / sqrtf(ss / (float)d + eps);
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (lane + j * WARP < d) tmp[lane + j * WARP] = hr.w[j] * (hr.x[j] * inv);
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

// The two together: dst[0..d) = rope(rmsnorm(src; w)).
__device__ __forceinline__ void warp_norm_rope(const float* __restrict__ src, const __nv_bfloat16* __restrict__ w,
                                               int d, int rot_dim, float eps, const float* cs, const float* sn,
                                               float* tmp, float* dst) {
    warp_norm_rope_loaded(warp_load_head(src, w, d), d, rot_dim, eps, cs, sn, tmp, dst);
}

// One warp: a row of d <= 128 floats into registers (lane l: l, l + 32, ...; zeros past d), and
// back out (so the load can go out before other work).
__device__ __forceinline__ void warp_load_row(const float* src, int d, float v[4]) {
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = lane + j * WARP < d ? src[lane + j * WARP] : 0.f;
}
__device__ __forceinline__ void warp_store_row(const float v[4], float* dst, int d) {
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (lane + j * WARP < d) dst[lane + j * WARP] = v[j];
}

// One warp: dst[0..d) = src[0..d), d <= 128, every load issued before any store (which the
// compiler would otherwise have to order, a store possibly aliasing the next load).
__device__ __forceinline__ void warp_copy_row(const float* src, float* dst, int d) {
    float v[4];
    warp_load_row(src, d, v);
    warp_store_row(v, dst, d);
}

__device__ __forceinline__ size_t kv_slot(int p, int ring) { return (size_t)(ring > 0 ? p % ring : p); }

// The slot k places after slot s (s < ring, 0 <= k <= ATT_TILE): a compare and at most one
// subtraction where the ring holds a tile, instead of a division by the runtime ring (some 35
// instructions). Nsight Compute: attend_decode's divisions by runtime values (a slot per cached
// key, an element index per summed element, a split count per block) were a sixth of its
// instructions.
__device__ __forceinline__ int kv_slot_after(int s, int k, int ring) {
    int t = s + k;
    if (ring > 0)
        while (t >= ring) t -= ring;
    return t;
}

// Prefill side of the cache: q_out[r, h, :] = norm_rope(q of row r), and k, v of every row into the
// cache at slot(pos[r]). A block takes eight heads (q heads, then kv heads) of one row, a warp
// each, sharing the row's rope table. grid: (ceil((heads + kv_heads) / 8), rows), block: 256.
extern "C" __global__ void __launch_bounds__(256) qk_norm_rope_store(
    const float* __restrict__ qkvg, int width, const __nv_bfloat16* __restrict__ q_norm,
    const __nv_bfloat16* __restrict__ k_norm, const int* __restrict__ pos, const float* __restrict__ inv_freq,
    int rot_dim, float rope_scaling, float eps, int heads, int kv_heads, int d, int ring, float* __restrict__ q_out,
    float* __restrict__ ck, float* __restrict__ cv) {
    __shared__ __align__(16) float tmp[8][128];
    __shared__ float cs[64], sn[64];
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

// One warp: head h of row r, the `used` splits' partials (max, sum, Σ p·v; `part`, d + 2 floats a
// split) merged in split order and gated by softplus(gates[h]) (the row's gate logits), into
// out[r, h, :].
__device__ __forceinline__ void warp_merge_head(const float* __restrict__ part, const float* gates, int r, int heads,
                                                int h, int used, int d, float* __restrict__ out) {
    static_assert(ATT_SPLITS == WARP, "the merge gives each lane one split");
    const int lane = threadIdx.x % WARP, pw = d + 2;
    const float gate = softplus(gates[h]);  // loaded alongside the partials
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
#pragma unroll 16
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

// The keys a row at position p attends to, lo ..= p (n of them: its sliding window's, or all),
// in ATT_SPLITS equal ranges of `per` keys (whole tiles), of which `used()` hold keys. The
// attention's blocks and the merge of their partials both take the ranges from here.
struct AttSplits {
    int lo, n, per;
    __device__ __forceinline__ int used() const { return (n + per - 1) / per; }
};
__device__ __forceinline__ AttSplits att_splits(int p, int window) {
    const int lo = window > 0 ? max(0, p - window + 1) : 0, n = p - lo + 1;
    return {lo, n, ((n + ATT_SPLITS - 1) / ATT_SPLITS + ATT_TILE - 1) / ATT_TILE * ATT_TILE};
}

// Split-KV decode attention. Block (kv head, split, row) owns the keys of one of ATT_SPLITS
// equal ranges (a multiple of ATT_TILE keys) of the row's visible window, max(0, p - window + 1)
// ..= p, for all heads of the kv head's group (one warp per head, so heads/kv_heads <= 8). Keys of
// earlier launches come from the cache; keys of this launch's rows are normalised from `qkvg` on
// the fly (so no row waits on another's cache write), and block (kvh, 0, r) writes row r's own
// k/v into the cache. Each block leaves (max, sum, Σ p·v) per head in `part`; the last block of a
// (row, kv head) to finish (counted in `counters`, reset afterwards) merges the splits in split
// order, applies the softplus gate and writes out[r, h, :]. The ranges depend only on the row's
// own position, so a row's bits never depend on the launch's other rows. grid: (kv heads, rows,
// ATT_SPLITS), split slowest, so blocks are dispatched split by split: a launch's splits past
// its rows' windows (half of them at 512 keys) come last, not between the working blocks.
// Shared: (G·d + TILE·(d+4) + TILE·d + 2·WARPS·d + d + 8·TILE + 8) floats. d % 32 == 0, d <= 128.
//
// With MERGE false (`attend_decode_parts`, a verify block's launches) a block leaves once its
// partials are written, and attend_merge merges them after the launch: the arrival, a release
// atomic that waits for the partials to reach L2 and then its own round trip, held every block
// of an 8-row launch 1.6 µs of its ~7 (bench --trace-rows 8), in waves of blocks.
template <bool MERGE>
__device__ __forceinline__ void attend_decode_body(
    const float* __restrict__ qkvg, int width, const __nv_bfloat16* __restrict__ q_norm,
    const __nv_bfloat16* __restrict__ k_norm, const int* __restrict__ pos, const float* __restrict__ inv_freq,
    int rot_dim, float rope_scaling, float eps, float* __restrict__ ck, float* __restrict__ cv, int ring, int window, int heads, int kv_heads, int d,
    float* __restrict__ part, unsigned int* __restrict__ counters, float* __restrict__ out) {
    FD_TRACE_KERNEL(3, kv_heads);
    extern __shared__ float sm[];
    const RopeArgs rope = {inv_freq, rot_dim, rope_scaling};
    const int kvh = blockIdx.x, r = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int p = pos[r], p0 = pos[0];
    const int koff = heads * d, voff = koff + kv_heads * d, goff = voff + kv_heads * d;
    const float* row = qkvg + (size_t)r * width;
    const AttSplits sp = att_splits(p, window);
    const int lo = sp.lo, n = sp.n, per = sp.per;
    // Splits past the window's end have no keys: they do nothing, and the merge skips them. (The
    // test needs no division, so idle blocks leave at once.)
    if (split * per >= n) {
        pdl_wait();  // lets the successor start once every block has passed here
        return;
    }
    const int used = sp.used();
    const int G = heads / kv_heads;
    float* qs = sm;                        // [G][d]
    // [TILE][d + 4]: keys of this launch's rows, normalised here and picked up into registers
    // (the padding dates from scoring out of shared memory; the stride and its size are also
    // the launcher's, ops.rs). After the tiles, ks and vs hold the warps' partial sums.
    float* ks = qs + G * d;
    float* vs = ks + ATT_TILE * (d + 4);   // [TILE][d]
    float* tmp = vs + ATT_TILE * d;        // [WARPS][d]
    float* cs = tmp + ATT_WARPS * d;       // [d / 2]: this row's rope table
    float* sn = cs + d / 2;
    float* kcs = sn + d / 2;               // [WARPS][d]: per-warp tables of other positions
    float* sc = kcs + ATT_WARPS * d;       // [8][TILE]: a tile's scores, then its weights, per head
    float* corr = sc + 8 * ATT_TILE;       // [8]: per head, the tile's rescale of earlier sums
    const int beg = lo + split * per, end = min(lo + (split + 1) * per, p + 1);
    const float scale = 1.f / sqrtf((float)d);

    // The tile stays in registers: thread (warp w, lane l) holds dims 4l..4l+4 of keys and values
    // w, w + 8, w + 16, w + 24 of the tile, and every head's scores and weighted sums are formed
    // from there, each key read once. (A shared-memory copy that each of the G heads' warps read
    // whole took as long: the tile's ~3 us are its dependent steps on few warps, BENCHMARKS,
    // seventh measurement.) Missing keys and dims are zeros. Cached keys are loaded before the
    // queries are normalised, and the next tile's while the current one is scored (keys) and
    // weighted (values).
    // s0 is tile t0's first slot; the tiles' slots follow from the range's first by kv_slot_after.
    // next_slot is the first slot of the tile the next fetches read.
    float4 kr[ATT_TILE / ATT_WARPS], vr[ATT_TILE / ATT_WARPS];
    auto fetch = [&](float4* dst, const float* cache, int t0, int s0) {
        const int nt = min(ATT_TILE, end - t0);
#pragma unroll
        for (int q = 0; q < ATT_TILE / ATT_WARPS; q++) {
            const int j = warp + ATT_WARPS * q, kp = t0 + j;
            dst[q] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (j < nt && kp < p0 && 4 * lane < d) {
                const size_t slot = (size_t)kv_slot_after(s0, j, ring);
                dst[q] = *reinterpret_cast<const float4*>(cache + (slot * kv_heads + kvh) * d + 4 * lane);
            }
        }
    };
    int next_slot = (int)kv_slot(beg, ring);
    fetch(kr, ck, beg, next_slot);  // earlier steps' keys: no kernel of this step writes them before this one
    fetch(vr, cv, beg, next_slot);
    rope_table(rope, p, cs, sn, threadIdx.x, blockDim.x);  // constants only: before the wait too
    // This launch's keys in the range's last tile (a decode step's own key, in its last split:
    // the straggler of every kv head) are normalised beside the queries, their rows requested
    // with the query rows, instead of inside the tile loop after them (a barrier and two more
    // round trips later): 2.294 against 2.375 ms/token for XS 2.1 (H200). When some fall in an
    // earlier tile (a multi-row launch across a tile boundary) the loop does them all.
    const int tl = beg + (end - 1 - beg) / ATT_TILE * ATT_TILE;  // the last tile's first key
    const bool early = max(beg, p0) >= tl;
    int jk = -1;  // this warp's first launch key in that tile (j = warp, warp + 8, ...)
    if (early)
        for (int j = warp; j < end - tl; j += ATT_WARPS)
            if (tl + j >= p0) {
                jk = j;
                break;
            }
    float* kc = kcs + warp * d;
    if (jk >= 0 && tl + jk != p) rope_table(rope, tl + jk, kc, kc + d / 2, lane, WARP);  // its table
    // One warp: launch key kp (its table computed here, in kc) normalised, rotated and stored with
    // its value at place j of the tile, as the cache writer does.
    auto launch_key = [&](int kp, int j) {
        const float* src = qkvg + (size_t)(kp - p0) * width;
        rope_table(rope, kp, kc, kc + d / 2, lane, WARP);
        __syncwarp();
        warp_norm_rope(src + koff + kvh * d, k_norm, d, rope.rot_dim, eps, kc, kc + d / 2, tmp + warp * d,
                       ks + j * (d + 4));
        warp_copy_row(src + voff + kvh * d, vs + j * d, d);
    };
    pdl_wait();
    __syncthreads();

    {
        HeadRow qh, kh;
        float vv[4];
        const float* ksrc = jk >= 0 ? qkvg + (size_t)(tl + jk - p0) * width : qkvg;
        if (warp < G) qh = warp_load_head(row + (kvh * G + warp) * d, q_norm, d);
        if (jk >= 0) {
            kh = warp_load_head(ksrc + koff + kvh * d, k_norm, d);
            warp_load_row(ksrc + voff + kvh * d, d, vv);
        }
        if (warp < G) warp_norm_rope_loaded(qh, d, rope.rot_dim, eps, cs, sn, tmp + warp * d, qs + warp * d);
        if (jk >= 0) {
            const bool own = tl + jk == p;  // the row's own key: the row's table, bit for bit
            warp_norm_rope_loaded(kh, d, rope.rot_dim, eps, own ? cs : kc, own ? sn : kc + d / 2, tmp + warp * d,
                                  ks + jk * (d + 4));
            warp_store_row(vv, vs + jk * d, d);
            for (int j = jk + ATT_WARPS; j < end - tl; j += ATT_WARPS) launch_key(tl + j, j);  // more rows
        }
    }
    if (split == 0 && warp == ATT_WARPS - 1) {
        const size_t dst = (kv_slot(p, ring) * kv_heads + kvh) * d;
        warp_norm_rope(row + koff + kvh * d, k_norm, d, rope.rot_dim, eps, cs, sn, tmp + warp * d, ck + dst);
        warp_copy_row(row + voff + kvh * d, cv + dst, d);
    }
    __syncthreads();
    FD_MARK(3);

    // Warp h < G keeps head h's running max and sum of weights (the same in every lane); every
    // thread keeps, per head, its keys' share of the weighted value sum (acc[h][c]: dim 4l + c).
    float mx = NEG_INF, ls = 0.f, acc[8][4];
#pragma unroll
    for (int h = 0; h < 8; h++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[h][c] = 0.f;
    for (int t0 = beg; t0 < end; t0 += ATT_TILE) {
        const int nt = min(ATT_TILE, end - t0);
        next_slot = kv_slot_after(next_slot, ATT_TILE, ring);
        if (t0 + nt > p0) {
            // Keys of this launch's rows: normalised and rotated here (unless done beside the
            // queries, `early`), as the cache writer does, then picked up from shared memory into
            // the registers.
            for (int j = warp; j < nt && !early; j += ATT_WARPS)
                if (t0 + j >= p0) launch_key(t0 + j, j);
            __syncthreads();
#pragma unroll
            for (int q = 0; q < ATT_TILE / ATT_WARPS; q++) {
                const int j = warp + ATT_WARPS * q;
                if (j < nt && t0 + j >= p0 && 4 * lane < d) {
                    kr[q] = *reinterpret_cast<const float4*>(ks + j * (d + 4) + 4 * lane);
                    vr[q] = *reinterpret_cast<const float4*>(vs + j * d + 4 * lane);
                }
            }
        }
        FD_MARK(6);
        // Scores: this thread's four dims of the 8 heads × 4 keys, reduced over the lanes by a
        // fixed reduce-scatter butterfly that leaves lane l with the whole dot of head l / 4 and
        // key warp + 8 (l % 4). The first level pairs heads h and h + 4 as it forms them.
        float v[16];
#pragma unroll
        for (int hp = 0; hp < 4; hp++) {
            const bool on = 4 * lane < d;
            const float4 qa = on && hp < G ? *reinterpret_cast<const float4*>(qs + hp * d + 4 * lane)
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 qb = on && hp + 4 < G ? *reinterpret_cast<const float4*>(qs + (hp + 4) * d + 4 * lane)
                                               : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float a = qa.x * kr[q].x + qa.y * kr[q].y + qa.z * kr[q].z + qa.w * kr[q].w;
                const float b = qb.x * kr[q].x + qb.y * kr[q].y + qb.z * kr[q].z + qb.w * kr[q].w;
                const bool hi = lane & 16;
                v[hp * 4 + q] = (hi ? b : a) + __shfl_xor_sync(0xffffffffu, hi ? a : b, 16);
            }
        }
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) {
            const bool hi = lane & o;
#pragma unroll
            for (int i = 0; i < o; i++) v[i] = (hi ? v[i + o] : v[i]) + __shfl_xor_sync(0xffffffffu, hi ? v[i] : v[i + o], o);
        }
        {
            const int h = lane / 4, j = warp + ATT_WARPS * (lane % 4);
            if (h < G) sc[h * ATT_TILE + j] = j < nt ? v[0] * scale : NEG_INF;
        }
        if (t0 + ATT_TILE < end) fetch(kr, ck, t0 + ATT_TILE, next_slot);
        __syncthreads();
        // Softmax of the tile, online: warp h rescales head h's sums and turns scores into weights.
        if (warp < G) {
            const float s = sc[warp * ATT_TILE + lane];
            const float mn = fmaxf(mx, warp_max(s));
            const float cr = expf(mx - mn);  // 0 on the first tile (mx = -inf, mn finite)
            const float pj = lane < nt ? expf(s - mn) : 0.f;
            ls = ls * cr + warp_sum(pj);
            mx = mn;
            sc[warp * ATT_TILE + lane] = pj;
            if (lane == 0) corr[warp] = cr;
        }
        __syncthreads();
        FD_MARK(7);
#pragma unroll
        for (int h = 0; h < 8; h++) {
            if (h < G) {
                const float cr = corr[h];
#pragma unroll
                for (int c = 0; c < 4; c++) acc[h][c] *= cr;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float pj = sc[h * ATT_TILE + warp + ATT_WARPS * q];
                    acc[h][0] += pj * vr[q].x;
                    acc[h][1] += pj * vr[q].y;
                    acc[h][2] += pj * vr[q].z;
                    acc[h][3] += pj * vr[q].w;
                }
            }
        }
        if (t0 + ATT_TILE < end) {
            fetch(vr, cv, t0 + ATT_TILE, next_slot);
            __syncthreads();  // every warp has read this tile's weights before the next scores land
        }
    }

    // The heads' sums over the warps (each warp's keys), in warp order, through shared memory
    // (the tile's area: 8 · G · d floats fit in it).
    __syncthreads();
    float* red = ks;
    if (4 * lane < d) {
#pragma unroll
        for (int h = 0; h < 8; h++)
            if (h < G)
                *reinterpret_cast<float4*>(red + (warp * G + h) * d + 4 * lane) =
                    make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
    }
    __syncthreads();

    FD_MARK(4);
    const int pw = d + 2;
    if (warp < G && lane == 0) {
        float* pp = part + (((size_t)r * heads + kvh * G + warp) * ATT_SPLITS + split) * pw;
        pp[0] = mx;
        pp[1] = ls;
    }
    // Element (h, e) of the G·d, thread by thread as i = h·d + e; h and e are stepped, not divided
    // out of i (see kv_slot_after).
    for (int h = 0, e = threadIdx.x; h < G;) {
        if (e >= d) {
            e -= d;
            h++;
            continue;
        }
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += red[(w * G + h) * d + e];
        part[(((size_t)r * heads + kvh * G + h) * ATT_SPLITS + split) * pw + 2 + e] = o;
        e += ATT_WARPS * WARP;
    }
    if constexpr (!MERGE) return;
    const bool is_last = block_arrives_last(&counters[r * kv_heads + kvh], (unsigned int)used);
    FD_MARK(5);
    if (!is_last) return;
    if (warp < G) warp_merge_head(part, row + goff, r, heads, kvh * G + warp, used, d, out);
    if (threadIdx.x == 0) counters[r * kv_heads + kvh] = 0;
}

#define ATTEND_DECODE_ARGS                                                                                      \
    const float *__restrict__ qkvg, int width, const __nv_bfloat16 *__restrict__ q_norm,                        \
        const __nv_bfloat16 *__restrict__ k_norm, const int *__restrict__ pos, const float *__restrict__ inv_freq, \
        int rot_dim, float rope_scaling, float eps, float *__restrict__ ck, float *__restrict__ cv, int ring,     \
        int window, int heads, int kv_heads, int d, float *__restrict__ part, unsigned int *__restrict__ counters, \
        float *__restrict__ out
extern "C" __global__ void __launch_bounds__(256) attend_decode(ATTEND_DECODE_ARGS) {
    attend_decode_body<true>(qkvg, width, q_norm, k_norm, pos, inv_freq, rot_dim, rope_scaling, eps, ck, cv, ring,
                             window, heads, kv_heads, d, part, counters, out);
}
extern "C" __global__ void __launch_bounds__(256) attend_decode_parts(ATTEND_DECODE_ARGS) {
    attend_decode_body<false>(qkvg, width, q_norm, k_norm, pos, inv_freq, rot_dim, rope_scaling, eps, ck, cv, ring,
                              window, heads, kv_heads, d, part, counters, out);
}

// The merge of attend_decode_parts' splits: block (kv head, row), warp w < G merging head
// kvh·G + w with attend_decode's last block's code (warp_merge_head), so the same bits.
// grid: (kv heads, rows), block: 256.
extern "C" __global__ void __launch_bounds__(256) attend_merge(const float* __restrict__ qkvg, int width,
                                                               const int* __restrict__ pos, int window, int heads,
                                                               int kv_heads, int d, const float* __restrict__ part,
                                                               float* __restrict__ out) {
    FD_TRACE_KERNEL(12, 0);
    pdl_wait();
    const int kvh = blockIdx.x, r = blockIdx.y, warp = threadIdx.x / WARP, G = heads / kv_heads;
    if (warp >= G) return;
    const int h = kvh * G + warp;
    warp_merge_head(after_wait(part), qkvg + (size_t)r * width + heads * d + 2 * kv_heads * d, r, heads, h,
                    att_splits(pos[r], window).used(), d, out);
}
