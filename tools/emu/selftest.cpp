// Driver for tools/emu/run.py none: the emulator itself (shim.h), on small kernels of its own.
// Shuffles, ballots and barriers give what the GPU's give; a read of another thread's write with
// no barrier between them gets the old value in some launch (the random resume order), and never
// with the barrier; a barrier that some thread never reaches ends the run with its report, and a
// fiber that overflows its stack faults (each in a child process). Exit status 0 when all hold.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver.h"

namespace emu_driver {

// The signal that ended a child process running f (0 if it exited), its stderr silenced and
// no core file left behind.
template <typename F>
int child_signal(F f) {
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        const rlimit no_core{0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        std::freopen("/dev/null", "w", stderr);
        f();
        std::_Exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

int check() {
    int failures = 0;
    auto fail = [&](const char* what) {
        std::printf("FAIL %s\n", what);
        failures++;
    };
    // Shuffles in two blocks of three warps; ballots in two blocks of 80 threads (the last warp
    // of 16 lanes).
    for (unsigned int threads : {96u, 80u}) {
        std::vector<int> got(2 * threads);
        emu_launch(2, threads, [&] {
            const int t = threadIdx.x, lane = t % 32, i = blockIdx.x * threads + t;
            if (threads == 96) {
                const int a = __shfl_xor_sync(~0u, t, 1), b = __shfl_down_sync(~0u, t, 3), c = __shfl_sync(~0u, t, 5);
                got[i] = a == (t ^ 1) && b == (lane + 3 < 32 ? t + 3 : t) && c == t - lane + 5;
            } else {
                unsigned int want = 0;
                for (int l = 0; l < (t < 64 ? 32 : 16); l++) want |= (unsigned int)(l % 3 == 0) << l;
                got[i] = __ballot_sync(~0u, lane % 3 == 0) == want;
            }
        });
        if (std::count(got.begin(), got.end(), 1) != (int)got.size()) fail(threads == 96 ? "shuffles" : "ballots");
    }
    std::printf("shuffles and ballots checked\n");
    // Thread t reads what thread t ^ 1 wrote to shared memory, with and without a barrier.
    for (int barrier = 0; barrier < 2; barrier++) {
        int stale = 0;
        for (int launch = 0; launch < 20; launch++)
            emu_launch(1, 64, [&] {
                auto& s = emu_shared<int[64]>(0);
                const int t = threadIdx.x;
                s[t] = launch + 1;
                if (barrier) __syncthreads();
                stale += s[t ^ 1] != launch + 1;
            });
        if (barrier ? stale != 0 : stale == 0)
            fail(barrier ? "a barrier let a stale read through" : "no stale read without a barrier");
        std::printf("%s a barrier: %d stale reads in 20 launches\n", barrier ? "with" : "without", stale);
    }
    // A barrier some thread never reaches (lane 0 waits for its warp, the rest for the block)
    // aborts the run; a thread that overflows its stack faults.
    if (child_signal([] {
            emu_launch(1, 64, [] {
                if (threadIdx.x % 32 == 0) __syncwarp();
                __syncthreads();
            });
        }) != SIGABRT)
        fail("a barrier never reached did not abort the run");
    else
        std::printf("a barrier never reached: the run aborted\n");
    if (child_signal([] {
            emu_launch(1, 32, [] {
                volatile char frame[256 * 1024];  // a fiber's whole stack: into its guard page
                frame[0] = (char)threadIdx.x;
            });
        }) != SIGSEGV)
        fail("a fiber's stack overflow did not fault");
    else
        std::printf("a stack overflow: the run faulted\n");
    return report(failures);
}

}  // namespace emu_driver
