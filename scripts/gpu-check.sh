#!/usr/bin/env bash
# gpu-check.sh — the CUDA backend's validation on a GPU machine, from
# binaries built elsewhere (GPU machines may have no Go toolchain).
#
# On a machine with Go (x86-64 or, with GOARCH=arm64, for a Grace host):
#     bash scripts/gpu-check.sh --build        # writes bin/ (tests, rpac, data)
# Carry the checkout (with bin/, about 40 MB) to the GPU machine, then:
#     bash scripts/gpu-check.sh [OUTDIR]        # default OUTDIR: gpu-report
#
# It finds the CUDA libraries (driver, NVRTC, cuBLASLt; the Python nvidia-*
# wheels included) and puts their folders in RPAC_CUDA_LIBS, prints the
# device, and with RPAC_REQUIRE_GPU=1 (a missing GPU fails instead of
# skipping) runs:
#   1. the kernel tests (parity against float64 references, every op of the
#      IR table through the backend against the CPU backend, NVRTC compiles
#      for the device's architecture);
#   2. the whole fuzzy and baseline training steps against the CPU (fp32,
#      bf16) and their repeatability;
#   3. a 200-step (RPAC_CHECK_STEPS) tiny WikiText-2 run on CUDA (fp32) and on the CPU with the
#      same seed, whose final val CE must agree within 0.02;
#   4. exact resume on CUDA (10 steps + 10 resumed = 20 straight, bit for bit);
#   5. the benchmarks: rpac bench train --device cuda, paper and baseline
#      presets, bf16 and fp32.
# The exported models on onnxruntime's CUDA provider have their own check,
# scripts/gpu-check-ort.sh: its provider library (229 MB) is carried in
# parts over several calls, so it runs separately (see that script's header).
#
# RPAC_CHECKS="kernels steps runs resume bench" (the default: all) picks
# groups, so a machine with a per-command time limit can run them in parts.
# It writes OUTDIR/report.txt and OUTDIR/report.json (device, driver, each
# check with its result and time, each benchmark's output).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--build" ]]; then
	mkdir -p bin/data
	CGO_ENABLED=0 go test -c -ldflags="-s -w" -o bin/cuda.test ./kernels/cuda
	CGO_ENABLED=0 go test -c -ldflags="-s -w" -o bin/training.test ./training
	CGO_ENABLED=0 go build -ldflags="-s -w" -o bin/rpac ./cmd/rpac
	data="${RPAC_DATA:-../shared/data/wikitext-2-raw-v1}"
	cp "$data"/wiki.valid.raw "$data"/wiki.test.raw bin/data/
	echo "built bin/ ($(go env GOOS)/$(go env GOARCH), $(du -sh bin | cut -f1)); carry bin/ to the GPU machine"
	exit 0
fi

out="${1:-gpu-report}"
mkdir -p "$out"
[[ -x bin/cuda.test ]] || { echo "gpu-check: bin/cuda.test is missing: run 'bash scripts/gpu-check.sh --build' where Go is installed" >&2; exit 1; }

libdirs="$(find / -xdev \( -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' -o -name 'libcuda.so.1' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd: -)"
export RPAC_CUDA_LIBS="${RPAC_CUDA_LIBS:+$RPAC_CUDA_LIBS:}$libdirs"
export RPAC_REQUIRE_GPU=1

{
	echo "# rpac GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "host: $(uname -m), $(nproc) cores"
	nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: nvidia-smi not available"
	echo "RPAC_CUDA_LIBS=$RPAC_CUDA_LIBS"
	echo
} | tee "$out/report.txt"

set +e
rc=0
check() { # check NAME CMD...: run, log, record the result
	local name="$1"; shift
	local t0=$SECONDS
	echo "=== $name" | tee -a "$out/checks.log"
	"$@" 2>&1 | tee "$out/$name.log"
	local r=${PIPESTATUS[0]}
	echo "$name $r $((SECONDS - t0))" >>"$out/checks.tsv"
	[[ $r -eq 0 ]] || rc=1
}
: >"$out/checks.tsv"
want() { [[ " ${RPAC_CHECKS:-kernels steps runs resume bench} " == *" $1 "* ]]; }
want kernels && check kernels bin/cuda.test -test.v -test.count=1
want steps && check steps bin/training.test -test.v -test.count=1 -test.run 'GPU'

