#!/usr/bin/env bash
# The controller and agent container images (scripts/build-image.sh, controller/Containerfile,
# controller/agent/Containerfile), checked for real without a container engine: the OCI archives are
# built, read with skopeo, unpacked with umoci, and the binaries are run from the unpacked root
# filesystems with chroot as the images' users.
# Controller image:
#   - config: non-root numeric user equal to the chart's runAsUser; Entrypoint + the chart's args
#     (the Deployment sets no command) form the controller's `run`; ports match the chart's;
#   - content: exactly the binary, the wasm module and the CA bundle; the module at the chart's
#     WARMPATH_WASM_FILE path is byte-identical (sha256) to the freshly built one; the binary is static;
#   - behaviour: `render -f` of every controller/testdata/render case equals its golden; `render`
#     with the image's module renders that module's sha256; `feed` serves a feed file on 127.0.0.1;
#     `run` with the chart's args/env verifies TLS to a loopback HTTPS stand-in for an API server
#     without the CRDs (404s), lists with its token and exits with the CRD hint (no panic); a server
#     certificate from another CA is refused.
# Agent image:
#   - config: user 0 = the DaemonSet's runAsUser (hostPath is root-owned), entrypoint + the DaemonSet's
#     args (`run ...`, no command), tag = the DaemonSet's and the controller's WARMPATH_AGENT_IMAGE;
#     the init container the controller renders (`warmpath-controller render`) uses that image, no command,
#     args `fetch ...` and no securityContext, so it runs as the image user;
#   - content: exactly the binary and the CA bundle; the binary is the musl build and static;
#   - behaviour: --version/--help; `fetch` with the rendered init-container args from a loopback
#     Range-capable HTTP server into a root-owned cache dir (bytes, sha256, ranged GETs with If-Match,
#     the JSON Ready line); again on the warm cache (nothing fetched); a wrong --sha256 fails with
#     ChecksumMismatch and keeps the current version; as a non-root user it fails with DiskError;
#     over HTTPS it refuses a private CA with the image's bundle and downloads once SSL_CERT_FILE
#     trusts it; hf:// with only the image's env fails cleanly (HOME set: hf-hub panics without one);
#     `run` with the DaemonSet's args/env reaches the API stand-in over TLS with its token,
#     survives 404s, exits 0 on SIGTERM and writes nothing outside /cache.
# Both: reproducibility (building again gives the same image digests).
# Tools: buildah/musl-tools via scripts/build-image.sh; skopeo and umoci installed here if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
TOOLS="${WARMPATH_TOOLS:-$HOME/.cache/warmpath/tools}"
HELM="$TOOLS/bin/helm"
PY=.venv/bin/python
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
pass=0
ok() { pass=$((pass + 1)); echo "[58-image] ok: $*"; }
fail() { echo "[58-image] FAIL: $*" >&2; echo "[58-image] $pass passed, 1 failed"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/warmpath-58-image.XXXXXX")
feed_pid=""
api_pid=""
http_pid=""
https_pid=""
agent_pid=""
cleanup() {
  for p in $agent_pid $feed_pid $api_pid $http_pid $https_pid; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  chmod -R u+w "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || fail "needs root (chroot into the unpacked image)"
[ -x "$HELM" ] || fail "helm missing: run scripts/setup.sh"
[ -x "$PY" ] || fail "$PY missing: run scripts/setup.sh"
need=()
command -v skopeo >/dev/null || need+=(skopeo)
command -v umoci >/dev/null || need+=(umoci)
if [ ${#need[@]} -gt 0 ]; then
  echo "[58-image] apt-get install ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- build ----------------------------------------------------------------------------------------
start=$(date +%s)
# stdout of build-image.sh: the controller archive's path, then the agent archive's.
bash scripts/build-image.sh --out "$tmp/out" >"$tmp/archives" || fail "scripts/build-image.sh"
[ "$(wc -l <"$tmp/archives")" = 2 ] || fail "build-image.sh printed $(wc -l <"$tmp/archives") lines, want 2 archive paths"
archive=$(sed -n 1p "$tmp/archives")
agent_archive=$(sed -n 2p "$tmp/archives")
echo "[58-image] build took $(( $(date +%s) - start )) s ($(du -h "$archive" | cut -f1) + $(du -h "$agent_archive" | cut -f1))" >&2
[ -s "$archive" ] || fail "no archive at '$archive'"
[ -s "$agent_archive" ] || fail "no agent archive at '$agent_archive'"
ok "scripts/build-image.sh wrote $(basename "$archive") and $(basename "$agent_archive")"
TAG=$(awk -F'"' '/^appVersion:/ {print $2}' charts/warmpath/Chart.yaml)
[ "$(basename "$archive")" = "warmpath-controller-$TAG.oci.tar" ] || fail "archive not named for the chart appVersion $TAG: $archive"
[ "$(basename "$agent_archive")" = "warmpath-agent-$TAG.oci.tar" ] || fail "agent archive not named for the chart appVersion $TAG: $agent_archive"
WASM="$TARGET_DIR/wasm32-wasip1/release/warmpath_filter.wasm"
BIN="$TARGET_DIR/x86_64-unknown-linux-musl/image/warmpath-controller"
AGENT_BIN="$TARGET_DIR/x86_64-unknown-linux-musl/image/warmpath-agent"

# --- config vs the chart --------------------------------------------------------------------------
skopeo inspect --config "oci-archive:$archive" >"$tmp/config.json" || fail "skopeo inspect --config"
skopeo inspect --raw "oci-archive:$archive" >"$tmp/manifest.json" || fail "skopeo inspect --raw"
"$HELM" template wp charts/warmpath --namespace warmpath-system --set agent.enabled=true >"$tmp/chart.yaml" || fail "helm template"
"$PY" - "$tmp/config.json" "$tmp/manifest.json" "$tmp/chart.yaml" "$TAG" >"$tmp/chart-env.sh" <<'PY' || fail "image config does not match the chart"
import json, shlex, sys, yaml
config = json.load(open(sys.argv[1]))
manifest = json.load(open(sys.argv[2]))
docs = [d for d in yaml.safe_load_all(open(sys.argv[3])) if d]
tag = sys.argv[4]
def check(cond, msg):
    if not cond:
        raise SystemExit(f"[58-image] {msg}")
    print(f"[58-image] checked: {msg}", file=sys.stderr)
dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-controller"))
pod = dep["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "controller")
cfg = config["config"]
check(config["os"] == "linux" and config["architecture"] == "amd64", f"platform linux/amd64 ({config['os']}/{config['architecture']})")
check(manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json" and len(manifest["layers"]) == 1, "one-layer OCI image manifest")
user = cfg.get("User", "")
uid = user.split(":")[0]
check(uid.isdigit() and int(uid) != 0, f"image user {user!r} is numeric and non-root")
check(int(uid) == pod["securityContext"]["runAsUser"] and pod["securityContext"]["runAsNonRoot"], "image uid equals the chart's runAsUser (runAsNonRoot)")
check(cfg["Entrypoint"] == ["/usr/local/bin/warmpath-controller"], f"entrypoint {cfg['Entrypoint']}")
check("command" not in c and c["args"] == ["run"], "chart Deployment keeps the entrypoint (no command) and passes args [run]")
check(cfg.get("Cmd") == ["run"], "default Cmd is [run] (plain `docker run` starts the controller too)")
check(c["image"].endswith(f"/warmpath-controller:{tag}"), f"chart image {c['image']} has the archive's tag {tag}")
ports = {p["containerPort"] for p in c["ports"]}
check({f"{p}/tcp" for p in ports} == set(cfg.get("ExposedPorts", {})), f"exposed ports {sorted(cfg.get('ExposedPorts', {}))} = chart container ports {sorted(ports)}")
check(c["securityContext"]["readOnlyRootFilesystem"], "chart runs it read-only (the controller writes no files)")
env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
check(env["WARMPATH_WASM_FILE"] == "/opt/warmpath/warmpath_filter.wasm", "chart WARMPATH_WASM_FILE is /opt/warmpath/warmpath_filter.wasm")
check(any(e.startswith("SSL_CERT_FILE=") for e in cfg.get("Env", [])), "SSL_CERT_FILE set")
# The chart's env, for `run` below (listen addresses moved to loopback port 0 by the caller).
for k, v in env.items():
    print(f"export {k}={shlex.quote(str(v))}")
PY
ok "image config matches the chart (user, entrypoint/args, tag, ports, wasm path)"
index_ref=$("$PY" -c 'import json,sys,tarfile; t=tarfile.open(sys.argv[1]); i=json.load(t.extractfile("index.json")); print(i["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])' "$archive")
[ "$index_ref" = "warmpath-controller:$TAG" ] || fail "archive ref name $index_ref"
ok "archive reference warmpath-controller:$TAG"

# --- unpack and content ---------------------------------------------------------------------------
mkdir -p "$tmp/oci"
tar -xf "$archive" -C "$tmp/oci"
umoci unpack --image "$tmp/oci:warmpath-controller:$TAG" "$tmp/bundle" >/dev/null || fail "umoci unpack (blob digests are verified)"
R="$tmp/bundle/rootfs"
files=$(cd "$R" && find . -mindepth 1 \( -type f -o -type l \) -printf '%P %m %U\n' | sort)
want=$'etc/ssl/certs/ca-certificates.crt 444 0\nopt/warmpath/warmpath_filter.wasm 444 0\nusr/local/bin/warmpath-controller 555 0'
[ "$files" = "$want" ] || fail "image files differ: got
$files"
ok "image holds exactly the binary, the wasm module and the CA bundle (root-owned, read-only)"
sha_img=$(sha256sum "$R/opt/warmpath/warmpath_filter.wasm" | cut -d' ' -f1)
sha_built=$(sha256sum "$WASM" | cut -d' ' -f1)
[ "$sha_img" = "$sha_built" ] || fail "wasm in image $sha_img != freshly built $sha_built"
ok "wasm module in the image = freshly built module (sha256 $sha_built)"
cmp -s "$R/usr/local/bin/warmpath-controller" "$BIN" || fail "binary in the image differs from $BIN"
! readelf -l "$R/usr/local/bin/warmpath-controller" | grep -q 'program interpreter' || fail "binary is dynamically linked"
ok "controller binary = the musl build, statically linked"
grep -q 'BEGIN CERTIFICATE' "$R/etc/ssl/certs/ca-certificates.crt" || fail "CA bundle has no certificate"
cmp -s "$R/etc/ssl/certs/ca-certificates.crt" /etc/ssl/certs/ca-certificates.crt || fail "CA bundle differs from Debian's"
ok "CA bundle = Debian's ca-certificates"

# --- run from the unpacked image (no libc in it: only a static binary runs) -----------------------
uid=$(grep -o '"User": *"[0-9]*' "$tmp/config.json" | grep -o '[0-9]*$')
CHROOT=$(command -v chroot)
IN=(env -i "$CHROOT" --userspec="$uid:$uid" "$R" /usr/local/bin/warmpath-controller)
version=$(awk -F'"' '/^\[workspace.package\]/{p=1} p && /^version/ {print $2; exit}' Cargo.toml)
out=$("${IN[@]}" --version) || fail "--version in the image"
[ "$out" = "warmpath-controller $version" ] || fail "--version printed '$out', want 'warmpath-controller $version'"
ok "runs as uid $uid in the image: $out"

# Golden renders: the same text controller/tests/render_golden.rs compares (objects, then conditions).
SHA=045fe3661531d607341bb5878db489d5cd8a55f65289da111fb3d42075e74101
mkdir -p "$R/in"
cases=0
for f in controller/testdata/render/*.yaml; do
  case "$f" in *.expected.yaml) continue ;; esac
  name=$(basename "$f" .yaml)
  cp "$f" "$R/in/$name.yaml"
  "${IN[@]}" render -f "/in/$name.yaml" --wasm-sha256 $SHA >"$tmp/$name.out" 2>"$tmp/$name.err" || { cat "$tmp/$name.err" >&2; fail "render $name"; }
  grep -E '^(InferenceRoutingPolicy|HTTPRoute) ' "$tmp/$name.err" | sed 's/^/# /' >>"$tmp/$name.out" || true
  diff -u "controller/testdata/render/$name.expected.yaml" "$tmp/$name.out" >&2 || fail "render $name differs from its golden"
  cases=$((cases + 1))
done
[ "$cases" -ge 2 ] || fail "only $cases render cases"
ok "render -f of $cases testdata cases in the image equals the goldens"

# The module shipped in the image is the one gateways are told to fetch (URL and sha256).
"${IN[@]}" render -f /in/envoy-gateway.yaml --wasm-file /opt/warmpath/warmpath_filter.wasm >"$tmp/own.out" 2>/dev/null || fail "render --wasm-file"
grep -q "sha256: $sha_built" "$tmp/own.out" || fail "render with the image's module lacks its sha256"
grep -q "/wasm/warmpath_filter-${sha_built:0:16}.wasm" "$tmp/own.out" || fail "render with the image's module lacks its URL"
ok "render with the image's module renders its sha256 and URL"

# `feed` from the image: a real HTTP server on 127.0.0.1, fed from a file.
cat >"$R/in/feed.json" <<'EOF'
{"version":0,"endpoints":[{"address":"10.0.0.1:8000","load":{"waiting":3,"running":2,"kv_cache_usage":0.5}},{"address":"10.0.0.2:8000"}]}
EOF
timeout 60 "${IN[@]}" feed --listen 127.0.0.1:0 --key policy/demo/chat --file /in/feed.json >"$tmp/feed.out" 2>"$tmp/feed.err" &
feed_pid=$!
url=""
for _ in $(seq 1 100); do
  url=$(sed -n 's/^listening on //p' "$tmp/feed.out")
  [ -n "$url" ] && break
  kill -0 "$feed_pid" 2>/dev/null || { cat "$tmp/feed.err" >&2; fail "feed exited"; }
  sleep 0.1
done
case "$url" in http://127.0.0.1:*/v1/feed/policy/demo/chat) ;; *) fail "feed did not print its URL ('$url')" ;; esac
curl -fsS --max-time 5 "$url" >"$tmp/feed-got.json" || { cat "$tmp/feed.err" >&2; fail "GET $url"; }
"$PY" - "$tmp/feed-got.json" <<'PY' || fail "feed content"
import json, sys
s = json.load(open(sys.argv[1]))
eps = {e["address"]: e.get("load") for e in s["endpoints"]}
assert set(eps) == {"10.0.0.1:8000", "10.0.0.2:8000"}, eps
assert eps["10.0.0.1:8000"]["waiting"] == 3 and eps["10.0.0.1:8000"]["running"] == 2, eps
assert eps["10.0.0.2:8000"] is None, eps
PY
health=$(curl -fsS --max-time 5 "${url%%/v1/*}/healthz") || fail "GET /healthz"
[ "$health" = ok ] || fail "/healthz said '$health'"
kill "$feed_pid"; wait "$feed_pid" 2>/dev/null || true; feed_pid=""
ok "feed from the image serves the file's endpoints and /healthz on 127.0.0.1"

# `run` exactly as the chart starts it (its args and env; listen addresses moved to loopback port 0)
# against a loopback HTTPS server standing in for an API server without warmpath's CRDs: it answers
# every request 404 and logs it. There is no Kubernetes API server on this machine (docs/image.md).
# The controller must verify the server's certificate against the kubeconfig's CA (ring/rustls in
# the static binary), send the list request with its bearer token, and exit with the CRD hint — no
# panic, no hang. A server certificate from another CA must be refused.
PKI="$tmp/pki"
mkdir -p "$PKI"
(
  cd "$PKI"
  for ca in ca other; do
    openssl req -x509 -newkey rsa:2048 -nodes -keyout $ca.key -out $ca.crt -days 1 -subj "/CN=warmpath-test-$ca" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
  done
  openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext.cnf
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf -out server.crt
) >/dev/null 2>&1 || fail "openssl: test PKI"
cat >"$tmp/apiserver.py" <<'PY'
import http.server, json, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[2], "a") as log:
            log.write(f"{self.path} {self.headers.get('Authorization')}\n")
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "code": 404, "message": "the server could not find the requested resource"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(http.server.ThreadingHTTPServer):
    def get_request(self):  # the TLS handshake runs on accept: record a client's refusal
        try:
            return super().get_request()
        except ssl.SSLError as e:
            with open(sys.argv[2], "a") as log:
                log.write(f"TLS handshake failed: {e.reason}\n")
            raise
srv = S(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1] + "/server.crt", sys.argv[1] + "/server.key")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
PY
timeout 600 "$PY" "$tmp/apiserver.py" "$PKI" "$tmp/requests.log" >"$tmp/apiserver.port" 2>"$tmp/apiserver.err" &
api_pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/apiserver.port" ] && break; sleep 0.1; done
port=$(cat "$tmp/apiserver.port")
[ -n "$port" ] || { cat "$tmp/apiserver.err" >&2; fail "test HTTPS server did not start"; }
run_in_image() { # $1: CA file for the kubeconfig; output in $tmp/run.err, exit code in $rc
  cat >"$R/in/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:$port", certificate-authority-data: $(base64 -w0 "$1")}}]
