#!/usr/bin/env bash
# gpu-check.sh — the CUDA backend's validation on a GPU machine, from
# binaries built elsewhere (GPU machines may have no Go toolchain).
#
# On a machine with Go (x86-64 or, with GOARCH=arm64, for a Grace host):
#     bash scripts/gpu-check.sh --build        # writes bin/ (tests with CGO_ENABLED=0, rpac, data)
# Carry the checkout with bin/cuda.test, bin/training.test, bin/rpac and
# bin/data (52.0 MB on x86-64 on 2026-11-29; the working tree 5.5 MB: 55 MiB
# of a device call's 64) to the GPU machine, then:
#     bash scripts/gpu-check.sh --all [OUT]     # this check, then scripts/gpu-check-ort.sh: the first run on a GPU
#     bash scripts/gpu-check.sh [OUT]           # this check only
# OUT defaults to $OUT (the device tool's folder) or gpu-report.
#
# The whole report is at most three files (--all adds three under OUT/ort):
#   OUT/summary.md   which checks ran, which passed, what was measured
#                    (benchmarks, final CE), the device, the driver's CUDA
#                    version, NVRTC's, and whether the kernels loaded as
#                    cubins or fell back to PTX;
#   OUT/report.json  the same, with every Go test's result and each check's
#                    log tail;
#   OUT/logs.txt     every check's full output.
# Training runs and checkpoints go to a scratch folder ($RPAC_CHECK_WORK, else
# a temporary one), never to OUT.
#
# It finds the CUDA libraries (driver, NVRTC, cuBLASLt; the Python nvidia-*
# wheels included) and puts their folders after $RPAC_CUDA_LIBS, and with
# RPAC_REQUIRE_GPU=1 (a missing GPU fails instead of skipping) runs:
#   probe    rpac gpu --json: device, driver and NVRTC versions, each kernel
#            source compiled (cubin for sm_NN, or the PTX fallback and why);
#   kernels  the kernel tests (parity against float64 references, every op
#            of the IR table through the backend against the CPU backend;
#            the TestSim* parity tests too: op, GEMM, MMA, reduction,
#            optimizer and EMA parity, which run on the simulator or, with
#            RPAC_REQUIRE_GPU=1, a GPU; the simulator's own tests skip);
#   steps    the training tests matching GPU|Sim: the whole fuzzy and
#            baseline training steps against the CPU (fp32 against the
#            float64 CPU step, bf16) and their repeatability, and whole short
#            trainer runs (device optimizer and state, resume) against the
#            CPU;
#   runs     a 40-step (RPAC_CHECK_STEPS) tiny WikiText-2 run on CUDA (fp32)
#            and on the CPU with the same seed, final val CE within 0.02
#            (the CPU binary is built without OpenBLAS: on
#            a 16-core H200 host it trains the tiny preset at 0.69 step/s);
#   resume   exact resume on CUDA (10 steps + 10 resumed = 20 straight);
#   predict  rpac bench train --predict --measure at the paper (T = 768) and
#            tiny presets, the paper step again with flash.cu's attention
#            (RPAC_CUDA_ATTENTION=flash), without the joined sibling
#            gradients (RPAC_CUDA_JOIN=off), with every chain's result in
#            fp32 (RPAC_CUDA_PACK=off), with the bias gradients' column
#            sums apart from their chains (RPAC_CUDA_SUMS=off), with every
#            GEMM plan's candidates timed and the fastest taken
#            (RPAC_CUDA_GEMM_TUNE, the choices printed), with the weight
#            gradients and the LM
#            head's GEMMs unpadded (RPAC_CUDA_PAD_GRADW=off,
#            RPAC_CUDA_HEAD_PAD=off), with the model's widths unpadded
#            (RPAC_CUDA_PAD_MODEL=off), and rpac bench gemm-algos on the paper
#            step's GEMM shapes (cuBLASLt's first 8 candidates each) and on
#            the LM head's padded variants, whose cuBLASLt kernels Nsight
#            Compute names;
#   bench    rpac bench train --device cuda, paper preset, fuzzy and baseline models,
#            bf16 and fp32, the fuzzy bf16 step at T = 768, with the
#            weight gradients unpadded, with the LM head unpadded, with
#            the model's widths unpadded, with flash.cu's attention, and
#            with each GEMM's cuBLASLt candidates timed and the fastest taken
#            (RPAC_CUDA_GEMM_TUNE, the choices printed);
#   profile  Nsight Compute (ncu, when installed) on one launch of each of the
#            paper step's costliest kernels (a generated elementwise chain
#            of each kind among them): speed of light, occupancy,
#            launch statistics (registers, shared memory), warp stalls.
# RPAC_CHECKS="probe kernels steps predict runs resume bench profile" (the default: all)
# picks groups; RPAC_CHECK_SKIP="NAME ..." leaves those checks out (reported
# skipped); RPAC_CHECK_RUN=REGEXP limits the kernels and steps groups to
# those tests; RPAC_CHECK_BUDGET=SECONDS stops starting checks after that
# long (the rest are reported "not run: time budget"), for a machine with a
# per-command time limit (--all defaults it to 480 s for this part);
# RPAC_CHECK_TIMEOUT=SECONDS kills any one check that runs longer.
#
# With RPAC_CUDA_LIBS pointing at the CUDA simulator (kernels/cuda/cudasim)
# the same script runs on a machine without a GPU; the summary says so.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--build" ]]; then
	mkdir -p bin/data
	export CGO_ENABLED=0
	go test -c -ldflags="-s -w" -o bin/cuda.test ./kernels/cuda
	go test -c -ldflags="-s -w" -o bin/training.test ./training
	# rpac with cgo where it can be (same architecture, a C compiler) and
	# without OpenBLAS, so it needs only the C library: then it runs the
	# exports in an onnxruntime library found on the GPU machine
	# (gpu-experiments.sh's --eval-lengths); the test binaries stay cgo-free.
	if [[ "$(go env GOARCH)" == "$(go env GOHOSTARCH)" ]] && command -v "$(go env CC)" >/dev/null; then
		CGO_ENABLED=1 go build -tags noopenblas -ldflags="-s -w" -o bin/rpac ./cmd/rpac
		rpac_cgo="cgo without OpenBLAS"
	else
		go build -ldflags="-s -w" -o bin/rpac ./cmd/rpac
		rpac_cgo="no cgo: no onnxruntime"
	fi
	data="${RPAC_DATA:-../shared/data/wikitext-2-raw-v1}"
	cp "$data"/wiki.valid.raw "$data"/wiki.test.raw bin/data/
	carry=(bin/cuda.test bin/training.test bin/rpac bin/data)
	echo "built ${carry[*]} ($(go env GOOS)/$(go env GOARCH), tests CGO_ENABLED=0, rpac $rpac_cgo, $(du -cb "${carry[@]}" | tail -n1 | cut -f1) bytes); carry these to the GPU machine"
	exit 0
