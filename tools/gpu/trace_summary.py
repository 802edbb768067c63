#!/usr/bin/env python3
"""Summarise a `fastdecode bench --trace FILE` timeline (kernels built with
FASTDECODE_NVRTC_DEFINES=-DFD_TRACE): per kernel kind, the median over its launches of
  step  - its last block's end minus the previous launch's last end (what it adds to the step),
  wait  - its first block passing pdl_wait minus the previous launch's last end (the dependency),
  run   - its last block's end minus its first wait (the work after the dependency),
and for every other event a kernel marks (FD_MARK(n) in common.cuh) its median time after the
launch's first wait, over the blocks (min / median / max); and the SM clock rate the kernel ran
at (each block's cycle-counter span over its timer span, median).
Usage: tools/gpu/trace_summary.py trace.csv"""
import collections
import csv
import statistics
import sys

KINDS = {1: "embed_rows", 2: "gemv_bf16", 3: "attend_decode", 4: "router", 5: "moe_gate_up",
         6: "moe_down", 7: "argmax_rows", 8: "silu_mul"}


def main(path):
    rows = list(csv.DictReader(open(path)))
    recs = sorted((int(r["ns"]), int(r["kind"]), int(r["event"]), int(r["block"])) for r in rows)
    # SM clock: (kind, launch-local block) start and end stamps, paired in time order.
    clk = collections.defaultdict(list)
    for r in sorted(rows, key=lambda r: int(r["ns"])):
        if r["event"] in ("0", "2"):
            clk[(int(r["kind"]), int(r["block"]))].append((int(r["ns"]), int(r["clock"])))
    mhz = collections.defaultdict(list)
    for (k, _), v in clk.items():
        for (t0, c0), (t1, c1) in zip(v[::2], v[1::2]):
            if t1 - t0 > 2000:  # long enough for the 32 ns timer
                mhz[k].append((c1 - c0) / (t1 - t0) * 1e3)
    if not recs:
        sys.exit(f"{path}: no records")
    # Launches: a kind's blocks start once per launch, so a repeated (kind, block) start opens the next.
    launches, cur = [], {}
    for t, k, e, b in recs:
        c = cur.get(k)
        if e == 0 and (c is None or b in c[0]):
            c = cur[k] = collections.defaultdict(dict)
            launches.append((k, c))
        if c is not None:
            c[e][b] = t
    launches.sort(key=lambda kc: min(kc[1][0].values()))
    steps = collections.defaultdict(list)
    marks = collections.defaultdict(lambda: collections.defaultdict(list))
    prev_end = None
    for k, c in launches:
        end = max(c[2].values())
        w0 = min(c[1].values()) if c[1] else min(c[0].values())
        if prev_end is not None:
            steps[k].append(((end - prev_end) / 1e3, (w0 - prev_end) / 1e3, (end - w0) / 1e3))
        for ev, per_block in c.items():
            if ev >= 3:
                v = sorted((t - w0) / 1e3 for t in per_block.values())
                marks[k][ev].append((v[0], v[len(v) // 2], v[-1]))
        prev_end = end
    name = lambda k: f"{KINDS.get(k >> 20, k >> 20)}" + (f" ({k & 0xfffff})" if k & 0xfffff else "")
    total = sum(s[0] for v in steps.values() for s in v)
    print(f"{'kernel (tag)':<26} {'launches':>8} {'step µs':>8} {'wait µs':>8} {'run µs':>8} {'share':>6} {'SM MHz':>7}")
    for k, v in sorted(steps.items(), key=lambda kv: -sum(s[0] for s in kv[1])):
        med = [statistics.median(s[i] for s in v) for i in range(3)]
        share = sum(s[0] for s in v) / total
        clock = f"{statistics.median(mhz[k]):>7.0f}" if mhz[k] else f"{'-':>7}"
        print(f"{name(k):<26} {len(v):>8} {med[0]:>8.2f} {med[1]:>8.2f} {med[2]:>8.2f} {share:>6.1%} {clock}")
        for ev, m in sorted(marks[k].items()):
            mm = [statistics.median(x[i] for x in m) for i in range(3)]
            print(f"    mark {ev}: {mm[0]:.2f} / {mm[1]:.2f} / {mm[2]:.2f} µs after the wait")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
