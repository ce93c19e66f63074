#!/usr/bin/env bash
# Helm chart charts/warmpath: helm lint; helm template for every provider; every rendered object
# (chart objects and CRDs) validated offline and strictly against the Kubernetes 1.35 and 1.37
# OpenAPI schemas (kubernetes-validate); least-privilege checks on the RBAC; and
# the Istio and Envoy Gateway objects the controller renders validated with those projects' CRD
# schemas (@kubernetes-models/istio, @kubernetes-models/envoy-gateway).
# Tools come from scripts/install-k8s-tools.sh (run by scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
HELM="$TOOLS/bin/helm"
VALIDATE=.venv/bin/kubernetes-validate
CHART=charts/warmpath
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
ok() { pass=$((pass + 1)); echo "[55-chart] ok: $*"; }
fail() { echo "[55-chart] FAIL: $*" >&2; exit 1; }

[ -x "$HELM" ] || fail "helm missing: run scripts/setup.sh"
"$HELM" lint --strict "$CHART" >"$tmp/lint.txt" 2>&1 || { cat "$tmp/lint.txt"; fail "helm lint"; }
ok "helm lint --strict"

for provider in auto envoy-gateway istio; do
  "$HELM" template wp "$CHART" --namespace warmpath-system --include-crds --set provider=$provider >"$tmp/$provider.yaml" \
    || fail "helm template provider=$provider"
  for k in 1.35.0 1.37.0; do
    "$VALIDATE" --strict --quiet -k "$k" "$tmp/$provider.yaml" || fail "kubernetes-validate --strict provider=$provider k8s=$k"
  done
  grep -q 'kind: Deployment' "$tmp/$provider.yaml" || fail "no Deployment for provider=$provider"
  [ "$(grep -c 'kind: CustomResourceDefinition' "$tmp/$provider.yaml")" -ge 1 ] || fail "no CRDs for provider=$provider"
  ok "helm template + strict schema validation, provider=$provider"
