#!/usr/bin/env python3
"""mqar-runs.py RUN... — one row per MQAR run directory (a run of rpac train
or one of rpac ablate's STAGE/seedN): the steps run, the first evaluation
with recall >= 0.5 and >= 0.9, the last recall, and, for an ablation run
scored with --eval-lengths (its result.json), recall and CE at each
length through the folded export.

mqar-runs.py --paired A B — A and B are stage directories of rpac ablate
runs (each with seedN/ runs, scored with --eval-lengths): a row per seed
both hold, with each run's first evaluation at recall >= 0.9 and its rise
of CE from the shortest to the longest length, then the paired
difference B − A of the rise: mean ± half the 95% interval (Student's t)."""
import json
import math
import os
import statistics
import sys

import metricslog

# Student's t, 0.975 quantile, by degrees of freedom
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


def evaluations(path):
    return [r for r in metricslog.records(path) if "recall_acc" in r]


def first(rows, level):
    return next((r["step"] for r in rows if r["recall_acc"] >= level), None)


def fmt(step):
    return "—" if step is None else f"{step:,}"


def t975(df):
    return T975.get(df) or T975[max(k for k in T975 if k <= df)]


def lengths(run):
    with open(os.path.join(run, "result.json")) as f:
        return json.load(f).get("length_ce", [])


def rise(run):
    ls = sorted(lengths(run), key=lambda l: l["T"])
    return ls[-1]["ce"] - ls[0]["ce"], ls[0]["T"], ls[-1]["T"]


def learned(run):
    return first(evaluations(os.path.join(run, "metrics.jsonl")), 0.9)


def paired(a, b):
    seeds = sorted((d for d in os.listdir(a) if d.startswith("seed") and os.path.isdir(os.path.join(b, d))),
                   key=lambda d: int(d[4:]))
    if not seeds:
        sys.exit(f"no seedN runs in both {a} and {b}")
    print(f"| seed | {a}: first recall ≥ 0.9 | {b}: first ≥ 0.9 | {a}: CE rise | {b}: CE rise | difference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    diffs = []
    for sd in seeds:
        ra, t0, t1 = rise(os.path.join(a, sd))
        rb, _, _ = rise(os.path.join(b, sd))
        diffs.append(rb - ra)
        print(f"| {sd[4:]} | {fmt(learned(os.path.join(a, sd)))} | {fmt(learned(os.path.join(b, sd)))} | "
              f"{ra:.3f} | {rb:.3f} | {rb - ra:+.3f} |")
    n = len(diffs)
    mean = statistics.fmean(diffs)
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n) if n > 1 else float("nan")
    print(f"\nCE rise {t0} → {t1}, paired difference {b} − {a}: {mean:+.3f} ± {half:.3f} (n {n})")


def main():
    runs = sys.argv[1:]
    if not runs:
        sys.exit(__doc__)
    if runs[0] == "--paired":
        if len(runs) != 3:
            sys.exit(__doc__)
        paired(runs[1], runs[2])
        return
    print("| run | steps | first recall ≥ 0.5 | first ≥ 0.9 | last recall | recall at T through the export | CE at T |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for run in runs:
        path = os.path.join(run, "metrics.jsonl")
        if not os.path.exists(path):
            print(f"| {run} | — | — | — | no metrics.jsonl | — | — |")
            continue
        rows = evaluations(path)
        if not rows:
            print(f"| {run} | — | — | — | no evaluation | — | — |")
            continue
        recall, ce = "—", "—"
        res = os.path.join(run, "result.json")
        if os.path.exists(res):
            with open(res) as f:
                lengths = json.load(f).get("length_ce", [])
            recall = ", ".join(f"{l['T']}: {l['recall_acc']:.3f}" for l in lengths if "recall_acc" in l) or "—"
            ce = ", ".join(f"{l['T']}: {l['ce']:.3f}" for l in lengths) or "—"
        print(f"| {run} | {rows[-1]['step']:,} | {fmt(first(rows, 0.5))} | {fmt(first(rows, 0.9))} | "
              f"{rows[-1]['recall_acc']:.3f} | {recall} | {ce} |")


if __name__ == "__main__":
    main()
