#!/usr/bin/env bash
# Every Rust source of the workspace is formatted as `cargo fmt` leaves it (settings in rustfmt.toml), so a
# change shows only what it changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo fmt --all --check
echo "format: every workspace source is formatted"
