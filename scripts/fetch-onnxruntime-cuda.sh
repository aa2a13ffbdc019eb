#!/usr/bin/env bash
# fetch-onnxruntime-cuda.sh — the --cuda half of fetch-onnxruntime.sh (see
# there): onnxruntime 1.29.0 with the CUDA provider, from two npm packages,
# integrity-checked and cached in ${XDG_CACHE_HOME:-$HOME/.cache}/rpac/onnxruntime-1.29.0-cuda/.
# The last line on stdout is the cached libonnxruntime.so.
set -euo pipefail

# The packages below hold linux x86-64 libraries only. On arm64 (a GH200's
# Grace host) stop here and say what to do instead.
arch="${RPAC_ORT_ARCH:-$(uname -m)}"
case "$arch" in
x64 | x86_64 | amd64) ;;
*)
	printf '%s\n' "fetch-onnxruntime --cuda: error: the CUDA-provider fetch is linux x86-64 only (this is $arch): its npm packages hold no arm64 libraries. On a GH200 (Grace, arm64), build onnxruntime with the CUDA provider from source (./build.sh --use_cuda ... --build_shared_lib) or take your distribution's build, then set ORT_LIB to its libonnxruntime.so (libonnxruntime_providers_cuda.so and libonnxruntime_providers_shared.so beside it); see docs/EXPORT.md, \"onnxruntime with the CUDA provider\", \"On arm64\"" >&2
	exit 1
	;;
esac

VERSION=1.29.0
BASE_PKG="com.github.asus4.onnxruntime@0.4.9"
GPU_PKG="com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9"
# dist.integrity of the two packages on registry.npmjs.org.
BASE_INTEGRITY="sha512-BkzxduSZ9IkeDP6Q8lz2TFU2ie7hSSvS7ZIfzMooExoq0CNzJnuuGaUJ7IsojBgqO4ouD1jXah8OYyJbCN29Fg=="
GPU_INTEGRITY="sha512-FopIhNE/Ng+v2X65wVc9clPCBCvhvA53Hxo2U0Kf5fGdVsC7iCA+mZ0KLWggcQAj7TIZ6pNidR4AC10g74Xo6w=="
DIR_IN_PKG="package/Plugins/Linux/x64"
# sha256 of each extracted library.
declare -A SHA256=(
	[libonnxruntime.so]=5715f06d8992ca8eeeddcce43df3a7d38f97d537052126f558e912cb312460ca
	[libonnxruntime_providers_shared.so]=c6a12593396095f5670160e284c35d1700b7708cf3037b7042e2a5200ccae772
	[libonnxruntime_providers_cuda.so]=56cf3254b118ad837ccc4ed8f6d1b23504bbf7ef91b34cbc0b289cb7f10b3037
)
FILES=(libonnxruntime.so libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so)

CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/rpac/onnxruntime-${VERSION}-cuda"
LIB="${CACHE_DIR}/libonnxruntime.so"

log() { printf 'fetch-onnxruntime --cuda: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

cached_ok() {
	local f
	for f in "${FILES[@]}"; do
		[[ -f "$CACHE_DIR/$f" && "$(sha256_of "$CACHE_DIR/$f")" == "${SHA256[$f]}" ]] || return 1
	done
}

if cached_ok; then
	log "cached: $CACHE_DIR (every sha256 matches)"
	printf '%s\n' "$LIB"
	exit 0
fi

for tool in npm tar sha256sum openssl base64; do
	command -v "$tool" >/dev/null || die "$tool not found (npm: apt-get install npm)"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# fetch PKG PINNED MEMBER...: npm pack, integrity against the registry and
# the pin, then extract the members into $tmp.
fetch() {
	local pkg="$1" pinned="$2"
	shift 2
	local reg got tarball
	reg="$(cd "$tmp" && npm view "$pkg" dist.integrity 2>/dev/null | tail -n1 | tr -d '[:space:]')"
	[[ -n "$reg" ]] || die "npm view $pkg dist.integrity returned nothing (is the npm registry reachable?)"
	[[ "$reg" == "$pinned" ]] || die "registry integrity of $pkg is $reg, not the pinned $pinned"
	log "npm pack $pkg"
	(cd "$tmp" && npm pack "$pkg" >&2) || die "npm pack $pkg failed"
	tarball="$tmp/$(printf '%s' "${pkg%@*}" | tr '/' '-')-${pkg##*@}.tgz"
	[[ -f "$tarball" ]] || die "npm pack left no $(basename "$tarball")"
	got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
	[[ "$got" == "$reg" ]] || die "tarball integrity $got does not match the registry's $reg"
	log "integrity ok: $pkg"
	local m
	for m in "$@"; do
		tar -xzf "$tarball" -C "$tmp" "$DIR_IN_PKG/$m" 2>/dev/null || die "$DIR_IN_PKG/$m not found in $(basename "$tarball")"
	done
	rm -f "$tarball"
}

fetch "$BASE_PKG" "$BASE_INTEGRITY" libonnxruntime.so
fetch "$GPU_PKG" "$GPU_INTEGRITY" libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so

mkdir -p "$CACHE_DIR"
for f in "${FILES[@]}"; do
	got="$(sha256_of "$tmp/$DIR_IN_PKG/$f")"
	[[ "$got" == "${SHA256[$f]}" ]] || die "$f has sha256 $got, not the pinned ${SHA256[$f]}"
	cp "$tmp/$DIR_IN_PKG/$f" "$CACHE_DIR/$f.tmp.$$"
	chmod 0755 "$CACHE_DIR/$f.tmp.$$"
	mv -f "$CACHE_DIR/$f.tmp.$$" "$CACHE_DIR/$f"
done
(cd "$CACHE_DIR" && sha256sum "${FILES[@]}" >SHA256SUMS)
log "installed onnxruntime $VERSION with the CUDA provider in $CACHE_DIR"
printf '%s\n' "$LIB"
