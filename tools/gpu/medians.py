#!/usr/bin/env python3
"""The table compare.sh and variants.sh end with: per candidate, the medians over its rounds of
the decode ms/token and prefill ms medians of its bench JSON files, OUT/PREFIX-NAME-ROUND.json.
A missing or unreadable round (a failed run, reported by the caller) is left out.

    medians.py OUT PREFIX ROUNDS LABEL NAME...
"""
import json
import statistics
import sys

out, prefix, rounds, label, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
print(f"{label:<16} {'decode ms/token':>16} {'prefill ms':>11}  (medians over rounds)")
for name in names:
    runs = []
    for n in range(1, rounds + 1):
        try:
            with open(f"{out}/{prefix}-{name}-{n}.json") as f:
                runs.append(json.load(f))
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    if not runs:
        print(f"{name:<16} {'no runs':>16}")
        continue
    d = statistics.median(r["decode_ms_per_token"]["median"] for r in runs)
    p = statistics.median(r["prefill_ms"]["median"] for r in runs)
    print(f"{name:<16} {d:>16.4f} {p:>11.2f}  ({len(runs)} rounds)")
