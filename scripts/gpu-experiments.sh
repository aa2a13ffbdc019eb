#!/usr/bin/env bash
# gpu-experiments.sh — the paper-claim experiments that want a GPU, from the
# binaries `bash scripts/gpu-check.sh --build` writes (bin/rpac, bin/data),
# on a GPU machine without Go:
#
#     bash scripts/gpu-experiments.sh [OUT]      # OUT: $OUT or gpu-experiments
#
# `rpac ablate` runs, one after the other (processes sharing a GPU run
# slower in all than one alone), each experiment stopped after its share of
# RPAC_EXP_BUDGET seconds (default 480). An ablation goes seed by seed and
# keeps finished runs, so a stopped one reports the complete pairs it has:
#   mqar        the transformer, the fuzzy model with the legacy bias and
#               with the RPA prior, every one with smeared keys and learned
#               positions, at 256 tokens and 16 pairs (vocab 128, lr 1e-3
#               flat, 2,000 steps: the sixth GPU run saw all three learn it by
#               step 1,750 with seed 1; 3 seeds take about 200 s on an H200;
#               RPAC_EXP_MQAR_SEEDS, default 3): recall
#               and its paired differences, also by query distance, and at
#               256, 512 and 1,024 tokens through the folded export (where
#               onnxruntime's C library is found, $ORT_LIB or a
#               libonnxruntime.so on the machine, and bin/rpac has cgo:
#               gpu-check.sh --build makes it so on x86-64);
#   mqar-sweep  the same three models, one seed, at each LEN:PAIRS of
#               RPAC_EXP_SWEEP (default "512:32 1024:64"; 4·LEN tokens per
#               step), sharing the experiment's time: where each breaks;
#   mqar-prior  the two fuzzy models at 64 tokens and 4 pairs (smeared keys,
#               no position embedding: the CPU comparison, where neither
#               learned in 1,500 steps), 4,000 steps, the prior ramped in
#               over each --warm-in of RPAC_EXP_WARMIN (default "50 2000
#               100000": the preset's, half the run, about off;
#               RPAC_EXP_PRIOR_SEEDS, default 3): whether the prior's
#               strength is what keeps them from the lookup (not in the
#               default list);
#   wikitext    the stepwise ablation at the tiny preset, 200 steps, train on
#               the test split, evaluate on valid (RPAC_EXP_ABL_SEEDS,
#               default 20: about what separates 0.02 nats; run on an H200
#               on 2026-11-26, docs/RESULTS.md);
#   wikitext-small  the prior's stage against the baseline (stages baseline
#               and cg_align) at the small preset, 200 steps, same protocol
#               (RPAC_EXP_SMALL_SEEDS, default 10): the issue's point at a
#               larger model.
# RPAC_EXPERIMENTS (default "mqar": its three seeds fill a short lease's
# time; the sixth run found 512:32 at chance and ran wikitext-small with 8
# seeds) picks them; RPAC_EXP_DEVICE (default cuda) and RPAC_EXP_STEPS
# (default 2,000 for mqar, 3,000 for the sweep and mqar-prior's 4,000, 200)
# make a dry run of the script elsewhere, e.g. RPAC_EXP_DEVICE=cpu
# RPAC_EXP_STEPS=4. Each writes OUT/<name>.md (the ablations' tables, or
# why there are none) and OUT/<name>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-experiments}}"
mkdir -p "$out"
work="${RPAC_EXP_WORK:-$(mktemp -d)}"
if [[ ! -x bin/rpac || ! -d bin/data ]]; then
	echo "gpu-experiments: bin/ is incomplete: run 'bash scripts/gpu-check.sh --build' where Go is installed and carry bin/" | tee "$out/NOT-RUN.md" >&2
	exit 1
fi
# shellcheck source=scripts/cuda-libs.sh
source scripts/cuda-libs.sh
export RPAC_CUDA_CACHE="${RPAC_CUDA_CACHE:-$work/cuda-cache}"

