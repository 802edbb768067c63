// Driver for tools/emu/run.py prefill+moe+dense: the prefill's mixture of experts, attention and
// normed splits, as prefill.rs launches them. pf_moe_place and pf_moe_tiles against a host counting sort (ids out
// of range, up to 1024 experts, rows not a multiple of 32); then the whole MoE (pf_split_perm,
// place, tiles, the grouped gate/up and down GEMMs with their cp.async pipelines and tensor-core
// MMAs, the combine) against the decode step's f32 expert kernels (moe.cu) on the same rows,
// within 1e-4 of the largest value, and each row's bits against the same pipeline run on that
// row alone; then pf_attn_split + pf_attend (ldmatrix fragments, a cp.async pipeline of key
// tiles, online softmax) against double-precision gated attention, full and sliding windows, a
// ring cache, head dims 32, 64 and 128; pf_rms_norm_split's three outputs equal rms_norm_rows
// (dense.cu) followed by pf_split_rows and pf_split_perm, bit for bit. Exit status 0 when all
// hold.
#include "driver.h"

namespace emu_driver {

constexpr int TILE = 32;                                 // PF_TOK, prefill.rs MOE_TILE
constexpr int SMEM = 3 * (256 * 64 + 256 * 8 + 32 * 576);  // PF_MOE_SMEM

// The host's grouping: pairs (r, s) in the canonical order q = (r / 32)·32k + s·32 + r % 32,
// stably sorted by id; out-of-range ids placed nowhere (pos -1).
struct Placement {
    std::vector<int> order, pos, cnt;
};
Placement place_on_host(const std::vector<int>& ids, int rows, int k, int E) {
    Placement p{std::vector<int>(), std::vector<int>((size_t)rows * k, -1), std::vector<int>(E, 0)};
    std::vector<std::pair<int, int>> canonical;  // (id, pair)
    for (int chunk = 0; chunk * 32 < rows; chunk++)
        for (int s = 0; s < k; s++)
            for (int l = 0; l < 32 && chunk * 32 + l < rows; l++) {
                const int pair = (chunk * 32 + l) * k + s, id = ids[pair];
                if (id >= 0 && id < E) canonical.push_back({id, pair});
            }
    std::stable_sort(canonical.begin(), canonical.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t j = 0; j < canonical.size(); j++) {
        p.order.push_back(canonical[j].second);
        p.pos[canonical[j].second] = (int)j;
        p.cnt[canonical[j].first]++;
    }
    return p;
}

// The work tiles prefill.rs sizes for: the shared expert's, then each expert's in order, then
// empty ones.
std::vector<int4> tiles_on_host(const std::vector<int>& cnt, int rows, int E, int max_tiles) {
    std::vector<int4> t;
    for (int i = 0; i * TILE < rows; i++) t.push_back({E, i * TILE, std::min(TILE, rows - i * TILE), 0});
    int first = 0;
    for (int e = 0; e < E; e++) {
        for (int i = 0; i * TILE < cnt[e]; i++) t.push_back({e, first + i * TILE, std::min(TILE, cnt[e] - i * TILE), 0});
        first += cnt[e];
    }
    t.resize(max_tiles, {0, 0, 0, 0});
    return t;
}

int max_tiles_for(int rows, int k, int E) {
    const int pairs = rows * k;
    return (rows + TILE - 1) / TILE + (pairs + TILE - 1) / TILE + std::min(E, pairs);
}

// pf_moe_place and pf_moe_tiles on random ids (a few out of range) against the host.
int check_placement(std::mt19937& rng) {
    int failures = 0;
    const int shapes[][3] = {{1, 1, 5}, {37, 8, 16}, {100, 3, 1024}, {513, 8, 256}, {64, 2, 3}};
    for (const auto& sh : shapes) {
        const int rows = sh[0], k = sh[1], E = sh[2], pairs = rows * k, mt = max_tiles_for(rows, k, E);
        std::vector<int> ids(pairs);
        for (auto& id : ids) id = (int)(rng() % (E + 4)) - 2;  // -2 .. E + 1
        std::vector<int> order(pairs, -7), pos(pairs, -7), cnt(E, -7);
        std::vector<int4> tiles(mt, {-7, -7, -7, -7});
        emu_launch(1, 256, [&] { pf_moe_place(ids.data(), rows, k, E, order.data(), pos.data(), cnt.data()); });
        emu_launch(1, 1024, [&] { pf_moe_tiles(cnt.data(), rows, E, tiles.data(), mt); });
        const Placement want = place_on_host(ids, rows, k, E);
        const std::vector<int> placed(order.begin(), order.begin() + want.order.size());
        const auto want_tiles = tiles_on_host(want.cnt, rows, E, mt);
        bool tiles_ok = true;
        for (int i = 0; i < mt; i++)
            tiles_ok &= tiles[i].x == want_tiles[i].x && tiles[i].y == want_tiles[i].y && tiles[i].z == want_tiles[i].z;
        if (placed != want.order || pos != want.pos || cnt != want.cnt || !tiles_ok) {
            std::printf("FAIL placement rows %d k %d E %d:%s%s%s%s\n", rows, k, E, placed != want.order ? " order" : "",
                        pos != want.pos ? " pos" : "", cnt != want.cnt ? " cnt" : "", tiles_ok ? "" : " tiles");
            failures++;
        }
    }
    std::printf("placement: pf_moe_place and pf_moe_tiles checked on %zu shapes\n", std::size(shapes));
    return failures;
}

constexpr int E = 8, K = 2, H = 256, I = 128, IS = 128, SW = I > IS ? I : IS;

struct Weights {
    Nvfp4 gate, up, down, sgate, sup, sdown;
};

const unsigned* u32(const Nvfp4& m) { return reinterpret_cast<const unsigned*>(m.codes.data()); }

// x + MoE(xn) of `rows` rows through the prefill's kernels.
std::vector<float> prefill_moe(const Weights& w, const std::vector<float>& xn, const std::vector<int>& ids,
                               const std::vector<float>& wts, const std::vector<float>& x, int rows) {
    const int pairs = rows * K, mt = max_tiles_for(rows, K, E);
    std::vector<uint4> xs((size_t)rows * H / 4);
    emu_launch((rows * H / 4 + 255) / 256, 256, [&] { pf_split_perm(xn.data(), xs.data(), rows, H); });
    std::vector<int> order(pairs), pos(pairs), cnt(E);
    std::vector<int4> tiles(mt);
    std::vector<__nv_bfloat16> h((size_t)2 * pairs * I), hs((size_t)2 * rows * IS);
    std::vector<float> y((size_t)(pairs + rows) * H), out = x;
    emu_launch(1, 256, [&] { pf_moe_place(ids.data(), rows, K, E, order.data(), pos.data(), cnt.data()); });
    emu_launch(1, 1024, [&] { pf_moe_tiles(cnt.data(), rows, E, tiles.data(), mt); });
    emu_launch(SW / 128, 256, [&] {
        pf_moe_gate_up(u32(w.gate), w.gate.scales.data(), u32(w.up), w.up.scales.data(), u32(w.sgate),
                       w.sgate.scales.data(), u32(w.sup), w.sup.scales.data(), xs.data(), order.data(), tiles.data(),
                       h.data(), hs.data(), E, H, I, IS, K);
    }, 1, mt);
    emu_launch((H + 255) / 256, 256, [&] {
        pf_moe_down(u32(w.down), w.down.scales.data(), u32(w.sdown), w.sdown.scales.data(),
                    reinterpret_cast<const uint4*>(h.data()), reinterpret_cast<const uint4*>(hs.data()), tiles.data(),
                    y.data(), E, H, I, IS, pairs);
    }, 1, mt);
    emu_launch((H + 255) / 256, 256, [&] { pf_moe_combine(y.data(), pos.data(), wts.data(), out.data(), H, K, rows, 2.5f); }, 1,
               rows);
    return out;
}

// The same through the decode step's f32 expert kernels.
std::vector<float> decode_moe(const Weights& w, const std::vector<float>& xn, const std::vector<int>& ids,
                              const std::vector<float>& wts, const std::vector<float>& x, int rows) {
    std::vector<float> h((size_t)rows * (K + 1) * SW), out = x;
    emu_launch((SW + 3) / 4, 32 * ((H / 32 + 31) / 32), [&] {
        moe_gate_up(xn.data(), ids.data(), w.gate.codes.data(), w.gate.scales.data(), w.up.codes.data(),
                    w.up.scales.data(), w.sgate.codes.data(), w.sgate.scales.data(), w.sup.codes.data(),
                    w.sup.scales.data(), h.data(), H, I, IS, K);
    }, 1, K + 1, rows);
    const int t = K * I / 32 + IS / 32;
    emu_launch((H + 7) / 8, 32 * ((t + 31) / 32), [&] {
        moe_down(h.data(), ids.data(), wts.data(), w.down.codes.data(), w.down.scales.data(), w.sdown.codes.data(),
                 w.sdown.scales.data(), out.data(), H, I, IS, K, 2.5f);
    }, 1, rows);
    return out;
}

int check_pipeline(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Weights w{random_nvfp4(rng, E * I, H), random_nvfp4(rng, E * I, H), random_nvfp4(rng, E * H, I),
              random_nvfp4(rng, IS, H),    random_nvfp4(rng, IS, H),    random_nvfp4(rng, H, IS)};
    int failures = 0;
    for (int rows : {1, 37}) {
        std::vector<float> xn((size_t)rows * H), x((size_t)rows * H), wts((size_t)rows * K);
        for (auto& v : xn) v = u(rng);
        for (auto& v : x) v = u(rng);
        for (auto& v : wts) v = 0.5f + 0.5f * u(rng);
        // K distinct experts per row in ascending order, as the router lists them.
        std::vector<int> ids((size_t)rows * K);
        for (int r = 0; r < rows; r++) {
            std::vector<int> all(E);
            for (int e = 0; e < E; e++) all[e] = e;
            std::shuffle(all.begin(), all.end(), rng);
            std::sort(all.begin(), all.begin() + K);
            std::copy(all.begin(), all.begin() + K, ids.begin() + (size_t)r * K);
        }
        const auto got = prefill_moe(w, xn, ids, wts, x, rows);
        const auto want = decode_moe(w, xn, ids, wts, x, rows);
        double off = 0, scale = 0;
        for (size_t i = 0; i < got.size(); i++) {
            off = std::max(off, (double)std::abs(got[i] - want[i]));
            scale = std::max(scale, (double)std::abs(want[i]));
        }
        if (!(off <= 1e-4 * scale)) {
            std::printf("FAIL pipeline rows %d: prefill against decode off by %g (largest %g)\n", rows, off, scale);
            failures++;
        }
        for (int r = 0; r < rows && rows > 1; r++) {
            const auto one = prefill_moe(w, row_of(xn, r, H), row_of(ids, r, K), row_of(wts, r, K), row_of(x, r, H), 1);
            if (one != row_of(got, r, H)) {
                std::printf("FAIL pipeline rows %d: row %d differs from its prefill alone\n", rows, r);
                failures++;
            }
        }
        std::printf("pipeline rows %d: prefill MoE against the decode kernels (off by %.2g, largest %.3g) and row by row\n",
                    rows, off, scale);
    }
    return failures;
}

// out[r, h] = softplus(g[r, h]) · Σ_j softmax_j(q·k_j / √D) v_j over the row's window, each
// key read from its slot (p % ring, or p), in double.
std::vector<double> attention_on_host(const std::vector<float>& q, const std::vector<float>& ck,
                                      const std::vector<float>& cv, const std::vector<float>& g,
                                      const std::vector<int>& pos, int rows, int heads, int kvh, int D, int window,
                                      int ring) {
    std::vector<double> out((size_t)rows * heads * D);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) {
            const int kv = h / (heads / kvh), lo = window > 0 ? std::max(0, pos[r] - window + 1) : 0;
            std::vector<double> sc;
            double m = -INFINITY;
            for (int p = lo; p <= pos[r]; p++) {
                const size_t at = ((size_t)(ring > 0 ? p % ring : p) * kvh + kv) * D;
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double)q[((size_t)r * heads + h) * D + d] * ck[at + d];
                sc.push_back(dot / std::sqrt((double)D));
                m = std::max(m, sc.back());
            }
            double sum = 0;
            for (double& v : sc) sum += v = std::exp(v - m);
            const double gate = std::log1p(std::exp((double)g[(size_t)r * heads + h]));
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int p = lo; p <= pos[r]; p++)
                    acc += sc[p - lo] * cv[((size_t)(ring > 0 ? p % ring : p) * kvh + kv) * D + d];
                out[((size_t)r * heads + h) * D + d] = gate * acc / sum;
            }
        }
    return out;
}

