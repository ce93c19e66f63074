#!/usr/bin/env bash
# Real llama.cpp servers through a real Envoy with the warmpath filter (docs/real-servers.md):
# installs llama-server, the SmolLM2 model and the openai client (scripts/install-llama.sh), then runs
# realserver/tests with pytest: fast unit tests plus the CI-sized PREFIX_AWARE test (2 servers, 12 requests).
# If the llama-server binary cannot run on this CPU (install exit 3), the real test is skipped with that
# reason and the unit tests still run; any other install failure fails the suite.
set -euo pipefail
cd "$(dirname "$0")/../.."
set +e
scripts/install-llama.sh >/dev/null
rc=$?
set -e
if [ $rc -eq 3 ]; then
  export WARMPATH_LLAMA_CANNOT_RUN="llama-server binary cannot run on this CPU (scripts/install-llama.sh exit 3; see its message above)"
  echo "[70-real-llama] SKIP real-server test: $WARMPATH_LLAMA_CANNOT_RUN" >&2
elif [ $rc -ne 0 ]; then
  echo "[70-real-llama] scripts/install-llama.sh failed (exit $rc)" >&2
  exit $rc
fi
exec .venv/bin/python -m pytest realserver -q -p no:cacheprovider