fi

all=0
if [[ "${1:-}" == "--all" ]]; then
	all=1
	shift
	export RPAC_CHECK_BUDGET="${RPAC_CHECK_BUDGET:-480}"
fi
out="${1:-${OUT:-gpu-report}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="${RPAC_CHECK_WORK:-$(mktemp -d)}"
mkdir -p "$work"
logs="$out/logs.txt"
tsv="$work/checks.tsv"
: >"$logs"
: >"$tsv"

if [[ ! -x bin/cuda.test || ! -x bin/training.test || ! -x bin/rpac ]]; then
	why="bin/ is incomplete: run 'bash scripts/gpu-check.sh --build' where Go is installed and carry bin/"
	printf '# rpac GPU check\n\nNOT RUN: %s\n' "$why" >"$out/summary.md"
	printf '{"exit": 1, "not_run": "%s"}\n' "$why" >"$out/report.json"
	echo "gpu-check: $why" >&2
	if [[ $all -eq 1 ]]; then bash scripts/gpu-check-ort.sh all "$out/ort" || true; fi
	exit 1
fi

# shellcheck source=scripts/cuda-libs.sh
source scripts/cuda-libs.sh
export RPAC_REQUIRE_GPU=1
export RPAC_CUDA_CACHE="${RPAC_CUDA_CACHE:-$work/cuda-cache}"

