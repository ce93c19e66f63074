#!/usr/bin/env bash
# Full comparison on real llama.cpp servers through Envoy with the warmpath filter (docs/real-servers.md):
# RANDOM, LEAST_OUTSTANDING_REQUESTS and PREFIX_AWARE (defaults of envoy/plugin-config.json),
# 3 servers, the multi-turn shared-prefix workload, 2 client threads. Bounded: each strategy stops issuing
# requests after --time-limit-s (default 130 s here), so the whole run takes about 10 minutes at most.
# Writes the table to out/real/compare.md and per-request records to out/real/compare.json.
# Exit 3 (with the reason) if the llama-server binary cannot run on this CPU; 1 on any other failure.
# Extra arguments go to `python -m warmpath_real.compare` (see --help), e.g. --strategies RANDOM,PREFIX_AWARE.
set -euo pipefail
cd "$(dirname "$0")/.."
set +e
scripts/install-llama.sh >/dev/null
rc=$?
set -e
if [ $rc -ne 0 ]; then
  [ $rc -eq 3 ] && echo "real-compare: llama-server binary cannot run on this CPU (see above); nothing measured" >&2
  exit $rc
fi
mkdir -p out/real
exec env PYTHONPATH=realserver timeout --signal=TERM --kill-after=30 780 .venv/bin/python -m warmpath_real.compare \
  --strategies 'RANDOM;LEAST_OUTSTANDING_REQUESTS;PREFIX_AWARE' \
  --servers 3 --concurrency 2 --time-limit-s 130 \
  --prefixes 6 --prefix-words 900 --conversations-per-prefix 2 --turns 3 \
  --markdown out/real/compare.md --json out/real/compare.json "$@"
