// A toy persistent kernel (issue 44), built on common.cuh's counters and page rings the way the
// persistent decode step will be: one block per SM walking its own queue of (op, tile) items; a
// loader warp filling a ring of TOY_PAGES shared-memory pages with the next items' weights while
// TOY_COMPUTE_WARPS compute warps wait for each page to be full and for the item's dependency
// counter, compute, write their outputs and release the counter. Two rings: page flags with the
// loader's lanes storing the words (`bulk` 0), or page barriers with a bulk copy a tile row
// (`bulk` 1, the production step's). Not a backend module (nvrtc.rs
// does not load it): tools/emu/persistent.cpp runs it grid-resident in the emulator against a
// host computation, and tools/gpu/nvrtc_cubin.py compiles it for sm_90 with NVRTC (common.cuh
// prepended, as the modules), so the helpers' inline PTX is assembled.
//
// The work: op i maps x_i (in_i words) to x_{i+1} (out_i = in_{i+1} words), x_{i+1}[j] =
// Σ_k W_i[j][k]·x_i[k] + j + i in wrapping 32-bit integers (exact, so any wrong read shows);
// its tiles are tile_i consecutive rows of W_i (the last may be short), a page each; a row is
// stored in toy_row_words(in_i) words (the bulk copies' 16-byte multiples). Item (i, t)
// reads all of x_i, so it waits for every tile of op i - 1: each compute warp adds 1 to done[i]
// per tile of op i it finishes, and step s (counters are never reset; they start at `base`)
// waits for done[i - 1] to reach base + (s + 1)·tiles_{i-1}·TOY_COMPUTE_WARPS.
#define TOY_COMPUTE_WARPS 3
#define TOY_PAGES 3
#define TOY_PAGE_WORDS 512  // a tile's weights: tile_i · toy_row_words(in_i) words at most

// The words a row of W_i takes in memory and in a page: in_i rounded up to 4 (16 bytes).
__host__ __device__ constexpr int toy_row_words(int in) { return (in + 3) & ~3; }

// Deliberate bugs for the emulator's negative tests (tools/emu/persistent.cpp): what a toy launch
// leaves out or gets wrong.
#define TOY_BUG_NONE 0
#define TOY_BUG_NO_RELEASE 1     // tile 0 of op 0 never releases its counter
#define TOY_BUG_NO_DEP_WAIT 2    // compute warps read x_i without waiting for op i - 1
#define TOY_BUG_TARGET_LOW 3     // the dependency target one short
#define TOY_BUG_TARGET_HIGH 4    // the dependency target one past
#define TOY_BUG_NO_FULL_WAIT 5   // compute warps read a page without waiting for it to be full
#define TOY_BUG_NO_EMPTY_WAIT 6  // the loader refills a page without waiting for it to be empty
#define TOY_BUG_EXPECT_HIGH 7    // bulk: the loader expects 16 bytes more than a tile's copies bring

