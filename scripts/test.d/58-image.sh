#!/usr/bin/env bash
# The controller and agent container images (scripts/build-image.sh, controller/Containerfile,
# controller/agent/Containerfile), checked for real without a container engine. This script only
# prepares: it builds both images twice (the tests compare the digests of the two builds), reads each
# archive with skopeo and unpacks it with umoci (which verifies the blob digests), then hands the result
# to the pytest tests in tests/image/, which hold every check: the config against `helm template` of the
# chart, the content, and the binaries run from the unpacked root filesystems with chroot as the
# images' users against loopback stand-ins (docs/image.md, "What is tested here").
# Needs root (chroot). buildah and musl-tools come from scripts/build-image.sh, skopeo and umoci are
# installed here if missing, helm and the venv's pytest come from scripts/setup.sh.
# Usage: scripts/test.d/58-image.sh [PYTEST-ARGS...]   (e.g. -k agent, --durations=10)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
HELM="$TOOLS/bin/helm"
PY=.venv/bin/python
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
die() { echo "[58-image] FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (chroot into the unpacked image)"
[ -x "$HELM" ] || die "helm missing: run scripts/setup.sh"
"$PY" -c 'import pytest, yaml' 2>/dev/null || die "pytest or PyYAML missing from .venv: run scripts/setup.sh"
need=()
command -v skopeo >/dev/null || need+=(skopeo)
command -v umoci >/dev/null || need+=(umoci)
if [ ${#need[@]} -gt 0 ]; then
  echo "[58-image] apt-get install ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/warmpath-58-image.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
IMAGES="$tmp/images"   # the layout tests/image/conftest.py describes
mkdir -p "$IMAGES"

# Stdout of build-image.sh: the controller archive's path, then the agent archive's. The second build is
# a cargo no-op (same inputs: it must give the same images).
start=$(date +%s)
bash scripts/build-image.sh --out "$tmp/out" >"$IMAGES/archives" || die "scripts/build-image.sh"
echo "[58-image] build took $(( $(date +%s) - start )) s" >&2
bash scripts/build-image.sh --out "$tmp/out2" >"$IMAGES/rebuilt.archives" || die "scripts/build-image.sh (second build)"
mapfile -t archives <"$IMAGES/archives"
mapfile -t rebuilt <"$IMAGES/rebuilt.archives"
[ ${#archives[@]} = 2 ] && [ ${#rebuilt[@]} = 2 ] || die "build-image.sh did not print two archive paths: ${archives[*]} / ${rebuilt[*]}"
TAG=$(awk -F'"' '/^appVersion:/ {print $2}' charts/warmpath/Chart.yaml)
i=0
for name in controller agent; do
  a=${archives[$i]} d="$IMAGES/$name"
  mkdir -p "$d/oci"
  skopeo inspect --config "oci-archive:$a" >"$d/config.json" || die "skopeo inspect --config $a"
  skopeo inspect --raw "oci-archive:$a" >"$d/manifest.json" || die "skopeo inspect --raw $a"
  skopeo inspect --format '{{.Digest}}' "oci-archive:$a" >"$d/digest" || die "skopeo inspect $a"
  skopeo inspect --format '{{.Digest}}' "oci-archive:${rebuilt[$i]}" >"$d/rebuilt.digest" || die "skopeo inspect ${rebuilt[$i]}"
  tar -xf "$a" -C "$d/oci"
  umoci unpack --image "$d/oci:warmpath-$name:$TAG" "$d/bundle" >/dev/null || die "umoci unpack $a (blob digests are verified)"
  i=$((i + 1))
done

rc=0
"$PY" -m pytest tests/image -v -p no:cacheprovider --basetemp "$tmp/pytest" \
  --images "$IMAGES" --target-dir "$TARGET_DIR" --helm "$HELM" "$@" || rc=$?
exit $rc
