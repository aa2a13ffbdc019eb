#!/usr/bin/env bash
# gpu-ort-parts.sh — carry bin/ort (scripts/gpu-check-ort.sh --build: the
# binaries and onnxruntime 1.29.0 with its 229.8 MB CUDA provider) to a GPU
# machine in device calls of at most 64 MiB each, the working tree included:
#
#   here (Go, the network):
#     bash scripts/fetch-onnxruntime.sh --cuda && bash scripts/gpu-check-ort.sh --build
#     bash scripts/gpu-ort-parts.sh pack     # bin/ort-pack: parts, MANIFEST, zstd; prints the calls
#     bash scripts/gpu-ort-parts.sh dry      # the calls' appends and the reassembly, in a scratch folder
#   on the GPU machine, one device call per part into the same warm machine
#   (held 30 s after a call; ignored paths already there are kept):
#     bash scripts/gpu-ort-parts.sh append   # carry: bin/ort-pack/MANIFEST, bin/ort-pack/zstd, bin/ort-pack/part-NN
#   and with the last part:
#     bash scripts/gpu-ort-parts.sh append && bash scripts/gpu-ort-parts.sh assemble && bash scripts/gpu-check-ort.sh all
#
# pack tars bin/ort, compresses it with `zstd -19 --long=27` (the provider
# library: 229.8 MB, 164.6 MB so) and splits the archive into parts of
# 64 MiB less what else travels (the working tree, MANIFEST, zstd) and
# 1 MiB of margin. append adds each part found, in order, to
# bin/ort-pack/state/ort.tar.zst after checking its sha256 (a part already
# added is skipped; a part out of order is refused), then removes it.
# assemble checks the whole archive's sha256, unpacks it into bin/ort with
# the carried zstd (Debian 12's static build: only libc, libz, liblzma,
# liblz4) and checks every library's sha256 (SHA256SUMS).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

PACK="${RPAC_ORT_PACK:-bin/ort-pack}"
ORT="${RPAC_ORT_DIR:-bin/ort}"
LIMIT=$((64 << 20))

