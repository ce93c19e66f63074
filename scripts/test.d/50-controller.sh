#!/usr/bin/env bash
# warmpath-controller: unit and integration tests — the routing reconcilers, status read-back, route status, leader election, uninstall clean-up and the feed loop
# against the in-memory API (kube-fake-client, in tests/cluster), golden `render -f` outputs, CRD sync + CEL rules, rendered Envoy fragments
# through a real `envoy --mode validate`, the standalone feed server on 127.0.0.1, and the Envoy
# Gateway rendering carrying live traffic through a real Envoy (envoy_live: needs the release
# filter module, built here first — a no-op when suite 20 already built it).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -p warmpath-filter --target wasm32-wasip1 --release
# (tee -a: opening /dev/stderr without append truncates a log file that stdout and stderr share, e.g. CI logs)
# Two cargo runs, not one: tests/cluster's kube-fake-client would add a second rustls provider to
# the controller binary that tls_client starts (cargo unifies features over one run's packages).
{ s=0; cargo test -p warmpath-controller 2>&1 || s=1; cargo test -p warmpath-cluster-tests --test routing --test feed_loop --test status_readback --test route_status --test leader_election --test cleanup 2>&1 || s=1; exit $s; } \
  | tee -a /dev/stderr | grep -E '^test result:' | awk '{p+=$4; f+=$6} END {printf "[50-controller] %d passed, %d failed\n", p, f; exit f > 0}'
