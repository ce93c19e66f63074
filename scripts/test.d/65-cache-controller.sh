#!/usr/bin/env bash
# Cache warming in the controller: reconciler tests against the in-memory API (kube-fake-client,
# tests/cluster),
# the timeline calculator's tests, the objects rendered for an InferenceEndpoint validated strictly
# against the Kubernetes OpenAPI schemas (kubernetes-validate) and the custom resources against the
# chart's CRD schemas (jsonschema), and `helm template` of the agent DaemonSet + RBAC.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; failn=0
ok() { pass=$((pass + 1)); echo "[65-cache] ok: $*"; }
bad() { failn=$((failn + 1)); echo "[65-cache] FAIL: $*" >&2; }

cargo test -p warmpath-cluster-tests --test cache_warming
cargo test -p warmpath-api
cargo test -p warmpath-timeline
ok "cargo tests (see the runner summaries above)"

if [ ! -x .venv/bin/kubernetes-validate ]; then
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check 'kubernetes-validate==1.37.0'
fi
cargo build -q -p warmpath-controller
cargo build -q -p warmpath-timeline
BIN="${CARGO_TARGET_DIR:-target}/debug"
"$BIN/warmpath-controller" render -f controller/testdata/cache/endpoint.yaml --wasm-sha256 0000000000000000000000000000000000000000000000000000000000000000 >"$tmp/rendered.yaml"
.venv/bin/python - "$tmp/rendered.yaml" "$tmp" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = sorted(d["kind"] for d in docs)
assert kinds == ["DaemonSet", "Deployment", "ImageCache", "InferenceRoutingPolicy", "ModelCache", "Service"], kinds
yaml.safe_dump_all([d for d in docs if d["kind"] in ("DaemonSet", "Deployment", "Service")], open(sys.argv[2] + "/builtin.yaml", "w"))
yaml.safe_dump_all([d for d in docs if d["kind"] not in ("DaemonSet", "Deployment", "Service")], open(sys.argv[2] + "/custom.yaml", "w"))
PY
for k in 1.35.0 1.37.0; do
  if .venv/bin/kubernetes-validate --strict --quiet -k "$k" "$tmp/builtin.yaml"; then ok "rendered Deployment/DaemonSet/Service valid (strict, k8s $k)"; else bad "kubernetes-validate k8s $k"; fi