log() { printf 'gpu-ort-parts: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# travelling: bytes of what travels besides the carried paths (tracked and
# untracked-not-ignored files).
travelling() {
	git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'
}

pack() {
	[[ -x "$ORT/bin/rpac" && -f "$ORT/lib/SHA256SUMS" ]] || die "$ORT is incomplete: run 'bash scripts/gpu-check-ort.sh --build' first"
	[[ -f "$ORT/lib/libonnxruntime_providers_cuda.so" ]] || die "$ORT/lib/libonnxruntime_providers_cuda.so is missing"
	local zstd tree part n i
	zstd="$(command -v zstd)" || die "zstd not found (apt-get install zstd)"
	rm -rf "$PACK"
	mkdir -p "$PACK"
	cp "$zstd" "$PACK/zstd"
	log "compressing $ORT (zstd -19 --long=27)"
	# RPAC_ORT_ZSTD_LEVEL: a faster level for the script's own test
	tar -C "$ORT" -cf - bin lib | "$zstd" -q "-${RPAC_ORT_ZSTD_LEVEL:-19}" --long=27 -T0 -o "$PACK/ort.tar.zst"
	tree=$(travelling)
	part=$((LIMIT - tree - $(stat -c %s "$PACK/zstd") - 4096 - (1 << 20)))
	part="${RPAC_ORT_PART_BYTES:-$part}" # smaller parts: the script's own test
	((part > 1 << 16)) || die "the working tree ($tree bytes) leaves no room for parts"
	split -a 2 -d -b "$part" "$PACK/ort.tar.zst" "$PACK/part-"
	{
		echo "archive $(sha "$PACK/ort.tar.zst") $(stat -c %s "$PACK/ort.tar.zst")"
		for p in "$PACK"/part-*; do echo "part $(basename "$p") $(sha "$p") $(stat -c %s "$p")"; done
	} >"$PACK/MANIFEST"
	rm "$PACK/ort.tar.zst"
	n=$(grep -c '^part ' "$PACK/MANIFEST")
	log "$n parts of at most $part bytes (the working tree is $tree bytes):"
	cat "$PACK/MANIFEST" >&2
	log "the device calls, one after the other into the same warm machine:"
	i=0
	for p in "$PACK"/part-*; do
		i=$((i + 1))
		local cmd="bash scripts/gpu-ort-parts.sh append"
		((i == n)) && cmd+=" && bash scripts/gpu-ort-parts.sh assemble && RPAC_ORT_BENCH='384:1 768:8' RPAC_ORT_RUNS=10 bash scripts/gpu-check-ort.sh all"
		log "  call $i: carry [$PACK/MANIFEST, $PACK/zstd, $p] (about $(((tree + $(stat -c %s "$p")) >> 20)) MiB), command: $cmd"
	done
}

# append: add the parts present to the archive, in MANIFEST's order.
append() {
	[[ -f "$PACK/MANIFEST" ]] || die "no $PACK/MANIFEST: carry it with each part"
	local state="$PACK/state" name want size have=0 total
	mkdir -p "$state"
	touch "$state/added"
	total=$(grep -c '^part ' "$PACK/MANIFEST")
	while read -r _ name want size; do
		if grep -qx "$name" "$state/added"; then
			have=$((have + 1))
			continue
		fi
		[[ -f "$PACK/$name" ]] || break
		[[ "$(sha "$PACK/$name")" == "$want" ]] || die "$name: sha256 differs from MANIFEST's (cut short in transit?): carry it again"
		cat "$PACK/$name" >>"$state/ort.tar.zst"
		echo "$name" >>"$state/added"
		rm -f "$PACK/$name"
		have=$((have + 1))
		log "added $name ($size bytes)"
	done < <(grep '^part ' "$PACK/MANIFEST")
	for p in "$PACK"/part-*; do
		[[ -f "$p" ]] && die "$(basename "$p") came before the parts ahead of it: carry the missing ones first ($have of $total added)"
	done
	log "$have of $total parts added"
}

# assemble: the whole archive checked and unpacked into $ORT.
assemble() {
	local state="$PACK/state" want zstd
	read -r _ want _ < <(grep '^archive ' "$PACK/MANIFEST")
	[[ -f "$state/ort.tar.zst" && "$(sha "$state/ort.tar.zst")" == "$want" ]] ||
		die "the archive is incomplete or damaged ($(wc -l <"$state/added" 2>/dev/null || echo 0) of $(grep -c '^part ' "$PACK/MANIFEST") parts added)"
	zstd="$PACK/zstd"
	[[ -x "$zstd" ]] || zstd="$(command -v zstd)" || die "no zstd: carry $PACK/zstd"
	mkdir -p "$ORT"
	"$zstd" -q -d --long=27 -c "$state/ort.tar.zst" | tar -C "$ORT" -xf -
	(cd "$ORT/lib" && sha256sum -c --quiet SHA256SUMS) || die "a library does not match SHA256SUMS"
	rm -f "$state/ort.tar.zst"
	log "assembled $ORT: every sha256 matches"
}

# dry: the device calls here, in a scratch copy: each part carried alone
# (with MANIFEST and zstd), appended, then assembled; the unpacked files
# must equal bin/ort's.
dry() {
	[[ -f "$PACK/MANIFEST" ]] || die "run pack first"
	local f
	dev="$(mktemp -d)"
	trap 'rm -rf "$dev"' EXIT
	mkdir -p "$dev/pack"
	for f in "$PACK"/part-*; do
		cp "$PACK/MANIFEST" "$PACK/zstd" "$f" "$dev/pack/"
		RPAC_ORT_PACK="$dev/pack" RPAC_ORT_DIR="$dev/ort" bash "$self" append
	done
	RPAC_ORT_PACK="$dev/pack" RPAC_ORT_DIR="$dev/ort" bash "$self" assemble
	(cd "$ORT" && find bin lib -type f | sort | xargs sha256sum) >"$dev/want"
	(cd "$dev/ort" && find bin lib -type f | sort | xargs sha256sum) >"$dev/got"
	cmp "$dev/want" "$dev/got" || die "the reassembled files differ from $ORT's"
	log "dry run: $(grep -c '^part ' "$PACK/MANIFEST") calls reassemble $ORT exactly ($(wc -l <"$dev/got") files)"
}

case "${1:-}" in
pack) pack ;;
append) append ;;
assemble) assemble ;;
dry) dry ;;
*) die "usage: gpu-ort-parts.sh pack | append | assemble | dry" ;;
esac
