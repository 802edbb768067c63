#!/usr/bin/env python3
"""Runs shell commands as jobs in lanes side by side, each output line tagged with its job.

    lanes.py --lanes 2 'arena=cargo test --test arena' 'rest=cargo test --lib' ...

Jobs start in the order given (put the longest first), each on the first free lane, and every
line a job prints goes to stdout as `[NAME] line` as it comes, so that tools/ci/summary.py can
follow each job's test binaries. The exit status is 0 when every job exited 0, else 1, after
every job has ended (a failing job stops no other). tools/test.sh runs the workspace's test
binaries this way: most of a binary's time is spent waiting on processes it started (builds,
pricings, a browser), so two lanes keep both of CI's cores busy. Whether they did is printed
at the end: the machine's busy share (all its cores, from /proc/stat) over the run and minute by
minute.
"""

import argparse
import os
import subprocess
import sys
import threading
import time


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle and iowait
    return sum(v) - idle, sum(v)


class BusySampler:
    """The machine's busy share, sampled every second on a thread of its own."""

    def __init__(self) -> None:
        self.shares: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        last = cpu_times()
        while not self.done.wait(1.0):
            now = cpu_times()
            busy, total = now[0] - last[0], now[1] - last[1]
            self.shares.append(busy / total if total else 0.0)
            last = now

    def report(self) -> str:
        self.done.set()
        self.thread.join()
        s = self.shares
        if not s:
            return "lanes.py: no CPU samples"
        minutes = [s[i : i + 60] for i in range(0, len(s), 60)]
        by_minute = " ".join(f"{100 * sum(m) / len(m):.0f}" for m in minutes)
        return (
            f"lanes.py: the machine ({os.cpu_count()} cores) was {100 * sum(s) / len(s):.0f} % busy "
            f"over the jobs' {len(s)} s; by minute (%): {by_minute}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lanes", type=int, default=2, help="jobs running at once")
    ap.add_argument("jobs", nargs="+", metavar="NAME=COMMAND")
    args = ap.parse_args()
    jobs = []
    for j in args.jobs:
        name, sep, command = j.partition("=")
        if not sep or not name or not command or " " in name:
            sys.exit(f"lanes.py: {j!r}: a job is NAME=COMMAND (a name without spaces)")
        jobs.append((name, command))
    if args.lanes < 1:
        sys.exit(f"lanes.py: --lanes {args.lanes}: at least 1")

    out = threading.Lock()
    queue = list(reversed(jobs))
    failed = []

    def lane() -> None:
        while True:
            with out:
                if not queue:
                    return
                name, command = queue.pop()
            p = subprocess.Popen(
                command,
                shell=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
            for line in p.stdout:
                with out:
                    sys.stdout.write(f"[{name}] {line}")
                    sys.stdout.flush()
            if p.wait() != 0:
                with out:
                    failed.append(name)
                    print(f"[{name}] lanes.py: the job exited {p.returncode}", flush=True)

    sampler = BusySampler()
    threads = [threading.Thread(target=lane) for _ in range(min(args.lanes, len(jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sampler.report(), flush=True)
    if failed:
        print(f"lanes.py: failed jobs: {', '.join(failed)}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