int check_attention(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    int failures = 0;
    // (D, heads, kv heads, rows, first position, window, ring): a full window over a cache as
    // long as the positions, a sliding one over a ring the positions wrap.
    const int cases[][7] = {{32, 4, 2, 37, 20, 0, 0}, {64, 6, 2, 21, 40, 24, 32}, {128, 2, 1, 18, 3, 0, 0}};
    for (const auto& c : cases) {
        const int D = c[0], heads = c[1], kvh = c[2], rows = c[3], p0 = c[4], window = c[5], ring = c[6];
        const int slots = ring > 0 ? ring : p0 + rows, kvd = kvh * D;
        std::vector<float> q((size_t)rows * heads * D), ck((size_t)slots * kvd), cv(ck.size()), g((size_t)rows * heads);
        for (auto* v : {&q, &ck, &cv}) for (auto& x : *v) x = u(rng);
        for (auto& x : g) x = 2.f * u(rng);
        std::vector<int> pos(rows);
        for (int r = 0; r < rows; r++) pos[r] = p0 + r;
        std::vector<__nv_bfloat16> kx((size_t)2 * slots * kvd), vx(kx.size());
        const long long n = (long long)slots * kvd;
        emu_launch((unsigned)((n / 4 + 255) / 256), 256, [&] { pf_attn_split(ck.data(), cv.data(), kx.data(), vx.data(), 0, n, D); });
        // prefill.rs's blocks: gb heads of a kv group (the largest divisor of the group <= 8)
        // times rb = 8 / gb blocks of 16 rows.
        const int group = heads / kvh;
        int gb = 1;
        for (int b = std::min(group, 8); b >= 1; b--)
            if (group % b == 0) {
                gb = b;
                break;
            }
        const int rb = 8 / gb;
        std::vector<float> out((size_t)rows * heads * D, NAN);
        auto kernel = D == 32 ? pf_attend_d32 : D == 64 ? pf_attend_d64 : pf_attend_d128;
        emu_launch(kvh, 32 * gb * rb, [&] {
            kernel(q.data(), kx.data(), vx.data(), g.data(), heads, pos.data(), out.data(), nullptr, rows, heads, kvh,
                   window, ring, slots, gb, rb);
        }, 1, (rows + 16 * rb - 1) / (16 * rb), group / gb);
        const auto want = attention_on_host(q, ck, cv, g, pos, rows, heads, kvh, D, window, ring);
        const auto [off, scale] = worst_error(out, want);
        if (!(off <= 1e-4 * scale)) {
            std::printf("FAIL attention D %d window %d ring %d: off by %g (largest %g)\n", D, window, ring, off, scale);
            failures++;
        }
        std::printf("attention D %d window %d ring %d: pf_attend against double precision (off by %.2g, largest %.3g)\n",
                    D, window, ring, off, scale);
    }
    return failures;
}