users: [{name: u, user: {token: not-a-token}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: warmpath-system}}]
current-context: x
EOF
  chmod 0444 "$R/in/kubeconfig"
  rc=0
  (
    # shellcheck disable=SC1091
    . "$tmp/chart-env.sh"
    export WARMPATH_HTTP_ADDR=127.0.0.1:0 WARMPATH_METRICS_ADDR=127.0.0.1:0 POD_NAMESPACE=warmpath-system KUBECONFIG=/in/kubeconfig RUST_BACKTRACE=0
    exec timeout 60 "$CHROOT" --userspec="$uid:$uid" "$R" /usr/local/bin/warmpath-controller run
  ) >"$tmp/run.out" 2>"$tmp/run.err" || rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 124 ] || grep -q 'panicked' "$tmp/run.err"; then
    cat "$tmp/run.err" >&2
    fail "run with the chart's args/env: exit $rc, want a clean error (no panic, no hang)"
  fi
}
run_in_image "$PKI/ca.crt"
grep -q 'cannot list InferenceRoutingPolicies.*are the CRDs installed' "$tmp/run.err" || { cat "$tmp/run.err" >&2; fail "run: no CRD hint"; }
grep -q '^/apis/warmpath.dev/v1alpha1/inferenceroutingpolicies?.*limit=1.* Bearer not-a-token$' "$tmp/requests.log" \
  || { cat "$tmp/requests.log" >&2; fail "run: the list request did not reach the HTTPS server"; }
