#!/usr/bin/env bash
# fetch-onnxruntime.sh — fetch the onnxruntime shared library (1.30.0, CPU
# provider, linux x86-64 or arm64) that rpac's runtime package loads.
#
#     bash scripts/fetch-onnxruntime.sh                # this machine's architecture
#     bash scripts/fetch-onnxruntime.sh --arch arm64   # another one (x64 or arm64)
#     bash scripts/fetch-onnxruntime.sh --cuda         # CUDA provider, x86-64 only (below)
#
# The architecture comes from `uname -m` (x86_64 → x64, aarch64 or arm64 →
# arm64); `--arch x64|arm64` or RPAC_ORT_ARCH=x64|arm64 overrides it, so that
# an x86-64 machine can fetch the arm64 library for tests under emulation
# (scripts/ci-arm64.sh).
#
# The library ships inside the npm package onnxruntime-node@1.30.0 at
# package/bin/napi-v6/linux/{x64,arm64}/libonnxruntime.so.1. This script runs
# `npm pack` in a temporary directory, checks the tarball's sha512 integrity
# against the registry's dist.integrity (and against the value pinned below;
# one tarball holds both architectures), extracts the architecture's file,
# checks it against its pinned sha256 and caches it under
#
#     ${XDG_CACHE_HOME:-$HOME/.cache}/rpac/onnxruntime-1.30.0-linux-ARCH/libonnxruntime.so.1
#
# next to a .sha256 file, one folder per architecture. A second run finds the
# cached library, checks it against the pinned sha256 and touches no network.
#
# The last line printed on stdout is the library path, so
#
#     export ORT_LIB="$(scripts/fetch-onnxruntime.sh | tail -n1)"
#
# points the runtime at it (the runtime also finds the cache path of its own
# architecture by itself). Progress and npm's own output go to stderr.
#
# --cuda fetches instead an onnxruntime with the CUDA provider (1.29.0, linux
# x86-64 only, built against CUDA 13 and cuDNN 9) from two npm packages:
# com.github.asus4.onnxruntime@0.4.9 (Plugins/Linux/x64/libonnxruntime.so,
# onnxruntime 1.29.0) and com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9
# (libonnxruntime_providers_cuda.so, 229 MB, and the
# libonnxruntime_providers_shared.so built with it). Each tarball's sha512 is
# checked against the registry's dist.integrity and the value pinned below,
# each extracted library against its pinned sha256; the three files are
# cached together (onnxruntime loads the providers from the folder of
# libonnxruntime.so) under
#
#     ${XDG_CACHE_HOME:-$HOME/.cache}/rpac/onnxruntime-1.29.0-cuda/
#
# and the last line printed is that folder's libonnxruntime.so (for ORT_LIB).
# The CUDA provider needs, at run time, libcudart.so.13, libcublas.so.13,
# libcublasLt.so.13, libcurand.so.10, cuDNN 9 (libcudnn.so.9) and the
# driver's libcuda.so.1 on the library path (pip's nvidia-* packages hold
# all but the driver; add their lib folders to LD_LIBRARY_PATH). The
# download is about 330 MB; CI does not fetch it. Those packages hold no
# arm64 libraries: on arm64 (a GH200's Grace host) --cuda stops with an
# error, and ORT_LIB must point at an onnxruntime built with the CUDA
# provider (docs/EXPORT.md, "onnxruntime with the CUDA provider", "On arm64").
set -euo pipefail

log() { printf 'fetch-onnxruntime: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# normalize_arch NAME: x64 or arm64, or empty for anything else.
normalize_arch() {
	case "$1" in
	x64 | x86_64 | amd64) echo x64 ;;
	arm64 | aarch64) echo arm64 ;;
	*) echo "" ;;
	esac
}

cuda=0
arch_arg="${RPAC_ORT_ARCH:-}"
while [[ $# -gt 0 ]]; do
	case "$1" in
	--cuda) cuda=1 ;;
	--arch)
		[[ $# -ge 2 ]] || { printf 'fetch-onnxruntime: --arch needs a value (x64 or arm64)\n' >&2; exit 2; }
		arch_arg="$2"
		shift
		;;
	--arch=*) arch_arg="${1#--arch=}" ;;
	*)
		printf 'fetch-onnxruntime: unknown argument %s (want none, --arch x64|arm64, or --cuda)\n' "$1" >&2
		exit 2
		;;
	esac
	shift
done
if [[ -n "$arch_arg" ]]; then
	ARCH="$(normalize_arch "$arch_arg")"
	[[ -n "$ARCH" ]] || { printf 'fetch-onnxruntime: unknown architecture %s (want x64 or arm64)\n' "$arch_arg" >&2; exit 2; }