// pf_rms_norm_split against its pieces: rms_norm_rows, then pf_split_rows and pf_split_perm of
// the normed rows.
int check_norm_split(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int rows = 5, n = 384;
    std::vector<float> x((size_t)rows * n), out(x.size(), NAN), want(x.size(), NAN);
    for (auto& v : x) v = 3.f * u(rng);
    std::vector<__nv_bfloat16> w(n), xs((size_t)2 * rows * n), want_xs(xs.size());
    for (auto& v : w) v = __float2bfloat16_rn(1.f + 0.5f * u(rng));
    std::vector<uint4> perm((size_t)rows * n / 4), want_perm(perm.size());
    emu_launch(rows, 256, [&] { pf_rms_norm_split(x.data(), w.data(), out.data(), xs.data(), perm.data(), n, rows, 1e-6f); });
    emu_launch(rows, 256, [&] { rms_norm_rows(x.data(), w.data(), want.data(), n, 1, 1e-6f); });
    emu_launch((rows * n + 255) / 256, 256, [&] { pf_split_rows(want.data(), want_xs.data(), (long long)rows * n); });
    emu_launch((rows * n / 4 + 255) / 256, 256, [&] { pf_split_perm(want.data(), want_perm.data(), rows, n); });
    const bool same = out == want && std::memcmp(xs.data(), want_xs.data(), 2 * xs.size()) == 0 &&
                      std::memcmp(perm.data(), want_perm.data(), 16 * perm.size()) == 0;
    if (!same) std::printf("FAIL pf_rms_norm_split: differs from rms_norm_rows + pf_split_rows + pf_split_perm\n");
    std::printf("norm split: pf_rms_norm_split against its pieces\n");
    return !same;
}

int check() {
    std::mt19937 rng(3);
    int failures = check_placement(rng);
    failures += check_pipeline(rng);
    failures += check_attention(rng);
    failures += check_norm_split(rng);
    return report(failures);
}

}  // namespace emu_driver
