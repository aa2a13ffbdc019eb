#!/usr/bin/env bash
# gpu-lease-fake.sh WHAT ARGS... — what `scripts/gpu-lease.sh --dry` runs
# in place of the GPU commands: after RPAC_LEASE_FAKE_SLEEP seconds (default
# 1), the output of WHAT (rpac, cuda.test, training.test, python3) in its
# real format with made-up figures, so that the lease's control flow, time
# budget, files and report run without a GPU. RPAC_LEASE_FAKE_FAIL=WORD
# makes a command whose arguments contain WORD fail. The stage order goes to
# $RPAC_LEASE_FAKE_TRACE when set (one line per command).
set -uo pipefail
what="$1"
shift
[[ -n "${RPAC_LEASE_FAKE_TRACE:-}" ]] && echo "$what $*" >>"$RPAC_LEASE_FAKE_TRACE"
sleep "${RPAC_LEASE_FAKE_SLEEP:-1}"
if [[ -n "${RPAC_LEASE_FAKE_FAIL:-}" && " $what $* " == *"${RPAC_LEASE_FAKE_FAIL}"* ]]; then
	echo "fake: failing as asked (RPAC_LEASE_FAKE_FAIL=$RPAC_LEASE_FAKE_FAIL)" >&2
	exit 3
fi
arg() { # arg FLAG DEFAULT: the value after FLAG in the arguments
	local prev="" a
	for a in "${ARGS[@]}"; do
		[[ "$prev" == "$1" ]] && { echo "$a"; return; }
		prev="$a"
	done
	echo "$2"
}
ARGS=("$@")
case "$what" in
cuda.test | training.test)
	run="$(arg -test.run Test)"
	for t in ${run//|/ }; do
		printf '=== RUN   %s\n--- PASS: %s (0.01s)\n' "$t" "$t"
	done
	echo PASS ;;
rpac)
	T="$(arg --context 384)"
	ms=114
	[[ " $* " == *" --cuda-candidate "* ]] && ms=89
	((T == 768)) && ms=$((ms + 20))
	if [[ " $* " == *" torch-export "* ]]; then
		o="$(arg --out fake-export)"
		mkdir -p "$o"
		echo '{"preset": "paper", "batch": 2, "context": 384, "loss": 10.9140142}' >"$o/rpac.json"
		echo "bench torch-export: paper fuzzy, batch 2×384, rpac loss 10.9140142 (fp32, CPU, eval with batch statistics); $o"
	elif [[ " $* " == *" --predict "* ]]; then
		echo "bench train --predict h200: preset=paper model=fuzzy params=91723450 T=$T B=64 micro-batch=64 tokens/step=24576 on cuda (fake)"
		echo "  GPU time         $((ms * 8 / 10)).00 ms (kernels back to back)"
		echo "predicted h200 paper: $((ms * 8 / 10)).0 ms/step, 300k tok/s, MFU 15.0%, host-device 512 KiB/step"
		echo "  measured         $((ms - 5)).00 ms (each kernel and GEMM timed between two synchronizations, less 4.0 µs per call, a synchronized empty launch's time; predicted $((ms * 8 / 10)).00)"
	else
		echo "bench train: preset=paper model=fuzzy params=91723450 T=$T B=$((24576 / T)) micro-batch=$((24576 / T)) tokens/step=24576 on cuda (fake) (forward, backward, clip, AdamW)"
		printf '  step time        %s s  (5 steps)\n' "$(awk -v m="$ms" 'BEGIN { printf "%.3f", m / 1000 }')"
		echo "  tokens/s         $((24576000 / ms))"
		echo "  MFU              $((1300 / ms)).5% of the NVIDIA H200 dense bf16 peak (989.4 TFLOP/s, datasheet)"
		echo "  MFU routed       $((1000 / ms)).2% (the FLOPs of routed experts, 1000.0 GFLOP/step: each token through its top-k only)"
	fi ;;
python3)
	o="$(arg --out torch.json)"
	echo '{"torch": "fake", "rpac_loss": 10.9140142, "loss_dense": 10.9140139, "diff_dense": 3e-7, "loss_routed": 10.9140139, "diff_routed": 3e-7, "tol": 0.001, "loss_ok": true, "eager": {"tokens_per_s": 60000.0, "ms_per_step": 409.6}, "eager_routed": {"tokens_per_s": 70000.0}, "compile": {"tokens_per_s": 90000.0}}' | tee "$o" ;;
*)
	echo "fake: unknown command $what" >&2
	exit 2 ;;
esac
