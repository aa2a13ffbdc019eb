#!/usr/bin/env bash
# gpu-check.sh — the CUDA backend's validation on a GPU machine, from
# binaries built elsewhere (GPU machines may have no Go toolchain).
#
# On a machine with Go (x86-64 or, with GOARCH=arm64, for a Grace host):
#     bash scripts/gpu-check.sh --build        # writes bin/cuda.test
# Carry the checkout (with bin/) to the GPU machine, then:
#     bash scripts/gpu-check.sh [OUTDIR]        # default OUTDIR: gpu-report
#
# It finds the CUDA libraries (driver, NVRTC, cuBLASLt; the Python nvidia-*
# wheels included) and puts their folders in RPAC_CUDA_LIBS, prints the
# device, runs every GPU test (kernel parity against float64 references,
# NVRTC compiles for the device's architecture) with RPAC_REQUIRE_GPU=1 so a
# missing GPU fails instead of skipping, and writes OUTDIR/report.txt and
# OUTDIR/report.json (device, driver, each check with its result and time).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--build" ]]; then
	mkdir -p bin
	CGO_ENABLED=0 go test -c -o bin/cuda.test ./kernels/cuda
	echo "built bin/cuda.test ($(go env GOOS)/$(go env GOARCH)); carry bin/ to the GPU machine"
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
bin/cuda.test -test.v -test.count=1 2>&1 | tee "$out/tests.log"
rc=${PIPESTATUS[0]}
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
gpu = ""
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except Exception:
    pass
json.dump({"gpu": gpu, "exit": rc, "tests": tests}, open(f"{out}/report.json", "w"), indent=2)
PY

grep -E -- "--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)" "$out/tests.log" >>"$out/report.txt" || true
echo "gpu-check: exit $rc; $out/report.txt, $out/report.json"
exit "$rc"
