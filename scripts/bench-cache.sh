#!/usr/bin/env bash
# Agent download throughput vs curl on the same file over loopback (numbers for docs/bench/cache.md).
# Serves a SIZE_MIB file (default 1024) from a Range-capable server (tower-http ServeDir) on 127.0.0.1,
# then times: curl (one stream), and `warmpath-agent fetch` at several range concurrencies, each RUNS
# times (default 3), printing the median MB/s (decimal MB). Bounded: RUNS x 5 downloads of SIZE_MIB.
# Usage: scripts/bench-cache.sh [SIZE_MIB] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB="${1:-1024}"; RUNS="${2:-3}"
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16   # faster build; same code paths
cargo build -q --release -p warmpath-agent --bin warmpath-agent --example range_server
T="${CARGO_TARGET_DIR:-target}/release"
work=$(mktemp -d)
srv_pid=""
cleanup() { [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/srv"
head -c "$((SIZE_MIB * 1024 * 1024))" /dev/urandom >"$work/srv/weights.bin"
SUM=$(sha256sum "$work/srv/weights.bin" | cut -d' ' -f1)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$T/examples/range_server" "$work/srv" "$PORT" & srv_pid=$!
for _ in $(seq 50); do curl -sf -o /dev/null -r 0-0 "http://127.0.0.1:$PORT/weights.bin" && break; sleep 0.1; done
URL="http://127.0.0.1:$PORT/weights.bin"
BYTES=$((SIZE_MIB * 1024 * 1024))

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
run() { # label, command...
  local label=$1; shift
  local rates=()
  for _ in $(seq "$RUNS"); do
    rm -rf "$work/dst"; mkdir -p "$work/dst"; sync
    local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
    rates+=("$(python3 -c "print(f'{$BYTES/($t1-$t0)/1e6:.0f}')")")
  done
  printf '%-44s %6s MB/s   (runs: %s)\n' "$label" "$(printf '%s\n' "${rates[@]}" | median)" "${rates[*]}"
}
echo "file: $SIZE_MIB MiB, loopback, $RUNS runs each, median; $(nproc) cores"
run "curl (1 stream, to disk)" curl -sf -o "$work/dst/weights.bin" "$URL"
for c in 1 4 8; do
  run "warmpath-agent fetch, $c ranges in flight" "$T/warmpath-agent" fetch --source "$URL" --key b.m --root "$work/dst" --reserve-bytes 0 --concurrency "$c"
done
run "warmpath-agent fetch, 8 in flight + sha256" "$T/warmpath-agent" fetch --source "$URL" --key b.m --root "$work/dst" --reserve-bytes 0 --concurrency 8 --sha256 "weights.bin=$SUM"
