#!/usr/bin/env bash
# setup.sh — install the Debian/Ubuntu packages rpac needs to build with
# OpenBLAS, then build the rpac binary at the repository root.
#
#     bash scripts/setup.sh            # from any directory
#     bash scripts/setup.sh --dry-run  # print the apt-get and go commands instead of running them
#
# Packages: libopenblas-dev (cblas.h and libopenblas, which the kernels link
# through cgo), pkg-config, and gcc with libc6-dev (cgo's C toolchain; without
# it Go builds rpac with cgo off, that is without OpenBLAS and without the
# onnxruntime runtime), and g++ (builds the CUDA simulator, which runs the
# CUDA backend on the CPU: --device cuda-sim). Each is checked with dpkg and installed only when
# missing, after an `apt-get update`; apt-get runs directly as root and
# through sudo otherwise. A second run installs nothing and rebuilds.
# Go itself (the version go.mod names, or newer) must already be on PATH.
# The same on x86-64 and arm64 (aarch64, e.g. a GH200's Grace host): the
# packages exist for both, and the cgo flags name both OpenBLAS folders.
# onnxruntime comes separately: scripts/fetch-onnxruntime.sh (its
# architecture from uname -m).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dry=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    -h | --help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument $arg (want --dry-run or --help)" >&2; exit 2 ;;
  esac
done

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }
run() {
  if [ "$dry" = 1 ]; then say "would run: $*"; else say "running: $*"; "$@"; fi
}

# --- Debian packages --------------------------------------------------------
packages=(libopenblas-dev pkg-config gcc libc6-dev g++)
if ! command -v dpkg-query >/dev/null 2>&1; then
  say "dpkg not found (not Debian or Ubuntu): not checking packages; install OpenBLAS" \
    "(cblas.h, libopenblas) and a C compiler with your package manager"
else
  # Installed for this machine's architecture (with multiarch, e.g. the
  # arm64 OpenBLAS of scripts/ci-arm64.sh, a name can have several).
  native_arch="$(dpkg --print-architecture)"
  need=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status} ${Architecture}\n' "$p" 2>/dev/null |
      grep -Eq "^install ok installed ($native_arch|all)\$" || need+=("$p")
  done
  if [ ${#need[@]} -eq 0 ]; then
    say "packages already installed: ${packages[*]} (apt-get not run)"
  else
    if [ "$(id -u)" -eq 0 ]; then
      as_root=()
    elif command -v sudo >/dev/null 2>&1; then
      as_root=(sudo)
      say "not root: using sudo for apt-get"
    else
      die "missing packages ${need[*]}, and installing them needs root: run this script as root," \
        "or install sudo, or have an administrator run: apt-get install -y ${need[*]}"
    fi
    say "missing packages: ${need[*]}"
    run "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    run "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}"
  fi
fi

# --- Build ------------------------------------------------------------------
want_go="$(sed -n 's/^go \([0-9.]*\).*/\1/p' go.mod)"
command -v go >/dev/null 2>&1 || die "go not found on PATH: install Go ${want_go} or newer (https://go.dev/dl/)"
if [ "$(go env CGO_ENABLED)" != 1 ]; then
  say "warning: cgo is off (CGO_ENABLED=$(go env CGO_ENABLED), CC=$(go env CC)):" \
    "rpac will build without OpenBLAS and without the onnxruntime runtime"
fi
run go build -o rpac ./cmd/rpac
# The CUDA simulator (kernels/cuda/cudasim), built once into the user cache.
if [ "$dry" = 1 ]; then
  say "would run: ./rpac cuda-sim build"
elif command -v g++ >/dev/null 2>&1; then
  run ./rpac cuda-sim build
else
  say "warning: g++ not found: the CUDA simulator (--device cuda-sim) is not built"
fi
if [ "$dry" = 1 ]; then
  say "dry run: nothing installed or built"
else
  say "built $(pwd)/rpac ($(go env GOOS)/$(go env GOARCH)) with $(go env GOVERSION); try: ./rpac --help"
fi
