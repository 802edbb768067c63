// What the drivers of tools/emu/run.py share: a row of a batch, the double-precision GEMV they
// check the dense kernels against, the closing report, and main (each driver defines
// emu_driver::check(), which returns the exit status).
#pragma once
#include <cstdio>
#include <random>
#include <vector>

namespace emu_driver {

int check();

// Row r of a row-major batch of rows of n values.
template <typename T>
std::vector<T> row_of(const std::vector<T>& batch, int r, int n) {
    return std::vector<T>(batch.begin() + (size_t)r * n, batch.begin() + (size_t)(r + 1) * n);
}

// y = x'·Wᵀ in double for `rows` rows of x, where x' is x, or x over its rms (eps 1e-6, the
// drivers' launches) times the norm weights when `norm` is given; W is out × in, row-major.
inline std::vector<double> reference_gemv(const std::vector<__nv_bfloat16>& w, const std::vector<float>& x,
                                          const std::vector<__nv_bfloat16>* norm, int out, int in, int rows) {
    std::vector<double> y((size_t)rows * out), xr(in);
    for (int r = 0; r < rows; r++) {
        double inv = 1;
        if (norm) {
            double ss = 0;
            for (int i = 0; i < in; i++) ss += (double)x[(size_t)r * in + i] * x[(size_t)r * in + i];
            inv = 1 / std::sqrt(ss / in + 1e-6);
        }
        for (int i = 0; i < in; i++)
            xr[i] = x[(size_t)r * in + i] * (norm ? inv * __bfloat162float((*norm)[i]) : 1.0);
        for (int o = 0; o < out; o++) {
            double want = 0;
            for (int i = 0; i < in; i++) want += (double)__bfloat162float(w[(size_t)o * in + i]) * xr[i];
            y[(size_t)r * out + o] = want;
        }
    }
    return y;
}

// The largest |got - want| and the largest |want|.
inline std::pair<double, double> worst_error(const std::vector<float>& got, const std::vector<double>& want) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < want.size(); i++) {
        worst = std::max(worst, std::abs(want[i] - got[i]));
        scale = std::max(scale, std::abs(want[i]));
    }
    return {worst, scale};
}

// An NVFP4 matrix as the kernels take it: 32 codes a 16-byte word, an e4m3 scale a 16 columns.
struct Nvfp4 {
    std::vector<uint4> codes;
    std::vector<unsigned char> scales;
};

// `rows` rows of `in` NVFP4 columns: random codes, scales of moderate e4m3 values.
inline Nvfp4 random_nvfp4(std::mt19937& rng, int rows, int in) {
    Nvfp4 m{std::vector<uint4>((size_t)rows * in / 32), std::vector<unsigned char>((size_t)rows * in / 16)};
    for (auto& c : m.codes) c = {(unsigned)rng(), (unsigned)rng(), (unsigned)rng(), (unsigned)rng()};
    for (auto& s : m.scales) s = (unsigned char)(0x28 + rng() % 24);  // 0.25 .. ~1.9
    return m;
}

// The closing line and the exit status.
inline int report(int failures) {
    std::printf(failures ? "%d failures\n" : "all passed\n", failures);
    return failures != 0;
}

}  // namespace emu_driver

int main() { return emu_driver::check(); }
