#!/usr/bin/env python3
"""mqar-runs.py RUN... — one row per MQAR run directory (a run of rpac train
or one of rpac ablate's STAGE/seedN): the steps run, the first evaluation
with recall >= 0.5 and >= 0.9, the last recall, and, for an ablation run
scored with --eval-lengths (its result.json), recall and CE at each
length through the folded export."""
import json
import os
import sys


def evaluations(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut by a stop
            if "recall_acc" in r:
                rows.append(r)
    return rows


def first(rows, level):
    return next((r["step"] for r in rows if r["recall_acc"] >= level), None)


def fmt(step):
    return "—" if step is None else f"{step:,}"


def main():
    runs = sys.argv[1:]
    if not runs:
        sys.exit(__doc__)
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
