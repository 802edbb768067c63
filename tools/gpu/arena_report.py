#!/usr/bin/env python3
"""The verdicts of an arena run and where each stage's time went, from the submissions' API views
(RUN/ID.json, as tools/gpu/arena-e2e.sh fetched them). Prints a table and writes RUN/report.json.

    tools/gpu/arena_report.py RUN ID:TRACK:NAME ...
"""
import json
import os
import sys


def summary(view):
    stages = view.get("stages", [])
    rows = []
    for s in stages:
        end = s.get("ended_ms")
        rows.append({
            "stage": s["stage"],
            "seconds": None if end is None else round((end - s["started_ms"]) / 1000, 1),
            "outcome": s.get("outcome"),
            "detail": s.get("detail"),
        })
    gate = next((s for s in stages if s["stage"] == "gate"), None)
    ends = [s["ended_ms"] for s in stages if s.get("ended_ms")]
    verdict = view.get("verdict") or {}
    return {
        "status": view.get("status"),
        "category": verdict.get("category"),
        "score": verdict.get("score"),
        "ci95": verdict.get("ci95"),
        "gate_to_verdict_seconds": None if gate is None or view.get("next_stage") or not ends
        else round((max(ends) - gate["started_ms"]) / 1000, 1),
        "stages": rows,
    }


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    report = {}
    for e in sys.argv[2:]:
        sid, track, name = e.split(":", 2)
        path = os.path.join(run, sid + ".json")
        view = json.load(open(path)) if os.path.exists(path) else {}
        s = summary(view)
        report[f"{track}:{name}"] = dict(s, id=sid)
        print(f"{track} {name} ({sid}): {s['status']} {s['category'] or ''} score {s['score']} "
              f"ci {s['ci95']} gate-to-verdict {s['gate_to_verdict_seconds']} s")
        for r in s["stages"]:
            print(f"  {r['stage']:<8} {r['seconds'] if r['seconds'] is not None else '-':>7} s  "
                  f"{r['outcome'] or 'running'}  {(r['detail'] or '')[:300]}")
    json.dump(report, open(os.path.join(run, "report.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
