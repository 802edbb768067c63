// The persistent toy (tools/emu/persistent_toy.cu) on a real GPU: what the emulator cannot check.
// The emulator runs the toy's own code grid-resident in random orders, but every load there sees
// every store at once; here the same kernel runs on the GPU, where a missing acquire, a release
// before the writes or a stale L1 line would give a wrong output. Then it times chains of
// hand-offs: ops of one tile each, consecutive ops on different SMs (every hand-off a release on
// one SM and an acquire-poll on another) or all on one block, so the cost of one hand-off of the
// counters the persistent step will wait on is measured, not assumed.
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

// A toy's shapes and queues (persistent_toy.cu's layout), its device copies, and the host's answer.
struct Toy {
    int ops = 0, grid = 0;
    std::vector<int> shape, w_off, x_off, queue, queue_start;
    std::vector<unsigned> weights, x;
    unsigned base = 0;
    int next_step = 0;  // counters are never reset: each launch is the next step
    unsigned *d_weights = nullptr, *d_x = nullptr, *d_done = nullptr;
    int *d_shape = nullptr, *d_w_off = nullptr, *d_x_off = nullptr, *d_queue = nullptr, *d_queue_start = nullptr;

    // `widths` (ops + 1 of them), `rows` per tile of each op, each tile dealt by `deal(op, tile)`.
    template <typename Deal>
    Toy(std::mt19937& rng, int grid_, const std::vector<int>& width, const std::vector<int>& rows, Deal deal)
        : ops((int)rows.size()), grid(grid_) {
        std::vector<std::vector<int>> queues(grid);
        int w_total = 0, x_total = width[0];
        x_off.push_back(0);
        for (int i = 0; i < ops; i++) {
            const int in = width[i], out = width[i + 1], tiles = (out + rows[i] - 1) / rows[i];
            shape.insert(shape.end(), {in, out, rows[i], tiles});
            w_off.push_back(w_total);
            w_total += in * out;
            x_off.push_back(x_total);
            x_total += out;
            for (int t = 0; t < tiles; t++) queues[deal(i, t) % grid].push_back(i << 16 | t);
        }
        weights.resize(w_total);
        for (auto& w : weights) w = rng();
        x.assign(x_total, 0xdeadbeefu);
        queue_start.push_back(0);
        for (auto& q : queues) {
            queue.insert(queue.end(), q.begin(), q.end());
            queue_start.push_back((int)queue.size());
        }
        base = rng() % 2 ? (unsigned)rng() : 0u - (unsigned)(rng() % 64);  // near 2^32: the targets wrap
        d_weights = upload(weights), d_x = upload(x), d_done = upload(std::vector<unsigned>(ops, base));
        d_shape = upload(shape), d_w_off = upload(w_off), d_x_off = upload(x_off);
        d_queue = upload(queue), d_queue_start = upload(queue_start);
    }

    void launch() {
        toy_persistent_step<<<grid, 32 * (1 + TOY_COMPUTE_WARPS)>>>(d_weights, d_shape, d_w_off, d_x_off, d_x, d_done,
                                                                     d_queue, d_queue_start, next_step++, base,
                                                                     TOY_BUG_NONE);
    }

    // The next step on input `in`: whether every op's output is the host's.
    bool step(const std::vector<unsigned>& in) {
        CHECK(cudaMemcpy(d_x, in.data(), in.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
        launch();
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(x.data(), d_x, x.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
        std::vector<unsigned> xi = in;
        bool ok = true;
        for (int i = 0; i < ops; i++) {
            const int n_in = shape[4 * i], n_out = shape[4 * i + 1];
            std::vector<unsigned> xo(n_out);
            for (int j = 0; j < n_out; j++) {
                unsigned acc = 0;
                for (int k = 0; k < n_in; k++) acc += weights[w_off[i] + (size_t)j * n_in + k] * xi[k];
                xo[j] = acc + (unsigned)(j + i);
                ok &= x[x_off[i + 1] + j] == xo[j];
            }
            xi = xo;
        }
        return ok;
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
    // Random shapes on grids up to every SM: every step's output the host's.
    int items = 0, steps = 0;
    for (int seed = 0; seed < 200; seed++) {
        std::mt19937 rng(seed);
        const int grid = 1 + rng() % sms, ops = 2 + rng() % 6;
        std::vector<int> width(ops + 1), rows(ops);
        for (int& w : width) w = 1 + rng() % 80;
        for (int i = 0; i < ops; i++) rows[i] = 1 + rng() % std::min(width[i + 1], TOY_PAGE_WORDS / width[i]);
        Toy toy(rng, grid, width, rows, [&](int, int) { return (int)(rng() % 65536); });
        if (!resident(grid)) continue;
        for (int s = 0; s < 4; s++) {
            std::vector<unsigned> in(width[0]);
            for (auto& v : in) v = rng();
            if (!toy.step(in)) {
                std::printf("FAIL seed %d step %d (grid %d, %d ops)\n", seed, s, grid, ops);
                failures++;
            }
            steps++;
        }
        items += (int)toy.queue.size();
    }
    std::printf("random toys: %d steps, %d items a step summed, %d wrong\n", steps, items, failures);

    // Chains of one-tile ops (16 wide): each op's tile on the next SM's block, or all on block 0.
    // The difference over the ops is what one hand-off between SMs adds to a chain.
    const int chain = 256;
    std::vector<int> width(chain + 1, 16), rows(chain, 16);
    std::mt19937 rng(1);
    Toy across(rng, std::min(sms, chain), width, rows, [](int op, int) { return op; });
    Toy within(rng, 1, width, rows, [](int, int) { return 0; });
    for (Toy* t : {&across, &within}) {
        std::vector<unsigned> in(16, 3);
        if (!t->step(in)) {
            std::printf("FAIL chain on %d blocks\n", t->grid);
            failures++;
        }
    }
    const double us_across = step_us(across, 51), us_within = step_us(within, 51);
    std::printf("chain of %d ops: %.1f us across %d SMs, %.1f us on one block\n", chain, us_across, across.grid,
                us_within);
    std::printf("{\"chain_ops\": %d, \"across_us\": %.2f, \"within_us\": %.2f, \"per_handoff_across_us\": %.3f, "
                "\"per_op_within_us\": %.3f, \"failures\": %d}\n",
                chain, us_across, us_within, us_across / chain, us_within / chain, failures);
    return failures ? 1 : 0;
}