done
# Provider narrows RBAC to the kinds it renders; WasmPlugin cannot carry the wasm option
# allow_on_headers_stop_iteration, so it is not rendered, so not granted.
! grep -qE 'wasmplugins' "$tmp/auto.yaml" || fail "RBAC grants kinds the controller does not render"
grep -q 'envoyextensionpolicies' "$tmp/envoy-gateway.yaml" || fail "envoy-gateway RBAC lacks EnvoyExtensionPolicy"
! grep -q 'extensions.istio.io' "$tmp/envoy-gateway.yaml" || fail "envoy-gateway RBAC grants Istio kinds"
! grep -q 'gateway.envoyproxy.io' "$tmp/istio.yaml" || fail "istio RBAC grants Envoy Gateway kinds"
# No wildcards, no secrets, no cluster-wide writes to core objects.
! grep -nE '"\*"|- \*$' "$tmp/auto.yaml" || fail "wildcard in RBAC"
awk 'BEGIN{RS="\n---"} /kind: ClusterRole\n/ && /name: wp-warmpath-controller-routing/' "$tmp/auto.yaml" >"$tmp/routing-role.yaml"
grep -q 'httproutes' "$tmp/routing-role.yaml" || fail "routing ClusterRole not found"
! grep -n 'secrets' "$tmp/routing-role.yaml" || fail "routing controller RBAC mentions secrets"
ok "RBAC least privilege (no wildcards, provider-scoped kinds)"
# Routing only by default: no cache-warming DaemonSet and none of its RBAC (nothing on deployments,
# daemonsets or nodes); the controller is told not to run the cache reconcilers.
doc() { awk -v kind="$2" -v name="$3" 'BEGIN{RS="\n---"} $0 ~ "\nkind: " kind "\n" && $0 ~ "\n  name: " name "\n"' "$1"; }
! grep -q 'kind: DaemonSet' "$tmp/auto.yaml" || fail "default install renders the agent DaemonSet"
! grep -qE '"(deployments|daemonsets|nodes)"' "$tmp/auto.yaml" || fail "default install grants RBAC on deployments/daemonsets/nodes"
! grep -q 'name: wp-warmpath-controller-cache' "$tmp/auto.yaml" || fail "default install renders the cache-warming ClusterRole"
grep -A1 'name: WARMPATH_CACHE_WARMING' "$tmp/auto.yaml" | grep -q 'value: "false"' || fail "controller not told cache warming is off"
"$HELM" template wp "$CHART" --namespace warmpath-system --set agent.enabled=true >"$tmp/agent.yaml" || fail "helm template agent.enabled=true"
"$VALIDATE" --strict --quiet -k 1.37.0 "$tmp/agent.yaml" || fail "kubernetes-validate --strict agent.enabled=true"
grep -q 'kind: DaemonSet' "$tmp/agent.yaml" || fail "agent.enabled=true renders no DaemonSet"
[ -n "$(doc "$tmp/agent.yaml" ClusterRole wp-warmpath-controller-cache)" ] || fail "agent.enabled=true renders no cache-warming ClusterRole"
grep -A1 'name: WARMPATH_CACHE_WARMING' "$tmp/agent.yaml" | grep -q 'value: "true"' || fail "controller not told cache warming is on"
ok "routing only by default; agent.enabled=true adds the DaemonSet, its RBAC and the cache reconcilers"
# Leader election: a Role on leases in the release namespace, bound to the controller.
doc "$tmp/auto.yaml" Role wp-warmpath-controller-leader-election >"$tmp/leader.yaml"
grep -q 'coordination.k8s.io' "$tmp/leader.yaml" && grep -q '"update"' "$tmp/leader.yaml" || fail "no leader-election Role on leases"
grep -A1 'name: WARMPATH_LEADER_LEASE' "$tmp/auto.yaml" | grep -q 'value: "wp-warmpath-controller"' || fail "controller not given its Lease name"
"$HELM" template wp "$CHART" --set controller.replicas=3 | grep -q 'replicas: 3' || fail "controller.replicas=3"
# The Service reaches the leader only: it selects the label the leader puts on its own pod, which the Role lets it set.
doc "$tmp/auto.yaml" Service wp-warmpath-controller | grep -q 'warmpath.dev/leader: "wp-warmpath-controller"' || fail "controller Service does not select the leader's pod"
grep -q '"pods"' "$tmp/leader.yaml" && grep -q '"list", "patch"' "$tmp/leader.yaml" || fail "leader-election Role cannot label pods"
ok "leader election Role and Lease name; replicas > 1 allowed"
# Uninstall: a pre-delete hook Job runs `cleanup` as the controller's ServiceAccount with a Role to scale it down.
doc "$tmp/auto.yaml" Job wp-warmpath-controller-cleanup >"$tmp/job.yaml"
grep -q 'helm.sh/hook: pre-delete' "$tmp/job.yaml" || fail "no pre-delete cleanup Job"
grep -q 'args: \["cleanup"\]' "$tmp/job.yaml" && grep -q 'serviceAccountName: wp-warmpath-controller' "$tmp/job.yaml" || fail "cleanup Job command or ServiceAccount"
doc "$tmp/auto.yaml" Role wp-warmpath-controller-cleanup | grep -q 'deployments/scale' || fail "cleanup Role cannot scale the controller"
doc "$tmp/auto.yaml" ClusterRole wp-warmpath-controller-cleanup >"$tmp/cleanup-cr.yaml"
grep -q 'helm.sh/hook: pre-delete' "$tmp/cleanup-cr.yaml" && grep -q '"inferenceendpoints", "modelcaches", "imagecaches"' "$tmp/cleanup-cr.yaml" \
  && grep -q '"list", "patch"' "$tmp/cleanup-cr.yaml" || fail "cleanup hook cannot release the cache-warming finalizers"
[ -n "$(doc "$tmp/auto.yaml" ClusterRoleBinding wp-warmpath-controller-cleanup)" ] || fail "no cleanup ClusterRoleBinding"
! "$HELM" template wp "$CHART" --set controller.cleanupOnUninstall=false | grep -q 'helm.sh/hook' || fail "cleanupOnUninstall=false still renders the hook"
ok "pre-delete cleanup hook Job with its RBAC"
# values.schema.json: wrong types and misspelled keys fail at template (= install) time; defaults pass.
refused_value() {
  if "$HELM" template wp "$CHART" --set "$1" >/dev/null 2>"$tmp/schema.err"; then fail "value $1 accepted"; fi
  grep -q "$2" "$tmp/schema.err" || { cat "$tmp/schema.err"; fail "value $1 refused without naming $2"; }
}
refused_value agent.enabled=flase '/agent/enabled'
refused_value http.port=abc '/http/port'
refused_value http.port=70000 '/http/port'
refused_value agent.enable=true 'enable'
refused_value controller.replicas=0 '/controller/replicas'
"$HELM" lint --strict "$CHART" --set agent.enabled=true --set http.port=8081 >/dev/null || fail "valid values refused"
ok "values schema refuses agent.enabled=flase, http.port=abc/70000, a misspelled key, replicas=0; accepts valid values"
# Envoy Gateway's xDS name scheme reaches the controller (v1 unless set); anything but v1 or v2 is refused.
grep -A1 'name: WARMPATH_ENVOY_GATEWAY_XDS_NAME_SCHEME' "$tmp/auto.yaml" | grep -q 'value: "v1"' || fail "controller not given the default xDS name scheme"
"$HELM" template wp "$CHART" --set envoyGateway.xdsNameScheme=v2 | grep -A1 'name: WARMPATH_ENVOY_GATEWAY_XDS_NAME_SCHEME' \
  | grep -q 'value: "v2"' || fail "envoyGateway.xdsNameScheme=v2 not passed on"
