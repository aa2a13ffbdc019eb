#!/usr/bin/env python3
"""Writes the reports of scripts/gpu-check.sh and scripts/gpu-check-ort.sh.

    gpu-report.py gpu OUT WORK RC      OUT/summary.md, OUT/report.json from WORK/checks.tsv and WORK/*.log
    gpu-report.py ort OUT WORK RC [WHY]  OUT/summary.md, OUT/report.json of the onnxruntime check
                                       from WORK's logs (WHY: it did not run, and why)
    gpu-report.py combine OUT          adds OUT/ort's outcome to the top of OUT/summary.md and OUT/report.json

Standard library only (the GPU machine has python3 and nothing else assumed).
"""
import json
import os
import re
import sys

TEST_RE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)")
MEASURE_RE = re.compile(r"^(bench train.*|\s+(step time|tokens/s|achieved|MFU|measured|GPU time).*|final val CE.*"
                        r"|predicted .*|gemm-algos on .*|  \S+ \(\d+ algorithms\)|\s+best: rank.*)$")


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def tests_of(text):
    out = []
    for line in text.splitlines():
        m = TEST_RE.match(line)
        if m:
            out.append({"test": m.group(2), "result": m.group(1), "seconds": float(m.group(3))})
    return out


def probe_of(text):
    i = text.find("{")
    if i < 0:
        return None
    try:
        return json.loads(text[i:])
    except ValueError:
        return None


def versions(probe):
    """The device, driver, NVRTC and code lines of a probe (rpac gpu --json)."""
    if not probe:
        return {}
    v = {
        "driver_cuda": probe.get("driver_version") or "",
        "nvrtc": probe.get("nvrtc") or "",
        "code": probe.get("code") or "",
        "simulated": bool(probe.get("simulated")),
        "nvrtc_newer_than_driver": bool(probe.get("nvrtc_newer_than_driver")),
    }
    if probe.get("driver"):
        v["driver_error"] = probe["driver"]
    devs = probe.get("devices") or []
    if devs:
        d = devs[0]
        v["device"] = "%s (%s, %d SMs, %.1f GiB)" % (d.get("name"), d.get("sm") or d.get("arch"), d.get("sms", 0),
                                                     d.get("total_memory", 0) / 2**30)
    v["kernels"] = probe.get("kernels") or {}
    return v


