#!/usr/bin/env bash
# Runs Envoy (--concurrency 2 by default) with the warmpath filter in front of local model servers.
#   scripts/envoy.sh run --upstream 127.0.0.1:8001 --upstream 127.0.0.1:8002 [--plugin-config FILE|JSON]
#                        [--listener-port 10000] [--admin-port 9901] [--concurrency 2] [--no-filter]
#                        [--wasm FILE]  (default: the release build of the filter, built when missing)
#   scripts/envoy.sh render ...the same options but --concurrency... # print the bootstrap YAML
#   scripts/envoy.sh examples                      # rewrite envoy/envoy.yaml, envoy/envoy-no-filter.yaml
#   scripts/envoy.sh validate FILE...              # envoy --mode validate
# Runs from any directory: paths given are read from it, the defaults are the repository's files (the plugin
# config envoy/plugin-config.json, the bootstrap under out/envoy/). Builds the release filter module first when it
# is missing and no --wasm is given. Envoy comes from .venv (scripts/setup.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
manifest=(--manifest-path "$root/Cargo.toml")
cmd="${1:-run}"; shift || true
wasm="${WARMPATH_FILTER_WASM:-${CARGO_TARGET_DIR:-$root/target}/wasm32-wasip1/release/warmpath_filter.wasm}"
given=0
for arg in "$@"; do
  case "$arg" in --wasm|--wasm=*|--no-filter) given=1 ;; esac
done
if [ "$given" = 0 ] && [ ! -f "$wasm" ] && { [ "$cmd" = run ] || [ "$cmd" = render ]; }; then
  cargo build -q "${manifest[@]}" -p warmpath-filter --target wasm32-wasip1 --release
fi
exec cargo run -q "${manifest[@]}" -p warmpath-harness --bin warmpath-envoy -- "$cmd" "$@"
