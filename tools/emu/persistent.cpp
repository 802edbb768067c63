// Driver for tools/emu/run.py tools/emu/persistent_toy.cu: the persistent kernels' counters and
// page flags (common.cuh) in a toy persistent kernel, run grid-resident (emu_launch_resident: the
// whole grid's threads at once, in a random order, blocks stalling at random). Over many random
// shapes (grids of 1 to 7 blocks, uneven queues, some empty, awkward widths and tiles) and
// schedules, three steps each on counters never reset (some starting just below 2^32, so the
// targets wrap), every op's output must equal the host's. Then the negative tests: each
// deliberate bug of persistent_toy.cu must be caught, a wait nothing satisfies as a reported
// deadlock (in a child process: it aborts), an early read as a wrong output in some schedule.
// Exit status 0 when all hold.
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "driver.h"

namespace emu_driver {

// A toy launch's shapes, weights, queues and buffers (persistent_toy.cu's layout).
struct Toy {
    int ops = 0, grid = 0;
    std::vector<int> shape, w_off, x_off, queue, queue_start;
    std::vector<unsigned> weights, x, done;
    unsigned base = 0;

    // A random toy: 2 to 5 ops of widths 1 to 80, tiles of rows fitting a page, its items dealt to
    // `grid` blocks at random (each block's queue in op order).
    Toy(std::mt19937& rng, int grid_) : grid(grid_) {
        ops = 2 + rng() % 4;
        std::vector<int> width(ops + 1);
        for (int& w : width) w = 1 + rng() % 80;
        std::vector<std::vector<int>> queues(grid);
        int w_total = 0, x_total = width[0];
        x_off.push_back(0);
        for (int i = 0; i < ops; i++) {
            const int in = width[i], out = width[i + 1];
            const int most = std::min(out, TOY_PAGE_WORDS / in);
            const int rows = 1 + rng() % most, tiles = (out + rows - 1) / rows;
            shape.insert(shape.end(), {in, out, rows, tiles});
            w_off.push_back(w_total);
            w_total += in * out;
            x_off.push_back(x_total);
            x_total += out;
            for (int t = 0; t < tiles; t++) queues[rng() % grid].push_back(i << 16 | t);
        }
        weights.resize(w_total);
        for (auto& w : weights) w = rng();
        x.assign(x_total, 0xdeadbeefu);
        queue_start.push_back(0);
        for (auto& q : queues) {
            queue.insert(queue.end(), q.begin(), q.end());  // dealt in op order already
            queue_start.push_back((int)queue.size());
        }
        base = rng() % 2 ? (unsigned)rng() : 0u - (unsigned)(rng() % 64);  // near 2^32: the targets wrap
        done.assign(ops, base);
    }

