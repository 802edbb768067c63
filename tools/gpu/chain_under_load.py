#!/usr/bin/env python3
"""How much a stream of weight loads slows a dependent chain of loads on this GPU (issue 20,
"measure first"). The decode step's latency-bound kernels are chains of dependent round trips
with HBM idle; a persistent step would stream the next ops' weights during those chains. Every
attempt to prefetch beside them lost ("the latency-bound kernels' own first loads queue behind
it", docs/decode-experiments.md), but how much a load in a chain waits behind a stream was never
measured on its own. Here it is.

One block per SM (each asks for 150 KiB of shared memory). Chain blocks: thread 0 follows
`next` (i = next[i], ld.global.cg, so every step is an L2 round trip and, over the 1 GiB table,
mostly an HBM one) for --steps steps and reports ns per step from %globaltimer. Stream: every
thread of the streaming blocks reads 16-byte words of a 1 GiB buffer (ld.global.nc.L1::no_allocate,
the weights' load), DEPTH of them in flight, until the chains are done, and the bytes they read
give the stream's rate. Configurations: no stream; the other SMs streaming at 1, 4 and 8 words
in flight per thread and on a quarter, half and all of them; and warps 1..7 of every block
streaming beside the chain's warp on the same SM (a persistent kernel's loader beside its
compute warps). Each with the chain over a 4 MiB table (L2-resident: the activations a kernel
reads from its predecessor) and over a 1 GiB one (HBM).

Runs on the GPU machine with the driver and NVRTC of the CUDA toolkit, no build (cuprobe.py):
    python3 tools/gpu/chain_under_load.py [--steps N] [--launches N] [--json FILE]
and `--compile-only` checks the kernels' source here, without a GPU.
"""
import ctypes
import json
import random
import statistics

import cuprobe

SRC = r"""
__device__ unsigned load_cg(const unsigned* p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ uint4 load_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ unsigned load_relaxed(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// next[i] = (i + stride) & mask: one cycle through all mask + 1 entries (stride odd).
extern "C" __global__ void init_next(unsigned* next, unsigned mask, unsigned stride) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i <= mask; i += gridDim.x * blockDim.x)
        next[i] = (i + stride) & mask;
}

// out: [0, chains): a chain's ns; [chains]: bytes streamed; [chains + 1]: the earliest stream
// start and [chains + 2] the latest stream end (globaltimer ns); [chains + 3]: a sink.
template <int DEPTH>
__device__ void stream(const uint4* big, unsigned long long words, unsigned long long tid,
                       unsigned long long threads, const unsigned* done, unsigned chains,
                       unsigned long long* out) {
    const unsigned long long t0 = now();
    unsigned acc = 0;
    unsigned long long i = tid % words, n = 0;
    for (;;) {
        uint4 v[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            unsigned long long j = i + d * threads;
            v[d] = load_stream(big + (j < words ? j : j - words));
        }
#pragma unroll
        for (int d = 0; d < DEPTH; d++) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;  // all four: all in flight
        i += DEPTH * threads;
        if (i >= words) i %= words;
        n += DEPTH;
        if ((n & 63) < DEPTH && load_relaxed(done) >= chains) break;
    }
    atomicAdd(out + chains, n * 16);
    atomicMin(out + chains + 1, t0);
    atomicMax(out + chains + 2, now());
    if (acc == 0x9e3779b9u) out[chains + 3] = acc;  // keeps the loads
}

// Blocks [0, chains) chain (thread 0, from entry start + 7919·block); with same_sm, warps 1.. of
// every block stream, else the `streamers` blocks after the chains do, all their threads. The
// launch asks for enough dynamic shared memory to hold one block per SM, so all are resident.
template <int DEPTH>
__device__ void probe(const unsigned* next, unsigned start, int steps, const uint4* big,
                      unsigned long long words, unsigned chains, unsigned streamers, int same_sm,
                      unsigned* done, unsigned long long* out) {
    const unsigned b = blockIdx.x, t = threadIdx.x;
    if (b < chains && t == 0) {
        unsigned i = load_cg(next + start + 7919u * b);  // the first step, untimed
        const unsigned long long t0 = now();
        for (int s = 0; s < steps; s++) i = load_cg(next + i);
        out[b] = now() - t0;
        if (i == 0xffffffffu) out[chains + 3] = i;
        atomicAdd(done, 1u);
        return;
    }
    if (same_sm) {
        if (t < 32) return;
        const unsigned per = blockDim.x - 32;
        stream<DEPTH>(big, words, (unsigned long long)b * per + t - 32, (unsigned long long)gridDim.x * per, done,
                      chains, out);
    } else if (b >= chains && b < chains + streamers) {
        stream<DEPTH>(big, words, (unsigned long long)(b - chains) * blockDim.x + t,
                      (unsigned long long)streamers * blockDim.x, done, chains, out);
    }
}
#define PROBE(D)                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, 1) probe_##D(const unsigned* next, unsigned start, int steps, \
                                         const uint4* big, unsigned long long words, unsigned chains, \
                                         unsigned streamers, int same_sm, unsigned* done,          \
                                         unsigned long long* out) {                                \
        probe<D>(next, start, steps, big, words, chains, streamers, same_sm, done, out);           \
    }
PROBE(1)
PROBE(4)
PROBE(8)
"""

