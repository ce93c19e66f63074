#!/usr/bin/env bash
# The README's test command: sets up what is missing, then runs every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace
