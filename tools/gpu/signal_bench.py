#!/usr/bin/env python3
"""The cost of one point-to-point signal between two SMs of this GPU (issue 20, "measure
first"): a persistent decode kernel replaces kernel boundaries and grid barriers by a producer
releasing a flag that a consumer on another SM acquires, so its schedule is priced in these.

Two single-thread blocks play ping-pong through two flags in global memory, each on its own
128-byte line: block 0 releases `ping = i` and waits to acquire `pong == i`, block 1 the mirror.
One round trip is two signals; the figure is the one-way time, nanoseconds from %globaltimer over
many rounds. Variants: release/acquire at GPU scope (`st.release.gpu` / `ld.acquire.gpu`, what a
monotonic counter between blocks uses), relaxed volatile stores with a `__threadfence()`, and a
counter bumped by `atomicAdd` (the "n producers done" form) polled by the consumer. A third block
on an idle SM does not matter; the SMs of the two blocks are reported (%smid).

Runs on the GPU machine with the driver and NVRTC of the CUDA toolkit, no build (cuprobe.py):
    python3 tools/gpu/signal_bench.py [--rounds N] [--json FILE]
and `--compile-only` checks the kernels' source here, without a GPU.
"""
import ctypes
import json
import statistics

import cuprobe

SRC = r"""
__device__ unsigned smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
__device__ void release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ unsigned acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// flags: ping at [0], pong at [32] (separate 128-byte lines); out: [ns, sm of block 0, sm of 1].
extern "C" __global__ void pingpong_acquire(unsigned* flags, int rounds, unsigned long long* out) {
    if (threadIdx.x != 0 || blockIdx.x > 1) return;
    unsigned* ping = flags;
    unsigned* pong = flags + 32;
    unsigned long long t0 = now();
    for (unsigned i = 1; i <= (unsigned)rounds; i++) {
        if (blockIdx.x == 0) {
            release(ping, i);
            while (acquire(pong) != i) {}
        } else {
            while (acquire(ping) != i) {}
            release(pong, i);
        }
    }
    if (blockIdx.x == 0) out[0] = now() - t0;
    out[1 + blockIdx.x] = smid();
}
extern "C" __global__ void pingpong_fence(unsigned* flags, int rounds, unsigned long long* out) {
    if (threadIdx.x != 0 || blockIdx.x > 1) return;
    volatile unsigned* ping = flags;
    volatile unsigned* pong = flags + 32;
    unsigned long long t0 = now();
    for (unsigned i = 1; i <= (unsigned)rounds; i++) {
        if (blockIdx.x == 0) {
            __threadfence();
            *ping = i;
            while (*pong != i) {}
        } else {
            while (*ping != i) {}
            __threadfence();
            *pong = i;
        }
    }
    if (blockIdx.x == 0) out[0] = now() - t0;
    out[1 + blockIdx.x] = smid();
}
extern "C" __global__ void pingpong_atomic(unsigned* flags, int rounds, unsigned long long* out) {
    if (threadIdx.x != 0 || blockIdx.x > 1) return;
    unsigned* ping = flags;
    unsigned* pong = flags + 32;
    unsigned long long t0 = now();
    for (unsigned i = 1; i <= (unsigned)rounds; i++) {
        if (blockIdx.x == 0) {
            __threadfence();
            atomicAdd(ping, 1u);
            while (acquire(pong) < i) {}
        } else {
            while (acquire(ping) < i) {}
            __threadfence();
            atomicAdd(pong, 1u);
        }
    }
    if (blockIdx.x == 0) out[0] = now() - t0;
    out[1 + blockIdx.x] = smid();
}
"""

KERNELS = ["pingpong_acquire", "pingpong_fence", "pingpong_atomic"]


def main():
    ap = cuprobe.parser(__doc__, "timed launches per variant")
    ap.add_argument("--rounds", type=int, default=20000, help="round trips per launch")
    a = ap.parse_args()
    if cuprobe.compiled_only(a, SRC, "signal.cu"):
        return
    gpu = cuprobe.Gpu()
    mod = gpu.module(SRC, "signal.cu")
    flags, out = gpu.alloc(256), gpu.alloc(24)
    results = {}
    for k in KERNELS:
        f = gpu.function(mod, k)
        one_way = []
        sms = None
        for launch in range(a.launches + 1):  # the first launch warms up
            gpu.memset32(flags, 0, 64)
            # Two blocks of one warp: they cannot share an SM's scheduler slot with each other's
            # spin loop unnoticed, and %smid says where they ran.
            gpu.launch(f, 2, 32, [flags, ctypes.c_int(a.rounds), out])
            host = gpu.read(out, ctypes.c_uint64, 3)
            if launch:
                one_way.append(host[0] / (2 * a.rounds))
            sms = (host[1], host[2])
        results[k] = {
            "one_way_ns_median": statistics.median(one_way),
            "one_way_ns_min": min(one_way),
            "one_way_ns_max": max(one_way),
            "sms": sms,
        }
        print(f"{k:<18} one-way signal {statistics.median(one_way):7.1f} ns median "
              f"({min(one_way):.1f}-{max(one_way):.1f}, {a.launches} launches of {a.rounds} round trips), "
              f"blocks on SMs {sms[0]} and {sms[1]}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rounds": a.rounds, "launches": a.launches, "variants": results}, fh, indent=2)


if __name__ == "__main__":
    main()
