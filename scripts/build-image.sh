#!/usr/bin/env bash
# Builds the warmpath container images without a container engine or registry (see docs/image.md):
#   warmpath-controller   controller/Containerfile: static controller + wasm filter module + CA bundle
#   warmpath-agent        controller/agent/Containerfile: static node agent + CA bundle
# Steps:
#   1. installs what is missing: buildah + musl-tools + ca-certificates (Debian), the Rust targets
#      x86_64-unknown-linux-musl and wasm32-wasip1;
#   2. builds both static binaries in ONE cargo invocation (musl, cargo profile `image`; the agent
#      links the controller crate, so shared dependencies compile once, with one feature set whichever
#      images are selected) and, for the controller image, the wasm filter module (release);
#   3. stages each image's files with Debian's CA bundle and runs `buildah bud` on its Containerfile
#      (FROM scratch, chroot isolation, vfs storage in a throwaway directory);
#   4. writes each image as an OCI archive: $OUT/warmpath-controller-<tag>.oci.tar, $OUT/warmpath-agent-<tag>.oci.tar.
# Idempotent: cargo rebuilds only what changed; the archives are replaced.
#
# Usage: scripts/build-image.sh [--tag TAG] [--out DIR] [--only controller|agent]
#   --tag TAG     image tag (default: the chart's appVersion, which the chart uses for both images when
#                 controller.image.tag / agent.image.tag are "")
#   --out DIR     where the archives go (default: out/)
#   --only NAME   build only that image (default: both)
# Env: CARGO_TARGET_DIR (default target/), IMAGE_NICE (default 10: niceness of the cargo builds).
# Stdout: only the archive paths, one per line, controller first, then agent (scripts/test.d/58-image.sh
# reads them); with --only, the one path.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { echo "[build-image] $*" >&2; }
die() { echo "[build-image] error: $*" >&2; exit 1; }

TAG=""
OUT="$ROOT/out"
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; TAG=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; OUT=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || die "--only needs a value"; ONLY=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
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
case "$ONLY" in
  "") IMAGES=(controller agent) ;;
  controller|agent) IMAGES=("$ONLY") ;;
  *) die "--only takes controller or agent, not '$ONLY'" ;;
esac
want() { [[ " ${IMAGES[*]} " == *" $1 "* ]]; }

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
bins=()
for i in "${IMAGES[@]}"; do bins+=(--bin "warmpath-$i"); done
# Both packages always: cargo unifies features over the selected packages, so the controller binary
# is the same whether or not the agent is built alongside it (and nothing recompiles between runs).
log "cargo build ${bins[*]} ($MUSL, profile image)"
nice -n "$NICE" cargo build --locked -q -p warmpath-controller -p warmpath-agent "${bins[@]}" --target $MUSL --profile image \
  || die "binary build failed"
for i in "${IMAGES[@]}"; do
  bin="$TARGET_DIR/$MUSL/image/warmpath-$i"
  [ -s "$bin" ] || die "$bin missing after the build"
  # FROM scratch has no dynamic loader: refuse a binary that asks for one.
  if readelf -l "$bin" 2>/dev/null | grep -q 'program interpreter'; then die "$bin is dynamically linked"; fi
done
WASM="$TARGET_DIR/wasm32-wasip1/release/warmpath_filter.wasm"
if want controller; then
  log "cargo build warmpath-filter (wasm32-wasip1, release)"
  nice -n "$NICE" cargo build --locked -q -p warmpath-filter --target wasm32-wasip1 --release || die "filter build failed"
  [ -s "$WASM" ] || die "$WASM missing after the build"
fi

# --- 3. images ------------------------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/warmpath-image.XXXXXX")
# vfs storage holds full copies of the layers: always remove it (buildah may leave read-only dirs).
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Layer file times and the config's creation time from the commit: same inputs, same image digest.
EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
mkdir -p "$OUT"
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac
ARCHIVES=()
for i in "${IMAGES[@]}"; do
  name="warmpath-$i"
  ctx="$work/context-$i"
  mkdir -p "$ctx"
  cp "$TARGET_DIR/$MUSL/image/$name" "$ctx/$name"
  cp -L /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
  case "$i" in
    controller) file=controller/Containerfile; cp "$WASM" "$ctx/warmpath_filter.wasm" ;;
    agent) file=controller/agent/Containerfile ;;
  esac
  ref="localhost/$name:$TAG"
  log "buildah bud -f $file (FROM scratch, tag $TAG)"
  "${B[@]}" bud --quiet --isolation chroot --layers=false --timestamp "$EPOCH" \
    --build-arg "VERSION=$TAG" --build-arg "REVISION=$REVISION" \
    -f "$file" -t "$ref" "$ctx" >/dev/null || die "buildah bud $file failed"
  archive="$OUT/$name-$TAG.oci.tar"
  rm -f "$archive"
  "${B[@]}" push --quiet "$ref" "oci-archive:$archive:$name:$TAG" >/dev/null || die "buildah push to $archive failed"
  log "wrote $archive ($(du -h "$archive" | cut -f1); binary $(du -h "$ctx/$name" | cut -f1))"
  ARCHIVES+=("$archive")
done

{
  echo "[build-image] next steps (see docs/image.md):"
  for a in "${ARCHIVES[@]}"; do
    n=$(basename "$a" "-$TAG.oci.tar")
    echo "  push:   skopeo copy oci-archive:$a docker://REGISTRY/$n:$TAG"
    echo "  load:   podman load -i $a      (or: skopeo copy oci-archive:$a docker-daemon:$n:$TAG)"
  done
  echo "  deploy: helm install warmpath charts/warmpath -n warmpath-system --create-namespace \\"
  echo "            --set controller.image.repository=REGISTRY/warmpath-controller --set controller.image.tag=$TAG \\"
  echo "            --set agent.image.repository=REGISTRY/warmpath-agent --set agent.image.tag=$TAG"
} >&2
printf '%s\n' "${ARCHIVES[@]}"
