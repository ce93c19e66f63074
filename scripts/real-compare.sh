#!/usr/bin/env bash
# Full comparison on real llama.cpp servers (docs/real-servers.md): RANDOM, LEAST_OUTSTANDING_REQUESTS and
# PREFIX_AWARE (defaults of envoy/plugin-config.json) through Envoy with the warmpath filter, and the peers' real
# routers in Envoy's place — SMG_CACHE_AWARE (SGLang Model Gateway) and VLLM_ROUTER_CACHE_AWARE (vLLM router),
# both `cache_aware` at their defaults, from .venv (scripts/setup.sh) — in front of the same fresh servers:
# 3 servers, the multi-turn shared-prefix workload, 2 client threads. Bounded: each strategy stops issuing
# requests after --time-limit-s (130 s here), so the whole run takes about 15 minutes; a timeout stops it at 18.
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
exec env PYTHONPATH=realserver timeout --signal=TERM --kill-after=30 1080 .venv/bin/python -m warmpath_real.compare \
  --strategies 'RANDOM;LEAST_OUTSTANDING_REQUESTS;PREFIX_AWARE;SMG_CACHE_AWARE;VLLM_ROUTER_CACHE_AWARE' \
  --servers 3 --concurrency 2 --time-limit-s 130 \
  --prefixes 6 --prefix-words 900 --conversations-per-prefix 2 --turns 3 \
  --markdown out/real/compare.md --json out/real/compare.json "$@"