refused_value envoyGateway.xdsNameScheme=V2 '/envoyGateway/xdsNameScheme'
ok "Envoy Gateway's xDS name scheme: v1 by default, v2 passed on, V2 refused"
# The cluster domain reaches the controller; a value that is no DNS name is refused.
grep -A1 'name: WARMPATH_CLUSTER_DOMAIN' "$tmp/auto.yaml" | grep -q 'value: "cluster.local"' || fail "controller not given the default cluster domain"
"$HELM" template wp "$CHART" --set clusterDomain=corp.example | grep -A1 'name: WARMPATH_CLUSTER_DOMAIN' | grep -q 'value: "corp.example"' || fail "clusterDomain=corp.example not passed on"
refused_value clusterDomain=Cluster.Local '/clusterDomain'
refused_value clusterDomain=.cluster.local '/clusterDomain'
ok "clusterDomain passed to the controller; invalid domains refused"
# A wrong provider value is refused at template time.
if "$HELM" template wp "$CHART" --set provider=nginx >/dev/null 2>&1; then fail "provider=nginx accepted"; fi
ok "invalid provider refused"
# Labels: commonLabels and nodeSelectors take valid label keys and values only, and commonLabels not the chart's own keys.
refused_value 'commonLabels.bad key=x' 'bad key'
refused_value 'commonLabels.team=a b' '/commonLabels/team'
refused_value 'commonLabels.app\.kubernetes\.io/name=other' '/commonLabels'
refused_value 'controller.nodeSelector.bad key=x' 'bad key'
"$HELM" template wp "$CHART" --set 'commonLabels.example\.com/team=ml-1' | grep -q 'example.com/team: ml-1' || fail "a valid common label"
ok "label keys and values checked; the chart's own label keys refused in commonLabels"
# Metrics: off means no listener (the controller is told so), and its port may not be the HTTP server's.
"$HELM" template wp "$CHART" --set metrics.enabled=false >"$tmp/nometrics.yaml" || fail "helm template metrics.enabled=false"
grep -A1 'name: WARMPATH_METRICS_ADDR' "$tmp/nometrics.yaml" | grep -q 'value: "off"' || fail "metrics.enabled=false still starts a metrics listener"
! grep -q 'name: metrics' "$tmp/nometrics.yaml" || fail "metrics.enabled=false still declares a metrics port"
! "$HELM" template wp "$CHART" --set metrics.port=8080 >/dev/null 2>"$tmp/ports.err" || fail "metrics.port = http.port rendered"
grep -q 'metrics.port and http.port are both 8080' "$tmp/ports.err" || { cat "$tmp/ports.err"; fail "port clash refused without saying so"; }
ok "metrics.enabled=false turns the listener off; metrics.port = http.port refused"
# A release name as long as Helm allows (53 characters): every object name stays a DNS label (63 characters at most;
# a Job's name is also a label value) and names stay distinct.
long=my-very-long-release-name-that-goes-on-and-on-forever
"$HELM" template "$long" "$CHART" --namespace warmpath-system --set agent.enabled=true >"$tmp/long.yaml" || fail "helm template with a 53-character release name"
.venv/bin/python - "$tmp/long.yaml" <<'PY' || fail "object names with a 53-character release name"
import collections, sys, yaml
names = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(open(sys.argv[1])) if d]
long = [n for n in names if len(n[1]) > 63]
twice = [n for n, c in collections.Counter(names).items() if c > 1]
assert not long and not twice, f"over 63 characters: {long}; twice: {twice}"
# The controller's own name (Deployment, Lease) is cut as it always was, so an upgrade does not rename it.
fullname = "my-very-long-release-name-that-goes-on-and-on-forever-warmpath"
want = f"{fullname}-controller"[:63].rstrip("-")
deployments = [n for k, n in names if k == "Deployment"]
assert deployments == [want], f"controller Deployment {deployments}, want {want!r}"
PY
"$VALIDATE" --strict --quiet -k 1.37.0 "$tmp/long.yaml" || fail "kubernetes-validate --strict with a 53-character release name"
ok "a 53-character release name keeps every object name within 63 characters"
# Strict validation has teeth: a misspelled field is refused.
sed 's/containerPort:/containerPortt:/' "$tmp/auto.yaml" >"$tmp/typo.yaml"
if "$VALIDATE" --strict --quiet "$tmp/typo.yaml" >/dev/null 2>&1; then fail "strict validation accepted a typo"; fi
ok "strict validation refuses a misspelled field"

