#!/usr/bin/env bash
# The controller container image (scripts/build-image.sh, controller/Containerfile), checked for real
# without a container engine: the OCI archive is built, read with skopeo, unpacked with umoci, and
# the binary is run from the unpacked root filesystem with chroot as the image's user.
#   - config: non-root numeric user equal to the chart's runAsUser; Entrypoint + the chart's args
#     (the Deployment sets no command) form the controller's `run`; ports match the chart's;
#   - content: exactly the binary, the wasm module and the CA bundle; the module at the chart's
#     WARMPATH_WASM_FILE path is byte-identical (sha256) to the freshly built one; the binary is static;
#   - behaviour: `render -f` of every controller/testdata/render case equals its golden; `render`
#     with the image's module renders that module's sha256; `feed` serves a feed file on 127.0.0.1;
#     `run` with the chart's args/env verifies TLS to a loopback HTTPS stand-in for an API server
#     without the CRDs (404s), lists with its token and exits with the CRD hint (no panic); a server
#     certificate from another CA is refused;
#   - reproducibility: building again gives the same image digest.
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
cleanup() {
  for p in $feed_pid $api_pid; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
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
archive=$(bash scripts/build-image.sh --out "$tmp/out" | tail -1) || fail "scripts/build-image.sh"
echo "[58-image] build took $(( $(date +%s) - start )) s ($(du -h "$archive" | cut -f1))" >&2
[ -s "$archive" ] || fail "no archive at '$archive'"
ok "scripts/build-image.sh wrote $(basename "$archive")"
TAG=$(awk -F'"' '/^appVersion:/ {print $2}' charts/warmpath/Chart.yaml)
[ "$(basename "$archive")" = "warmpath-controller-$TAG.oci.tar" ] || fail "archive not named for the chart appVersion $TAG: $archive"
WASM="$TARGET_DIR/wasm32-wasip1/release/warmpath_filter.wasm"
BIN="$TARGET_DIR/x86_64-unknown-linux-musl/image/warmpath-controller"

# --- config vs the chart --------------------------------------------------------------------------
skopeo inspect --config "oci-archive:$archive" >"$tmp/config.json" || fail "skopeo inspect --config"
skopeo inspect --raw "oci-archive:$archive" >"$tmp/manifest.json" || fail "skopeo inspect --raw"
"$HELM" template wp charts/warmpath --namespace warmpath-system >"$tmp/chart.yaml" || fail "helm template"
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
  grep '^InferenceRoutingPolicy ' "$tmp/$name.err" | sed 's/^/# /' >>"$tmp/$name.out" || true
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
timeout 120 "$PY" "$tmp/apiserver.py" "$PKI" "$tmp/requests.log" >"$tmp/apiserver.port" 2>"$tmp/apiserver.err" &
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
kill "$api_pid"; wait "$api_pid" 2>/dev/null || true; api_pid=""

# Same inputs, same image: the second build is a cargo no-op and must give the same digest.
archive2=$(bash scripts/build-image.sh --out "$tmp/out2" | tail -1) || fail "second build"
d1=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive")
d2=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive2")
[ "$d1" = "$d2" ] || fail "rebuild changed the digest: $d1 -> $d2"
ok "rebuild is reproducible ($d1)"

echo "[58-image] $pass passed, 0 failed"
