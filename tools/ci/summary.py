#!/usr/bin/env python3
"""Where a `cargo test` run's time went, and its one summary line.

Reads cargo test's output on stdin and passes it through unchanged as it comes; at the end
prints how long the build took (start to the first test binary), each test binary's wall time
and CPU time (tools/ci/timed-runner.sh's line), the tests that cost the most wall time, and one
line:
`tests: P passed, F failed, I ignored in S s (build B s)`; a binary that ends without libtest's
result line (a crash, a signal) counts its tests' own lines and one failure more. A test's cost is the wall time from
the previous test's end in its binary (or the binary's start) to its own: what it added to the
run, whether its binary's tests ran in turns (the arena's hold a lock) or side by side; libtest's
own figure (`--report-time`, which tools/test.sh asks for) follows it, and counts time spent
waiting for a turn. Lines tagged `[JOB] ` (tools/ci/lanes.py: jobs side by side) are followed
job by job; a binary's wall time is then its own, overlapping other jobs', and lanes.py's line
on how busy the machine was is repeated with the figures. With `--stages FILE` (removed at the start) it also sums the arena stages
the end-to-end tests' arenas appended there, one JSON line a stage (crates/cli/tests/
arena_support): time by stage, and the longest stages with their test. With `--json FILE` the
same figures go into FILE as well. The exit status is 0; the caller takes cargo's own (pipefail).

    cargo test -- -Zunstable-options --report-time 2>&1 | tools/ci/summary.py
"""

import argparse
import collections
import json
import os
import re
import sys
import time

RUNNING = re.compile(r"^\s+(Running|Doc-tests) (?:unittests )?(\S+)(?: \((\S+)\))?")
RESULT = re.compile(
    r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; .*finished in ([\d.]+)s"
)
JOB = re.compile(r"^\[(\S+)\] ")
BUSY = re.compile(r"^lanes\.py: the machine .*")
TIMED = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?: <([\d.]+)s>)?")
CPU = re.compile(r"^timed-runner: cpu (\d+) ms")