exps=(${RPAC_EXPERIMENTS:-mqar})
share=$(( ${RPAC_EXP_BUDGET:-480} / ${#exps[@]} ))
rc=0
# complete DIR N: how many seeds from 1 every stage of the ablation in DIR
# has finished (runs go seed by seed, so they are a prefix).
complete() {
	local dir="$1" n="$2" k stage
	for ((k = 1; k <= n; k++)); do
		for stage in "$dir"/*/; do
			[[ -f "$stage/seed$k/result.json" ]] || { echo $((k - 1)); return; }
		done
	done
	echo "$n"
}
# ort_lib: onnxruntime's C library of this machine's architecture ($ORT_LIB
# first), for --eval-lengths; empty when there is none.
ort_lib() {
	[[ -n "${ORT_LIB:-}" ]] && { echo "$ORT_LIB"; return; }
	local arch f
	arch="$(uname -m | sed 's/_/-/')" # x86-64 or aarch64, as file(1) names them
	while read -r f; do
		if ! command -v file >/dev/null || file -L "$f" | grep -q "$arch"; then echo "$f"; return; fi
	done < <(find "${roots[@]}" -name 'libonnxruntime.so*' -not -name '*providers*' -not -name '*.sha256' -not -path "$PWD/*" 2>/dev/null)
}
# ablate NAME SEEDS SECONDS ARGS...: rpac ablate ARGS for SEEDS seeds into
# $work/NAME, stopped after SECONDS (then the table of the complete seeds);
# its log goes to $out/LOG and its table is added to $out/MD (LOG and MD:
# the experiment's files, set by the caller).
ablate() {
	local name="$1" seeds="$2" secs="$3"
	shift 3
	local args=("$@") r k
	echo "gpu-experiments: $name, $seeds seeds, at most $secs s" >&2
	timeout "$secs" bin/rpac ablate "${args[@]}" --seeds "$seeds" --out "$work/$name" >>"$out/$LOG" 2>&1
	r=$?
	if [[ $r -ne 0 && $r -ne 124 ]] && grep -q -- "--eval-lengths runs the exports in onnxruntime" "$out/$LOG"; then
		# the library found does not load (another version or build, or an rpac without cgo): without the lengths
		echo "gpu-experiments: onnxruntime at ${ORT_LIB:-} does not load: $name without --eval-lengths" | tee -a "$out/$LOG" >&2
		args=("${args[@]:0:${#args[@]}-2}")
		timeout "$secs" bin/rpac ablate "${args[@]}" --seeds "$seeds" --out "$work/$name" >>"$out/$LOG" 2>&1
		r=$?
	fi
	if [[ $r -eq 124 ]]; then
		# stopped: the table of the complete seeds (all reused, nothing trained)
		k=$(complete "$work/$name" "$seeds")
		echo "gpu-experiments: $name stopped after $secs s with $k complete seeds" | tee -a "$out/$LOG" >&2
		((k > 0)) && bin/rpac ablate "${args[@]}" --seeds "$k" --out "$work/$name" >>"$out/$LOG" 2>&1
	elif [[ $r -ne 0 ]]; then
		rc=1
	fi
	if [[ -f "$work/$name/ablation.md" ]]; then
		cat "$work/$name/ablation.md" >>"$out/$MD"
	else
		printf '# %s\n\nNo table (exit %s): no seed finished every stage. See %s.\n' "$name" "$r" "$LOG" >>"$out/$MD"
	fi
	echo >>"$out/$MD"
}
# mqar_args LEN PAIRS STEPS: the comparison's ablate flags at LEN tokens
# and PAIRS pairs (smeared keys, learned positions; 4·LEN tokens per step,
# at least 4,096).
mqar_args() {
	local len="$1" pairs="$2" steps="$3" tps=$((4 * $1))
	((tps < 4096)) && tps=4096
	echo '{"smear_keys": true}' >"$work/mqar.json"
	echo --dataset mqar --mqar-len "$len" --mqar-pairs "$pairs" --mqar-vocab 128 --preset tiny --contexts "$((len / 2)),$len" \
		--tokens-per-step "$tps" --stages transformer,fuzzy_legacy,fuzzy_rpa --config "$work/mqar.json" \
		--steps "$steps" --lr 1e-3 --lr-flat 1 --eval-every 250 --eval-batches 8 --device "${RPAC_EXP_DEVICE:-cuda}" --precision fp32
}
for e in "${exps[@]}"; do
	LOG="$e.log" MD="$e.md"
	: >"$out/$LOG"
	: >"$out/$MD"
	case "$e" in
	mqar)
		args=($(mqar_args 256 16 "${RPAC_EXP_STEPS:-2000}") --max-len 1024)
		ort="$(ort_lib)"
		if [[ -n "$ort" ]]; then
			export ORT_LIB="$ort"
			args+=(--eval-lengths 256,512,1024)
		else
			echo "gpu-experiments: no libonnxruntime here: mqar without --eval-lengths" >&2
		fi
		ablate mqar "${RPAC_EXP_MQAR_SEEDS:-3}" "$share" "${args[@]}" ;;
	mqar-sweep)
		settings=(${RPAC_EXP_SWEEP:-512:32 1024:64})
		for st in "${settings[@]}"; do
			ablate "mqar-L${st%%:*}-P${st##*:}" 1 $((share / ${#settings[@]})) $(mqar_args "${st%%:*}" "${st##*:}" "${RPAC_EXP_STEPS:-3000}")
		done ;;
	mqar-prior)
		echo '{"smear_keys": true, "pos_init": "none"}' >"$work/mqar-prior.json"
		warms=(${RPAC_EXP_WARMIN:-50 2000 100000})
		for w in "${warms[@]}"; do
			ablate "mqar-prior-W$w" "${RPAC_EXP_PRIOR_SEEDS:-3}" $((share / ${#warms[@]})) --dataset mqar --mqar-len 64 --mqar-pairs 4 \
				--mqar-vocab 128 --preset tiny --contexts 32,64 --tokens-per-step 2048 --stages fuzzy_legacy,fuzzy_rpa \
				--config "$work/mqar-prior.json" --steps "${RPAC_EXP_STEPS:-4000}" --lr 1e-3 --lr-flat 1 --eval-every 250 \
				--eval-batches 8 --warm-in "$w" --device "${RPAC_EXP_DEVICE:-cuda}" --precision fp32
		done ;;
	wikitext)
		ablate wikitext "${RPAC_EXP_ABL_SEEDS:-20}" "$share" --preset tiny --dataset wikitext2 --data-dir bin/data --train-split test --eval-split valid \
			--steps "${RPAC_EXP_STEPS:-200}" --device "${RPAC_EXP_DEVICE:-cuda}" ;;
	wikitext-small)
		ablate wikitext-small "${RPAC_EXP_SMALL_SEEDS:-10}" "$share" --preset small --dataset wikitext2 --data-dir bin/data --train-split test \
			--eval-split valid --stages baseline,cg_align --steps "${RPAC_EXP_STEPS:-200}" --device "${RPAC_EXP_DEVICE:-cuda}" ;;
	*)
		echo "gpu-experiments: unknown experiment $e (mqar, mqar-sweep, mqar-prior, wikitext, wikitext-small)" >&2
		rc=1 ;;
	esac
done
exit "$rc"