set +e
rc=0
t_start=$SECONDS
# check NAME CMD...: run (unless the time budget is spent), log, record.
check() {
	local name="$1"; shift
	if [[ " ${RPAC_CHECK_SKIP:-} " == *" $name "* ]]; then
		printf '%s\tskip-asked\t0\n' "$name" >>"$tsv"
		printf '\n===== %s: not run (RPAC_CHECK_SKIP)\n' "$name" >>"$logs"
		return
	fi
	if [[ -n "${RPAC_CHECK_BUDGET:-}" && $((SECONDS - t_start)) -ge $RPAC_CHECK_BUDGET ]]; then
		printf '%s\tskip\t0\n' "$name" >>"$tsv"
		printf '\n===== %s: not run (time budget of %s s spent)\n' "$name" "$RPAC_CHECK_BUDGET" >>"$logs"
		return
	fi
	local t0=$SECONDS
	echo "gpu-check: $name" >&2
	printf '\n===== %s: %s\n' "$name" "$*" >>"$logs"
	local limit=()
	[[ -n "${RPAC_CHECK_TIMEOUT:-}" ]] && limit=(timeout -k 5 "$RPAC_CHECK_TIMEOUT")
	"${limit[@]}" "$@" >"$work/$name.log" 2>&1
	local r=$?
	[[ $r -eq 124 || $r -eq 137 ]] && printf '\n(killed after %s s: RPAC_CHECK_TIMEOUT)\n' "$RPAC_CHECK_TIMEOUT" >>"$work/$name.log"
	cat "$work/$name.log" >>"$logs"
	printf '%s\t%s\t%s\n' "$name" "$r" "$((SECONDS - t0))" >>"$tsv"
	[[ $r -eq 0 ]] || rc=1
}
want() { [[ " ${RPAC_CHECKS:-probe kernels steps runs resume predict bench profile} " == *" $1 "* ]]; }
testrun=()
[[ -n "${RPAC_CHECK_RUN:-}" ]] && testrun=(-test.run "$RPAC_CHECK_RUN")

want probe && check probe bin/rpac gpu --json
want kernels && check kernels bin/cuda.test -test.v -test.count=1 "${testrun[@]}"
want steps && check steps bin/training.test -test.v -test.count=1 -test.run "${RPAC_CHECK_RUN:-GPU|Sim}"