# The InferenceRoutingPolicies of the render testdata against the committed CRD's openAPIV3Schema
# (strict: unknown fields refused), and out-of-range / unknown values refused by the schema alone.
if .venv/bin/python - charts/warmpath/crds/inferenceroutingpolicies.warmpath.dev.yaml controller/testdata/render/*.yaml <<'PY'
import sys, copy, yaml, jsonschema
crd = yaml.safe_load(open(sys.argv[1]))
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
def strict(s):
    if isinstance(s, dict):
        if s.get("type") == "object" and "properties" in s and "additionalProperties" not in s:
            s["additionalProperties"] = False
        for v in s.values(): strict(v)
    elif isinstance(s, list):
        for v in s: strict(v)
strict(schema)
schema["properties"].update(metadata={"type": "object"}, apiVersion={"type": "string"}, kind={"type": "string"})
policies = [d for f in sys.argv[2:] if not f.endswith(".expected.yaml") for d in yaml.safe_load_all(open(f)) if d and d.get("kind") == "InferenceRoutingPolicy"]
assert len(policies) >= 3, policies
for p in policies:
    jsonschema.validate(p, schema)
    print("[55-chart] schema ok: InferenceRoutingPolicy", p["metadata"]["name"])
bad = [("prefixLength", 10), ("strategy", "ROUND_ROBIN"), ("concurrencyThreshold", 5000), ("failureMode", "Sometimes"), ("prefixLenght", 4096)]
for field, value in bad:
    p = copy.deepcopy(policies[0]); p["spec"][field] = value
    try:
        jsonschema.validate(p, schema)
        raise SystemExit(f"schema accepted {field}={value!r}")
    except jsonschema.ValidationError:
        pass
PY
then ok "testdata policies valid against the CRD schema; bad values and typos refused"; else fail "policy schema validation"; fi

# Istio and Envoy Gateway objects rendered by the controller, checked with the projects' CRD schemas.
MODULES="$TOOLS/node/node_modules"
if [ -d "$MODULES/@kubernetes-models/istio" ] && [ -d "$MODULES/@kubernetes-models/envoy-gateway" ] && command -v node >/dev/null; then
  cargo build -q -p warmpath-controller
  BIN="${CARGO_TARGET_DIR:-target}/debug/warmpath-controller"
  SHA=045fe3661531d607341bb5878db489d5cd8a55f65289da111fb3d42075e74101
  CHECK=controller/schema-check/validate-models.mjs
  # refused RENDERED.json SED-EXPR WHAT: the check must fail on RENDERED.json edited by SED-EXPR.
  refused() {
    sed "$2" "$1" >"$tmp/mutated.json"
    if node "$CHECK" "$tmp/mutated.json" "$MODULES" >/dev/null; then fail "$3"; fi
  }
  "$BIN" render -f controller/testdata/render/istio-annotated.yaml --wasm-sha256 "$SHA" -o json >"$tmp/istio.json" 2>/dev/null
  node "$CHECK" "$tmp/istio.json" "$MODULES" || fail "Istio schema validation"
  ok "rendered EnvoyFilter (wasm HTTP filter + cluster patch) valid against Istio CRD schemas"
  refused "$tmp/istio.json" 's/"applyTo"/"applyToo"/' "Istio check accepted a misspelled field"
  refused "$tmp/istio.json" 's/"INSERT_BEFORE"/"INSERT_SOMEWHERE"/' "Istio check accepted a bad enum"
  ok "Istio check refuses a misspelled field and a bad enum value"
  for case in envoy-gateway envoy-gateway-two-routes docs-annotated-route; do
    "$BIN" render -f "controller/testdata/render/$case.yaml" --wasm-sha256 "$SHA" -o json >"$tmp/eg-$case.json" 2>/dev/null
    node "$CHECK" "$tmp/eg-$case.json" "$MODULES" || fail "Envoy Gateway schema validation ($case)"
  done
  ok "rendered EnvoyExtensionPolicy / BackendTrafficPolicy / EnvoyPatchPolicy valid against Envoy Gateway CRD schemas"
  refused "$tmp/eg-envoy-gateway.json" 's/"rootID"/"rootId"/' "Envoy Gateway check accepted a misspelled field"
  refused "$tmp/eg-envoy-gateway.json" 's/"type": *"HTTP"/"type":"HTTPS"/' "Envoy Gateway check accepted a bad enum"
  ok "Envoy Gateway check refuses a misspelled field and a bad enum value"
else
  echo "[55-chart] SKIP: Istio / Envoy Gateway schema checks (npm packages or node missing)"
fi
echo "[55-chart] $pass passed, 0 failed"
