// The persistent toy (tools/emu/persistent_toy.cu) on a real GPU: what the emulator cannot check.
// The emulator runs the toy's own code grid-resident in random orders, but every load there sees
// every store at once; here the same kernel runs on the GPU, with either ring (page flags and the
// loader's stores, or page barriers and bulk copies), where a missing acquire, a release before
// the writes, a stale L1 line or a wrong expected byte count would give a wrong output (or a
// hang). Then it times chains of hand-offs: ops of one tile each, consecutive ops on different
// SMs (every hand-off a release on one SM and an acquire-poll on another) or all on one block, so
// the cost of one hand-off of the counters the persistent step will wait on is measured, not
// assumed.
//
// On the GPU machine (nvcc there, no cargo):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/toy tools/gpu/persistent_toy.cu && /tmp/toy
// Prints one line per check and a JSON line of the timings; exit status 0 when every output is
// the host's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../../crates/cuda/kernels/common.cuh"
#include "../emu/persistent_toy.cu"
#include "../emu/persistent_toy_host.h"

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(2);                                                                \
        }                                                                                \
    } while (0)

template <typename T>
T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// A toy (persistent_toy_host.h's layout and answer), its ring and its device copies.
struct Toy : ToyLayout {
    int bulk;           // the ring: bulk copies on page barriers (1) or page flags (0)
    int next_step = 0;  // counters are never reset: each launch is the next step
    unsigned *d_weights = nullptr, *d_x = nullptr, *d_done = nullptr;
    int *d_shape = nullptr, *d_w_off = nullptr, *d_x_off = nullptr, *d_queue = nullptr, *d_queue_start = nullptr;

    template <typename Deal>
    Toy(std::mt19937& rng, int grid_, const std::vector<int>& width, const std::vector<int>& rows, Deal deal,
        int bulk_)
        : ToyLayout(rng, grid_, width, rows, deal), bulk(bulk_) {
        d_weights = upload(weights), d_x = upload(x), d_done = upload(std::vector<unsigned>(ops, base));
        d_shape = upload(shape), d_w_off = upload(w_off), d_x_off = upload(x_off);
        d_queue = upload(queue), d_queue_start = upload(queue_start);
    }

    void launch() {
        toy_persistent_step<<<grid, 32 * (1 + TOY_COMPUTE_WARPS)>>>(d_weights, d_shape, d_w_off, d_x_off, d_x, d_done,
                                                                     d_queue, d_queue_start, next_step++, base,
                                                                     TOY_BUG_NONE, bulk);
    }

    // The next step on input `in`: whether every op's output is the host's.
    bool step(const std::vector<unsigned>& in) {
        CHECK(cudaMemcpy(d_x, in.data(), in.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
        launch();
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(x.data(), d_x, x.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
        return outputs_right(in);
    }
};

// Whether `grid` blocks of the toy fit on the GPU at once (its waits need them all resident).
bool resident(int grid) {
    int per_sm = 0, sms = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, toy_persistent_step, 32 * (1 + TOY_COMPUTE_WARPS), 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return grid <= per_sm * sms;
}

// Microseconds a step of `toy` takes (the median of `reps` launches timed one by one).
double step_us(Toy& toy, int reps) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        CHECK(cudaEventRecord(a));
        toy.launch();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
}

int main() {
    int failures = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // Random shapes on grids up to every SM, with either ring: every step's output the host's.
    for (int bulk = 0; bulk < 2; bulk++) {
        int items = 0, steps = 0, wrong = 0;
        for (int seed = 0; seed < 200; seed++) {
            std::mt19937 rng(seed);
            const int grid = 1 + rng() % sms, ops = 2 + rng() % 6;
            std::vector<int> width, rows;
            toy_random_shape(rng, ops, width, rows);
            Toy toy(rng, grid, width, rows, [&](int, int) { return (int)(rng() % 65536); }, bulk);
            if (!resident(grid)) continue;
            for (int s = 0; s < 4; s++) {
                std::vector<unsigned> in(width[0]);
                for (auto& v : in) v = rng();
                if (!toy.step(in)) {
                    std::printf("FAIL %s ring seed %d step %d (grid %d, %d ops)\n", bulk ? "bulk" : "flag", seed, s,
                                grid, ops);
                    wrong++;
                }
                steps++;
            }
            items += (int)toy.queue.size();
        }
        std::printf("random toys, %s ring: %d steps, %d items a step summed, %d wrong\n", bulk ? "bulk" : "flag", steps,
                    items, wrong);
        failures += wrong;
    }

    // Chains of one-tile ops: each op's tile on the next SM's block, or all on block 0. The
    // difference over the ops is what one hand-off between SMs adds to a chain; the one-block
    // figure is the op itself. 16 wide: each compute warp walks 5-6 rows, an L2 read of x each;
    // 3 wide: one row a compute warp, the least an op does (wait, one L2 read, store, release).
    // Each with either ring (the keys of the bulk ring's end in _bulk).
    const int chain = 256;
    std::printf("{");
    for (int bulk = 0; bulk < 2; bulk++) {
        for (int wide : {16, 3}) {
            std::vector<int> width(chain + 1, wide), rows(chain, wide);
            std::mt19937 rng(1);
            Toy across(rng, std::min(sms, chain), width, rows, [](int op, int) { return op; }, bulk);
            Toy within(rng, 1, width, rows, [](int, int) { return 0; }, bulk);
            for (Toy* t : {&across, &within}) {
                std::vector<unsigned> in(wide, 3);
                if (!t->step(in)) {
                    std::printf("FAIL chain %d wide on %d blocks, %s ring\n", wide, t->grid, bulk ? "bulk" : "flag");
                    failures++;
                }
            }
            const double us_across = step_us(across, 51), us_within = step_us(within, 51);
            std::printf("\"wide_%d%s\": {\"chain_ops\": %d, \"across_us\": %.2f, \"within_us\": %.2f, "
                        "\"per_op_across_us\": %.3f, \"per_op_within_us\": %.3f}, ",
                        wide, bulk ? "_bulk" : "", chain, us_across, us_within, us_across / chain, us_within / chain);
        }
    }
    std::printf("\"failures\": %d}\n", failures);
    return failures ? 1 : 0;
}