def binary_name(m: re.Match) -> str:
    """`arena tests/arena.rs`, `fastdecode_clock src/lib.rs`, `doc-tests fastdecode_model`."""
    kind, source, path = m.groups()
    if kind == "Doc-tests":
        return f"doc-tests {source}"
    crate = path.rsplit("/", 1)[-1].rsplit("-", 1)[0] if path else ""
    return f"{crate} {source}".strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--slowest", type=int, default=15, help="how many tests to list")
    ap.add_argument("--stages", help="the arenas' stage times (JSON lines) to sum")
    args = ap.parse_args()
    if args.stages and os.path.exists(args.stages):
        os.remove(args.stages)

    t0 = time.monotonic()
    build_s = None
    binaries = []  # [name, wall seconds, CPU seconds or None]
    tests = []  # (binary, test, wall seconds added, libtest's seconds or None)
    counts = {"passed": 0, "failed": 0, "ignored": 0}
    failed = []
    # Each job's running binary (tools/ci/lanes.py tags a job's lines `[NAME] `): the row of
    # `binaries` it fills, when it started, when its last test ended, and its tests' own lines
    # counted until its result line comes.
    jobs = {}
    busy = None  # tools/ci/lanes.py's line on how busy the machine was

    def unfinished(state) -> None:
        """A binary that ended without its result line (a crash, a signal: cargo's `--no-fail-fast`
        goes on to the next) counts its tests' own lines, and one failure for the run itself."""
        if state["row"] is None or state["seen"] is None:
            return
        for key, n in state["seen"].items():
            counts[key] += n
        state["row"][1] = state["last"] - state["started"]
        counts["failed"] += 1
        failed.append(f"{state['row'][0]}: ended without its result line")
        state["seen"] = None

    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        now = time.monotonic()
        job, text = "", line
        if m := JOB.match(line):
            job, text = m.group(1), line[m.end() :]
        state = jobs.setdefault(job, {"row": None, "started": now, "last": now, "seen": None})
        if BUSY.match(text):
            busy = text.strip()
        elif m := RUNNING.match(text):
            if build_s is None:
                build_s = now - t0
            unfinished(state)
            binaries.append([binary_name(m), 0.0, None])
            state.update(row=binaries[-1], started=now, last=now)
            state["seen"] = {"passed": 0, "failed": 0, "ignored": 0}
        elif (m := RESULT.match(text)) and state["row"] is not None:
            for key, g in zip(("passed", "failed", "ignored"), m.groups()):
                counts[key] += int(g)
            state["row"][1] = now - state["started"]
            state["seen"] = None
        elif (m := CPU.match(text)) and state["row"] is not None:
            state["row"][2] = int(m.group(1)) / 1000
        elif (m := TIMED.match(text)) and state["row"] is not None:
            current = state["row"][0]
            if state["seen"] is not None:
                key = {"ok": "passed", "FAILED": "failed"}.get(m.group(2), "ignored")
                state["seen"][key] += 1
            if m.group(2) == "FAILED":
                failed.append(f"{current}: {m.group(1)}")
            if m.group(2) != "ignored":
                own = float(m.group(3)) if m.group(3) else None
                tests.append((current, m.group(1), now - state["last"], own))
                state["last"] = now
    for state in jobs.values():
        unfinished(state)
    total = time.monotonic() - t0

    out = sys.stdout
    print("\n== where the time went ==", file=out)
    print(f"{build_s or total:8.1f} s  build (start to the first test binary)", file=out)
    if busy:
        print(busy, file=out)
    print("-- test binaries (wall; CPU of the binary and all it started) --", file=out)
    for name, s, cpu in sorted(binaries, key=lambda b: -b[1]):
        cpu = f"{cpu:8.1f} s" if cpu is not None else " " * 10
        print(f"{s:8.1f} s {cpu}  {name}", file=out)
    known = [b[2] for b in binaries if b[2] is not None]
    if known:
        print(f"{sum(known):8.1f} s CPU in the test binaries", file=out)
    if tests:
        print(f"-- the {args.slowest} costliest tests (wall time added; libtest's own) --", file=out)
        for binary, name, s, own in sorted(tests, key=lambda t: -t[2])[: args.slowest]:
            short = binary.split(" ")[0]
            mine = f"{own:8.1f} s" if own is not None else " " * 10
            print(f"{s:8.1f} s {mine}  {short} {name}", file=out)
    stages = read_stages(args.stages)
    print_stages(stages, args.slowest)
    for f in failed:
        print(f"FAILED {f}", file=out)
    print(
        f"tests: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['ignored']} ignored in {total:.0f} s (build {build_s or total:.0f} s)",
        file=out,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "total_s": round(total, 1),
                    "build_s": round(build_s or total, 1),
                    "counts": counts,
                    "busy": busy,
                    "binaries": [
                        {"name": n, "s": round(s, 1), "cpu_s": cpu} for n, s, cpu in binaries
                    ],
                    "tests": [
                        {"binary": b, "test": t, "wall_s": round(s, 2), "libtest_s": own}
                        for b, t, s, own in tests
                    ],
                    "failed": failed,
                    "stages": stages,
                },
                f,
                indent=1,
            )


def read_stages(path):
    """The stage rows the arenas appended (none without --stages or when no arena ran)."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def print_stages(rows, slowest: int) -> None:
    """Arena time by stage (rows, seconds in all, mean, longest), then the longest rows."""
    if not rows:
        return
    by = collections.defaultdict(list)
    for r in rows:
        by[r["stage"]].append(r["seconds"])
    print("-- the arenas' stages (rows, seconds in all, mean, longest) --")
    for stage, s in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(s):8.1f} s  {stage:<9} {len(s):4d} rows  {sum(s) / len(s):6.1f} s  {max(s):6.1f} s")
    print(f"-- the {slowest} longest stages --")
    for r in sorted(rows, key=lambda r: -r["seconds"])[:slowest]:
        test = r["test"].rsplit("::", 2)
        test = "::".join(test[-2:]) if len(test) > 1 else test[0]
        detail = (r.get("detail") or "")[:70]
        print(f"{r['seconds']:8.1f} s  {r['stage']:<8} {r['outcome'] or '':<12} {test}: {detail}")


if __name__ == "__main__":
    main()