done
# Custom resources against the openAPIV3Schema of the committed CRDs (jsonschema ships with kubernetes-validate).
if .venv/bin/python - "$tmp/custom.yaml" charts/warmpath/crds <<'PY'
import sys, glob, yaml, jsonschema
schemas = {}
for f in glob.glob(sys.argv[2] + "/*.yaml"):
    crd = yaml.safe_load(open(f))
    schemas[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
def strict(s):
    # Structural schemas prune unknown fields; refuse them here so a typo is caught.
    if isinstance(s, dict):
        if s.get("type") == "object" and "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
        for v in s.values(): strict(v)
    elif isinstance(s, list):
        for v in s: strict(v)
    return s
for s in schemas.values():
    strict(s)
    for k in ("apiVersion", "kind"):
        s["properties"].setdefault(k, {"type": "string"})
    s["properties"].setdefault("metadata", {"type": "object"})
docs = list(yaml.safe_load_all(open(sys.argv[1])))
for doc in docs:
    jsonschema.validate(doc, schemas[doc["kind"]])
    print("[65-cache] schema ok:", doc["kind"], doc["metadata"]["name"])
# The check has teeth: a misspelled spec field is refused (on the ModelCache, whatever the render order).
mc = next(d for d in docs if d["kind"] == "ModelCache")
typo = dict(mc); typo["spec"] = dict(typo["spec"], hostPth="/x")
try:
    jsonschema.validate(typo, schemas[typo["kind"]])
    raise SystemExit("typo accepted")
except jsonschema.ValidationError:
    pass
# A sha256 that is not 64 hex characters is refused by the schema (before any download).
bad = dict(mc); bad["spec"] = dict(bad["spec"], sha256={"model.safetensors": "not-a-checksum"})
try:
    jsonschema.validate(bad, schemas[bad["kind"]])
    raise SystemExit("non-hex sha256 accepted")
except jsonschema.ValidationError:
    pass
good = dict(mc); good["spec"] = dict(good["spec"], sha256={"model.safetensors": "ab" * 32})
jsonschema.validate(good, schemas[good["kind"]])
PY
then ok "rendered ModelCache/ImageCache/InferenceRoutingPolicy valid against the chart CRDs"; else bad "CR schema validation"; fi

# Preferred (never required) affinity, hostPath mount and fallback fetch in the rendered Deployment.
if grep -q 'preferredDuringSchedulingIgnoredDuringExecution' "$tmp/builtin.yaml" && ! grep -q 'requiredDuringScheduling' "$tmp/builtin.yaml" \
   && grep -q 'warmpath.dev/cache-ready-ml.qwen3-8b-' "$tmp/builtin.yaml" && grep -q 'hf://Qwen/Qwen3-8B' "$tmp/builtin.yaml"; then
  ok "Deployment prefers cache-ready nodes and falls back to fetching from the source"
else bad "Deployment affinity/fallback shape"; fi

# Timeline calculator: the HyperPod example and a 600 GB model.
"$BIN/warmpath-timeline" --preset hyperpod --nodes 4 --warm-nodes 4 | tee "$tmp/t1.txt"
"$BIN/warmpath-timeline" --preset hyperpod-600gb --nodes 4 --warm-nodes 4 | tee "$tmp/t2.txt"
if grep -q '^image + weights cache .*20.7 s' "$tmp/t1.txt"; then ok "timeline: HyperPod warm node with both caches = NVMe load"; else bad "timeline output"; fi
if "$BIN/warmpath-timeline" --nvme-gbps 0 >/dev/null 2>&1; then bad "timeline accepted NVMe 0 GB/s"; else ok "timeline refuses bad input"; fi

# Chart: agent DaemonSet and RBAC render, and are valid.
HELM="$TOOLS/bin/helm"
if [ -x "$HELM" ]; then
  "$HELM" template wp charts/warmpath --namespace warmpath-system --set agent.enabled=true --show-only templates/agent-daemonset.yaml \
     --show-only templates/agent-rbac.yaml --show-only templates/cache-controller-rbac.yaml \
     --set agent.huggingFace.tokenSecret=hf >"$tmp/agent.yaml"
  if .venv/bin/kubernetes-validate --strict --quiet -k 1.35.0 "$tmp/agent.yaml"; then ok "agent DaemonSet + RBAC render and validate"; else bad "agent chart objects"; fi
  # Agent RBAC: modelcaches read-only, nodes get/patch only, nothing else.
  .venv/bin/python - "$tmp/agent.yaml" <<'PY' && ok "agent RBAC is node get/patch + modelcaches read" || bad "agent RBAC too wide"
import sys, yaml
role = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-agent")][0]
got = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"]))) for r in role["rules"])
assert got == [(("",), ("nodes",), ("get", "patch")), (("warmpath.dev",), ("modelcaches",), ("get", "list", "watch"))], got
PY
  if "$HELM" template wp charts/warmpath --set agent.enabled=false --show-only templates/agent-daemonset.yaml >/dev/null 2>&1; then
    bad "agent.enabled=false still renders the DaemonSet"
  else ok "agent.enabled=false renders no DaemonSet"; fi
  # An overridden agent image reaches both the DaemonSet and the controller (cold-node fallback init container).
  "$HELM" template wp charts/warmpath --set agent.enabled=true --set agent.image.tag=t1 \
     --show-only templates/agent-daemonset.yaml --show-only templates/controller-deployment.yaml >"$tmp/img.yaml"
  .venv/bin/python - "$tmp/img.yaml" <<'PY' && ok "agent image override reaches DaemonSet and WARMPATH_AGENT_IMAGE" || bad "agent image override"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = [d for d in docs if d["kind"] == "DaemonSet"][0]
dep = [d for d in docs if d["kind"] == "Deployment"][0]
assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith("warmpath-agent:t1")
env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
assert env["WARMPATH_AGENT_IMAGE"].endswith("warmpath-agent:t1"), env
PY
else
  echo "[65-cache] SKIP: helm missing (scripts/setup.sh installs it)"
fi
echo "[65-cache] $pass passed, $failn failed"
[ "$failn" = 0 ]
