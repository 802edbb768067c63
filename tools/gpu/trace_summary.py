#!/usr/bin/env python3
"""Summarise a `fastdecode bench --trace FILE` timeline (kernels built with
FASTDECODE_NVRTC_DEFINES=-DFD_TRACE): per kernel kind, the median over its launches of
  step  - its last block's end minus the previous launch's last end (what it adds to the step),
  wait  - its first block passing pdl_wait minus the previous launch's last end (the dependency),
  run   - its last block's end minus its first wait (the work after the dependency),
and for every other event a kernel marks (FD_MARK(n) in common.cuh) its median time after the
launch's first wait, over the blocks (min / median / max); and the SM clock rate the kernel ran
at (each block's cycle-counter span over its timer span, median).
With --svg OUT (and --window US, default 300), also draws the first US microseconds of the timeline
as a waterfall: a row per launch, pale from its first block's start to its first wait (resident,
prefetching, waiting for its predecessor), dark from there to its last block's end.
Usage: tools/gpu/trace_summary.py trace.csv [--svg timeline.svg [--window US]]"""
import argparse
import collections
import csv
import os
import statistics
import sys

KINDS = {1: "embed_rows", 2: "gemv_bf16", 3: "attend_decode", 4: "router", 5: "moe_gate_up",
         6: "moe_down", 7: "argmax_rows", 8: "silu_mul"}


def waterfall(launches, name, out, window_us):
    """The first window_us of the launches as an SVG waterfall, written to a temporary name first."""
    t0 = min(min(c[0].values()) for _, c in launches)
    px, row_h, label_w = 4.0, 16, 200
    rows = []
    for k, c in launches:
        start, end = min(c[0].values()), max(c[2].values())
        wait = min(c[1].values()) if c[1] else start
        if (start - t0) / 1e3 > window_us:
            break
        rows.append((name(k), (start - t0) / 1e3, (wait - t0) / 1e3, (end - t0) / 1e3))
    width = label_w + window_us * px + 20
    height = (len(rows) + 2) * row_h + 10
    out_lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
                 'font-family="monospace" font-size="11">',
                 f'<rect width="{width:.0f}" height="{height}" fill="white"/>']
    for us in range(0, int(window_us) + 1, 10):  # a tick every 10 µs, labelled every 50
        x = label_w + us * px
        out_lines.append(f'<line x1="{x:.1f}" y1="{row_h}" x2="{x:.1f}" y2="{height - 5}" stroke="#eee"/>')
        if us % 50 == 0:
            out_lines.append(f'<text x="{x + 2:.1f}" y="{row_h - 4}">{us} µs</text>')
    for i, (label, start, wait, end) in enumerate(rows):
        y = (i + 1) * row_h + 4
        clip = lambda v: label_w + min(v, window_us) * px
        out_lines.append(f'<text x="4" y="{y + 11}">{label}</text>')
        out_lines.append(f'<rect x="{clip(start):.1f}" y="{y}" width="{max(clip(wait) - clip(start), 0.5):.1f}" '
                         f'height="{row_h - 4}" fill="#c6dbef"/>')
        out_lines.append(f'<rect x="{clip(wait):.1f}" y="{y}" width="{max(clip(end) - clip(wait), 0.5):.1f}" '
                         f'height="{row_h - 4}" fill="#2171b5"><title>{label}: wait {wait - start:.2f} µs after '
                         f'start, runs {end - wait:.2f} µs</title></rect>')
    out_lines.append("</svg>")
    tmp = out + ".partial"
    with open(tmp, "w") as f:
        f.write("\n".join(out_lines) + "\n")
    os.replace(tmp, out)


def main(path, svg=None, window_us=300.0):
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
    if svg:
        waterfall(launches, name, svg, window_us)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="CSV written by fastdecode bench --trace")
    ap.add_argument("--svg", help="also draw the timeline's start as an SVG waterfall here")
    ap.add_argument("--window", type=float, default=300.0, help="µs of the timeline to draw (default 300)")
    a = ap.parse_args()
    if a.window <= 0:
        ap.error("--window must be positive")
    main(a.trace, a.svg, a.window)
