// Driver for tools/emu/run.py dense: the GEMVs on awkward shapes. For launches of 1, 3, 8 and 16
// rows of every multi-row f32 entry dense.rs may pick (weight rows per warp G = 1, 2, 4, normed
// rows staged or not, plain pairs as fours over half of the rows, or as pairs at two rows): each
// row gives the bits of the one-row kernels (gemv_bf16_1s, and gemv_bf16_1 for inputs too wide to
// stage), every value is within 1e-5 (relative to the largest) of a double-precision y = x'·Wᵀ,
// and accumulate adds onto y exactly. The same for the tensor-core GEMV (gemv_mma_R, its input in slices summed by the last
// warp of a tile to arrive) against its own one-row launch, and for the column-owned GEMV
// (gemv_cols_R, inputs up to 2048; rows 1, 3, 8) against its own one-row launch. Exit status 0 when all hold.
#include "driver.h"

namespace emu_driver {

using Kernel = void (*)(const __nv_bfloat16*, const float*, const __nv_bfloat16*, float, float*, int, int, int, int);

struct Variant {
    const char* name;
    Kernel k[4];  // R = 2, 4, 8, 16
    bool staged;  // stages x' (normed rows only)
    int group;
};

const Variant VARIANTS[] = {
    {"g1", {gemv_bf16_2, gemv_bf16_4, gemv_bf16_8, gemv_bf16_16}, false, 1},
    {"g2", {gemv_bf16_2_g2, nullptr, nullptr, nullptr}, false, 2},
    {"g4", {gemv_bf16_2_g4, gemv_bf16_4_g4, gemv_bf16_8_g4, gemv_bf16_16_g4}, false, 4},
    {"g4h", {nullptr, gemv_bf16_4_g4h, gemv_bf16_8_g4h, gemv_bf16_16_g4h}, false, 4},
    {"s_g1", {gemv_bf16_2s_g1, gemv_bf16_4s_g1, gemv_bf16_8s_g1, gemv_bf16_16s_g1}, true, 1},
    {"s_g2", {gemv_bf16_2s_g2, gemv_bf16_4s_g2, gemv_bf16_8s_g2, gemv_bf16_16s_g2}, true, 2},
    {"s_g4", {gemv_bf16_2s_g4, gemv_bf16_4s_g4, gemv_bf16_8s_g4, gemv_bf16_16s_g4}, true, 4},
};

std::vector<float> run(Kernel k, const std::vector<__nv_bfloat16>& w, const std::vector<float>& x,
                       const std::vector<__nv_bfloat16>* norm, int out, int in, int rows, unsigned grid,
                       std::vector<float> y = {}, bool accumulate = false) {
    if (y.empty()) y.assign((size_t)rows * out, 0.f);
    const __nv_bfloat16* nw = norm ? norm->data() : nullptr;
    float* yp = y.data();
    emu_launch(grid, 256, [&] { k(w.data(), x.data(), nw, 1e-6f, yp, out, in, rows, accumulate); });
    return y;
}

using MmaKernel = void (*)(const __nv_bfloat16*, const float*, const __nv_bfloat16*, float, float*, int, int, int, int,
                          int, float*, unsigned int*);

// gemv_mma_R over slices of `ks` columns (dense.rs's launch: blocks of 8 16-output tiles).
std::vector<float> run_mma(int rows, const std::vector<__nv_bfloat16>& w, const std::vector<float>& x,
                           const std::vector<__nv_bfloat16>* norm, int out, int in, int ks) {
    const MmaKernel ks_[5] = {gemv_mma_1, gemv_mma_2, gemv_mma_4, gemv_mma_8, gemv_mma_16};
    const MmaKernel k = ks_[rows <= 1 ? 0 : rows <= 2 ? 1 : rows <= 4 ? 2 : rows <= 8 ? 3 : 4];
    const int slices = (in + ks - 1) / ks, tiles = (out + 15) / 16;
    std::vector<float> y((size_t)rows * out), partial((size_t)slices * rows * out);
    std::vector<unsigned int> counters(tiles);
    const __nv_bfloat16* nw = norm ? norm->data() : nullptr;
    emu_launch((tiles + 7) / 8, 256, [&] {
        k(w.data(), x.data(), nw, 1e-6f, y.data(), out, in, rows, 0, ks, partial.data(), counters.data());
    }, 1, slices);
    for (unsigned int c : counters)
        if (c != 0) {
            std::printf("FAIL gemv_mma: a tile's counter left at %u\n", c);
            std::exit(1);
        }
    return y;
}

// A kernel's y of `rows` rows (named `kernel` in failures) within 1e-5 (relative to `scale`) of
// the one-row f32 kernels' `alone`, and each row of a multi-row launch the bits of its own
// one-row launch, `one_row(r)`. How many of those failed.
template <typename OneRow>
int rows_like_alone(const char* kernel, const std::vector<float>& y, const std::vector<float>& alone, double scale,
                    int out, int in, int rows, int normed, OneRow one_row) {
    int failures = 0;
    double off = 0;
    for (size_t i = 0; i < y.size(); i++) off = std::max(off, (double)std::abs(y[i] - alone[i]));
    if (off > 1e-5 * std::max(scale, 1e-3)) {
        std::printf("FAIL %dx%d rows %d norm %d %s: off by %g\n", out, in, rows, normed, kernel, off);
        failures++;
    }
    for (int r = 0; r < rows && rows > 1; r++) {
        const std::vector<float> y1 = one_row(r);
        if (std::memcmp(y1.data(), y.data() + (size_t)r * out, sizeof(float) * out) != 0) {
            std::printf("FAIL %dx%d rows %d norm %d %s: row %d differs from its one-row launch\n", out, in, rows,
                        normed, kernel, r);
            failures++;
        }
    }
    return failures;
}

int check() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    int failures = 0;
    // (out, in, grid): outputs not a multiple of the groups, inputs not a multiple of 256 columns,
    // fewer warps than groups (persistent warps).
    const int shapes[][3] = {{37, 1000, 2}, {64, 2048, 1}, {9, 2056, 3}};
    for (const auto& s : shapes) {
        const int out = s[0], in = s[1];
        const unsigned grid = s[2];
        std::vector<__nv_bfloat16> w((size_t)out * in), nw(in);
        for (auto& v : w) v = __float2bfloat16_rn(0.1f * u(rng));
        for (auto& v : nw) v = __float2bfloat16_rn(1.f + 0.5f * u(rng));
        for (int normed = 0; normed < 2; normed++) {
            const auto* norm = normed ? &nw : nullptr;
            for (int rows : {1, 3, 8, 16}) {
                std::vector<float> x((size_t)rows * in);
                for (auto& v : x) v = 2.f * u(rng);
                // The one-row kernel's bits, row by row; the unstaged one-row kernel (inputs too
                // wide to stage) gives the same.
                std::vector<float> alone((size_t)rows * out);
                for (int r = 0; r < rows; r++) {
                    const auto y1 = run(gemv_bf16_1s, w, row_of(x, r, in), norm, out, in, 1, grid);
                    std::copy(y1.begin(), y1.end(), alone.begin() + (size_t)r * out);
                    if (run(gemv_bf16_1, w, row_of(x, r, in), norm, out, in, 1, grid) != y1) {
                        std::printf("FAIL %dx%d norm %d: gemv_bf16_1 differs from gemv_bf16_1s\n", out, in, normed);
                        failures++;
                    }
                }
                // Against double precision.
                const auto [worst, scale] = worst_error(alone, reference_gemv(w, x, norm, out, in, rows));
                if (worst > 1e-5 * std::max(scale, 1e-3)) {
                    std::printf("FAIL %dx%d norm %d: one-row kernel off by %g (largest %g)\n", out, in, normed, worst, scale);
                    failures++;
                }
                // The tensor-core GEMV: its rows alone give its bits; within 1e-5 of double.
                const int ks = in <= 1024 ? 512 : 704;
                failures += rows_like_alone("mma", run_mma(rows, w, x, norm, out, in, ks), alone, scale, out, in, rows,
                                            normed, [&](int r) { return run_mma(1, w, row_of(x, r, in), norm, out, in, ks); });
                // The column-owned GEMV (inputs up to 2048): the same, and accumulate adds onto y
                // exactly.
                if (in <= 2048 && rows <= 8) {
                    const Kernel cols[4] = {gemv_cols_1, gemv_cols_2, gemv_cols_4, gemv_cols_8};
                    const Kernel k = cols[rows <= 1 ? 0 : rows <= 2 ? 1 : rows <= 4 ? 2 : 3];
                    const auto y = run(k, w, x, norm, out, in, rows, grid);
                    failures += rows_like_alone("cols", y, alone, scale, out, in, rows, normed, [&](int r) {
                        return run(gemv_cols_1, w, row_of(x, r, in), norm, out, in, 1, grid + 2);
                    });
                    const auto y2 = run(k, w, x, norm, out, in, rows, grid + 1, y, true);
                    for (size_t i = 0; i < y.size(); i++)
                        if (y2[i] != y[i] + y[i]) {
                            std::printf("FAIL %dx%d rows %d norm %d cols: accumulate\n", out, in, rows, normed);
                            failures++;
                            break;
                        }
                }
                if (rows == 1) continue;
                const int ri = rows <= 2 ? 0 : rows <= 4 ? 1 : rows <= 8 ? 2 : 3;
                for (const auto& v : VARIANTS) {
                    if (!v.k[ri] || (v.staged && !normed)) continue;
                    // The ungrouped staging holds every row's x' in the block's shared memory.
                    if (v.staged && v.group == 1 && (size_t)rows * in * 4 > emu_block_dyn_bytes) continue;
                    const auto y = run(v.k[ri], w, x, norm, out, in, rows, grid);
                    if (std::memcmp(y.data(), alone.data(), sizeof(float) * y.size()) != 0) {
                        std::printf("FAIL %dx%d rows %d norm %d %s: a row differs from its one-row launch\n", out, in,
                                    rows, normed, v.name);
                        failures++;
                    }
                    const auto y2 = run(v.k[ri], w, x, norm, out, in, rows, grid + 1, y, true);
                    for (size_t i = 0; i < y.size(); i++)
                        if (y2[i] != y[i] + y[i]) {
                            std::printf("FAIL %dx%d rows %d norm %d %s: accumulate\n", out, in, rows, normed, v.name);
                            failures++;
                            break;
                        }
                }
            }
        }
        std::printf("%dx%d: checked rows 1, 3, 8, 16, plain and normed, every multi-row entry and the tensor-core GEMV%s\n",
                    out, in, in <= 2048 ? ", and the column-owned one at 1, 3, 8" : "");
    }
    return report(failures);
}

}  // namespace emu_driver
