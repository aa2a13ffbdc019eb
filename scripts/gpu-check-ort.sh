#!/usr/bin/env bash
# gpu-check-ort.sh — exported models on onnxruntime's CUDA provider, checked
# on a GPU machine from binaries and libraries prepared elsewhere (the GPU
# machine has no Go toolchain and no network).
#
# 1. Where Go is installed (x86-64), after
#        bash scripts/fetch-onnxruntime.sh --cuda
#    run
#        bash scripts/gpu-check-ort.sh --build
#    It builds bin/ort/bin/{rpac,export.test,runtime.test} (stripped) and
#    copies the cached onnxruntime 1.29.0 with the CUDA provider (the
#    229.8 MB libonnxruntime_providers_cuda.so among them) into bin/ort/lib/
#    (bin/ is git-ignored).
#
# 2. Carry bin/ort to the GPU machine. A device call carries at most 64 MiB
#    (the working tree included), so `bash scripts/gpu-ort-parts.sh pack`
#    compresses bin/ort (zstd -19 --long=27) into parts that fit, and each
#    part goes in its own call into the same warm machine, appended there
#    (`gpu-ort-parts.sh append`); the last call reassembles and checks it
#    (`gpu-ort-parts.sh assemble`) and runs step 3. The calls are printed
#    by pack and written out in docs/GPU.md; `gpu-ort-parts.sh dry` runs
#    them here. (Parts of the provider library split raw,
#    libonnxruntime_providers_cuda.so.part-*, are still joined by setup.)
#
# 3. On the GPU machine:
#        bash scripts/gpu-check-ort.sh                # all of setup, check, bench, report (OUT: $OUT or gpu-report/ort)
#        bash scripts/gpu-check.sh --all              # or: the CUDA backend's check, then this one (OUT/ort)
#    or step by step (one call each, on the same warm machine):
#        bash scripts/gpu-check-ort.sh setup          # join the parts, check every sha256
#        bash scripts/gpu-check-ort.sh check          # the provider loads; parity per dtype
#        bash scripts/gpu-check-ort.sh bench          # latency benchmarks
#        bash scripts/gpu-check-ort.sh report [OUT]   # the report
#    The report is three files: OUT/summary.md (which checks ran and passed,
#    parity, latency; or "NOT RUN: why"), OUT/report.json, OUT/logs.txt.
#    Logs, env.sh and benchmark data between the steps live in bin/ort/work.
#    Where bin/ort or the NVIDIA driver is missing, the report says "NOT RUN"
#    and why, and the script exits 3.
#    setup finds the CUDA 13 and cuDNN 9 libraries (the Python nvidia-*
#    packages included) and writes bin/ort/work/env.sh with LD_LIBRARY_PATH,
#    ORT_LIB and RPAC_ORT_CUDA for the later steps.
#
#    check runs, with RPAC_REQUIRE_GPU=1 (a provider that does not load
#    fails) and NVIDIA_TF32_OVERRIDE=0 (fp32 products in fp32):
#      - runtime.test TestCUDAProviderLoadOrExplain: a model runs on the
#        CUDA provider; TestCUDAFetchRunsOnCPU: the same library on the CPU
#        provider matches the float64 reference;
#      - export.test TestGPUProviderParity: for fp32, fp16 and bf16, dense
#        and rank fold, the CUDA provider against the Go executor (fp32:
#        max |Δlogit| <= 1e-4, also against the CPU provider; fp16/bf16:
#        |CE cost| < 0.01 nats), one GPUPARITY line each.
#    bench runs rpac bench infer on the CUDA provider: paper preset, fuzzy
#    model, fp32/fp16/bf16, dense (rpa) against rank fold (rank-approx: a
#    randomly initialised model's clip cuts a few entries), attention op
#    and op8 (heads padded to one multiple of 8, which flash attention
#    needs: the dense fold's mask rules it out anyway, the rank fold's does
#    not), p50/p95/p99 and tokens/s, for every L:B of RPAC_ORT_BENCH
#    (default "384:1 384:8 384:32 768:1 768:8 768:32"; each pair exports
#    twelve models, so a short lease takes a subset, e.g.
#    RPAC_ORT_BENCH="384:1 768:8" RPAC_ORT_DTYPES=fp16), RPAC_ORT_RUNS timed
#    runs per model (default 20). RPAC_ORT_PROVIDER, RPAC_ORT_PRESET,
#    RPAC_ORT_DTYPES and RPAC_ORT_ATTENTION (defaults cuda, paper,
#    fp32,fp16,bf16, op,op8) change what bench runs, e.g. a dry run on a
#    CPU machine: RPAC_ORT_PROVIDER=cpu RPAC_ORT_PRESET=tiny RPAC_ORT_DTYPES=fp32,fp16.
set -euo pipefail
cd "$(dirname "$0")/.."

