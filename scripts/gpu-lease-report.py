#!/usr/bin/env python3
"""gpu-lease-report.py OUT STAGES.TSV BUDGET ELAPSED DRY — the summary of
scripts/gpu-lease.sh: reads OUT's stage logs (steps.log, measure.log,
smoke.log), OUT/torch.json and the stage table, writes OUT/summary.md
(the figures in its first lines) and OUT/lease.json. Exit 1 when a command
failed or a smoke test failed; stages left out by the time budget are
reported, not failures. Nothing but the standard library."""
import json
import os
import re
import sys


def blocks(path):
    """(command, output) of each command in a stage log."""
    if not os.path.exists(path):
        return []
    text = open(path, encoding="utf-8", errors="replace").read()
    parts = text.split("\n----- ")[1:]
    return [tuple(p.split("\n", 1)) if "\n" in p else (p, "") for p in parts]


def setting(cmd):
    """default, candidate (every unmeasured path on) or routed (the
    candidate with RPAC_LEASE_ROUTED's flag)."""
    routed = os.environ.get("RPAC_LEASE_ROUTED", "")
    if routed and routed in cmd:
        return "routed"
    return "candidate" if "--cuda-candidate" in cmd else "default"


def num(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else None


def steps(out):
    rows = []
    for cmd, text in blocks(os.path.join(out, "steps.log")):
        if cmd.startswith("not run") or ": not run" in cmd:
            continue
        T = num(r"--context (\d+)", cmd)
        step = num(r"step time\s+([0-9.]+) s", text)
        rows.append({"T": int(T) if T else None, "setting": setting(cmd), "command": cmd,
                     "ms_per_step": round(1e3 * step, 2) if step else None,
                     "tokens_per_s": num(r"tokens/s\s+([0-9.]+)", text),
                     "mfu_pct": num(r"MFU\s+([0-9.]+)%", text),
                     "mfu_routed_pct": num(r"MFU routed\s+([0-9.]+)%", text),
                     "error": None if step else (text.strip().splitlines() or ["no output"])[-1][:300]})
    return rows


def measures(out):
    rows = []
    for cmd, text in blocks(os.path.join(out, "measure.log")):
        rows.append({"setting": setting(cmd), "T": int(num(r"--context (\d+)", cmd) or 0),
                     "predicted_ms": num(r"predicted \S+ \S+: ([0-9.]+) ms/step", text),
                     "kernels_measured_ms": num(r"measured\s+([0-9.]+) ms", text)})
    return rows


def smoke(out):
    text = open(os.path.join(out, "smoke.log"), errors="replace").read() if os.path.exists(os.path.join(out, "smoke.log")) else ""
    return {"passed": len(re.findall(r"^\s*--- PASS", text, re.M)), "failed": re.findall(r"^\s*--- FAIL: (\S+)", text, re.M),
            "skipped": len(re.findall(r"^\s*--- SKIP", text, re.M))}


def fmt(v, f="{:,.0f}"):
    return "—" if v is None else f.format(v)


def main():
    out, tsv, budget, elapsed, dry = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    table = [line.rstrip("\n").split("\t") for line in open(tsv) if line.strip()]
    failed = [r[0] for r in table if len(r) > 1 and r[1] not in ("0",) and not r[1].startswith("not run")]
    not_run = [r[0] for r in table if len(r) > 1 and r[1].startswith("not run")]
    st, ms, sm = steps(out), measures(out), smoke(out)
    torch = {}
    tj = os.path.join(out, "torch.json")
    if os.path.exists(tj):
        torch = json.load(open(tj))
    rpac384 = {r["setting"]: r for r in st if r["T"] == 384 and r["tokens_per_s"]}
    for r in ms:
        s = rpac384.get(r["setting"])
        r["step_ms"] = s["ms_per_step"] if s else None
        r["predicted_over_measured"] = round(r["predicted_ms"] / s["ms_per_step"], 3) if s and r["predicted_ms"] else None
    ratios = {}
    for kind in ("eager", "compile", "eager_routed"):
        tps = (torch.get(kind) or {}).get("tokens_per_s")
        for name, r in rpac384.items():
            if tps:
                ratios[f"{name}/{kind}"] = round(r["tokens_per_s"] / tps, 2)
    lines = [f"# rpac GPU lease{' (DRY RUN: fakes, no GPU)' if dry else ''}", ""]
    lines.append("| T | paths | ms/step | tokens/s | MFU (dense FLOPs) | MFU (routed FLOPs) |")
    lines.append("| ---: | --- | ---: | ---: | ---: | ---: |")
    for r in st:
        lines.append(f"| {r['T']} | {r['setting']} | {fmt(r['ms_per_step'], '{:.1f}')} | {fmt(r['tokens_per_s'])} | "
                     f"{fmt(r['mfu_pct'], '{:.1f}%')} | {fmt(r['mfu_routed_pct'], '{:.1f}%')} |")
    if torch:
        e, c = torch.get("eager") or {}, torch.get("compile") or {}
        comp = f"{fmt(c.get('tokens_per_s'))} tokens/s" if c.get("tokens_per_s") else f"not run ({c.get('skipped', 'no result')})"
        lines.append("")
        lines.append(f"PyTorch {torch.get('torch')} (paper, T = 384, same weights, bf16 autocast): eager {fmt(e.get('tokens_per_s'))} tokens/s, "
                     f"torch.compile {comp}; rpac/torch: " + (", ".join(f"{k} {v}x" for k, v in ratios.items()) or "—"))
        lines.append(f"loss on the fixed batch: rpac {torch.get('rpac_loss')}, torch dense |Δ| {torch.get('diff_dense')}, "
                     f"routed |Δ| {torch.get('diff_routed')} (limit {torch.get('tol')}): {'ok' if torch.get('loss_ok') else 'FAILED'}")
    else:
        lines += ["", "PyTorch: no result (torch.log)"]
    pm = [f"{r['setting']} {r['predicted_ms']} ms predicted / {r['step_ms']} ms measured = {r['predicted_over_measured']}" for r in ms if r["predicted_over_measured"]]
    lines.append("the model's predicted/measured (h200, T = 384): " + ("; ".join(pm) if pm else "— (measure not run)"))
    lines.append(f"smoke: {sm['passed']} passed, {len(sm['failed'])} failed{' (' + ', '.join(sm['failed']) + ')' if sm['failed'] else ''}, {sm['skipped']} skipped")
    lines += ["", f"{elapsed} s of a {budget} s budget. Commands:", ""]
    for r in table:
        status = r[1] if len(r) > 1 else "?"
        lines.append(f"- `{r[0]}`: " + ("passed" if status == "0" else status if status.startswith("not run") else f"FAILED (exit {status})")
                     + (f", {r[2]} s" if len(r) > 2 and status == "0" else ""))
    open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
    rep = {"dry": dry, "budget_s": budget, "elapsed_s": elapsed, "steps": st, "measure": ms, "torch": torch,
           "rpac_over_torch": ratios, "smoke": sm, "failed": failed, "not_run": not_run}
    json.dump(rep, open(os.path.join(out, "lease.json"), "w"), indent=1)
    print("\n".join(lines[:12]))
    return 1 if failed or sm["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
