#!/usr/bin/env bash
# Native unit and property tests of the pure routing core.
set -euo pipefail
cargo test -p warmpath-core