ok "run with the chart's args/env: TLS to the kubeconfig's server, list with its token, clean CRD hint on 404"
: >"$tmp/requests.log"
run_in_image "$PKI/other.crt"
# (The controller's message names only the connect error; the server sees the client's TLS alert.)
! grep -q '^/apis/' "$tmp/requests.log" || fail "run sent a request to a server whose certificate it should not trust"
alert=$(sed -n 's/^TLS handshake failed: //p' "$tmp/requests.log" | head -1)
case "$alert" in *ALERT*) ;; *) cat "$tmp/requests.log" "$tmp/run.err" >&2; fail "run: no TLS refusal seen by the server" ;; esac
ok "run refuses a server certificate from another CA (client alert $alert, exit $rc)"

# ==================================================================================================
# The agent image (controller/agent/Containerfile). One image, two users: the chart's DaemonSet
# (`run`) and the cold-node fallback init container the controller renders into InferenceEndpoint
# pods (`fetch`). Both write into kubelet-created, root-owned hostPath directories.
AR="$tmp/agent"
mkdir -p "$AR"
skopeo inspect --config "oci-archive:$agent_archive" >"$AR/config.json" || fail "skopeo inspect --config (agent)"
skopeo inspect --raw "oci-archive:$agent_archive" >"$AR/manifest.json" || fail "skopeo inspect --raw (agent)"
"$PY" - "$AR/config.json" "$AR/manifest.json" "$tmp/chart.yaml" "$TAG" >"$AR/ds.sh" <<'PY' || fail "agent image config does not match the chart"
import json, shlex, sys, yaml
config = json.load(open(sys.argv[1]))
manifest = json.load(open(sys.argv[2]))
docs = [d for d in yaml.safe_load_all(open(sys.argv[3])) if d]
tag = sys.argv[4]
def check(cond, msg):
    if not cond:
        raise SystemExit(f"[58-image] {msg}")
    print(f"[58-image] checked: {msg}", file=sys.stderr)
ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-agent"))
pod = ds["spec"]["template"]["spec"]
c = next(c for c in pod["containers"] if c["name"] == "agent")
dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-controller"))
ctl = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "controller")
cfg = config["config"]
check(config["os"] == "linux" and config["architecture"] == "amd64", f"agent platform linux/amd64 ({config['os']}/{config['architecture']})")
check(manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json" and len(manifest["layers"]) == 1, "agent: one-layer OCI image manifest")
image = f"ghcr.io/warmpath/warmpath-agent:{tag}"
check(c["image"] == image, f"DaemonSet image {c['image']} = {image} (the archive's tag)")
ctl_env = {e["name"]: e.get("value") for e in ctl["env"]}
check(ctl_env.get("WARMPATH_AGENT_IMAGE") == image, "the controller is told the same image for the init container (WARMPATH_AGENT_IMAGE)")
sc = c["securityContext"]
user = cfg.get("User", "")
check(user == "0:0", f"image user {user!r} is numeric root")
check(sc["runAsUser"] == 0 and "runAsNonRoot" not in sc and not pod.get("securityContext", {}).get("runAsNonRoot"),
      "DaemonSet runs the agent as uid 0 = the image user (root-owned hostPath)")
check(sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True,
      "DaemonSet drops all capabilities, no privilege escalation, read-only root filesystem")
check(cfg["Entrypoint"] == ["/usr/local/bin/warmpath-agent"], f"agent entrypoint {cfg['Entrypoint']}")
check("command" not in c and c["args"][0] == "run", "DaemonSet keeps the entrypoint (no command) and passes args [run, ...]")
check(cfg.get("Cmd") == ["run"], "default Cmd is [run]")
check(not cfg.get("ExposedPorts") and "ports" not in c, "no ports (the agent serves nothing)")
env = dict(e.split("=", 1) for e in cfg.get("Env", []))
check(env.get("SSL_CERT_FILE") == "/etc/ssl/certs/ca-certificates.crt", "SSL_CERT_FILE set")
check(env.get("HOME", "").startswith("/"), "HOME set (hf-hub needs a home directory; no /etc/passwd)")
mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
check(mounts["cache"] == "/cache" and "--root=/cache" in c["args"], "cache hostPath mounted at /cache = --root")
# For `run` below: the image's env, then the DaemonSet's args and literal env (NODE_NAME comes from
# the downward API; the caller sets it).
print("img_env=(" + " ".join(shlex.quote(e) for e in cfg.get("Env", [])) + ")")
print("ds_args=(" + " ".join(shlex.quote(a) for a in c["args"]) + ")")
print("ds_env=(" + " ".join(shlex.quote(f"{e['name']}={e['value']}") for e in c["env"] if "value" in e) + ")")
PY
ok "agent image config matches the chart (root user as the DaemonSet runs it, entrypoint/args, tag, env)"
# shellcheck disable=SC1090,SC1091
. "$AR/ds.sh"
index_ref=$("$PY" -c 'import json,sys,tarfile; t=tarfile.open(sys.argv[1]); i=json.load(t.extractfile("index.json")); print(i["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])' "$agent_archive")
[ "$index_ref" = "warmpath-agent:$TAG" ] || fail "agent archive ref name $index_ref"
ok "archive reference warmpath-agent:$TAG"

mkdir -p "$AR/oci"
tar -xf "$agent_archive" -C "$AR/oci"
umoci unpack --image "$AR/oci:warmpath-agent:$TAG" "$AR/bundle" >/dev/null || fail "umoci unpack (agent)"
RA="$AR/bundle/rootfs"
files=$(cd "$RA" && find . -mindepth 1 \( -type f -o -type l \) -printf '%P %m %U\n' | sort)
want=$'etc/ssl/certs/ca-certificates.crt 444 0\nusr/local/bin/warmpath-agent 555 0'
[ "$files" = "$want" ] || fail "agent image files differ: got
$files"
ok "agent image holds exactly the binary and the CA bundle (root-owned, read-only)"
cmp -s "$RA/usr/local/bin/warmpath-agent" "$AGENT_BIN" || fail "agent binary in the image differs from $AGENT_BIN"
! readelf -l "$RA/usr/local/bin/warmpath-agent" | grep -q 'program interpreter' || fail "agent binary is dynamically linked"
ok "agent binary = the musl build, statically linked"
cmp -s "$RA/etc/ssl/certs/ca-certificates.crt" /etc/ssl/certs/ca-certificates.crt || fail "agent CA bundle differs from Debian's"
ok "agent CA bundle = Debian's ca-certificates"

# Runs from the unpacked rootfs like a runtime would: only the image's env (plus $extra), as $1.
agent_in() { # $1 uid, rest: args; env additions in the array `extra`
  local u=$1; shift
  env -i "${img_env[@]}" "${extra[@]}" RUST_BACKTRACE=0 timeout 120 "$CHROOT" --userspec="$u:$u" "$RA" /usr/local/bin/warmpath-agent "$@"
}
extra=()
out=$(agent_in 0 --version) || fail "agent --version in the image"
[ "$out" = "warmpath-agent $version" ] || fail "agent --version printed '$out', want 'warmpath-agent $version'"
agent_in 0 --help >"$AR/help.out" || fail "agent --help in the image"
for sub in run fetch remove; do grep -q "^  $sub " "$AR/help.out" || { cat "$AR/help.out" >&2; fail "agent --help lacks $sub"; }; done
ok "agent runs as uid 0 in the image: $out; --help lists run, fetch, remove"

# A loopback HTTP(S) file server with what the agent's object_store client needs: HEAD with size and
# ETag, ranged GETs answered 206, If-Match honoured. It records each request (and TLS refusals).
cat >"$AR/fileserver.py" <<'PY'
import hashlib, http.server, os, re, ssl, sys
root, log_path, pki = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "")
def log(line):
    with open(log_path, "a") as f:
        f.write(line + "\n")
