#!/usr/bin/env bash
# Native unit and property tests of the pure routing core, then the arbitrary-input fuzz targets
# (proptest, stable toolchain) for a bounded case count and time; each target prints how many inputs it tried.
set -euo pipefail
cargo test -p warmpath-core
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! WARMPATH_FUZZ_CASES="${WARMPATH_FUZZ_CASES:-1000000}" WARMPATH_FUZZ_SECS="${WARMPATH_FUZZ_SECS:-30}" \
  cargo test -p warmpath-core --test fuzz -- --nocapture --test-threads 1 >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
grep -E "fuzz target|test result" "$log"