else
	machine="$(uname -m)"
	ARCH="$(normalize_arch "$machine")"
	if [[ "$(uname -s)" != Linux ]]; then
		ARCH=""
	fi
	[[ -n "$ARCH" ]] || die "no onnxruntime-node library for this machine ($(uname -s) $machine): this script fetches the linux x64 and arm64 ones (--arch picks one); set ORT_LIB to a libonnxruntime.so built for it"
fi

if [[ "$cuda" == 1 ]]; then
	RPAC_ORT_ARCH="$ARCH" exec bash "$(dirname "$0")/fetch-onnxruntime-cuda.sh"
fi

VERSION=1.30.0
PKG="onnxruntime-node@${VERSION}"
MEMBER="package/bin/napi-v6/linux/${ARCH}/libonnxruntime.so.1"
# dist.integrity of onnxruntime-node@1.30.0 on registry.npmjs.org.
PINNED_INTEGRITY="sha512-twhs1C2C/BFkz1yc5OY0KIU2GUq6DURO7hD4bx5Q2Qy3nAMJwRXW8xU3NVczE29VA9lolLOYepoD8fjTGOfIqw=="
# sha256 of the extracted libonnxruntime.so.1, per architecture.
declare -A PINNED_SHA256S=(
	[x64]=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
	[arm64]=1f549d46250b005580b597f4164984aaf75b3bcb9f3aeb07c7f8a8fe60b23c76
)
PINNED_SHA256="${PINNED_SHA256S[$ARCH]}"

CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/rpac/onnxruntime-${VERSION}-linux-${ARCH}"
LIB="${CACHE_DIR}/libonnxruntime.so.1"
SUM="${LIB}.sha256"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Cached and verified: no network.
if [[ -f "$LIB" ]]; then
	want="$PINNED_SHA256"
	got="$(sha256_of "$LIB")"
	if [[ "$want" == "$got" ]]; then
		log "cached ($ARCH): $LIB (sha256 $got)"
		printf '%s\n' "$LIB"
		exit 0
	fi
	log "cached library does not match the pinned sha256 (want $want, got $got); fetching again"
	rm -f "$LIB" "$SUM"
fi

command -v npm >/dev/null || die "npm not found; install Node.js/npm (Debian: apt-get install npm) or set ORT_LIB to an existing libonnxruntime.so"
command -v tar >/dev/null || die "tar not found"
command -v sha256sum >/dev/null || die "sha256sum not found"
command -v openssl >/dev/null || die "openssl not found (needed to check the package's sha512 integrity)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

log "registry integrity of $PKG"
registry_integrity="$(cd "$tmp" && npm view "$PKG" dist.integrity 2>/dev/null | tail -n1 | tr -d '[:space:]')"
[[ -n "$registry_integrity" ]] || die "npm view $PKG dist.integrity returned nothing (is the npm registry reachable?)"
if [[ "$registry_integrity" != "$PINNED_INTEGRITY" ]]; then
	die "registry integrity $registry_integrity differs from the pinned $PINNED_INTEGRITY"
fi

log "npm pack $PKG"
(cd "$tmp" && npm pack "$PKG" >&2) || die "npm pack $PKG failed"
tarball="$(find "$tmp" -maxdepth 1 -name 'onnxruntime-node-*.tgz' | head -n1)"
[[ -n "$tarball" ]] || die "npm pack left no tarball in $tmp"

got_integrity="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [[ "$got_integrity" != "$registry_integrity" ]]; then
	die "tarball integrity $got_integrity does not match the registry's $registry_integrity"
fi
log "tarball integrity ok ($got_integrity)"

tar -xzf "$tarball" -C "$tmp" "$MEMBER" 2>/dev/null ||
	die "$MEMBER not found in $(basename "$tarball"); members named libonnxruntime*: $(tar -tzf "$tarball" | grep libonnxruntime | tr '\n' ' ')"

got_sha="$(sha256_of "$tmp/$MEMBER")"
if [[ "$got_sha" != "$PINNED_SHA256" ]]; then
	die "extracted library sha256 $got_sha differs from the pinned $PINNED_SHA256"
fi

mkdir -p "$CACHE_DIR"
cp "$tmp/$MEMBER" "$LIB.tmp.$$"
chmod 0644 "$LIB.tmp.$$"
mv -f "$LIB.tmp.$$" "$LIB"
printf '%s  %s\n' "$got_sha" "libonnxruntime.so.1" >"$SUM.tmp.$$"
mv -f "$SUM.tmp.$$" "$SUM"
printf '%s\n' "$registry_integrity" >"${CACHE_DIR}/package.integrity"

log "installed ($ARCH) $LIB (sha256 $got_sha)"
printf '%s\n' "$LIB"
