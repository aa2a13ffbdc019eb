#!/usr/bin/env bash
# gpu-experiments.sh — the paper-claim experiments that want a GPU, from the
# binaries `bash scripts/gpu-check.sh --build` writes (bin/rpac, bin/data),
# on a GPU machine without Go:
#
#     bash scripts/gpu-experiments.sh [OUT]      # OUT: $OUT or gpu-experiments
#
# Two `rpac ablate` runs, one after the other (processes sharing a GPU run
# slower in all than one alone), each stopped after its share of
# RPAC_EXP_BUDGET seconds (default 480). An ablation goes seed by seed and
# keeps finished runs, so a stopped one reports the complete pairs it has:
#   mqar      the transformer, the fuzzy model with the legacy bias and with
#             the RPA prior, every one with smeared keys and no learned
#             position embedding (the CPU comparison of docs/RESULTS.md), at
#             256 tokens and 16 pairs (vocab 128, lr 1e-3 flat, 3,000 steps;
#             RPAC_EXP_MQAR_SEEDS, default 5): recall and its paired
#             differences, also by query distance, and at 256, 512 and 1,024
#             tokens through the folded export (where onnxruntime's C library
#             is found: $ORT_LIB or a libonnxruntime.so on the machine);
#   wikitext  the stepwise ablation at the tiny preset, 200 steps, train on
#             the test split, evaluate on valid (RPAC_EXP_ABL_SEEDS, default
#             20: about what separates 0.02 nats).
# RPAC_EXPERIMENTS="mqar wikitext" picks them; RPAC_EXP_DEVICE (default
# cuda) and RPAC_EXP_STEPS (default 3,000 and 200) make a dry run of the
# script elsewhere, e.g. RPAC_EXP_DEVICE=cpu RPAC_EXP_STEPS=4. Each writes
# OUT/<name>.md (the ablation's tables, or why there are none) and
# OUT/<name>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-experiments}}"
mkdir -p "$out"
work="${RPAC_EXP_WORK:-$(mktemp -d)}"
if [[ ! -x bin/rpac || ! -d bin/data ]]; then
	echo "gpu-experiments: bin/ is incomplete: run 'bash scripts/gpu-check.sh --build' where Go is installed and carry bin/" | tee "$out/NOT-RUN.md" >&2
	exit 1
fi
roots=()
for r in /usr /opt /lib /lib64 /root /home /usr/local/nvidia; do [[ -d $r ]] && roots+=("$r"); done
libdirs="$(find "${roots[@]}" \( -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' -o -name 'libcuda.so.1' \) -not -path "$PWD/*" 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd: -)"
export RPAC_CUDA_LIBS="${RPAC_CUDA_LIBS:+$RPAC_CUDA_LIBS:}$libdirs"
export RPAC_CUDA_CACHE="${RPAC_CUDA_CACHE:-$work/cuda-cache}"

exps=(${RPAC_EXPERIMENTS:-mqar wikitext})
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
for e in "${exps[@]}"; do
	case "$e" in
	mqar)
		seeds="${RPAC_EXP_MQAR_SEEDS:-5}"
		echo '{"smear_keys": true, "pos_init": "none"}' >"$work/mqar.json"
		args=(ablate --dataset mqar --mqar-len 256 --mqar-pairs 16 --mqar-vocab 128 --preset tiny --max-len 1024 --contexts 128,256
			--tokens-per-step 4096 --stages transformer,fuzzy_legacy,fuzzy_rpa --config "$work/mqar.json"
			--steps "${RPAC_EXP_STEPS:-3000}" --lr 1e-3 --lr-flat 1 --eval-every 250 --eval-batches 8 --device "${RPAC_EXP_DEVICE:-cuda}" --precision fp32)
		# the longer lengths run the export in onnxruntime's C library, when this machine has one
		ort="${ORT_LIB:-}"
		if [[ -z "$ort" ]]; then
			arch="$(uname -m | sed 's/_/-/')" # x86-64 or aarch64, as file(1) names them
			while read -r f; do
				if ! command -v file >/dev/null || file -L "$f" | grep -q "$arch"; then ort="$f"; break; fi
			done < <(find "${roots[@]}" -name 'libonnxruntime.so*' -not -name '*providers*' -not -name '*.sha256' -not -path "$PWD/*" 2>/dev/null)
		fi
		if [[ -n "$ort" ]]; then
			export ORT_LIB="$ort"
			args+=(--eval-lengths 256,512,1024)
		else
			echo "gpu-experiments: no libonnxruntime here: mqar without --eval-lengths" >&2
		fi ;;
	wikitext)
		seeds="${RPAC_EXP_ABL_SEEDS:-20}"
		args=(ablate --preset tiny --dataset wikitext2 --data-dir bin/data --train-split test --eval-split valid
			--steps "${RPAC_EXP_STEPS:-200}" --device "${RPAC_EXP_DEVICE:-cuda}") ;;
	*)
		echo "gpu-experiments: unknown experiment $e (mqar, wikitext)" >&2
		rc=1
		continue ;;
	esac
	echo "gpu-experiments: $e, $seeds seeds, at most $share s" >&2
	timeout "$share" bin/rpac "${args[@]}" --seeds "$seeds" --out "$work/$e" >"$out/$e.log" 2>&1
	r=$?
	if [[ $r -ne 0 && $r -ne 124 ]] && grep -q -- "--eval-lengths runs the exports in onnxruntime" "$out/$e.log"; then
		# the library found does not load (another version or build): without the lengths
		echo "gpu-experiments: onnxruntime at ${ORT_LIB:-} does not load: $e without --eval-lengths" | tee -a "$out/$e.log" >&2
		args=("${args[@]:0:${#args[@]}-2}")
		timeout "$share" bin/rpac "${args[@]}" --seeds "$seeds" --out "$work/$e" >>"$out/$e.log" 2>&1
		r=$?
	fi
	if [[ $r -eq 124 ]]; then
		# stopped: the table of the complete seeds (all reused, nothing trained)
		k=$(complete "$work/$e" "$seeds")
		echo "gpu-experiments: $e stopped after $share s with $k complete seeds" | tee -a "$out/$e.log" >&2
		((k > 0)) && bin/rpac "${args[@]}" --seeds "$k" --out "$work/$e" >>"$out/$e.log" 2>&1
	elif [[ $r -ne 0 ]]; then
		rc=1
	fi
	if [[ -f "$work/$e/ablation.md" ]]; then
		cp "$work/$e/ablation.md" "$out/$e.md"
	else
		printf '# %s\n\nNo table (exit %s): no seed finished every stage. See %s.log.\n' "$e" "$r" "$e" >"$out/$e.md"
	fi
done
exit "$rc"
