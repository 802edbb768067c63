// Driver for tools/emu/run.py moe: the router and the expert GEMVs (f32 and tensor-core) on a
// small MoE shape, launched as ops.rs launches them. For launches of 1, 3 and 8 rows: each row's
// router outputs (xn, logits, experts, weights), gate/up h and down x are the bits of its one-row
// launch, every router counter is reset, the tensor-core kernels (gate/up mma2, down)
// agree with the f32 ones to within 1e-4 of the largest value, and the prefill's router_topk
// picks the router's experts and weights from its logits, bit for bit. Exit status 0 when all
// hold.
#include "driver.h"

namespace emu_driver {

constexpr int H = 512, E = 16, K = 4, I = 64, IS = 128, SW = I > IS ? I : IS;

struct Weights {
    std::vector<__nv_bfloat16> norm, router;
    std::vector<float> bias;
    Nvfp4 gate, up, down, sgate, sup, sdown;
};

struct Out {
    std::vector<float> xn, logits, wts, h_f32, h_mma, x_f32, x_mma, topk_wts;
    std::vector<int> ids, topk_ids;
};

Out run(const Weights& w, const std::vector<float>& x, int rows) {
    Out o;
    o.xn.assign((size_t)rows * H, 0.f);
    o.logits.assign((size_t)rows * E, 0.f);
    o.ids.assign((size_t)rows * K, 0);
    o.wts.assign((size_t)rows * K, 0.f);
    std::vector<unsigned int> counter(rows, 0);
    emu_launch(2, 256, [&] {
        router(x.data(), w.norm.data(), 1e-6f, w.router.data(), w.bias.data(), o.xn.data(), o.logits.data(),
               o.ids.data(), o.wts.data(), counter.data(), E, H, K, 1, 0.f);
    }, 1, rows);
    for (unsigned int c : counter)
        if (c != 0) {
            std::printf("FAIL router: a row's counter left at %u\n", c);
            std::exit(1);
        }
    // The prefill's router on the same logits (the decode router's selection code).
    o.topk_ids.assign((size_t)rows * K, -1);
    o.topk_wts.assign((size_t)rows * K, NAN);
    emu_launch(rows, 256, [&] {
        router_topk(o.logits.data(), w.bias.data(), o.topk_ids.data(), o.topk_wts.data(), E, K, 1, 0.f, rows);
    });
    // gate/up, f32 (OB = 4 outputs per block) and tensor-core (mma2: 16 outputs, a warp per 256 columns).
    o.h_f32.assign((size_t)rows * (K + 1) * SW, 0.f);
    o.h_mma = o.h_f32;
    emu_launch((SW + 3) / 4, 32 * ((H / 32 + 31) / 32), [&] {
        moe_gate_up(o.xn.data(), o.ids.data(), w.gate.codes.data(), w.gate.scales.data(), w.up.codes.data(),
                    w.up.scales.data(), w.sgate.codes.data(), w.sgate.scales.data(), w.sup.codes.data(),
                    w.sup.scales.data(), o.h_f32.data(), H, I, IS, K);
    }, 1, K + 1, rows);
    emu_launch(SW / 16, 32 * ((H + 255) / 256), [&] {
        moe_gate_up_mma2(o.xn.data(), o.ids.data(), w.gate.codes.data(), w.gate.scales.data(), w.up.codes.data(),
                         w.up.scales.data(), w.sgate.codes.data(), w.sgate.scales.data(), w.sup.codes.data(),
                         w.sup.scales.data(), o.h_mma.data(), H, I, IS, K);
    }, 1, K + 1, rows);
    // down onto the residual x, f32 (8 outputs per block) and tensor-core (a warp per slot and
    // 512 columns of h).
    o.x_f32 = x;
    o.x_mma = x;
    const int t = K * I / 32 + IS / 32;
    emu_launch((H + 7) / 8, 32 * ((t + 31) / 32), [&] {
        moe_down(o.h_f32.data(), o.ids.data(), o.wts.data(), w.down.codes.data(), w.down.scales.data(),
                 w.sdown.codes.data(), w.sdown.scales.data(), o.x_f32.data(), H, I, IS, K, 2.5f);
    }, 1, rows);
    const int warps = (K + 1) * ((SW + 511) / 512);
    emu_launch((H + 15) / 16, 32 * warps, [&] {
        moe_down_mma4(o.h_mma.data(), o.ids.data(), o.wts.data(), w.down.codes.data(), w.down.scales.data(),
                      w.sdown.codes.data(), w.sdown.scales.data(), o.x_mma.data(), H, I, IS, K, 2.5f);
    }, 1, rows);
    return o;
}

template <typename T>
bool same_row(const std::vector<T>& all, const std::vector<T>& one, int r) {
    return std::memcmp(all.data() + r * one.size(), one.data(), sizeof(T) * one.size()) == 0;
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float f : v) m = std::max(m, (double)std::abs(f));
    return m;
}

int check() {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Weights w;
    w.norm.resize(H);
    for (auto& v : w.norm) v = __float2bfloat16_rn(1.f + 0.3f * u(rng));
    w.router.resize((size_t)E * H);
    for (auto& v : w.router) v = __float2bfloat16_rn(0.2f * u(rng));
    w.bias.resize(E);
    for (auto& v : w.bias) v = 0.01f * u(rng);
    w.gate = random_nvfp4(rng, E * I, H);
    w.up = random_nvfp4(rng, E * I, H);
    w.down = random_nvfp4(rng, E * H, I);
    w.sgate = random_nvfp4(rng, IS, H);
    w.sup = random_nvfp4(rng, IS, H);
    w.sdown = random_nvfp4(rng, H, IS);
    int failures = 0;
    for (int rows : {1, 3, 8}) {
        std::vector<float> x((size_t)rows * H);
        for (auto& v : x) v = 2.f * u(rng);
        const Out all = run(w, x, rows);
        // The tensor-core kernels against the f32 ones.
        const double hs = max_abs(all.h_f32), xs = max_abs(all.x_f32);
        double dh = 0, dx = 0;
        for (size_t i = 0; i < all.h_f32.size(); i++)
            dh = std::max(dh, (double)std::abs(all.h_f32[i] - all.h_mma[i]));
        for (size_t i = 0; i < all.x_f32.size(); i++) dx = std::max(dx, (double)std::abs(all.x_f32[i] - all.x_mma[i]));
        if (dh > 1e-4 * hs || dx > 1e-4 * xs) {
            std::printf("FAIL rows %d: tensor-core against f32: h off by %g (largest %g), x by %g (largest %g)\n", rows,
                        dh, hs, dx, xs);
            failures++;
        }
        if (all.topk_ids != all.ids || all.topk_wts != all.wts) {
            std::printf("FAIL rows %d: router_topk chose otherwise than the router\n", rows);
            failures++;
        }
        for (int r = 0; r < rows && rows > 1; r++) {
            const Out one = run(w, row_of(x, r, H), 1);
            const bool ok = same_row(all.xn, one.xn, r) && same_row(all.logits, one.logits, r) &&
                            same_row(all.ids, one.ids, r) && same_row(all.wts, one.wts, r) &&
                            same_row(all.h_f32, one.h_f32, r) && same_row(all.h_mma, one.h_mma, r) &&
                            same_row(all.x_f32, one.x_f32, r) && same_row(all.x_mma, one.x_mma, r);
            if (!ok) {
                std::printf("FAIL rows %d: row %d differs from its one-row launch\n", rows, r);
                failures++;
            }
        }
        std::printf("rows %d: router, gate/up and down (f32 and tensor-core) checked\n", rows);
    }
    return report(failures);
}

}  // namespace emu_driver
