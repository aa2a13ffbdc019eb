#!/usr/bin/env bash
# gpu-lease.sh — one prepared command for a GPU lease: at most about 6
# minutes of work, so that a session can run it, read it and run it again
# within 15 minutes of device time (the machine's start included). From the
# binaries `bash scripts/gpu-check.sh --build` writes:
#
#     bash scripts/gpu-lease.sh [OUT]          # on the GPU machine; OUT: $OUT or gpu-lease
#     bash scripts/gpu-lease.sh --dry [OUT]    # anywhere: the same control flow on fakes
# Carry bin/cuda.test, bin/training.test, bin/rpac and bin/data (52.0 MB).
#
# Give the device call a timeout of 420 s. In this order, each stage started
# only while the budget (RPAC_LEASE_SECONDS, default 330 s of work) lasts,
# each command killed at its stage's limit:
#   1. smoke (RPAC_LEASE_SMOKE, 60 s): the kernels of the paths no GPU has
#      run (cuda.Unmeasured: the cross-entropy's row of 201 KB in shared
#      memory, bf16 GEMM results with an fp32 bias epilogue, the lean
#      attention stores into a buffer zeroed once, the padded weight
#      gradients and model widths, the redrawn dropouts, LayerNorm's
#      one-kernel backward, the attention's kept packs): their parity
#      tests from bin/cuda.test and bin/training.test (`go test -c`), on the
#      GPU (RPAC_REQUIRE_GPU=1); and one rank of a communicator through the
#      real NCCL (TestGPUCollectiveOneRank: nvidia-nccl-cu13's libnccl.so.2);
#   2. steps: rpac bench train --device cuda --preset paper at T = 384 and
#      768 (24,576 tokens a step), with the default paths and with every
#      unmeasured one on (--cuda-candidate), 5 timed steps each, and at
#      T = 384 the candidate with the experts routed (--expert-dispatch
#      routed; RPAC_LEASE_ROUTED);
#   3. torch: bench/torch/rpac_torch.py beside rpac on the same preset,
#      tokens per step and weights (rpac bench torch-export): the loss on a
#      fixed batch against rpac's (1e-3), eager and torch.compile under bf16
#      autocast, tokens/s (RPAC_LEASE_TORCH, 120 s);
#   4. measure: rpac bench train --predict h200 --measure (each kernel timed
#      on its own beside the model's prediction) with both path settings.
# OUT gets at most 8 files (the device tool's limit): summary.md (its first
# lines the figures: ms/step, tokens/s and MFU per setting, torch's eager and
# compiled tokens/s and rpac's ratio to them, the model's predicted/measured
# ratio), lease.json (the same, parsed), and one log per stage (smoke.log,
# steps.log, torch.log, measure.log). A stage not run says why in the
# summary ("not run: time budget").
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
if [[ "${1:-}" == "--dry" ]]; then
	dry=1
	shift
fi
out="${1:-${OUT:-gpu-lease}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="${RPAC_LEASE_WORK:-$(mktemp -d)}"
mkdir -p "$work"
total="${RPAC_LEASE_SECONDS:-330}"
t0=$SECONDS
: >"$work/stages.tsv"

# The commands the stages run: the real binaries, or in the dry mode
# scripts/gpu-lease-fake.sh, which answers in their output formats after
# RPAC_LEASE_FAKE_SLEEP seconds (the dry run checks the order, the time
# budget and the files; scripts/leasetest runs it).
if ((dry)); then
	fake=(bash scripts/gpu-lease-fake.sh)
	RPAC=("${fake[@]}" rpac) CUDA_TEST=("${fake[@]}" cuda.test) TRAINING_TEST=("${fake[@]}" training.test)
	PYTHON=("${fake[@]}" python3)
else
	RPAC=(bin/rpac) CUDA_TEST=(bin/cuda.test) TRAINING_TEST=(bin/training.test) PYTHON=(python3)
	if [[ ! -x bin/rpac || ! -x bin/cuda.test || ! -x bin/training.test ]]; then
		printf '# rpac GPU lease\n\nNOT RUN: bin/ is incomplete: run `bash scripts/gpu-check.sh --build` where Go is installed and carry bin/\n' >"$out/summary.md"
		exit 1
	fi
	# shellcheck source=scripts/cuda-libs.sh
	source scripts/cuda-libs.sh
	export RPAC_REQUIRE_GPU=1
fi
export RPAC_CUDA_CACHE="${RPAC_CUDA_CACHE:-$work/cuda-cache}"

