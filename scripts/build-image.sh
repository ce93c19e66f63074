#!/usr/bin/env bash
# Builds the warmpath-controller OCI image without a container engine or registry (see docs/image.md):
#   1. installs what is missing: buildah + musl-tools + ca-certificates (Debian), the Rust targets
#      x86_64-unknown-linux-musl and wasm32-wasip1;
#   2. builds a static controller (musl, cargo profile `image`) and the wasm filter module (release);
#   3. stages them with Debian's CA bundle and runs `buildah bud` on controller/Containerfile
#      (FROM scratch, chroot isolation, vfs storage in a throwaway directory);
#   4. writes the image as an OCI archive: $OUT/warmpath-controller-<tag>.oci.tar.
# Idempotent: cargo rebuilds only what changed; the archive is replaced.
#
# Usage: scripts/build-image.sh [--tag TAG] [--out DIR]
#   --tag TAG   image tag (default: the chart's appVersion, which the chart uses when controller.image.tag is "")
#   --out DIR   where the archive goes (default: out/)
# Env: CARGO_TARGET_DIR (default target/), IMAGE_NICE (default 10: niceness of the cargo builds).
# Last line of stdout: the archive's path (scripts/test.d/58-image.sh reads it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { echo "[build-image] $*" >&2; }
die() { echo "[build-image] error: $*" >&2; exit 1; }

TAG=""
OUT="$ROOT/out"
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; TAG=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

CHART_VERSION=$(awk -F'"' '/^appVersion:/ {print $2}' charts/warmpath/Chart.yaml)
[ -n "$CHART_VERSION" ] || die "cannot read appVersion from charts/warmpath/Chart.yaml"
TAG=${TAG:-$CHART_VERSION}
# Tags: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127} (OCI distribution spec).
[[ "$TAG" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "invalid tag '$TAG'"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
NICE=${IMAGE_NICE:-10}
MUSL=x86_64-unknown-linux-musl

# --- 1. tools -------------------------------------------------------------------------------------
missing=()
command -v buildah >/dev/null || missing+=(buildah)
# aws-lc-sys (pulled in through rustls) compiles C: for the musl target cc-rs needs musl-gcc.
command -v x86_64-linux-musl-gcc >/dev/null || command -v musl-gcc >/dev/null || missing+=(musl-tools)
[ -s /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root"
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install them with your package manager"
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
fi
command -v rustup >/dev/null || die "rustup not found (needed for the $MUSL and wasm32-wasip1 targets)"
installed=$(rustup target list --installed)
for t in $MUSL wasm32-wasip1; do
  grep -qx "$t" <<<"$installed" || { log "rustup target add $t"; rustup target add "$t" >&2 || die "rustup target add $t failed"; }
done

# --- 2. artifacts ---------------------------------------------------------------------------------
export CARGO_TARGET_DIR="$TARGET_DIR"
log "cargo build warmpath-controller ($MUSL, profile image)"
nice -n "$NICE" cargo build --locked -q -p warmpath-controller --bin warmpath-controller --target $MUSL --profile image \
  || die "controller build failed"
BIN="$TARGET_DIR/$MUSL/image/warmpath-controller"
# FROM scratch has no dynamic loader: refuse a binary that asks for one.
if readelf -l "$BIN" 2>/dev/null | grep -q 'program interpreter'; then die "$BIN is dynamically linked"; fi
log "cargo build warmpath-filter (wasm32-wasip1, release)"
nice -n "$NICE" cargo build --locked -q -p warmpath-filter --target wasm32-wasip1 --release || die "filter build failed"
WASM="$TARGET_DIR/wasm32-wasip1/release/warmpath_filter.wasm"
[ -s "$WASM" ] || die "$WASM missing after the build"

# --- 3. image -------------------------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/warmpath-image.XXXXXX")
# vfs storage holds full copies of the layers: always remove it (buildah may leave read-only dirs).
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
ctx="$work/context"
mkdir -p "$ctx"
cp "$BIN" "$ctx/warmpath-controller"
cp "$WASM" "$ctx/warmpath_filter.wasm"
cp -L /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Layer file times and the config's creation time from the commit: same inputs, same image digest.
EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
REF="localhost/warmpath-controller:$TAG"
B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
log "buildah bud -f controller/Containerfile (FROM scratch, tag $TAG)"
"${B[@]}" bud --quiet --isolation chroot --layers=false --timestamp "$EPOCH" \
  --build-arg "VERSION=$TAG" --build-arg "REVISION=$REVISION" \
  -f controller/Containerfile -t "$REF" "$ctx" >/dev/null || die "buildah bud failed"
mkdir -p "$OUT"
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
ARCHIVE="$OUT/warmpath-controller-$TAG.oci.tar"
rm -f "$ARCHIVE"
"${B[@]}" push --quiet "$REF" "oci-archive:$ARCHIVE:warmpath-controller:$TAG" >/dev/null || die "buildah push to $ARCHIVE failed"

size=$(du -h "$ARCHIVE" | cut -f1)
log "wrote $ARCHIVE ($size; binary $(du -h "$BIN" | cut -f1), wasm $(du -h "$WASM" | cut -f1))"
cat >&2 <<EOF
[build-image] next steps (see docs/image.md):
  push:   skopeo copy oci-archive:$ARCHIVE docker://REGISTRY/warmpath-controller:$TAG
  load:   podman load -i $ARCHIVE      (or: skopeo copy oci-archive:$ARCHIVE docker-daemon:warmpath-controller:$TAG)
  deploy: helm install warmpath charts/warmpath -n warmpath-system --create-namespace \\
            --set controller.image.repository=REGISTRY/warmpath-controller --set controller.image.tag=$TAG
EOF
echo "$ARCHIVE"
