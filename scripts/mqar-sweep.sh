#!/usr/bin/env bash
# mqar-sweep.sh — where a model stops learning MQAR: one `rpac train` run per
# setting LEN:PAIRS (sequence length and key-value pairs; the context is the
# sequence), each stopped after RPAC_SWEEP_SECONDS (default 480) with a
# checkpoint, RPAC_SWEEP_JOBS runs at once (default 2, one thread each), then
# a table (OUT/sweep.md) of each run's steps, best recall, the first step at
# recall >= 0.9 and its last recall by query distance:
#
#     bash scripts/mqar-sweep.sh OUT LEN:PAIRS... [-- rpac train flags]
#
# e.g. bash scripts/mqar-sweep.sh runs/sweep 128:4 256:4 512:4 -- --model baseline --smear-keys
#
# Every run: --dataset mqar --mqar-vocab 128 --preset tiny --lr 1e-3
# --lr-flat 1 --eval-every 250 --eval-batches 8 --steps 20000 --seed 1 (the train
# stream is generated for the steps up front: more steps, a longer start), and
# max(2048, 4·LEN) tokens per step (at least 4 sequences), then the flags
# after --, which win. RPAC (default: bin/rpac, else ./rpac) is the binary.
set -uo pipefail
if [[ $# -lt 2 ]]; then
	sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
out="$1"
shift
settings=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
	[[ "$1" =~ ^[0-9]+:[0-9]+$ ]] || { echo "mqar-sweep: $1 is not LEN:PAIRS" >&2; exit 2; }
	settings+=("$1")
	shift
done
[[ $# -gt 0 ]] && shift
extra=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
rpac="${RPAC:-}"
if [[ -z "$rpac" ]]; then
	if [[ -x "$here/../bin/rpac" ]]; then rpac="$here/../bin/rpac"; else rpac=./rpac; fi
fi
secs="${RPAC_SWEEP_SECONDS:-480}"
jobs="${RPAC_SWEEP_JOBS:-2}"
mkdir -p "$out"
run() {
	local len="${1%%:*}" pairs="${1##*:}"
	local dir="$out/L${len}-P${pairs}" tps=$((4 * ${1%%:*}))
	((tps < 2048)) && tps=2048
	GOMAXPROCS=1 OPENBLAS_NUM_THREADS=1 timeout "$secs" "$rpac" train --dataset mqar --mqar-len "$len" --mqar-pairs "$pairs" \
		--mqar-vocab 128 --preset tiny --context "$len" --tokens-per-step "$tps" --lr 1e-3 --lr-flat 1 \
		--eval-every 250 --eval-batches 8 --steps 20000 --seed 1 --device cpu "${extra[@]}" --out "$dir" >"$dir.log" 2>&1
	local rc=$?
	# stopped by the time limit: rpac saves a checkpoint and says so
	if [[ $rc -ne 0 ]] && ! grep -q "checkpoint saved" "$dir.log"; then
		echo "mqar-sweep: L$len P$pairs exited $rc (see $dir.log)" >&2
	fi
	return 0
}
running=0
for s in "${settings[@]}"; do
	run "$s" &
	running=$((running + 1))
	if ((running >= jobs)); then
		wait -n
		running=$((running - 1))
	fi
done
wait
python3 "$here/mqar-table.py" "$out" "${settings[@]}" >"$out/sweep.md"
cat "$out/sweep.md"
