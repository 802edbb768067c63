// Driver for tools/emu/run.py tools/emu/persistent_toy.cu: the persistent kernels' counters,
// page flags and bulk-copy page barriers (common.cuh) in a toy persistent kernel, run
// grid-resident (emu_launch_resident: the whole grid's threads at once, in a random order, blocks
// stalling at random, bulk copies landing at random later passes). Over many random shapes (grids
// of 1 to 7 blocks, uneven queues, some empty, awkward widths and tiles) and schedules, three steps
// each on counters never reset (some starting just below 2^32, so the targets wrap), every op's
// output must equal the host's, with either ring. Then the negative tests: each deliberate bug of
// persistent_toy.cu must be caught, a wait nothing satisfies as a reported deadlock (in a child
// process: it aborts), an early read as a wrong output in some schedule. Exit status 0 when all
// hold.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <tuple>

#include "driver.h"
#include "persistent_toy_host.h"

namespace emu_driver {

// A random toy (2 to 5 ops, tiles dealt to `grid` blocks at random), its counters and its ring
// (bulk copies on page barriers, or page flags).
struct Toy : ToyLayout {
    std::vector<unsigned> done;
    int bulk;

    Toy(std::mt19937& rng, int grid_, int bulk_) : ToyLayout(random(rng, grid_)), bulk(bulk_) { done.assign(ops, base); }

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
                                queue.data(), queue_start.data(), s, base, bug, bulk);
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

// What a child process did: whether it was aborted (SIGABRT), its exit status otherwise, its stderr.
struct Child {
    bool aborted;
    int status;
    std::string err;
};
// Runs f (returning an exit status) in a child process.
template <typename F>
Child child(F f) {
    std::fflush(stdout);
    int fd[2];
    if (pipe(fd) != 0) std::abort();
    const pid_t child = fork();
    if (child == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        std::_Exit(f());
    }
    close(fd[1]);
    std::string err;
    char buf[4096];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) err.append(buf, n);
    close(fd[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return {WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, WIFEXITED(status) ? WEXITSTATUS(status) : -1, err};
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
    const auto [aborted, status, err] = child([&] {
        emu_launch(2, 2, waits_for_later);
        return 0;
    });
    if (!aborted || err.find("wait for counter[0] to reach 1 (it is 0)") == std::string::npos ||
        err.find("needs emu_launch_resident") == std::string::npos)
        fail("a wait for a later block, block after block: no deadlock reported:\n" + err);
    emu_launch_resident(2, 2, waits_for_later, 1);
    if (seen != std::vector<unsigned>{1, 1}) fail("a wait for a later block, grid resident: not released");
    std::printf("a wait for a later block: a deadlock block after block, released grid-resident\n");

    // A bulk copy lands later than its issue: a read right after it (the issuing block's other
    // thread, no wait) sees the old bytes in some schedules, a read after the wait never does.
    int stale[2] = {0, 0};
    constexpr int COPIES = 40;
    for (int wait = 0; wait < 2; wait++) {
        for (int seed = 0; seed < COPIES; seed++) {
            alignas(16) const unsigned src[4] = {1, 2, 3, 4};
            unsigned seen = 0;
            emu_launch_resident(1, 2, [&] {
                auto& bar = emu_shared<unsigned long long>(1 << 20, "bar");
                auto& page = emu_shared<unsigned[4]>((1 << 20) + 1, "page");
                if (threadIdx.x == 0) page_barrier_init(&bar, 1);
                __syncthreads();
                if (threadIdx.x == 0) {
                    page_barrier_arrive_expect_bytes(&bar, sizeof src);
                    page_bulk_load(page, src, sizeof src, &bar);
                } else {
                    if (wait) page_barrier_wait_parity(&bar, 0);
                    seen = page[3];
                }
            }, seed);
            stale[wait] += seen != 4;
        }
    }
    if (stale[0] == 0 || stale[1] != 0) fail("a bulk copy: landed at once, or not by the wait");
    std::printf("a bulk copy: a read without the wait stale in %d of %d launches, after it in %d\n", stale[0], COPIES,
                stale[1]);

    // The toy on many shapes and schedules, with either ring: every step's output right.
    constexpr int STEPS = 3;
    for (const auto& [bulk, shapes, ring] : {std::tuple{0, 50, ""}, std::tuple{1, 30, ", bulk ring"}}) {
        int items = 0, most_grid = 0;
        for (int seed = 0; seed < shapes; seed++) {
            std::mt19937 rng(seed);
            Toy toy(rng, 1 + seed % 7, bulk);
            items += (int)toy.queue.size();
            most_grid = std::max(most_grid, toy.grid);
            if (const int wrong = toy.run(rng, STEPS, seed))
                fail("toy" + std::string(ring) + " seed " + std::to_string(seed) + ": " + std::to_string(wrong) +
                     " wrong steps");
        }
        std::printf("persistent toy%s: %d shapes x %d steps right (grids 1..%d, %d items)\n", ring, shapes, STEPS,
                    most_grid, items);
    }

    // A wait that nothing satisfies: a deadlock, reported (naming the counter op 1 waits for, or
    // the page barrier whose phase waits for bytes no copy brings), not a hang. TOY_SHOW=1 prints
    // the reports.
    for (const auto& [bug, bulk, name, says] :
         {std::tuple{TOY_BUG_NO_RELEASE, 0, "a missing release", "for done[0] to reach"},
          std::tuple{TOY_BUG_TARGET_HIGH, 0, "a target one past", "for done[0] to reach"},
          std::tuple{TOY_BUG_EXPECT_HIGH, 1, "bulk ring, 16 bytes too many expected",
                     "__shared__ full_bar[0] to complete its phase of parity 0 (the current one: 0 of 1 arrivals "
                     "and 16 bytes to come)"}}) {
        const auto [aborted, status, err] = child([bug = bug, bulk = bulk] {
            std::mt19937 rng(7);
            Toy toy(rng, 5, bulk);
            return toy.run(rng, STEPS, 7, bug);
        });
        if (std::getenv("TOY_SHOW")) std::fputs(err.c_str(), stdout);
        if (!aborted || err.find("emu: deadlock") == std::string::npos || err.find(says) == std::string::npos)
            fail(std::string(name) + ": no deadlock reported:\n" + err);
        else
            std::printf("%s: deadlock reported, e.g.%s\n", name, first_wait(err).c_str());
    }
    // Reads too early: a wrong output in some of the schedules. Each toy in a child process: a
    // bulk ring's early refill also goes wrong in other ways the emulator reports (and aborts on):
    // an arrival on "full" before its previous phase completed, past the phase's count, or the
    // barrier two phases on, so a compute warp waits for the parity it already saw (a deadlock).
    for (const auto& [bug, bulk, name] :
         {std::tuple{TOY_BUG_NO_DEP_WAIT, 0, "a dependency read without waiting"},
          std::tuple{TOY_BUG_TARGET_LOW, 0, "a target one short"},
          std::tuple{TOY_BUG_NO_FULL_WAIT, 0, "a page read before it is full"},
          std::tuple{TOY_BUG_NO_EMPTY_WAIT, 0, "a page refilled before it is empty"},
          std::tuple{TOY_BUG_NO_FULL_WAIT, 1, "bulk ring, a page read before its copies land"},
          std::tuple{TOY_BUG_NO_EMPTY_WAIT, 1, "bulk ring, a page refilled before it is empty"}}) {
        int wrong = 0, runs = 0, over = 0, deadlocks = 0;
        for (int seed = 100; seed < 112; seed++) {
            const auto [aborted, status, err] = child([bug = bug, bulk = bulk, seed] {
                std::mt19937 rng(seed);
                Toy toy(rng, 1 + seed % 7, bulk);
                return toy.run(rng, STEPS, seed, bug);
            });
            if (bulk && aborted && err.find("an arrival past its phase's count") != std::string::npos) {
                over++;
            } else if (bulk && aborted && err.find("emu: deadlock") != std::string::npos) {
                deadlocks++;
            } else if (aborted || status < 0) {
                fail(std::string(name) + " seed " + std::to_string(seed) + ": the run failed:\n" + err);
            } else {
                wrong += status;
                runs += STEPS;
            }
        }
        if (wrong == 0) fail(std::string(name) + ": never a wrong output");
        std::printf("%s: wrong output in %d of %d steps", name, wrong, runs);
        if (over + deadlocks)
            std::printf(" (%d more toys reported: %d arrivals past a phase's count, %d deadlocks)", over + deadlocks,
                        over, deadlocks);
        std::printf("\n");
    }
    return report(failures);
}

}  // namespace emu_driver