class H(http.server.BaseHTTPRequestHandler):
    def _file(self):
        p = os.path.realpath(os.path.join(root, self.path.split("?")[0].lstrip("/")))
        if not p.startswith(os.path.realpath(root) + "/") or not os.path.isfile(p):
            self.send_error(404)
            return None
        st = os.stat(p)
        return p, st.st_size, '"%s"' % hashlib.sha256(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    def do_HEAD(self):
        log(f"HEAD {self.path}")
        f = self._file()
        if f:
            self.send_response(200)
            self.send_header("Content-Length", str(f[1]))
            self.send_header("ETag", f[2])
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
    def do_GET(self):
        rng = self.headers.get("Range", "")
        log(f"GET {self.path} {rng} if-match={self.headers.get('If-Match')}")
        f = self._file()
        if not f:
            return
        path, size, etag = f
        if self.headers.get("If-Match") not in (None, etag):
            self.send_error(412)
            return
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
        start, end = (int(m.group(1)), min(int(m.group(2) or size - 1), size - 1)) if m else (0, size - 1)
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("ETag", etag)
        self.end_headers()
        with open(path, "rb") as fh:
            fh.seek(start)
            self.wfile.write(fh.read(end - start + 1))
    def log_message(self, *a):
        pass
class S(http.server.ThreadingHTTPServer):
    def get_request(self):
        try:
            return super().get_request()
        except ssl.SSLError as e:
            log(f"TLS handshake failed: {e.reason}")
            raise
srv = S(("127.0.0.1", 0), H)
if pki:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki + "/server.crt", pki + "/server.key")
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
PY
mkdir -p "$AR/www/models/tiny"
# 20 MiB + 4567 bytes: two ranged reads at the default 16 MiB range size.
head -c $((20 * 1024 * 1024 + 4567)) /dev/urandom >"$AR/www/models/tiny/model.safetensors"
weights_sha=$(sha256sum "$AR/www/models/tiny/model.safetensors" | cut -d' ' -f1)
weights_size=$(stat -c %s "$AR/www/models/tiny/model.safetensors")
start_fileserver() { # $1 log, $2 port file, [$3 pki]; the server's pid in $srv_pid
  timeout 600 "$PY" "$AR/fileserver.py" "$AR/www" "$1" ${3:+"$3"} >"$2" 2>"$2.err" &
  srv_pid=$!
  for _ in $(seq 1 100); do [ -s "$2" ] && break; sleep 0.1; done
  [ -s "$2" ] || { cat "$2.err" >&2; fail "file server did not start"; }
}
start_fileserver "$AR/http.log" "$AR/http.port"
http_pid=$srv_pid
http_port=$(cat "$AR/http.port")

