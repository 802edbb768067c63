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

// The closing line and the exit status.
inline int report(int failures) {
    std::printf(failures ? "%d failures\n" : "all passed\n", failures);
    return failures != 0;
}

}  // namespace emu_driver

int main() { return emu_driver::check(); }