    // Step `step` on input `in` (x_0): the launch, then whether every op's output is the host's.
    bool step(int s, const std::vector<unsigned>& in, uint64_t seed, int bug = TOY_BUG_NONE) {
        std::copy(in.begin(), in.end(), x.begin());
        emu_label(done.data(), done.size(), "done");
        emu_launch_resident(grid, 32 * (1 + TOY_COMPUTE_WARPS), [&] {
            toy_persistent_step(weights.data(), shape.data(), w_off.data(), x_off.data(), x.data(), done.data(),
                                queue.data(), queue_start.data(), s, base, bug);
        }, seed);
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

    // Steps 0..steps-1 on random inputs: how many gave a wrong output.
    int run(std::mt19937& rng, int steps, uint64_t seed, int bug = TOY_BUG_NONE) {
        int wrong = 0;
        for (int s = 0; s < steps; s++) {
            std::vector<unsigned> in(shape[0]);
            for (auto& v : in) v = rng();
            wrong += !step(s, in, seed * 16 + s, bug);
        }
        return wrong;
    }
};

// Runs f in a child process: whether it was aborted (SIGABRT), and its stderr.
template <typename F>
std::pair<bool, std::string> child_aborts(F f) {
    std::fflush(stdout);
    int fd[2];
    if (pipe(fd) != 0) std::abort();
    const pid_t child = fork();
    if (child == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        f();
        std::_Exit(0);
    }
    close(fd[1]);
    std::string err;
    char buf[4096];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) err.append(buf, n);
    close(fd[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return {WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, err};
}

// The report's first waiting thread (its second line).
std::string first_wait(const std::string& err) {
    const size_t a = err.find('\n') + 1, b = err.find('\n', a);
    return err.substr(a, b - a);
}

int check() {
    int failures = 0;
    auto fail = [&](const std::string& what) {
        std::printf("FAIL %s\n", what.c_str());
        failures++;
    };
    // Block 0 waits for a counter block 1 releases: a deadlock block after block (emu_launch),
    // reported as such, and none with the grid resident.
    std::vector<unsigned> counter(1), seen(2);
    auto waits_for_later = [&] {
        if (blockIdx.x == 0) seen[threadIdx.x] = counter_wait_at_least(&counter[0], 1);
        if (blockIdx.x == 1 && threadIdx.x == 0) counter_release_add(&counter[0], 1);
    };
    emu_label(counter.data(), 1, "counter");
    const auto [aborted, err] = child_aborts([&] { emu_launch(2, 2, waits_for_later); });
    if (!aborted || err.find("wait for counter[0] to reach 1 (it is 0)") == std::string::npos ||
        err.find("needs emu_launch_resident") == std::string::npos)
        fail("a wait for a later block, block after block: no deadlock reported:\n" + err);
    emu_launch_resident(2, 2, waits_for_later, 1);
    if (seen != std::vector<unsigned>{1, 1}) fail("a wait for a later block, grid resident: not released");
    std::printf("a wait for a later block: a deadlock block after block, released grid-resident\n");

    // The toy on many shapes and schedules: every step's output right.
    constexpr int SHAPES = 50, STEPS = 3;
    int items = 0, most_grid = 0;
    for (int seed = 0; seed < SHAPES; seed++) {
        std::mt19937 rng(seed);
        Toy toy(rng, 1 + seed % 7);
        items += (int)toy.queue.size();
        most_grid = std::max(most_grid, toy.grid);
        if (const int wrong = toy.run(rng, STEPS, seed)) fail("toy seed " + std::to_string(seed) + ": " +
                                                              std::to_string(wrong) + " wrong steps");
    }
    std::printf("persistent toy: %d shapes x %d steps right (grids 1..%d, %d items)\n", SHAPES, STEPS, most_grid,
                items);

    // A wait that nothing satisfies: a deadlock, reported (naming the counter op 1 waits for), not
    // a hang. TOY_SHOW=1 prints the reports.
    for (const auto& [bug, name] : {std::pair{TOY_BUG_NO_RELEASE, "a missing release"},
                                    std::pair{TOY_BUG_TARGET_HIGH, "a target one past"}}) {
        const auto [aborted, err] = child_aborts([bug = bug] {
            std::mt19937 rng(7);
            Toy toy(rng, 5);
            toy.run(rng, STEPS, 7, bug);
        });
        if (std::getenv("TOY_SHOW")) std::fputs(err.c_str(), stdout);
        if (!aborted || err.find("emu: deadlock") == std::string::npos || err.find("for done[0] to reach") == std::string::npos)
            fail(std::string(name) + ": no deadlock reported:\n" + err);
        else
            std::printf("%s: deadlock reported, e.g.%s\n", name, first_wait(err).c_str());
    }
    // Reads too early: a wrong output in some of the schedules.
    for (const auto& [bug, name] : {std::pair{TOY_BUG_NO_DEP_WAIT, "a dependency read without waiting"},
                                    std::pair{TOY_BUG_TARGET_LOW, "a target one short"},
                                    std::pair{TOY_BUG_NO_FULL_WAIT, "a page read before it is full"},
                                    std::pair{TOY_BUG_NO_EMPTY_WAIT, "a page refilled before it is empty"}}) {
        int wrong = 0, runs = 0;
        for (int seed = 100; seed < 112; seed++) {
            std::mt19937 rng(seed);
            Toy toy(rng, 1 + seed % 7);
            wrong += toy.run(rng, STEPS, seed, bug);
            runs += STEPS;
        }
        if (wrong == 0) fail(std::string(name) + ": never caught");
        std::printf("%s: wrong output in %d of %d steps\n", name, wrong, runs);
    }
    return report(failures);
}

}  // namespace emu_driver
