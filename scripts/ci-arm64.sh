#!/usr/bin/env bash
# ci-arm64.sh — check rpac on linux/arm64 (a GH200's Grace host) from an
# x86-64 Debian 12 machine: cross-build the test binaries with cgo (OpenBLAS
# and onnxruntime included) and run a time-boxed subset of them under
# qemu-user emulation. On an arm64 machine the same binaries build and run
# natively. .ci/run calls it; it also runs alone:
#
#     bash scripts/ci-arm64.sh
#
# 1. Packages (installed when missing, as root or through sudo): on x86-64
#    the arm64 architecture is added to dpkg (Debian's own sources serve
#    arm64 too), then crossbuild-essential-arm64 (aarch64-linux-gnu-gcc),
#    qemu-user-static, and libopenblas-dev:arm64 and libstdc++6:arm64
#    (libonnxruntime needs it) from multiarch; npm for the fetch.
# 2. onnxruntime 1.30.0 for linux/arm64 from onnxruntime-node
#    (scripts/fetch-onnxruntime.sh --arch arm64, integrity-checked, cached
#    beside the x86-64 one, never over it); ORT_LIB points at it.
# 3. `go test -c` per package with CC=aarch64-linux-gnu-gcc CGO_ENABLED=1
#    GOARCH=arm64 (pkg-config, where used, reads the arm64 .pc files), and
#    `go build ./cmd/rpac`; each binary is checked to be AArch64 and to link
#    OpenBLAS.
# 4. Each test binary runs under qemu-aarch64-static with a -test.run
#    filter, a -test.timeout and a hard kill after it, from its package
#    folder, with CI, ORT_LIB and RPAC_DATA passed through (CI defaults to
#    true here: a missing library or data set fails instead of skipping,
#    and so does any skipped test of the subset). The GEMM-heavy checks run a
#    second time with OpenBLAS's Neoverse V1 kernels (SVE), since the kernels
#    OpenBLAS picks by itself depend on the CPU. Then `rpac train` (3 steps,
#    synthetic data) and `rpac export --verify` on the arm64 onnxruntime,
#    whose max |Δlogit| must stay within 1e-4.
#
# The emulated CPU is qemu's `max` with SME off and 128-bit SVE vectors
# (RPAC_QEMU_CPU overrides): SVE2, bf16, i8mm and dot products as on
# Neoverse V2 (Grace), which has no SME. Two details make emulation work:
#   - qemu runs without `-L /usr/aarch64-linux-gnu`: that folder holds the
#     cross toolchain's ld.so, while libopenblas:arm64 pulls in the
#     multiarch libc6:arm64 of another Debian revision, and with the pair
#     the test binaries hung before main. The multiarch ld.so
#     (/lib/ld-linux-aarch64.so.1) is used instead.
#   - QEMU_LD_PREFIX points at a folder holding only proc/cpuinfo for the
#     emulated CPU (scripts/arm64-cpuinfo.c says why onnxruntime needs it).
#
# Prints one line per test binary (passed, failed, skipped, seconds), the
# time of each stage and the total, and ends with "arm64: N passed, M
# failed". Exit status 1 when anything failed. RPAC_ARM64_KEEP=1 keeps the
# work folder (binaries, logs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive
export CI="${CI:-true}"

say() { echo "ci-arm64: $*"; }
die() {
	echo "ci-arm64: error: $*" >&2
	exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t_all="$(now)"
declare -a stage_times=()
stage_done() { stage_times+=("$1 $(since "$2")s"); }

case "$(uname -m)" in
x86_64 | amd64) native=0 ;;
aarch64 | arm64) native=1 ;;
*) die "runs on x86-64 (cross-build and emulate) or arm64 (natively), not $(uname -m)" ;;
esac

# --- 1. Packages ---------------------------------------------------------
t0="$(now)"
if [[ "$native" == 1 ]]; then
	packages=(libopenblas-dev gcc libc6-dev)
else
	packages=(crossbuild-essential-arm64 qemu-user-static libopenblas-dev:arm64 libstdc++6:arm64)