def gpu(out, work, rc):
    checks = []
    for line in read(os.path.join(work, "checks.tsv")).splitlines():
        name, code, secs = line.split("\t")
        log = read(os.path.join(work, name + ".log"))
        c = {"check": name, "seconds": int(secs), "tail": log[-2000:]}
        if code in ("skip", "skip-asked"):
            c["result"], c["why"] = "not run", "time budget spent" if code == "skip" else "RPAC_CHECK_SKIP"
        else:
            c["result"], c["exit"] = ("passed" if code == "0" else "FAILED"), int(code)
        checks.append(c)
    logs = {c["check"]: read(os.path.join(work, c["check"] + ".log")) for c in checks}
    tests = tests_of(logs.get("kernels", "") + "\n" + logs.get("steps", ""))
    probe = probe_of(logs.get("probe", ""))
    ver = versions(probe)
    measured = []
    for name, log in logs.items():
        if name.startswith(("bench-", "predict-")) or name == "compare-ce" or name.startswith("gemm-algos"):
            lines = [l.rstrip() for l in log.splitlines() if MEASURE_RE.match(l)]
            if lines:
                measured.append({"check": name, "lines": lines})
    report = {"exit": rc, "versions": ver, "checks": checks, "tests": tests, "measured": measured}
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)

    failed_tests = [t["test"] for t in tests if t["result"] == "FAIL"]
    skipped = [c["check"] for c in checks if c["result"] == "not run"]
    head = "PASSED" if rc == 0 else "FAILED"
    if skipped:
        head += " (%d of %d checks not run: %s)" % (len(skipped), len(checks), ", ".join(skipped))
    md = ["# rpac GPU check: %s" % head, ""]
    if ver.get("simulated"):
        md += ["**On the CUDA simulator, not a GPU**: timings say nothing about a GPU.", ""]
    md += ["| | |", "| --- | --- |"]
    md.append("| device | %s |" % ver.get("device", "none (%s)" % ver.get("driver_error", "probe did not run")))
    md.append("| driver (cuDriverGetVersion) | CUDA %s |" % (ver.get("driver_cuda") or "?"))
    md.append("| NVRTC (nvrtcVersion) | %s%s |" % (ver.get("nvrtc") or "?",
                                               " (newer than the driver: PTX would not load)" if ver.get("nvrtc_newer_than_driver") else ""))
    code = ver.get("code")
    md.append("| kernels | %s |" % {"cubin": "cubins for the device's sm_NN", "ptx": "PTX fallback (see below)", "": "FAILED to compile"}.get(code, code or "?"))
    md.append("")
    md += ["## Checks", "", "| check | result | seconds |", "| --- | --- | --- |"]
    for c in checks:
        r = c["result"] if c["result"] != "FAILED" else "**FAILED** (exit %d)" % c["exit"]
        if c["result"] == "not run":
            r = "not run: " + c["why"]
        md.append("| %s | %s | %d |" % (c["check"], r, c["seconds"]))
    n = {k: sum(1 for t in tests if t["result"] == k) for k in ("PASS", "FAIL", "SKIP")}
    md += ["", "Go tests: %d passed, %d failed, %d skipped." % (n["PASS"], n["FAIL"], n["SKIP"])]
    if failed_tests:
        md += ["", "Failed tests: " + ", ".join(failed_tests)]
    if measured:
        md += ["", "## Measured", ""]
        for m in measured:
            md.append("### " + m["check"])
            md += ["```"] + m["lines"] + ["```"]
    if ver.get("kernels") and code != "cubin":
        md += ["", "## Kernel compilation", ""]
        for k, v in sorted(ver["kernels"].items()):
            md.append("- %s: %s" % (k, v))
    md += ["", "Full output: logs.txt; every test: report.json."]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def ort(out, work, rc, why=""):
    logs = {n: read(os.path.join(work, n)) for n in ("setup.log", "runtime.log", "parity.log")}
    names = sorted(os.listdir(work)) if os.path.isdir(work) else []
    logs["bench.log"] = "\n".join(read(os.path.join(work, n)) for n in names if re.match(r"bench_L\d+_B\d+\.txt$", n))
    tests = tests_of(logs["runtime.log"] + "\n" + logs["parity.log"])
    parity = []
    for line in (logs["parity.log"] + "\n" + logs["runtime.log"]).splitlines():
        m = re.search(r"GPUPARITY (\{.*\})", line)
        if m:
            try:
                parity.append(json.loads(m.group(1)))
            except ValueError:
                pass
    bench = []
    for name in names:
        if re.match(r"bench_L\d+_B\d+\.json$", name):
            try:
                bench += json.load(open(os.path.join(work, name)))
            except ValueError:
                pass
    report = {"exit": rc, "tests": tests, "parity": parity, "bench": bench}
    if why:
        report["not_run"] = why
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    if why:
        status = "NOT RUN: " + why
    else:
        status = "PASSED" if rc == 0 else "FAILED"
    md = ["# rpac onnxruntime CUDA provider check: %s" % status, ""]
    if not why:
        n = {k: sum(1 for t in tests if t["result"] == k) for k in ("PASS", "FAIL", "SKIP")}
        md += ["Go tests: %d passed, %d failed, %d skipped." % (n["PASS"], n["FAIL"], n["SKIP"]), ""]
        for t in tests:
            md.append("- %s: %s (%.1f s)" % (t["test"], t["result"], t["seconds"]))
        if parity:
            md += ["", "## Parity (CUDA provider against the Go executor)", "", "```"]
            md += [json.dumps(p) for p in parity] + ["```"]
        btxt = logs["bench.log"].strip()
        if btxt:
            md += ["", "## Latency", "", "```", btxt[-6000:], "```"]
    md += ["", "Full output: logs.txt; details: report.json."]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def combine(out):
    o = read(os.path.join(out, "ort", "summary.md")).splitlines()
    line = o[0].lstrip("# ") if o else "rpac onnxruntime CUDA provider check: NOT RUN: no report"
    s = read(os.path.join(out, "summary.md"))
    head = ["# rpac first GPU run (gpu-check.sh --all)", "",
            "- " + (s.splitlines()[0].lstrip("# ") if s else "rpac GPU check: no report") + " (below; logs.txt, report.json)",
            "- " + line + " (ort/summary.md, ort/logs.txt, ort/report.json)", ""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(head) + "\n" + s)
    try:
        r = json.load(open(os.path.join(out, "report.json")))
        r["ort"] = json.load(open(os.path.join(out, "ort", "report.json")))
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(r, f, indent=2)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "gpu":
        gpu(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "ort":
        ort(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "")
    elif mode == "combine":
        combine(sys.argv[2])
    else:
        sys.exit("gpu-report.py: unknown mode " + mode)
