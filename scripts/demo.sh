#!/usr/bin/env bash
# The README's "run" command: a local comparison of routing strategies, no cluster needed.
#   - installs what is missing (scripts/setup.sh: Envoy 1.40 and the peers' routers smg / vllm-router into .venv,
#     wasm target),
#   - builds the warmpath wasm filter and the replay harness (release),
#   - starts N simulated OpenAI model servers on 127.0.0.1 and, per strategy, a real Envoy with the filter or the
#     peer's real router process (SMG_CACHE_AWARE, VLLM_ROUTER_CACHE_AWARE),
#   - replays the default workload once per strategy and prints the table; CSV + PNG go to out/bench/.
# Extra arguments go to warmpath-bench (see `scripts/demo.sh --help` and docs/demo.md), e.g.
#   scripts/demo.sh --workload rag --endpoints 8
#   scripts/demo.sh --trace $WARMPATH_TRACES/mooncake_synthetic_trace.jsonl --requests 1000
# Ctrl-C stops Envoy and the servers.
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case "$arg" in
    -h|--help)
      if [ ! -x "${CARGO_TARGET_DIR:-target}/release/warmpath-bench" ]; then
        echo "[demo] the options are warmpath-bench's; building it first (a few minutes on a first run)" >&2
      fi ;;
  esac
done
export WARMPATH_TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
export PATH="$PWD/.venv/bin:$PATH"
scripts/setup.sh --no-wasm-bindgen --no-k8s-tools
echo "[demo] building the filter (wasm32-wasip1) and the harness (release)" >&2
cargo build -q --release -p warmpath-filter --target wasm32-wasip1
cargo build -q --release -p warmpath-bench
exec "${CARGO_TARGET_DIR:-target}/release/warmpath-bench" "$@"