# The init container as the controller renders it: `warmpath-controller render` (the image's own
# controller build) on an InferenceEndpoint whose weights are the file above, with the chart's
# WARMPATH_AGENT_IMAGE. (The wasm sha256 only matters for routing objects; none are rendered here.)
cat >"$AR/endpoint.yaml" <<EOF
apiVersion: warmpath.dev/v1alpha1
kind: InferenceEndpoint
metadata: {name: tiny, namespace: ml}
spec:
  model:
    http: {url: "http://127.0.0.1:$http_port/models/tiny/model.safetensors"}
  sha256: {model.safetensors: $weights_sha}
  image: registry.example/model-server:1
  modelCacheConfig:
    weightsCache: {enabled: true}
EOF
(
  # shellcheck disable=SC1091
  . "$tmp/chart-env.sh"
  "$TARGET_DIR/x86_64-unknown-linux-musl/image/warmpath-controller" render -f "$AR/endpoint.yaml" --wasm-sha256 "0000000000000000000000000000000000000000000000000000000000000000"
) >"$AR/rendered.yaml" || fail "warmpath-controller render (InferenceEndpoint)"
"$PY" - "$AR/rendered.yaml" "ghcr.io/warmpath/warmpath-agent:$TAG" >"$AR/init.sh" <<'PY' || fail "rendered init container"
import shlex, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
dep = next(d for d in docs if d["kind"] == "Deployment")
pod = dep["spec"]["template"]["spec"]
inits = pod["initContainers"]
assert len(inits) == 1, inits
c = inits[0]
def check(cond, msg):
    if not cond:
        raise SystemExit(f"[58-image] init container: {msg}: {c}")
    print(f"[58-image] checked: init container {msg}", file=sys.stderr)
