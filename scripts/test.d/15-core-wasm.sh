#!/usr/bin/env bash
# The routing core compiled to wasm32-unknown-unknown and run under Node with wasm-bindgen-test: the parity
# test recomputes the committed native fixture (tests/fixtures/parity.json: extraction, block hashes,
# rendezvous order, a scripted routing stream) and must match it exactly; the unit tests run too.
# Needs node and wasm-bindgen-test-runner (installed by scripts/setup.sh, same version as wasm-bindgen in Cargo.lock).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}/bin:$PATH"
if ! command -v node >/dev/null; then
  echo "15-core-wasm: node not found; it is required for the wasm tests" >&2
  exit 1
fi
if ! command -v wasm-bindgen-test-runner >/dev/null; then
  echo "15-core-wasm: wasm-bindgen-test-runner not found; run scripts/setup.sh" >&2
  exit 1
fi
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
cargo test -p warmpath-core --target wasm32-unknown-unknown