CHAINS = 4
HOLD = 150 * 1024  # dynamic shared memory a block: one block per SM
BIG = 1 << 30      # bytes of the streamed buffer and of the HBM chain's table


def main():
    ap = cuprobe.parser(__doc__, "timed launches per configuration")
    ap.add_argument("--steps", type=int, default=4000, help="dependent loads per chain")
    a = ap.parse_args()
    if cuprobe.compiled_only(a, SRC, "chain.cu"):
        return
    gpu = cuprobe.Gpu()
    sms = gpu.attribute(16)
    mod = gpu.module(SRC, "chain.cu")
    init = gpu.function(mod, "init_next")
    probes = {d: gpu.function(mod, f"probe_{d}", HOLD) for d in (1, 4, 8)}
    big = gpu.alloc(BIG)
    tables = {}
    # (entries, stride): 4 MiB (L2-resident) with steps of ~16 KiB, 1 GiB with steps of ~4 MiB.
    for name, entries, stride in (("L2", 1 << 20, 4099), ("HBM", BIG // 4, 1000003)):
        t = gpu.alloc(entries * 4)
        gpu.launch(init, 1024, 256, [t, ctypes.c_uint(entries - 1), ctypes.c_uint(stride)])
        tables[name] = (t, entries)
    done, out = gpu.alloc(4), gpu.alloc(8 * (CHAINS + 4))
    others = sms - CHAINS
    configs = [("no stream", 1, 0, 0)]
    configs += [(f"{others} other SMs, {d} in flight", d, others, 0) for d in (1, 4, 8)]
    configs += [(f"{n} other SMs, 4 in flight", 4, n, 0) for n in (others // 4, others // 2)]
    configs += [("warps 1-7 of every SM, 4 in flight", 4, 0, 1)]
    rng = random.Random(1)
    results = []
    print(f"{sms} SMs; {CHAINS} chains of {a.steps} dependent loads; medians of {a.launches} launches")
    for table, (tp, entries) in tables.items():
        for label, depth, streamers, same_sm in configs:
            step_ns, rates = [], []
            for launch in range(a.launches + 1):  # the first launch warms up
                gpu.memset32(done, 0, 1)
                gpu.memset32(out, 0, 2 * (CHAINS + 4))
                gpu.memset32(ctypes.c_uint64(out.value + 8 * (CHAINS + 1)), 0xffffffff, 2)  # earliest start: high
                # A fresh start each launch: over the 1 GiB table, lines no launch has touched.
                start = rng.randrange(entries - 7919 * CHAINS)
                args = [tp, ctypes.c_uint(start), ctypes.c_int(a.steps), big,
                        ctypes.c_uint64(BIG // 16), ctypes.c_uint(CHAINS), ctypes.c_uint(streamers),
                        ctypes.c_int(same_sm), done, out]
                gpu.launch(probes[depth], sms, 256, args, HOLD)
                o = gpu.read(out, ctypes.c_uint64, CHAINS + 4)
                if launch:
                    step_ns += [ns / a.steps for ns in o[:CHAINS]]
                    if o[CHAINS]:
                        rates.append(o[CHAINS] / (o[CHAINS + 2] - o[CHAINS + 1]))  # bytes per ns = GB/s
            r = {"table": table, "stream": label, "depth": depth, "streaming_blocks": streamers,
                 "same_sm": bool(same_sm), "chain_ns_per_load_median": statistics.median(step_ns),
                 "chain_ns_per_load_max": max(step_ns),
                 "stream_gb_per_s_median": statistics.median(rates) if rates else 0.0}
            results.append(r)
            print(f"{table:<4} {label:<38} chain {r['chain_ns_per_load_median']:7.1f} ns a load "
                  f"(max {r['chain_ns_per_load_max']:.1f}), stream {r['stream_gb_per_s_median']:7.1f} GB/s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"sms": sms, "chains": CHAINS, "steps": a.steps, "launches": a.launches,
                       "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