# 3. CUDA vs CPU, 200 tiny steps, same seed.
if want runs; then
train=(train --preset tiny --dataset wikitext2 --data-dir bin/data --train-split test --eval-split valid
	--steps "${RPAC_CHECK_STEPS:-200}" --eval-every 100 --eval-batches 8 --seed 3)
check run-cuda bin/rpac "${train[@]}" --device cuda --precision fp32 --out "$out/run-cuda"
check run-cpu bin/rpac "${train[@]}" --device cpu --out "$out/run-cpu"
lastce() { grep '"val_ce"' "$1/metrics.jsonl" | tail -n1 | sed 's/.*"val_ce":\([-0-9.eE+]*\).*/\1/'; }
check compare-ce awk -v a="$(lastce "$out/run-cuda")" -v b="$(lastce "$out/run-cpu")" \
	'BEGIN { d = a - b; if (d < 0) d = -d; printf "final val CE: cuda %s, cpu %s, |diff| %.4f (limit 0.02)\n", a, b, d; exit !(a != "" && d <= 0.02) }'
fi

# 4. Exact resume on CUDA.
if want resume; then
short=(train --preset tiny --dataset wikitext2 --data-dir bin/data --train-split test --eval-split valid
	--eval-every 10 --eval-batches 2 --seed 5 --device cuda --precision fp32)
check resume-straight bin/rpac "${short[@]}" --steps 20 --out "$out/straight"
check resume-first bin/rpac "${short[@]}" --steps 20 --stop-after 10 --out "$out/resumed"
check resume-rest bin/rpac "${short[@]}" --steps 20 --resume --out "$out/resumed"
check resume-compare cmp "$out/straight/checkpoint/model.safetensors" "$out/resumed/checkpoint/model.safetensors"
fi

# 5. Benchmarks.
want bench && for preset in paper baseline; do
	for prec in bf16 fp32; do
		check "bench-$preset-$prec" bin/rpac bench train --device cuda --precision "$prec" --preset "$preset" --steps 5
	done
done
cat "$out"/*.log >"$out/tests.log"
set -e

# report.json: one entry per test with its result and seconds.
python3 - "$out" "$rc" <<'PY' 2>/dev/null || awk -v rc="$rc" 'BEGIN{print "{\"exit\": " rc "}"}' >"$out/report.json"
import json, re, subprocess, sys
out, rc = sys.argv[1], int(sys.argv[2])
tests = []
for line in open(f"{out}/tests.log"):
    m = re.match(r"\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)", line)
    if m:
        tests.append({"test": m.group(2), "result": m.group(1), "seconds": float(m.group(3))})
checks = []
for line in open(f"{out}/checks.tsv"):
    name, code, secs = line.split()
    log = open(f"{out}/{name}.log").read()
    checks.append({"check": name, "exit": int(code), "seconds": int(secs), "tail": log[-2000:]})
gpu = ""
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except Exception:
    pass
json.dump({"gpu": gpu, "exit": rc, "checks": checks, "tests": tests}, open(f"{out}/report.json", "w"), indent=2)
PY

{
	awk '{ printf "check %-22s %s (%ss)\n", $1, ($2 == 0 ? "ok" : "FAILED exit " $2), $3 }' "$out/checks.tsv"
	grep -E -- "--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)" "$out/tests.log" || true
	grep -hE "^(bench train|  (step time|tokens/s|achieved|MFU))|final val CE" "$out"/bench-*.log "$out/compare-ce.log" || true
} >>"$out/report.txt"
echo "gpu-check: exit $rc; $out/report.txt, $out/report.json"
exit "$rc"
