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
#include "persistent_toy_host.h"

namespace emu_driver {

// A random toy (2 to 5 ops, tiles dealt to `grid` blocks at random) and its counters.
struct Toy : ToyLayout {
    std::vector<unsigned> done;

    Toy(std::mt19937& rng, int grid_) : ToyLayout(random(rng, grid_)) { done.assign(ops, base); }

    static ToyLayout random(std::mt19937& rng, int grid) {
        std::vector<int> width, rows;
        toy_random_shape(rng, 2 + rng() % 4, width, rows);
        return ToyLayout(rng, grid, width, rows, [&](int, int) { return (int)(rng() % 65536); });
    }

    // Step `step` on input `in` (x_0): the launch, then whether every op's output is the host's.
    bool step(int s, const std::vector<unsigned>& in, uint64_t seed, int bug = TOY_BUG_NONE) {
        std::copy(in.begin(), in.end(), x.begin());
        emu_label(done.data(), done.size(), "done");
        emu_launch_resident(grid, 32 * (1 + TOY_COMPUTE_WARPS), [&] {
            toy_persistent_step(weights.data(), shape.data(), w_off.data(), x_off.data(), x.data(), done.data(),
                                queue.data(), queue_start.data(), s, base, bug);
        }, seed);
        return outputs_right(in);
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
