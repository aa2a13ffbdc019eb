#!/usr/bin/env bash
# gpu-lease.sh — what a short GPU lease should run, as one command, from the
# binaries `bash scripts/gpu-check.sh --build` writes (carry bin/):
#
#     bash scripts/gpu-lease.sh [OUT]        # OUT: $OUT or gpu-lease
#
# 1. scripts/gpu-check.sh (every check group, the Nsight Compute profile
#    included, less the checks below that measure nothing new), at most
#    RPAC_LEASE_CHECK seconds of checks (default 240);
# 2. scripts/gpu-experiments.sh in the time left of RPAC_LEASE_SECONDS
#    (default 540, the whole command), less 20 s for the reports.
# With the defaults the command ends within about 9 minutes: give the device
# call a 600 s limit. OUT gets five files, within the device tool's eight: summary.md,
# report.json and logs.txt (the check), experiments.md (every experiment's
# tables, one after the other) and experiments.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-lease}}"
mkdir -p "$out"
t0=$SECONDS
total="${RPAC_LEASE_SECONDS:-540}"
# Left out of a short lease unless RPAC_CHECK_SKIP says otherwise: checks
# that passed in the fifth and sixth runs and measure nothing that changed
# since (the 68 s CPU run beside the CUDA one, the other attention path,
# the fp32 steps), so that the budget reaches the whole steps.
skip_default="run-cpu compare-ce predict-paper-flash predict-paper-unpacked predict-paper-unjoined"
skip_default+=" bench-paper-fuzzy-fp32 bench-paper-baseline-fp32 bench-paper-fuzzy-bf16-flash"
RPAC_CHECK_SKIP="${RPAC_CHECK_SKIP-$skip_default}" RPAC_CHECK_BUDGET="${RPAC_LEASE_CHECK:-240}" \
	RPAC_CHECK_TIMEOUT="${RPAC_CHECK_TIMEOUT:-150}" bash scripts/gpu-check.sh "$out"
check_rc=$?
left=$((total - (SECONDS - t0) - 20))
exp="$(mktemp -d)"
exp_rc=0
if ((left >= 60)); then
	RPAC_EXP_BUDGET="$left" bash scripts/gpu-experiments.sh "$exp"
	exp_rc=$?
else
	echo "gpu-lease: $left s left after the check: no experiments" | tee "$exp/NOT-RUN.md" >&2
fi
# the experiments' files as two
: >"$out/experiments.md"
: >"$out/experiments.log"
for f in "$exp"/*.md; do
	[[ -f "$f" ]] && { cat "$f"; echo; } >>"$out/experiments.md"
done
for f in "$exp"/*.log; do
	[[ -f "$f" ]] && { printf '===== %s\n' "$(basename "$f")"; cat "$f"; } >>"$out/experiments.log"
done
rm -rf "$exp"
echo "gpu-lease: check exit $check_rc, experiments exit $exp_rc, $((SECONDS - t0)) s; $out" >&2
((check_rc == 0 && exp_rc == 0))