check(c["image"] == sys.argv[2], f"image = the chart's agent image {sys.argv[2]}")
check("command" not in c and c["args"][0] == "fetch", "keeps the entrypoint (no command), args [fetch, ...]")
check("securityContext" not in c and "securityContext" not in pod, "sets no securityContext: runs as the image's user")
a = c["args"]
key = a[a.index("--key") + 1]
check(a[a.index("--root") + 1] == "/cache" and [m["mountPath"] for m in c["volumeMounts"]] == [f"/cache/{key}"],
      f"mounts its weights volume at --root/--key = /cache/{key}")
vol = next(v for v in pod["volumes"] if v["name"] == c["volumeMounts"][0]["name"])
check(vol["hostPath"]["type"] == "DirectoryOrCreate", f"volume is hostPath {vol['hostPath']['path']} (DirectoryOrCreate: kubelet creates it root-owned 0755)")
print("init_args=(" + " ".join(shlex.quote(x) for x in a) + ")")
print(f"key={shlex.quote(key)}")
PY
# shellcheck disable=SC1090,SC1091
. "$AR/init.sh"
ok "controller renders the init container with the chart's agent image, no command, args ${init_args[*]:0:2}..., as the image user"

# Fetch exactly as rendered, into a root-owned 0755 directory like the kubelet's hostPath.
fresh_cache() { rm -rf "$RA/cache"; install -d -m 0755 -o 0 -g 0 "$RA/cache" "$RA/cache/$key"; }
fetch_report() { # $1 name; reads the agent's last stdout line as JSON; rc in $frc
  frc=0
  agent_in "$fetch_uid" "${@:2}" >"$AR/$1.out" 2>"$AR/$1.err" || frc=$?
  ! grep -q panicked "$AR/$1.err" || { cat "$AR/$1.err" >&2; fail "$1: the agent panicked"; }
  tail -1 "$AR/$1.out" >"$AR/$1.json"
}
json() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$@"; }
fresh_cache
fetch_uid=0
fetch_report fetch1 "${init_args[@]}"
[ "$frc" = 0 ] || { cat "$AR/fetch1.out" "$AR/fetch1.err" >&2; fail "fetch with the rendered args exited $frc"; }
[ "$(json "$AR/fetch1.json" 'd["phase"]')" = Ready ] || fail "fetch printed $(cat "$AR/fetch1.json")"
[ "$(json "$AR/fetch1.json" '(d["report"]["key"], d["report"]["files"], d["report"]["bytesTotal"], d["report"]["bytesFetched"], d["report"]["alreadyCurrent"], d["report"]["path"])')" \
  = "('$key', 1, $weights_size, $weights_size, False, '/cache/$key/current')" ] || fail "fetch report: $(cat "$AR/fetch1.json")"
