#!/usr/bin/env python3
"""Runs shell commands as jobs in lanes side by side, each output line tagged with its job.

    lanes.py --lanes 2 'arena=cargo test --test arena' 'rest=cargo test --lib' ...

Jobs start in the order given (put the longest first), each on the first free lane, and every
line a job prints goes to stdout as `[NAME] line` as it comes, so that tools/ci/summary.py can
follow each job's test binaries. The exit status is 0 when every job exited 0, else 1, after
every job has ended (a failing job stops no other). tools/test.sh runs the workspace's test
binaries this way: most of a binary's time is spent waiting on processes it started (builds,
pricings, a browser), so two lanes keep both of CI's cores busy.
"""

import argparse
import subprocess
import sys
import threading


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

    threads = [threading.Thread(target=lane) for _ in range(min(args.lanes, len(jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        print(f"lanes.py: failed jobs: {', '.join(failed)}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