fi
command -v npm >/dev/null 2>&1 || packages+=(npm)
# installed NAME[:ARCH]: installed for ARCH (default: this machine's), or
# for all architectures.
installed() {
	local want
	want="$(dpkg --print-architecture)"
	[[ "$1" == *:* ]] && want="${1##*:}"
	dpkg-query -W -f='${Status} ${Architecture}\n' "$1" 2>/dev/null | grep -Eq "^install ok installed ($want|all)\$"
}
need=()
for p in "${packages[@]}"; do
	installed "$p" || need+=("$p")
done
if [[ ${#need[@]} -gt 0 ]]; then
	as_root=()
	if [[ "$(id -u)" -ne 0 ]]; then
		command -v sudo >/dev/null 2>&1 || die "missing packages ${need[*]}; installing them needs root or sudo"
		as_root=(sudo)
	fi
	if [[ "$native" == 0 ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
		say "adding the arm64 architecture to dpkg"
		"${as_root[@]}" dpkg --add-architecture arm64
	fi
	say "installing ${need[*]}"
	"${as_root[@]}" apt-get update -qq
	"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [[ "$native" == 0 ]]; then
	for tool in aarch64-linux-gnu-gcc aarch64-linux-gnu-readelf qemu-aarch64-static; do
		command -v "$tool" >/dev/null || die "$tool not found after installing the packages"
	done
	[[ -f /usr/lib/aarch64-linux-gnu/libopenblas.so ]] || die "the arm64 OpenBLAS (libopenblas-dev:arm64) is not installed"
	[[ -e /lib/ld-linux-aarch64.so.1 ]] || die "the arm64 dynamic loader (libc6:arm64) is not installed"
fi
stage_done packages "$t0"

# --- 2. onnxruntime for arm64 ---------------------------------------------
t0="$(now)"
ORT_LIB="$(bash scripts/fetch-onnxruntime.sh --arch arm64 | tail -n1)"
[[ -f "$ORT_LIB" ]] || die "scripts/fetch-onnxruntime.sh --arch arm64 gave no library"
export ORT_LIB
if [[ -z "${RPAC_DATA:-}" && -d ../shared/data/wikitext-2-raw-v1 ]]; then
	RPAC_DATA="$(cd ../shared/data/wikitext-2-raw-v1 && pwd)"
fi
if [[ -n "${RPAC_DATA:-}" ]]; then
	[[ -d "$RPAC_DATA" ]] || die "RPAC_DATA=$RPAC_DATA is not a folder"
	RPAC_DATA="$(cd "$RPAC_DATA" && pwd)" # the tests run from their package folders
	export RPAC_DATA
fi
stage_done onnxruntime "$t0"

work="$(mktemp -d "${TMPDIR:-/tmp}/rpac-arm64.XXXXXX")"
if [[ "${RPAC_ARM64_KEEP:-0}" == 1 ]]; then
	say "work folder (kept): $work"
else
	trap 'rm -rf "$work"' EXIT
fi
bin="$work/bin"
logs="$work/logs"
mkdir -p "$bin" "$logs"

# --- 3. Emulation ---------------------------------------------------------
runner=()
if [[ "$native" == 0 ]]; then
	t0="$(now)"
	export QEMU_CPU="${RPAC_QEMU_CPU:-max,sme=off,sve-default-vector-length=16}"
	unset QEMU_LD_PREFIX
	aarch64-linux-gnu-gcc -O2 -o "$bin/arm64-cpuinfo" scripts/arm64-cpuinfo.c
	ncpu="$(awk -F'[-,]' '{ print $NF + 1 }' /sys/devices/system/cpu/possible)"
	mkdir -p "$work/qemu-root/proc"
	qemu-aarch64-static "$bin/arm64-cpuinfo" "$ncpu" >"$work/qemu-root/proc/cpuinfo" ||
		die "qemu-aarch64-static cannot run an arm64 program (QEMU_CPU=$QEMU_CPU)"
	export QEMU_LD_PREFIX="$work/qemu-root"
	runner=(qemu-aarch64-static)
	say "qemu: $(qemu-aarch64-static --version | head -n1), QEMU_CPU=$QEMU_CPU," \
		"$(grep -m1 'CPU part' "$QEMU_LD_PREFIX/proc/cpuinfo" | tr -s '\t ' ' ')"
	stage_done emulation "$t0"
fi

# --- 4. Build -------------------------------------------------------------
t0="$(now)"
pkgs=(./ir ./passes ./internal/logsumexp ./kernels/cpu ./kernels/cpu/blas ./kernels/cuda ./compiler/model ./training ./training/data ./compiler/export ./runtime)
build_env=(CGO_ENABLED=1 GOARCH=arm64)
if [[ "$native" == 0 ]]; then
	build_env+=(CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
fi
say "building ${#pkgs[@]} test binaries and rpac for linux/arm64 (${build_env[*]})"
# No symbol table or DWARF (-s -w): shorter links; panics still print
# symbolized stacks.
env "${build_env[@]}" go test -c -ldflags="-s -w" -o "$bin/" "${pkgs[@]}"
env "${build_env[@]}" go build -ldflags="-s -w" -o "$bin/rpac" ./cmd/rpac
readelf=readelf
[[ "$native" == 0 ]] && readelf=aarch64-linux-gnu-readelf
for f in "$bin"/*.test "$bin/rpac"; do
	"$readelf" -h "$f" | grep -q 'Machine:.*AArch64' || die "$f is not an AArch64 binary"
done
for f in "$bin/cpu.test" "$bin/rpac"; do
	"$readelf" -d "$f" | grep -q 'NEEDED.*libopenblas' || die "$f does not link OpenBLAS (cgo off?)"
done
stage_done build "$t0"

# --- 5. Tests -------------------------------------------------------------
passed=0
failed=0
bad=()
# run LABEL PKG LIMIT RUN SKIP [VAR=VALUE...]: PKG's test binary with
# -test.run RUN (and -test.skip SKIP unless empty) from PKG's folder, at
# most LIMIT seconds.
run() {
	local label="$1" pkg="$2" limit="$3" re="$4" skip="$5"
	shift 5
	local exe="$bin/$(basename "$pkg").test" log="$logs/$label.log" rc=0 t np nf ns
	local args=(-test.v -test.count=1 -test.timeout="${limit}s" -test.run "$re")
	[[ -n "$skip" ]] && args+=(-test.skip "$skip")
	t="$(now)"
	(cd "$pkg" && env "$@" timeout -s KILL "$((limit + 30))" "${runner[@]}" "$exe" "${args[@]}") >"$log" 2>&1 || rc=$?
	np="$(grep -c '^--- PASS' "$log" || true)"
	nf="$(grep -c '^--- FAIL' "$log" || true)"
	ns="$(grep -c '^--- SKIP' "$log" || true)"
	printf 'ci-arm64: %-22s %3d passed, %d failed, %d skipped  %6.1fs\n' "$label" "$np" "$nf" "$ns" "$(since "$t")"
	passed=$((passed + np))
	failed=$((failed + nf))
	if [[ "$rc" -ne 0 || "$nf" -gt 0 || "$np" -eq 0 || ("$CI" == true && "$ns" -gt 0) ]]; then
		[[ "$nf" -eq 0 ]] && failed=$((failed + 1)) # a crash, a timeout, no test run or a skip
		bad+=("$label")
		say "$label: exit status $rc; the end of $log:"
		grep -E '^\s*--- (FAIL|SKIP)|^panic|timed out' "$log" | head -n 20 || true
		tail -n 40 "$log"
	fi
}

t0="$(now)"
# The IR and the passes: everything.
run ir ./ir 120 . ""
run passes ./passes 180 . ""
# The scorer's log-sum-exp: the NEON C kernel and the Go path against float64.
run logsumexp ./internal/logsumexp 60 . ""
# Every CPU kernel, forward and backward, against float64 finite differences.
run kernels-cpu ./kernels/cpu 240 . ""
# OpenBLAS GEMM against a float64 reference (every shape, transposition, stride).
run blas ./kernels/cpu/blas 300 'TestSgemm$|TestDgemm$|TestImpl$|TestBadArgsPanic$' ""
# The CUDA backend's host side (no GPU; NVRTC is not installed for arm64,
# so the kernel-source compiles (ptxas reports and generated chains too) are left out, and the CUDA simulator is
# built by the host's g++, so its tests run in the host stage): views and reductions against
# the CPU, every op and whole training steps on the fake device.
run cuda-host ./kernels/cuda 120 . 'TestGPU|TestSim|TestKernelSourcesCompile$|TestCompileErrorHasLog$|TestCompileCache$|TestMMASourceCompiles$|TestKernelResources$|TestFusedGenCompiles$|TestChainSumCompiles$'
# The fuzzy (RPA, legacy bias, undetached) and baseline models' gradients.
run model ./compiler/model 240 . ""
# Training steps: exact resume, micro-batch equivalence, fused attention,
# a micro-batched run, recall, errors (WikiText-2 from RPAC_DATA).
run training ./training 300 'TestResumeIsExact$|TestMicroBatchEquivalenceBaseline$|TestMicroBatchFuzzyIsPerMicroBatchStatistics$|TestFusedAttentionStepMatchesUnfused$|TestFusedAttentionEvalMatchesUnfused$|TestTrainMicroBatchedRun$|TestTrainErrors$' ""
# The WikiText-2 loader on the real valid split (GPT-2 BPE, row and token counts).
run data ./training/data 180 'TestWikiText2Figures$/^valid$' ""
# onnxruntime (arm64) against the Go executor: every export path, and the
# KV-cache graphs at every decode step.
run export ./compiler/export 360 'TestParity$|TestExportKVCache$' ""
# The runtime package on the arm64 onnxruntime.
run runtime ./runtime 240 'TestOps$|TestOpsets$|TestLogitsPaddingExact$|TestPaddingDoesNotLeak$|TestGenerateGreedy$|TestGenerateOnCache$|TestScore$|TestExternalData$|TestLibraryPathMessage$|TestCachedLibraryPathPerArch$|TestCUDABuildHint$|TestMissingCUDALibraries$' ""
# Again with OpenBLAS's Neoverse V1 (SVE) kernels instead of the ones it
# picks for the emulated CPU: SGEMM (training's precision) against the
# reference; DGEMM through the float64 gradient checks.
if [[ "$native" == 0 ]]; then
	run blas-neoversev1 ./kernels/cpu/blas 300 'TestSgemm$' "" OPENBLAS_CORETYPE=NEOVERSEV1
	run kernels-neoversev1 ./kernels/cpu 240 'TestGradients|TestLMHead' "" OPENBLAS_CORETYPE=NEOVERSEV1
	run model-neoversev1 ./compiler/model 240 'TestModelGradients$' "" OPENBLAS_CORETYPE=NEOVERSEV1
fi
stage_done tests "$t0"

# --- 6. The rpac binary: train, export, verify on onnxruntime ------------
t0="$(now)"
cli_ok=0
(
	set -e
	cd "$work"
	export XDG_CACHE_HOME="$work/cache"
	timeout -s KILL 300 "${runner[@]}" "$bin/rpac" train --dataset synthetic --d-model 32 --layers 1 --heads 2 \
		--steps 3 --eval-every 3 --eval-batches 1 --out run
	timeout -s KILL 300 "${runner[@]}" "$bin/rpac" export --run run --lengths 32 --verify --verify-batches 1 --out onnx
) >"$logs/cli.log" 2>&1 && cli_ok=1
diff="$(sed -n 's/.*max|Δlogit| \([0-9.e+-]*\).*/\1/p' "$logs/cli.log" | head -n1)"
if [[ "$cli_ok" == 1 && -n "$diff" ]] && awk -v d="$diff" 'BEGIN { exit !(d <= 1e-4) }'; then
	passed=$((passed + 1))
	printf 'ci-arm64: %-22s %3d passed, %d failed, %d skipped  %6.1fs  (export max |Δlogit| %s)\n' cli 1 0 0 "$(since "$t0")" "$diff"
else
	failed=$((failed + 1))
	bad+=(cli)
	say "cli: rpac train/export/verify failed (max |Δlogit| '${diff}'); the end of $logs/cli.log:"
	tail -n 40 "$logs/cli.log"
fi
stage_done cli "$t0"

say "times: ${stage_times[*]}; total $(since "$t_all")s"
if [[ ${#bad[@]} -gt 0 ]]; then
	say "FAILED: ${bad[*]}"
	[[ "${RPAC_ARM64_KEEP:-0}" == 1 ]] || trap - EXIT
	say "logs kept in $logs"
fi
echo "arm64: $passed passed, $failed failed"
[[ ${#bad[@]} -eq 0 ]]