// shape: 4 ints per op (in, out, tile rows, tiles); w_off[i]: op i's weights in `weights`;
// x_off[i]: x_i in `x` (x_0 is the step's input); queue[queue_start[b] .. queue_start[b + 1]):
// block b's items, op << 16 | tile, in op order (a block's items of op i come before its items
// of op i + 1, so every wait is for work queued before it somewhere: no deadlock).
extern "C" __global__ void __launch_bounds__(32 * (1 + TOY_COMPUTE_WARPS))
    toy_persistent_step(const unsigned* __restrict__ weights, const int* __restrict__ shape,
                        const int* __restrict__ w_off, const int* __restrict__ x_off, unsigned* x, unsigned* done,
                        const int* __restrict__ queue, const int* __restrict__ queue_start, int step, unsigned base,
                        int bug, int bulk) {
    __shared__ __align__(16) unsigned page[TOY_PAGES][TOY_PAGE_WORDS];
    __shared__ unsigned full[TOY_PAGES], empty[TOY_PAGES];  // flags: monotonic within the launch
    __shared__ unsigned long long full_bar[TOY_PAGES], empty_bar[TOY_PAGES];  // bulk: use u is phase u
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (threadIdx.x < TOY_PAGES) {  // shared memory starts undefined
        full[threadIdx.x] = empty[threadIdx.x] = 0;
        if (bulk) {
            page_barrier_init(&full_bar[threadIdx.x], 1);
            page_barrier_init(&empty_bar[threadIdx.x], TOY_COMPUTE_WARPS);
        }
    }
    __syncthreads();
    const int first = queue_start[blockIdx.x], items = queue_start[blockIdx.x + 1] - first;
    if (warp == 0) {
        // The loader: item k into page k % TOY_PAGES, once every compute warp released that page's
        // previous use (item k - TOY_PAGES).
        for (int k = 0; k < items; k++) {
            const int p = k % TOY_PAGES, use = k / TOY_PAGES;
            const int op = queue[first + k] >> 16, tile = queue[first + k] & 0xffff;
            const int in = shape[4 * op], out = shape[4 * op + 1], rows0 = shape[4 * op + 2];
            const int rows = min(rows0, out - tile * rows0), row_words = toy_row_words(in);
            const unsigned* w = weights + w_off[op] + (size_t)tile * rows0 * row_words;
            if (bulk) {
                // Every lane waits for the page's previous use to be released, then lane 0 expects
                // the tile's bytes and each lane copies its rows (the warp together, as
                // tools/gpu/stream_ring.py measured it).
                if (use > 0 && bug != TOY_BUG_NO_EMPTY_WAIT) page_barrier_wait_parity(&empty_bar[p], (use - 1) & 1);
                const unsigned row_bytes = 4 * row_words;
                if (lane == 0)
                    page_barrier_arrive_expect_bytes(&full_bar[p], rows * row_bytes + (bug == TOY_BUG_EXPECT_HIGH ? 16 : 0));
                __syncwarp();
                for (int r = lane; r < rows; r += WARP)
                    page_bulk_load(&page[p][r * row_words], w + r * row_words, row_bytes, &full_bar[p]);
                continue;
            }
            if (bug != TOY_BUG_NO_EMPTY_WAIT) warp_page_flag_wait_at_least(&empty[p], use * TOY_COMPUTE_WARPS);
            for (int e = lane; e < rows * row_words; e += WARP) page[p][e] = w[e];
            warp_page_flag_release_add(&full[p], 1);
        }
        return;
    }
    const int cw = warp - 1;  // this compute warp
    for (int k = 0; k < items; k++) {
        const int p = k % TOY_PAGES, use = k / TOY_PAGES;
        const int op = queue[first + k] >> 16, tile = queue[first + k] & 0xffff;
        const int in = shape[4 * op], out = shape[4 * op + 1], rows0 = shape[4 * op + 2];
        const int rows = min(rows0, out - tile * rows0), row_words = toy_row_words(in);
        if (bug != TOY_BUG_NO_FULL_WAIT) {
            if (bulk)
                page_barrier_wait_parity(&full_bar[p], use & 1);  // every lane: each acquires the bytes it reads
            else
                warp_page_flag_wait_at_least(&full[p], use + 1);
        }
        if (op > 0 && bug != TOY_BUG_NO_DEP_WAIT) {
            unsigned target = base + (unsigned)(step + 1) * shape[4 * (op - 1) + 3] * TOY_COMPUTE_WARPS;
            target += bug == TOY_BUG_TARGET_LOW ? -1 : bug == TOY_BUG_TARGET_HIGH ? 1 : 0;
            warp_counter_wait_at_least(&done[op - 1], target);
        }
        // x_i was written by other SMs in this launch: read at L2 (__ldcg), after the wait.
        const unsigned* xi = x + x_off[op];
        unsigned* xo = x + x_off[op + 1];
        for (int r = cw; r < rows; r += TOY_COMPUTE_WARPS) {
            unsigned s = 0;
            for (int c = lane; c < in; c += WARP) s += page[p][r * row_words + c] * __ldcg(xi + c);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            const int j = tile * rows0 + r;
            if (lane == 0) xo[j] = s + (unsigned)(j + op);
        }
        // Its last reads of the page are done.
        if (bulk) {
            __syncwarp();
            if (lane == 0) page_barrier_arrive(&empty_bar[p]);
        } else {
            warp_page_flag_release_add(&empty[p], 1);
        }
        if (!(bug == TOY_BUG_NO_RELEASE && op == 0 && tile == 0)) warp_counter_release_add(&done[op], 1);
    }
}