got=$(sha256sum "$RA/cache/$key/current/model.safetensors" | cut -d' ' -f1)
[ "$got" = "$weights_sha" ] || fail "fetched file sha256 $got != $weights_sha"
ranges=$(grep -c '^GET /models/tiny/model.safetensors bytes=' "$AR/http.log" || true)
[ "$ranges" = 2 ] || { cat "$AR/http.log" >&2; fail "want 2 ranged GETs at the default range size, saw $ranges"; }
! grep -q 'if-match=None' "$AR/http.log" || fail "a ranged GET was sent without If-Match"
version1=$(json "$AR/fetch1.json" 'd["report"]["version"]')
ok "fetch (rendered init-container args, uid 0) from 127.0.0.1: Ready, $weights_size bytes in $ranges ranged GETs with If-Match, sha256 matches"

# A warm node: the same args return at once without fetching.
: >"$AR/http.log"
fetch_report fetch2 "${init_args[@]}"
[ "$frc" = 0 ] && [ "$(json "$AR/fetch2.json" '(d["phase"], d["report"]["alreadyCurrent"], d["report"]["bytesFetched"], d["report"]["version"])')" = "('Ready', True, 0, '$version1')" ] \
  || { cat "$AR/fetch2.out" "$AR/fetch2.err" >&2; fail "second fetch on the warm cache"; }
! grep -q '^GET ' "$AR/http.log" || fail "warm fetch downloaded again"
ok "fetch again on the warm cache: alreadyCurrent, 0 bytes fetched, no GET"

