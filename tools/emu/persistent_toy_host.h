// The host side of the persistent toy (tools/emu/persistent_toy.cu), shared by its two drivers:
// tools/emu/persistent.cpp (the emulator, grid-resident, g++) and tools/gpu/persistent_toy.cu
// (a real GPU, nvcc). A toy's layout in the kernel's arrays, and the host's answer to a step.
#pragma once

#include <algorithm>
#include <random>
#include <vector>

struct ToyLayout {
    int ops = 0, grid = 0;
    std::vector<int> shape, w_off, x_off, queue, queue_start;
    std::vector<unsigned> weights, x;
    unsigned base = 0;  // the counters' start (near 2^32 half the time: the targets wrap)

    // `width` (ops + 1 of them), `rows` per tile of each op, tile t of op i dealt to block
    // deal(i, t) % grid (each block's queue in op order).
    template <typename Deal>
    ToyLayout(std::mt19937& rng, int grid_, const std::vector<int>& width, const std::vector<int>& rows, Deal deal)
        : ops((int)rows.size()), grid(grid_) {
        std::vector<std::vector<int>> queues(grid);
        int w_total = 0, x_total = width[0];
        x_off.push_back(0);
        for (int i = 0; i < ops; i++) {
            const int in = width[i], out = width[i + 1], tiles = (out + rows[i] - 1) / rows[i];
            shape.insert(shape.end(), {in, out, rows[i], tiles});
            w_off.push_back(w_total);
            w_total += toy_row_words(in) * out;
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
        base = rng() % 2 ? (unsigned)rng() : 0u - (unsigned)(rng() % 64);
    }

    // Whether `x` (after a step on input `in`) holds every op's output as the host computes it.
    bool outputs_right(const std::vector<unsigned>& in) const {
        std::vector<unsigned> xi = in;
        bool ok = true;
        for (int i = 0; i < ops; i++) {
            const int n_in = shape[4 * i], n_out = shape[4 * i + 1];
            std::vector<unsigned> xo(n_out);
            for (int j = 0; j < n_out; j++) {
                unsigned acc = 0;
                for (int k = 0; k < n_in; k++) acc += weights[w_off[i] + (size_t)j * toy_row_words(n_in) + k] * xi[k];
                xo[j] = acc + (unsigned)(j + i);
                ok &= x[x_off[i + 1] + j] == xo[j];
            }
            xi = xo;
        }
        return ok;
    }
};

// Random widths (1 to 80) of `ops` ops and rows per tile that fit a page.
inline void toy_random_shape(std::mt19937& rng, int ops, std::vector<int>& width, std::vector<int>& rows) {
    width.resize(ops + 1);
    rows.resize(ops);
    for (int& w : width) w = 1 + rng() % 80;
    for (int i = 0; i < ops; i++) rows[i] = 1 + rng() % std::min(width[i + 1], TOY_PAGE_WORDS / toy_row_words(width[i]));
}
