#!/usr/bin/env bash
# Runs Envoy (--concurrency 2 by default) with the warmpath filter in front of local model servers.
#   scripts/envoy.sh run --upstream 127.0.0.1:8001 --upstream 127.0.0.1:8002 [--plugin-config FILE|JSON]
#                        [--listener-port 10000] [--admin-port 9901] [--concurrency 2] [--no-filter]
#                        [--wasm FILE]  (default: the release build of the filter, built when missing)
#   scripts/envoy.sh render ...the same options but --concurrency... # print the bootstrap YAML
#   scripts/envoy.sh examples                      # rewrite envoy/envoy.yaml, envoy/envoy-no-filter.yaml
#   scripts/envoy.sh validate FILE...              # envoy --mode validate
# Builds the release filter module first when it is missing. Envoy comes from .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
wasm="$target/wasm32-wasip1/release/warmpath_filter.wasm"
cmd="${1:-run}"; shift || true
# A module given with --wasm FILE replaces the release build (which is then neither built nor passed).
own=(--wasm "$wasm")
for arg in "$@"; do
  case "$arg" in --wasm|--wasm=*) own=() ;; esac
done
if [ ${#own[@]} -gt 0 ] && [ ! -f "$wasm" ] && { [ "$cmd" = run ] || [ "$cmd" = render ]; }; then
  cargo build -q -p warmpath-filter --target wasm32-wasip1 --release
fi
case "$cmd" in
  run|render) exec cargo run -q -p warmpath-harness --bin warmpath-envoy -- "$cmd" ${own[@]+"${own[@]}"} "$@" ;;
  *) exec cargo run -q -p warmpath-harness --bin warmpath-envoy -- "$cmd" "$@" ;;
esac