# Wrong checksum: fails with the checksum reason and keeps the current version.
wrong=$(printf '%064d' 0)
bad_args=()
for ((i = 0; i < ${#init_args[@]}; i++)); do
  if [ "${init_args[$i]}" = --sha256 ]; then bad_args+=(--sha256 "model.safetensors=$wrong"); i=$((i + 1)); else bad_args+=("${init_args[$i]}"); fi
done
fetch_report fetch3 "${bad_args[@]}"
[ "$frc" != 0 ] || fail "fetch with a wrong --sha256 succeeded"
[ "$(json "$AR/fetch3.json" '(d["phase"], d["reason"])')" = "('Failed', 'ChecksumMismatch')" ] || fail "wrong checksum printed $(cat "$AR/fetch3.json")"
got=$(sha256sum "$RA/cache/$key/current/model.safetensors" | cut -d' ' -f1)
[ "$got" = "$weights_sha" ] || fail "the failed fetch changed the current version"
ok "fetch with a wrong --sha256 fails (exit $frc, reason ChecksumMismatch) and keeps the current version"

# Why the image runs as root: the same fetch as a non-root user cannot write the root-owned hostPath.
fresh_cache
fetch_uid=65532
fetch_report fetch4 "${init_args[@]}"
[ "$frc" != 0 ] && [ "$(json "$AR/fetch4.json" 'd["reason"]')" = DiskError ] || fail "non-root fetch into a root-owned dir: exit $frc, $(cat "$AR/fetch4.json")"
ok "as uid 65532 the same fetch fails with DiskError (root-owned 0755 hostPath): the image user must be root"

# HTTPS: the agent's object_store client trusts SSL_CERT_FILE (the image's Debian bundle), so a server
# certificate from a private CA is refused; with SSL_CERT_FILE pointing at that CA it downloads.
start_fileserver "$AR/https.log" "$AR/https.port" "$PKI"
https_pid=$srv_pid
https_url="https://127.0.0.1:$(cat "$AR/https.port")/models/tiny/model.safetensors"
tls_args=()
for ((i = 0; i < ${#init_args[@]}; i++)); do
  if [ "${init_args[$i]}" = --source ]; then tls_args+=(--source "$https_url"); i=$((i + 1)); else tls_args+=("${init_args[$i]}"); fi
done
fresh_cache
# object_store retries connect errors (10 times, backoff up to 15 s): watch for the first refusal
# the server records, then stop the agent instead of waiting out its retries.
env -i "${img_env[@]}" RUST_BACKTRACE=0 timeout 120 "$CHROOT" --userspec=0:0 "$RA" /usr/local/bin/warmpath-agent "${tls_args[@]}" \
  >"$AR/fetch5.out" 2>"$AR/fetch5.err" &
agent_pid=$!
for _ in $(seq 1 100); do grep -q '^TLS handshake failed' "$AR/https.log" 2>/dev/null && break; sleep 0.1; done
kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; agent_pid=""
alert=$(sed -n 's/^TLS handshake failed: //p' "$AR/https.log" | head -1)
case "$alert" in *ALERT*) ;; *) cat "$AR/https.log" "$AR/fetch5.err" >&2; fail "https with the image's CA bundle: the server saw no TLS refusal" ;; esac
! grep -q '^HEAD \|^GET ' "$AR/https.log" || fail "the agent sent a request over an untrusted connection"
! grep -q panicked "$AR/fetch5.err" || { cat "$AR/fetch5.err" >&2; fail "https fetch panicked"; }
mkdir -p "$RA/in"
cp "$PKI/ca.crt" "$RA/in/test-ca.crt"
extra=(SSL_CERT_FILE=/in/test-ca.crt)
fetch_uid=0
fetch_report fetch6 "${tls_args[@]}"
extra=()
[ "$frc" = 0 ] && [ "$(json "$AR/fetch6.json" 'd["phase"]')" = Ready ] || { cat "$AR/fetch6.out" "$AR/fetch6.err" >&2; fail "https with SSL_CERT_FILE trusting the CA: exit $frc"; }
[ "$(sha256sum "$RA/cache/$key/current/model.safetensors" | cut -d' ' -f1)" = "$weights_sha" ] || fail "https fetch sha256"
ok "https fetch: refused with the image's CA bundle (client alert $alert), Ready with SSL_CERT_FILE trusting the server's CA"
# hf:// with only the image's env: hf-hub needs a home directory (there is no /etc/passwd) and
# panics without one; the image sets HOME. A Hub without the repo (the file server's 404) is HubError.
fresh_cache
fetch_report fetch7 fetch --source "hf://org/tiny?endpoint=http://127.0.0.1:$http_port" --root /cache --key "$key"
[ "$frc" != 0 ] && [ "$(json "$AR/fetch7.json" 'd["reason"]')" = HubError ] || { cat "$AR/fetch7.err" >&2; fail "hf:// fetch: exit $frc, $(cat "$AR/fetch7.json")"; }
grep -q '^GET /api/models/org/tiny/revision/main' "$AR/http.log" || { cat "$AR/http.log" >&2; fail "hf:// fetch did not ask the Hub API"; }
ok "hf:// fetch with the image's env asks the Hub API and fails cleanly (HubError, no panic)"
kill "$http_pid" "$https_pid" 2>/dev/null || true; wait "$http_pid" "$https_pid" 2>/dev/null || true; http_pid=""; https_pid=""

# The DaemonSet's `run` with the chart's args and env against the loopback HTTPS API stand-in (404 to
# everything): it verifies TLS with the kubeconfig's CA, asks for its Node with the token, keeps
# polling through the errors, and stops cleanly on SIGTERM. Nothing is written outside the /cache mount
# (the chart sets readOnlyRootFilesystem).
rm -rf "$RA/cache" "$RA/in"
install -d -m 0755 "$RA/cache" "$RA/in"
cat >"$RA/in/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:$port", certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")}}]
users: [{name: u, user: {token: agent-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
EOF
before=$(cd "$RA" && find . -path ./cache -prune -o -path ./in -prune -o -print | sort)
: >"$tmp/requests.log"
env -i "${img_env[@]}" "${ds_env[@]}" NODE_NAME=node-a KUBECONFIG=/in/kubeconfig RUST_BACKTRACE=0 \
  timeout 120 "$CHROOT" --userspec=0:0 "$RA" /usr/local/bin/warmpath-agent "${ds_args[@]}" >"$AR/run.out" 2>"$AR/run.err" &
agent_pid=$!
for _ in $(seq 1 150); do
  grep -q '^/api/v1/nodes/node-a Bearer agent-token$' "$tmp/requests.log" && grep -q 'node pass failed' "$AR/run.err" && break
  kill -0 "$agent_pid" 2>/dev/null || break
  sleep 0.2
done
kill -0 "$agent_pid" 2>/dev/null || { cat "$AR/run.err" >&2; fail "agent run exited early"; }
grep -q '^/api/v1/nodes/node-a Bearer agent-token$' "$tmp/requests.log" || { cat "$tmp/requests.log" "$AR/run.err" >&2; fail "agent run: no Node GET with its token"; }
kill -TERM "$agent_pid"
rc=0
wait "$agent_pid" || rc=$?
agent_pid=""
[ "$rc" = 0 ] || { cat "$AR/run.err" >&2; fail "agent run: exit $rc after SIGTERM, want 0"; }
! grep -q panicked "$AR/run.err" || fail "agent run panicked"
after=$(cd "$RA" && find . -path ./cache -prune -o -path ./in -prune -o -print | sort)
[ "$before" = "$after" ] || fail "agent run wrote outside /cache"
ok "agent run with the DaemonSet's args/env: TLS to the API stand-in, GET its Node with the token, polls through 404s, exits 0 on SIGTERM, writes nothing outside /cache"
kill "$api_pid"; wait "$api_pid" 2>/dev/null || true; api_pid=""

# Same inputs, same images: the second build is a cargo no-op and must give the same digests.
bash scripts/build-image.sh --out "$tmp/out2" >"$tmp/archives2" || fail "second build"
digests=()
for n in 1 2; do
  d1=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$(sed -n ${n}p "$tmp/archives")")
  d2=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$(sed -n ${n}p "$tmp/archives2")")
  [ "$d1" = "$d2" ] || fail "rebuild changed the digest of $(sed -n ${n}p "$tmp/archives"): $d1 -> $d2"
  digests+=("$d1")
done
ok "rebuild is reproducible (controller ${digests[0]}, agent ${digests[1]})"

echo "[58-image] $pass passed, 0 failed"