# The performance model against the GPU: each kernel of a traced step
# timed on its own beside its prediction (docs/PERFMODEL.md).
if want predict; then
	# the model of the card present (an H100 where the name says neither)
	case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)" in
	*GH200*) machine=gh200 ;;
	*H200*) machine=h200 ;;
	*) machine=h100 ;;
	esac
	check predict-paper bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 0 --gemm-shapes 24 --preset paper --context 768
	# the same GEMMs with each plan's cuBLASLt candidates timed and the fastest taken (gemmtune.go), and the choices
	check predict-paper-tuned env RPAC_CUDA_GEMM_ALGOS="$work/gemm-algos.json" RPAC_CUDA_GEMM_TUNE=1 \
		bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --gemm-shapes 24 --preset paper --context 768
	check gemm-choices cat "$work/gemm-algos.json"
	check predict-tiny bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 0 --preset tiny
	# the attention on flash.cu's kernels instead of the GEMM path, to compare
	check predict-paper-flash env RPAC_CUDA_ATTENTION=flash bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --preset paper --context 768
	# one backward GEMM per Linear instead of the joined sibling gradients, to compare
	check predict-paper-unjoined env RPAC_CUDA_JOIN=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --gemm-shapes 12 --preset paper --context 768
	# chains whose results only bf16 GEMMs read writing them in fp32, converted before each GEMM, to compare
	check predict-paper-unpacked env RPAC_CUDA_PACK=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --preset paper --context 768
	# bias gradients as separate column sums (reduce_cols_f32) instead of folded into their chains, to compare
	check predict-paper-unsummed env RPAC_CUDA_SUMS=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --preset paper --context 768
	# the weight gradients over their own dims instead of rounded up to 8 and compacted (RPAC_CUDA_PAD_GRADW=off), to compare
	check predict-paper-gradwunpadded env RPAC_CUDA_PAD_GRADW=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --gemm-shapes 12 --preset paper --context 768
	# the LM head's GEMMs over the vocabulary and width as they are instead of rounded up to 8 (RPAC_CUDA_HEAD_PAD=off), to compare
	check predict-paper-headunpadded env RPAC_CUDA_HEAD_PAD=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --gemm-shapes 12 --preset paper --context 768
	# the model's widths as they are (510, 85, 1,020) instead of padded to 512, 88 and 1,024 (RPAC_CUDA_PAD_MODEL=off), to compare
	check predict-paper-modelunpadded env RPAC_CUDA_PAD_MODEL=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --gemm-shapes 12 --preset paper --context 768
	# the memory traffic before PERFMODEL.md's "Fewer bytes" (the logits read twice, the experts' dropouts written once,
	# GEMM results for the chains in fp32), to compare
	check predict-paper-fullbytes env RPAC_CUDA_CE_SMEM=off RPAC_CUDA_REMAT=off RPAC_CUDA_BF16_ACT=off RPAC_CUDA_AG_LEAN=off bin/rpac bench train --device cuda --predict "$machine" --measure --kernels 12 --preset paper --context 768
	# the LM head's GEMMs (4,096-row chunks) as they are and with V, K or the chunk rounded or grown, and the padded weight
	# gradients' and other model GEMMs' shapes with every dim a multiple of 8: which layouts cuBLASLt runs fast
	check gemm-algos-head bin/rpac bench gemm-algos --algos 4 --reps 10 --shapes \
		4096x50257x510:NT:50264,4096x50257x512:NT:50264,4096x50264x510:NT:50264,4096x50264x512:NT:50264,4096x50304x512:NT:50304,8192x50264x512:NT:50264,4096x510x50257,4096x510x50264,4096x512x50264,50257x510x4096:TN,50264x510x4096:TN,50264x512x4096:TN,24576x1024x512:NT,24576x512x512:NT,24576x1020x512:NT,512x1024x24576:TN,512x512x24576:TN,1536x512x24576:TN,4080x512x24576:TN,24576x512x4080,24576x1024x512
	# the cuBLASLt kernels those shapes run (their names say the tile, the layout and whether they are Hopper's wgmma kernels)
	ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1 || true)
	[[ -n "$ncu" ]] && check gemm-kernels "$ncu" --clock-control none --metrics gpu__time_duration.sum \
		bin/rpac bench gemm-algos --algos 1 --reps 1 --shapes 4096x50257x510:NT:50264,4096x50264x512:NT:50264,4096x510x50257,4096x512x50264,50257x510x4096:TN,24576x1020x510:NT,24576x1024x512:NT
	# cuBLASLt's other candidate algorithms on the paper step's GEMM shapes (T = 768): what choosing by time would gain
	check gemm-algos bin/rpac bench gemm-algos --algos 8 --reps 10 --shapes \
		4096x50257x510:NT:50264,4096x510x50257,50257x510x4096:TN,1024x510x50257,24576x1020x510:NT,24576x1020x510,24576x510x1020:NT,24576x510x1020,24576x510x510:NT,24576x510x510,510x510x24576:TN,1020x510x24576:TN,510x1020x24576:TN,1530x510x24576:TN,4080x510x24576:TN,24576x510x1530,24576x510x4080
fi

# CUDA vs CPU, 40 tiny steps, same seed.
if want runs; then
	train=(train --preset tiny --dataset wikitext2 --data-dir bin/data --train-split test --eval-split valid
		--steps "${RPAC_CHECK_STEPS:-40}" --eval-every "${RPAC_CHECK_STEPS:-40}" --eval-batches 8 --seed 3)
	check run-cuda bin/rpac "${train[@]}" --device cuda --precision fp32 --out "$work/run-cuda"
	check run-cpu bin/rpac "${train[@]}" --device cpu --out "$work/run-cpu"
	lastce() { grep '"val_ce"' "$1/metrics.jsonl" 2>/dev/null | tail -n1 | sed 's/.*"val_ce":\([-0-9.eE+]*\).*/\1/'; }
	check compare-ce awk -v a="$(lastce "$work/run-cuda")" -v b="$(lastce "$work/run-cpu")" \
		'BEGIN { d = a - b; if (d < 0) d = -d; printf "final val CE: cuda %s, cpu %s, |diff| %.4f (limit 0.02)\n", a, b, d; exit !(a != "" && b != "" && d <= 0.02) }'
fi

