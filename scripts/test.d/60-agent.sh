#!/usr/bin/env bash
# Node agent (warmpath-agent): unit tests, the node loop against the in-memory API, plus downloads against a real S3-compatible server (moto, from PyPI,
# installed here into .venv idempotently) and a local HTTP server with Range support.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv/bin/moto_server ]; then
  echo "[60-agent] installing moto[server] into .venv" >&2
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check 'moto[server]>=5,<6'
fi
cargo test -p warmpath-agent
# The node loop against the in-memory API (its own cargo run: see tests/cluster/Cargo.toml).
cargo test -p warmpath-cluster-tests --test node_agent