left() { echo $((total - (SECONDS - t0))); }
# stage NAME LIMIT: whether stage NAME starts (some budget left), recorded.
stage() {
	local name="$1" limit="$2" l
	l=$(left)
	if ((l < 10)); then
		printf '%s\tnot run: time budget (%s s of %s spent)\t0\n' "$name" "$((SECONDS - t0))" "$total" >>"$work/stages.tsv"
		printf 'not run: time budget\n' >"$out/$name.log"
		return 1
	fi
	((limit == 0 || limit > l)) && limit=$l
	echo "gpu-lease: $name (at most $limit s; $l s left)" >&2
	printf '===== %s, started at %s s\n' "$name" "$((SECONDS - t0))" >"$out/$name.log"
	return 0
}
# run NAME LIMIT CMD...: CMD into NAME's log, killed after LIMIT seconds or
# the budget's end, whichever comes first; its status recorded.
run() {
	local name="$1" limit="$2" l r s=$SECONDS
	shift 2
	l=$(left)
	((l < limit)) && limit=$l
	if ((limit < 5)); then
		printf '\n----- %s: not run: time budget\n' "$*" >>"$out/$name.log"
		printf '%s\tnot run: time budget\t0\n' "$name: $*" >>"$work/stages.tsv"
		return 124
	fi
	printf '\n----- %s\n' "$*" >>"$out/$name.log"
	timeout -k 5 "$limit" "$@" >>"$out/$name.log" 2>&1
	r=$?
	((r == 124 || r == 137)) && printf '(killed after %s s)\n' "$limit" >>"$out/$name.log"
	printf '%s\t%s\t%s\n' "$name: $*" "$r" "$((SECONDS - s))" >>"$work/stages.tsv"
	return "$r"
}

# The paths' settings each step runs with: the defaults, every unmeasured
# path on, and (at T = 384 only, to keep the budget) the candidate with the
# experts routed (RPAC_LEASE_ROUTED, default `--expert-dispatch routed`: each
# token through its top-k experts only; empty leaves it out).
routed="${RPAC_LEASE_ROUTED---expert-dispatch routed}"
export RPAC_LEASE_ROUTED="$routed"
settings=("default:" "candidate:--cuda-candidate")
[[ -n "$routed" ]] && settings+=("routed:--cuda-candidate $routed")

# 1. smoke: the unmeasured paths' kernels and whole steps against the CPU.
smoke_kernels='TestGPUCollectiveOneRank|TestGPUSoftmaxCE|TestSimLinearBiasEpilogue|TestSimHalfOutputs|TestGPUAttnRowsUpperZero|TestSimHalfAttentionOperands|TestGPUPaddedGradW|TestGPUPaddedWeights|TestGPUAttentionGradIntoConcat|TestGPULayerNorm|TestSimAttentionSavedPacks'
smoke_steps='TestGPUStepMatchesCPU|TestSimRematSameBits|TestSimAlignedStep|TestSimBF16GradientErrors'
smoke="${RPAC_LEASE_SMOKE:-60}"
if stage smoke "$smoke"; then
	s=$SECONDS
	run smoke "$smoke" "${CUDA_TEST[@]}" -test.v -test.count=1 -test.run "$smoke_kernels"
	run smoke $((smoke - (SECONDS - s))) "${TRAINING_TEST[@]}" -test.v -test.count=1 -test.run "$smoke_steps"
fi

# 2. steps: the paper step at T = 384 and 768, each setting.
if stage steps 0; then
	for T in 384 768; do
		for st in "${settings[@]}"; do
			[[ "$T" != 384 && "${st%%:*}" == routed ]] && continue
			# shellcheck disable=SC2086 # the setting's flags split on purpose
			run steps 90 "${RPAC[@]}" bench train --device cuda --preset paper --context "$T" --steps 5 ${st#*:}
		done
	done
fi

# 3. torch: the same preset, tokens per step and weights in PyTorch.
torch="${RPAC_LEASE_TORCH:-120}"
if stage torch "$torch"; then
	s=$SECONDS
	if run torch 60 "${RPAC[@]}" bench torch-export --preset paper --context 384 --batch 2 --out "$work/torch-export"; then
		run torch $((torch - (SECONDS - s))) env PYTHONUNBUFFERED=1 "${PYTHON[@]}" bench/torch/rpac_torch.py "$work/torch-export" \
			--context 384 --tokens-per-step 24576 --steps 10 --warmup 2 --time-limit 10 --out "$out/torch.json"
	fi
	rm -rf "$work/torch-export"
fi

# 4. measure: each kernel of the paper step timed beside its prediction.
if stage measure 0; then
	for st in "${settings[@]}"; do
		# shellcheck disable=SC2086
		run measure 90 "${RPAC[@]}" bench train --device cuda --predict h200 --measure --kernels 12 --preset paper --context 384 ${st#*:}
	done
fi

python3 scripts/gpu-lease-report.py "$out" "$work/stages.tsv" "$total" "$((SECONDS - t0))" "$dry"
rc=$?
[[ -z "${RPAC_LEASE_WORK:-}" ]] && rm -rf "$work"
echo "gpu-lease: $((SECONDS - t0)) s; $out/summary.md" >&2
exit "$rc"
