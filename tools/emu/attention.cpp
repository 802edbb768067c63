// Driver for tools/emu/run.py attention: decode attention (attend_decode; attend_decode_parts and
// attend_merge, a verify block's pair) launched as ops.rs launches them, over a KV cache of
// random earlier keys. A K-row launch at positions p0 .. p0 + K - 1 must give each row the bits
// of K one-row launches in turn (each writing its own key and value into the cache, as serial
// decoding does), and leave the same cache and every counter reset; full and
// sliding windows, windows within one tile and across several splits. The prefill's
// qk_norm_rope_store writes the same keys and values. Exit status 0 when all hold.
#include "driver.h"

namespace emu_driver {

constexpr int HEADS = 8, KVH = 2, D = 64, ROT = 32, RING = 128, SPLITS = 32;
constexpr int WIDTH = HEADS * D + 2 * KVH * D + HEADS;
constexpr int SHARED = (HEADS / KVH * D + 32 * (D + 4) + 32 * D + 2 * 8 * D + D + 8 * 32 + 8) * 4;

struct Model {
    std::vector<__nv_bfloat16> q_norm, k_norm;
    std::vector<float> inv_freq;
};

struct State {
    std::vector<float> ck, cv, out;
};

using Decode = void (*)(const float*, int, const __nv_bfloat16*, const __nv_bfloat16*, const int*, const float*, int,
                        float, float, float*, float*, int, int, int, int, int, float*, unsigned int*, float*);

// One launch of `rows` rows of qkvg at positions pos, as ops.rs's attend_decode makes it: several
// rows leave their splits' partials for attend_merge, one row's last block merges them.
void launch(const Model& m, const float* qkvg, const std::vector<int>& pos, int window, State& s, float* out) {
    const int rows = (int)pos.size();
    const bool apart = rows > 1;
    std::vector<float> part((size_t)rows * HEADS * SPLITS * (D + 2), 0.f);
    std::vector<unsigned int> counters((size_t)rows * KVH, 0);
    const Decode k = apart ? attend_decode_parts : attend_decode;
    emu_launch(KVH, 256, [&] {
        k(qkvg, WIDTH, m.q_norm.data(), m.k_norm.data(), pos.data(), m.inv_freq.data(), ROT, 1.f, 1e-6f, s.ck.data(),
          s.cv.data(), RING, window, HEADS, KVH, D, part.data(), counters.data(), out);
    }, 1, rows, SPLITS);
    if (apart)
        emu_launch(KVH, 256, [&] { attend_merge(qkvg, WIDTH, pos.data(), window, HEADS, KVH, D, part.data(), out); }, 1,
                   rows);
    for (unsigned int c : counters)
        if (c != 0) {
            std::printf("FAIL attention: a counter left at %u\n", c);
            std::exit(1);
        }
}

int check() {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Model m;
    m.q_norm.resize(D);
    m.k_norm.resize(D);
    for (auto& v : m.q_norm) v = __float2bfloat16_rn(1.f + 0.3f * u(rng));
    for (auto& v : m.k_norm) v = __float2bfloat16_rn(1.f + 0.3f * u(rng));
    for (int i = 0; i < ROT / 2; i++) m.inv_freq.push_back(std::pow(10000.f, -2.f * i / ROT));
    int failures = 0;
    // (first position, window): keys in one tile; in several splits; a sliding window whose
    // slots wrap around the ring, and one whose start moves within the launch.
    const int cases[][2] = {{5, 0}, {70, 0}, {150, 40}, {100, 64}};
    for (const auto& c : cases) {
        const int p0 = c[0], window = c[1];
        State init;
        init.ck.resize((size_t)RING * KVH * D);
        init.cv.resize((size_t)RING * KVH * D);
        for (auto& v : init.ck) v = u(rng);
        for (auto& v : init.cv) v = u(rng);
        for (int rows : {1, 3, 8}) {
            std::vector<float> qkvg((size_t)rows * WIDTH);
            for (auto& v : qkvg) v = 2.f * u(rng);
            // Serial: one row after another, each writing its key into the cache.
            State serial = init;
            serial.out.assign((size_t)rows * HEADS * D, 0.f);
            for (int r = 0; r < rows; r++)
                launch(m, qkvg.data() + (size_t)r * WIDTH, {p0 + r}, window, serial,
                       serial.out.data() + (size_t)r * HEADS * D);
            std::vector<int> pos(rows);
            for (int r = 0; r < rows; r++) pos[r] = p0 + r;
            {
                State s = init;
                s.out.assign((size_t)rows * HEADS * D, 0.f);
                launch(m, qkvg.data(), pos, window, s, s.out.data());
                if (s.out != serial.out || s.ck != serial.ck || s.cv != serial.cv) {
                    std::printf("FAIL p0 %d window %d rows %d: differs from %d one-row launches\n", p0, window, rows,
                                rows);
                    failures++;
                }
            }
            // The prefill's cache writes (qk_norm_rope_store) are the decode's, bit for bit.
            {
                State pre = init;
                std::vector<float> q_out((size_t)rows * HEADS * D);
                emu_launch((HEADS + KVH + 7) / 8, 256, [&] {
                    qk_norm_rope_store(qkvg.data(), WIDTH, m.q_norm.data(), m.k_norm.data(), pos.data(),
                                       m.inv_freq.data(), ROT, 1.f, 1e-6f, HEADS, KVH, D, RING, q_out.data(),
                                       pre.ck.data(), pre.cv.data());
                }, 1, rows);
                if (pre.ck != serial.ck || pre.cv != serial.cv) {
                    std::printf("FAIL p0 %d rows %d: qk_norm_rope_store writes other keys or values\n", p0, rows);
                    failures++;
                }
            }
            // Every output is a number (a convex mix of the values, gated).
            for (float v : serial.out)
                if (!std::isfinite(v)) {
                    std::printf("FAIL p0 %d window %d rows %d: a non-finite output\n", p0, window, rows);
                    failures++;
                    break;
                }
        }
        std::printf("p0 %d window %d: rows 1, 3, 8 checked against serial launches, prefill's cache writes\n",
                    p0, window);
    }
    return report(failures);
}

}  // namespace emu_driver
