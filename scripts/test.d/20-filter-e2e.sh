#!/usr/bin/env bash
# The wasm filter through a real Envoy: builds the release module for wasm32-wasip1, runs the shell's unit tests,
# then the harness's own tests (the warmpath-envoy launcher) and the end-to-end tests (Envoy --concurrency 2, local
# upstreams; see tests/e2e/tests/e2e/main.rs).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
cargo build -p warmpath-filter --target wasm32-wasip1 --release
target="${CARGO_TARGET_DIR:-$PWD/target}"
ls -l "$target/wasm32-wasip1/release/warmpath_filter.wasm" >&2
cargo test -p warmpath-filter --lib
# The Envoy fragments shared by the controller and the bootstraps (unit tests; Envoy loads them in the e2e tests).
cargo test -p warmpath-envoy-config
# Each test starts its own Envoy (2 workers) and upstreams; 2 at a time keeps the 2-core machine responsive.
cargo test -p warmpath-harness -p warmpath-e2e -- --test-threads 2
