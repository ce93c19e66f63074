#!/usr/bin/env bash
# Simulated model server + replay harness: unit tests, then short replays through a real Envoy with the filter
# (PREFIX_AWARE beats RANDOM on server-side hit ratio; two gateways decide every request once), through the peers'
# real routers (smg, vllm-router from .venv, installed by scripts/setup.sh; smg's cache_aware reuses repeated
# prefixes) and the DYNAMO_KV / ORACLE cost routers: every request answered, client and server counts balance.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
cargo build -q -p warmpath-filter --target wasm32-wasip1 --release
cargo test -p warmpath-sim
cargo test -p warmpath-bench
