#!/usr/bin/env python3
"""mqar-table.py OUT LEN:PAIRS... — the table of scripts/mqar-sweep.sh from
each run's metrics.jsonl (OUT/L<len>-P<pairs>/metrics.jsonl): steps run,
wall time, best recall and its step, the first step with recall >= 0.9, and
the last evaluation's recall by query distance."""
import os
import sys

import metricslog


def evals(path):
    first_time, rows = None, []
    for r in metricslog.records(path):
        if first_time is None and "time" in r:
            first_time = r["time"]
        if "recall_acc" in r:
            rows.append(r)
        last = r
    return first_time, rows, last


def main():
    out, settings = sys.argv[1], sys.argv[2:]
    print("| length | pairs | steps | wall | best recall (step) | first step ≥ 0.9 | last recall by distance |")
    print("| ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for s in settings:
        length, pairs = s.split(":")
        path = os.path.join(out, f"L{length}-P{pairs}", "metrics.jsonl")
        if not os.path.exists(path):
            print(f"| {length} | {pairs} | — | — | no metrics | — | — |")
            continue
        t0, rows, last = evals(path)
        steps = last.get("step", 0)
        wall = last.get("time", t0) - t0 if t0 else 0
        if not rows:
            print(f"| {length} | {pairs} | {steps} | {wall/60:.1f} min | no evaluation | — | — |")
            continue
        best = max(rows, key=lambda r: r["recall_acc"])
        hit = next((r["step"] for r in rows if r["recall_acc"] >= 0.9), None)
        dist = ", ".join(
            f"[{b['lo']},{b['hi']}) {b['correct']/b['total']:.2f}" for b in rows[-1].get("recall_by_dist", []) if b["total"] > 0
        )
        print(f"| {length} | {pairs} | {steps:,} | {wall/60:.1f} min | {best['recall_acc']:.3f} ({best['step']:,}) | "
              f"{'—' if hit is None else f'{hit:,}'} | {dist} |")


if __name__ == "__main__":
    main()
