// Driver for tools/emu/run.py dense: the row kernels around the GEMVs. argmax_rows picks the
// lowest index of the largest logit (ties inside a warp, across warps and across the 1024-wide
// stride; a row of -inf and one of NaN give 0; vocabularies not a multiple of 1024);
// rms_norm_rows is w · (x · inv_rms) within 1e-6 of double precision, cycling its W weight
// vectors; embed_rows, silu_mul and copy_taps move and combine exactly what they say. Exit
// status 0 when all hold.
#include "driver.h"

namespace emu_driver {

int check_argmax(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    int failures = 0;
    for (int vocab : {1, 1000, 5000}) {
        const int rows = 8;
        std::vector<float> logits((size_t)rows * vocab);
        for (auto& v : logits) v = u(rng);
        std::vector<int> want(rows, 0);
        // Row 0: random; row 1: the max twice, the later one first in its thread's stride; row 2:
        // the max at the last index; row 3: the max in two warps; row 4: -inf throughout; row 5:
        // NaN throughout; row 6: the max at index 0 and at 1024 (the same thread's stride); row 7:
        // the max at 9 and 5 (two lanes of one warp).
        auto at = [&](int r, int i) -> float& { return logits[(size_t)r * vocab + std::min(i, vocab - 1)]; };
        at(1, vocab / 2) = 5.f, at(1, vocab / 3) = 5.f;
        at(2, vocab - 1) = 5.f;
        at(3, 700) = 5.f, at(3, 40) = 5.f;
        for (int i = 0; i < vocab; i++) at(4, i) = -INFINITY, at(5, i) = NAN;
        at(6, 1024) = 5.f, at(6, 0) = 5.f;
        at(7, 9) = 5.f, at(7, 5) = 5.f;
        for (int r = 0; r < rows; r++) {
            if (r == 4 || r == 5) continue;  // no number beats -inf or NaN: 0
            for (int i = 1; i < vocab; i++)
                if (at(r, i) > at(r, want[r])) want[r] = i;
        }
        std::vector<int> got(rows, -1);
        emu_launch(rows, 1024, [&] { argmax_rows(logits.data(), vocab, got.data()); });
        if (got != want) {
            std::printf("FAIL argmax vocab %d:", vocab);
            for (int r = 0; r < rows; r++) std::printf(" %d/%d", got[r], want[r]);
            std::printf(" (got/want)\n");
            failures++;
        }
    }
    std::printf("argmax_rows: ties, -inf, NaN, three vocabularies\n");
    return failures;
}

int check_rows(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    int failures = 0;
    const int rows = 5, n = 1000, W = 3;
    std::vector<float> x((size_t)rows * n), y(x.size(), NAN);
    for (auto& v : x) v = 3.f * u(rng);
    std::vector<__nv_bfloat16> w((size_t)W * n);
    for (auto& v : w) v = __float2bfloat16_rn(1.f + 0.5f * u(rng));
    emu_launch(rows, 256, [&] { rms_norm_rows(x.data(), w.data(), y.data(), n, W, 1e-6f); });
    double worst = 0;
    for (int q = 0; q < rows; q++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[(size_t)q * n + i] * x[(size_t)q * n + i];
        const double inv = 1 / std::sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; i++) {
            const double want = __bfloat162float(w[(size_t)(q % W) * n + i]) * x[(size_t)q * n + i] * inv;
            worst = std::max(worst, std::abs(want - y[(size_t)q * n + i]) / std::max(1.0, std::abs(want)));
        }
    }
    if (!(worst <= 1e-6)) {
        std::printf("FAIL rms_norm_rows: off by %g\n", worst);
        failures++;
    }
    // embed_rows: token rows of the table, widened.
    const int vocab = 11, hidden = 300;
    std::vector<__nv_bfloat16> embed((size_t)vocab * hidden);
    for (auto& v : embed) v = __float2bfloat16_rn(u(rng));
    const std::vector<int> tokens = {3, 10, 0, 3};
    std::vector<float> e(tokens.size() * hidden, NAN);
    emu_launch(tokens.size(), 256, [&] { embed_rows(embed.data(), tokens.data(), e.data(), hidden); });
    for (size_t r = 0; r < tokens.size(); r++)
        for (int i = 0; i < hidden; i++)
            if (e[r * hidden + i] != __bfloat162float(embed[(size_t)tokens[r] * hidden + i])) {
                std::printf("FAIL embed_rows: row %zu column %d\n", r, i);
                failures++;
                r = tokens.size();
                break;
            }
    // silu_mul: a = silu(gate) · up over a fused gate|up row.
    const int m = 300;
    std::vector<float> gu((size_t)2 * 2 * m), a((size_t)2 * m, NAN);
    for (auto& v : gu) v = 4.f * u(rng);
    emu_launch((m + 255) / 256, 256, [&] { silu_mul(gu.data(), a.data(), m); }, 1, 2);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < m; i++) {
            const float g = gu[(size_t)r * 2 * m + i], want = g / (1.f + std::exp(-g)) * gu[(size_t)r * 2 * m + m + i];
            if (std::abs(a[(size_t)r * m + i] - want) > 1e-5f * std::max(1.f, std::abs(want))) {
                std::printf("FAIL silu_mul: row %d element %d: %g against %g\n", r, i, a[(size_t)r * m + i], want);
                failures++;
                r = 2;
                break;
            }
        }
    // copy_taps: rows into tap slot t, the other slots untouched.
    const int T = 3, t = 1, H = 64;
    std::vector<float> src((size_t)rows * H), taps((size_t)rows * T * H, -1.f);
    for (auto& v : src) v = u(rng);
    emu_launch(rows, 256, [&] { copy_taps(src.data(), taps.data(), H, T, t); });
    for (int r = 0; r < rows; r++)
        for (int s = 0; s < T; s++)
            for (int i = 0; i < H; i++) {
                const float want = s == t ? src[(size_t)r * H + i] : -1.f;
                if (taps[((size_t)r * T + s) * H + i] != want) {
                    std::printf("FAIL copy_taps: row %d slot %d element %d\n", r, s, i);
                    failures++;
                    r = rows, s = T;
                    break;
                }
            }
    std::printf("rms_norm_rows, embed_rows, silu_mul, copy_taps checked\n");
    return failures;
}

int check() {
    std::mt19937 rng(13);
    int failures = check_argmax(rng);
    failures += check_rows(rng);
    return report(failures);
}

}  // namespace emu_driver