# Exact resume on CUDA.
if want resume; then
	short=(train --preset tiny --dataset wikitext2 --data-dir bin/data --train-split test --eval-split valid
		--eval-every 10 --eval-batches 2 --seed 5 --device cuda --precision fp32)
	check resume-straight bin/rpac "${short[@]}" --steps 20 --out "$work/straight"
	check resume-first bin/rpac "${short[@]}" --steps 20 --stop-after 10 --out "$work/resumed"
	check resume-rest bin/rpac "${short[@]}" --steps 20 --resume --out "$work/resumed"
	check resume-compare cmp "$work/straight/checkpoint/model.safetensors" "$work/resumed/checkpoint/model.safetensors"
fi


# Benchmarks.
if want bench; then
	for model in fuzzy baseline; do
		for prec in bf16 fp32; do
			check "bench-paper-$model-$prec" bin/rpac bench train --device cuda --precision "$prec" --preset paper --model "$model" --steps 5
		done
	done
	check bench-paper-fuzzy-bf16-768 bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --context 768 --steps 5
	check bench-paper-fuzzy-bf16-gradwunpadded env RPAC_CUDA_PAD_GRADW=off bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --steps 5
	check bench-paper-fuzzy-bf16-headunpadded env RPAC_CUDA_HEAD_PAD=off bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --steps 5
	check bench-paper-fuzzy-bf16-modelunpadded env RPAC_CUDA_PAD_MODEL=off bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --steps 5
	check bench-paper-fuzzy-bf16-fullbytes env RPAC_CUDA_CE_SMEM=off RPAC_CUDA_REMAT=off RPAC_CUDA_BF16_ACT=off RPAC_CUDA_AG_LEAN=off bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --steps 5
	check bench-paper-fuzzy-bf16-flash env RPAC_CUDA_ATTENTION=flash bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --steps 5
	# with each GEMM plan's cuBLASLt candidates timed (in the warm-up step; those of T = 768 already chosen) and the fastest taken
	check bench-paper-fuzzy-bf16-tuned env RPAC_CUDA_GEMM_ALGOS="$work/gemm-algos.json" RPAC_CUDA_GEMM_TUNE=1 \
		bin/rpac bench train --device cuda --precision bf16 --preset paper --model fuzzy --steps 5
fi

# Nsight Compute, one launch of each kernel (a paper step each).
if want profile; then
	ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1 || true)
	if [[ -n "$ncu" ]]; then
		# LABEL=REGEX of the kernel names (the generated chains have hashed names)
		for lk in attn_softmax_fwd_f32=attn_softmax_fwd_f32 attn_softmax_bwd_f32=attn_softmax_bwd_f32 \
			fused_gen_bcast=fused_gen_bcast_ 'fused_gen_dense=fused_gen_[0-9a-f]+$' fused_gen_sum=fused_gen_sum_ \
			softmax_ce_fused_f32=softmax_ce_fused_f32; do
			k="${lk%%=*}"
			check "profile-$k" "$ncu" --clock-control none -k "regex:^${lk#*=}" -c 1 --section SpeedOfLight --section Occupancy \
				--section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
				bin/rpac bench train --device cuda --preset paper --context 768 --steps 1
		done
	fi
fi
set -e

python3 scripts/gpu-report.py gpu "$out" "$work" "$rc" || {
	# without python3: a plain summary from the check table
	{
		echo "# rpac GPU check (exit $rc; python3 missing, so no details)"
		awk -F'\t' '{ printf "- %s: %s\n", $1, ($2 == "skip" ? "not run (time budget)" : ($2 == 0 ? "passed" : "FAILED (exit " $2 ")")) }' "$tsv"
	} >"$out/summary.md"
	echo "{\"exit\": $rc}" >"$out/report.json"
}
[[ -z "${RPAC_CHECK_WORK:-}" ]] && rm -rf "$work"
echo "gpu-check: exit $rc; $out/summary.md" >&2

if [[ $all -eq 1 ]]; then
	ort_rc=0
	bash scripts/gpu-check-ort.sh all "$out/ort" || ort_rc=$?
	python3 scripts/gpu-report.py combine "$out" || true
	[[ $ort_rc -eq 0 || $ort_rc -eq 3 ]] || rc=1 # 3: not run (reported as such)
fi
exit "$rc"