ORT=bin/ort
WORK="${RPAC_ORT_WORK:-$ORT/work}"
PARTS_OF=libonnxruntime_providers_cuda.so
FILES=(libonnxruntime.so libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so)

log() { printf 'gpu-check-ort: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

build() {
	local cache
	cache="$(bash scripts/fetch-onnxruntime.sh --cuda | tail -n1)"
	cache="$(dirname "$cache")"
	rm -rf "$ORT"
	mkdir -p "$ORT/bin" "$ORT/lib"
	# noopenblas: the GPU machine has no libopenblas; these need only the C library
	go build -tags noopenblas -ldflags "-s -w" -o "$ORT/bin/rpac" ./cmd/rpac
	go test -c -tags noopenblas -ldflags "-s -w" -o "$ORT/bin/export.test" ./compiler/export
	go test -c -tags noopenblas -ldflags "-s -w" -o "$ORT/bin/runtime.test" ./runtime
	cp "$cache/libonnxruntime.so" "$cache/libonnxruntime_providers_shared.so" "$ORT/lib/"
	(cd "$cache" && sha256sum "${FILES[@]}") >"$ORT/lib/SHA256SUMS"
	cp "$cache/$PARTS_OF" "$ORT/lib/"
	log "built $ORT ($(go env GOOS)/$(go env GOARCH)):"
	(cd "$ORT" && find . -type f -printf '  %p %s bytes\n' | sort) >&2
	log "carry it in parts of at most 64 MiB: bash scripts/gpu-ort-parts.sh pack"
}

# cuda_dirs lists the folders holding the CUDA 13 and cuDNN 9 libraries
# the provider needs (and the driver's libcuda.so.1).
cuda_dirs() {
	find / -xdev \( -name 'libcublasLt.so.13*' -o -name 'libcublas.so.13*' -o -name 'libcudart.so.13*' -o -name 'libcurand.so.10*' \
		-o -name 'libcudnn*.so.9*' -o -name 'libcuda.so.1' -o -name 'libnvrtc.so.13*' \) 2>/dev/null |
		{ grep -v "/$ORT/" || true; } | xargs -r -n1 dirname | sort -u | paste -sd: -
}

setup() {
	local out="$1"
	mkdir -p "$out"
	[[ -x "$ORT/bin/rpac" && -x "$ORT/bin/export.test" && -x "$ORT/bin/runtime.test" ]] ||
		die "$ORT/bin is incomplete: run 'bash scripts/gpu-check-ort.sh --build' where Go is installed and carry $ORT/bin"
	[[ -f "$ORT/lib/SHA256SUMS" ]] || die "$ORT/lib/SHA256SUMS is missing: carry it with libonnxruntime.so"
	if [[ ! -f "$ORT/lib/$PARTS_OF" ]]; then
		compgen -G "$ORT/lib/$PARTS_OF.part-*" >/dev/null || die "no $PARTS_OF.part-* in $ORT/lib: carry every part"
		cat "$ORT/lib/$PARTS_OF".part-* >"$ORT/lib/$PARTS_OF.tmp"
		mv "$ORT/lib/$PARTS_OF.tmp" "$ORT/lib/$PARTS_OF"
	fi
	(cd "$ORT/lib" && sha256sum -c SHA256SUMS >&2) ||
		{ rm -f "$ORT/lib/$PARTS_OF"; die "a library does not match its sha256 (a part missing or cut short?): carry the parts again"; }
	local dirs
	dirs="$(cuda_dirs)"
	{
		printf 'export LD_LIBRARY_PATH=%q\n' "$PWD/$ORT/lib${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
		printf 'export ORT_LIB=%q\n' "$PWD/$ORT/lib/libonnxruntime.so"
		printf 'export RPAC_ORT_CUDA=%q\n' "$PWD/$ORT/lib/libonnxruntime.so"
	} >"$out/env.sh"
	log "libraries joined and checked; CUDA library folders: ${dirs:-none found}"
}

check() {
	local out="$1"
	# shellcheck disable=SC1091
	source "$out/env.sh"
	export RPAC_REQUIRE_GPU=1 RPAC_GPU_ORT=1 NVIDIA_TF32_OVERRIDE=0 CI=true
	local rc=0
	"$ORT/bin/runtime.test" -test.v -test.count=1 -test.run '^(TestCUDAProviderLoadOrExplain|TestCUDAFetchRunsOnCPU)$' >"$out/runtime.log" 2>&1 || rc=1
	"$ORT/bin/export.test" -test.v -test.count=1 -test.run '^TestGPUProviderParity$' -test.timeout 20m >"$out/parity.log" 2>&1 || rc=1
	grep -h -E -- "--- (PASS|FAIL|SKIP)|GPUPARITY|CUDA provider" "$out/runtime.log" "$out/parity.log" >&2 || true
	echo "$rc" >"$out/check.rc"
	return "$rc"
}

bench() {
	local out="$1"
	# shellcheck disable=SC1091
	source "$out/env.sh"
	local runs="${RPAC_ORT_RUNS:-20}" lb L B rc=0
	for lb in ${RPAC_ORT_BENCH:-384:1 384:8 384:32 768:1 768:8 768:32}; do
		L="${lb%%:*}" B="${lb##*:}"
		log "bench ${RPAC_ORT_PRESET:-paper} L=$L B=$B"
		"$ORT/bin/rpac" bench infer --provider "${RPAC_ORT_PROVIDER:-cuda}" --preset "${RPAC_ORT_PRESET:-paper}" --model fuzzy \
			--fold rpa,rank-approx --dtype "${RPAC_ORT_DTYPES:-fp32,fp16,bf16}" \
			--attention "${RPAC_ORT_ATTENTION:-op,op8}" --length "$L" --batch "$B" --runs "$runs" --block 5 --gemm-time 0 \
			--json "$out/bench_L${L}_B${B}.json" >"$out/bench_L${L}_B${B}.txt" 2>"$out/bench_L${L}_B${B}.err" || {
			rc=1
			tail -n 5 "$out/bench_L${L}_B${B}.err" >&2
		}
	done
	return "$rc"
}

report() { # report OUT [WHY]: OUT/summary.md, OUT/report.json, OUT/logs.txt from $WORK
	local out="$1" why="${2:-}" rc
	mkdir -p "$out"
	rc="$(cat "$WORK/check.rc" 2>/dev/null || echo 1)"
	[[ -n "$why" ]] && rc=3
	{
		echo "# rpac onnxruntime CUDA check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), $(nproc) cores"
		nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: nvidia-smi not available"
		[[ -n "$why" ]] && echo "NOT RUN: $why"
		for f in setup.log runtime.log parity.log "$WORK"/bench_L*_B*.txt "$WORK"/bench_L*_B*.err; do
			f="$WORK/${f#"$WORK"/}"
			[[ -f "$f" ]] && { echo; echo "===== ${f#"$WORK"/}"; cat "$f"; }
		done
	} >"$out/logs.txt"
	python3 scripts/gpu-report.py ort "$out" "$WORK" "$rc" "$why" ||
		{ printf '# rpac onnxruntime CUDA provider check: exit %s%s\n' "$rc" "${why:+, NOT RUN: $why}" >"$out/summary.md"; log "python3 missing: no report.json"; }
	log "$out/summary.md"
}

# not_run_reason says why the check cannot run here ("" when it can).
not_run_reason() {
	if [[ ! -x "$ORT/bin/rpac" || ! -x "$ORT/bin/export.test" || ! -x "$ORT/bin/runtime.test" ]]; then
		echo "$ORT/bin is missing: run 'bash scripts/fetch-onnxruntime.sh --cuda' and 'bash scripts/gpu-check-ort.sh --build' where Go and the network are, and carry bin/ort (in pieces of at most 64 MiB, see this script's header)"
	elif ! compgen -G "$ORT/lib/libonnxruntime_providers_cuda.so*" >/dev/null; then
		echo "the CUDA provider library ($ORT/lib/$PARTS_OF or its .part-* pieces) was not carried"
	elif [[ -z "$(find / -xdev -name 'libcuda.so.1' -not -path "$PWD/*" 2>/dev/null | head -n1)" ]]; then
		echo "no NVIDIA driver on this machine (libcuda.so.1 not found): the onnxruntime CUDA provider needs a GPU"
	fi
}

default_out="${OUT:-gpu-report}/ort"
[[ -n "${OUT:-}" ]] && default_out="$OUT"
case "${1:-all}" in
--build) build ;;
setup) mkdir -p "$WORK" && setup "$WORK" ;;
check) check "$WORK" ;;
bench) bench "$WORK" ;;
report) report "${2:-$default_out}" ;;
all)
	out="${2:-$default_out}"
	rm -rf "$WORK"
	mkdir -p "$WORK"
	why="$(not_run_reason)"
	if [[ -n "$why" ]]; then
		log "not run: $why"
		report "$out" "$why"
		exit 3
	fi
	if ! (setup "$WORK") 2>"$WORK/setup.log"; then
		report "$out" "setup failed: $(tail -n1 "$WORK/setup.log")"
		exit 3
	fi
	rc=0
	check "$WORK" || rc=1
	bench "$WORK" || rc=1
	report "$out"
	exit "$rc"
	;;
*) die "unknown step $1 (want --build, setup, check, bench, report, or none for all)" ;;
esac
