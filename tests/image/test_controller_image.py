"""The controller image (controller/Containerfile): its config against the chart's Deployment, its wasm
module, and the controller run from the unpacked image as the image's user: `render`, `feed`, and `run`
as the chart starts it against the HTTPS API stand-in."""
import difflib
import json
import re
import urllib.request

import pytest

from support import REPO, inside, kubeconfig, sha256_file, stop, wait_until

WASM_PATH = "/opt/warmpath/warmpath_filter.wasm"
# The sha256 the goldens were rendered with (controller/tests/render_golden.rs).
GOLDEN_SHA = "045fe3661531d607341bb5878db489d5cd8a55f65289da111fb3d42075e74101"
RENDER_DIR = "controller/testdata/render"


CASES = sorted(p.name[:-len(".yaml")] for p in (REPO / RENDER_DIR).glob("*.yaml") if not p.name.endswith(".expected.yaml"))


# === config against the chart ====================================================================

def test_user_is_numeric_and_non_root(controller_image):
    uid = controller_image.cfg.get("User", "").split(":")[0]
    assert uid.isdigit() and int(uid) != 0, controller_image.cfg.get("User")


def test_user_is_the_charts_run_as_user(controller_image, controller_pod):
    sc = controller_pod["securityContext"]
    assert controller_image.uid == sc["runAsUser"]
    assert sc["runAsNonRoot"] is True


def test_deployment_keeps_the_entrypoint_and_passes_run(controller_container):
    assert "command" not in controller_container
    assert controller_container["args"] == ["run"]


def test_chart_image_has_the_archive_tag(controller_container, tag):
    assert controller_container["image"].endswith(f"/warmpath-controller:{tag}")


def test_exposed_ports_are_the_chart_container_ports(controller_image, controller_container):
    ports = {f"{p['containerPort']}/tcp" for p in controller_container["ports"]}
    assert set(controller_image.cfg.get("ExposedPorts", {})) == ports


def test_chart_runs_it_read_only(controller_container):
    """The controller writes no files."""
    assert controller_container["securityContext"]["readOnlyRootFilesystem"] is True


def test_chart_wasm_file_is_the_module_in_the_image(controller_env):
    assert controller_env["WARMPATH_WASM_FILE"] == WASM_PATH


# === content =====================================================================================

def test_wasm_module_is_the_freshly_built_one(controller_image, target_dir):
    built = target_dir / "wasm32-wasip1/release/warmpath_filter.wasm"
    assert sha256_file(controller_image.rootfs / WASM_PATH.lstrip("/")) == sha256_file(built)


# === behaviour ===================================================================================

@pytest.mark.parametrize("case", CASES)
def test_render_case_equals_its_golden(controller_image, case):
    """The same text controller/tests/render_golden.rs compares: the objects, then the conditions."""
    src = (REPO / RENDER_DIR / f"{case}.yaml").read_text()
    with inside(controller_image, "in", {f"{case}.yaml": src}):
        r = controller_image.run(["render", "-f", f"/in/{case}.yaml", "--wasm-sha256", GOLDEN_SHA], timeout=60)
    assert r.returncode == 0, r.stderr
    conditions = [f"# {line}\n" for line in r.stderr.splitlines() if re.match(r"(InferenceRoutingPolicy|HTTPRoute) ", line)]
    got = r.stdout + "".join(conditions)
    want = (REPO / RENDER_DIR / f"{case}.expected.yaml").read_text()
    assert got == want, "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "image"))


def test_there_are_render_cases():
    assert len(CASES) >= 2, CASES


def test_render_with_the_images_module_names_its_sha256_and_url(controller_image):
    """The module shipped in the image is the one gateways are told to fetch."""
    sha = sha256_file(controller_image.rootfs / WASM_PATH.lstrip("/"))
    src = (REPO / RENDER_DIR / "envoy-gateway.yaml").read_text()
    with inside(controller_image, "in", {"envoy-gateway.yaml": src}):
        r = controller_image.run(["render", "-f", "/in/envoy-gateway.yaml", "--wasm-file", WASM_PATH], timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"sha256: {sha}" in r.stdout
    assert f"/wasm/warmpath_filter-{sha[:16]}.wasm" in r.stdout


FEED = {"version": 0, "endpoints": [
    {"address": "10.0.0.1:8000", "load": {"waiting": 3, "running": 2, "kv_cache_usage": 0.5}},
    {"address": "10.0.0.2:8000"},
]}


def test_feed_serves_the_files_endpoints_and_healthz(controller_image, tmp_path):
    out, err = tmp_path / "feed.out", tmp_path / "feed.err"
    with inside(controller_image, "in", {"feed.json": json.dumps(FEED)}):
        proc = controller_image.start(["feed", "--listen", "127.0.0.1:0", "--key", "policy/demo/chat", "--file", "/in/feed.json"], out, err)
        try:
            def url():
                m = re.search(r"^listening on (\S+)$", out.read_text(), re.M)
                return m.group(1) if m else (proc.poll() is not None and "exited")
            wait_until(url, 10)
            u = url()
            assert u and re.fullmatch(r"http://127\.0\.0\.1:\d+/v1/feed/policy/demo/chat", u), (u, err.read_text())
            with urllib.request.urlopen(u, timeout=5) as resp:
                snapshot = json.load(resp)
            with urllib.request.urlopen(u.split("/v1/")[0] + "/healthz", timeout=5) as resp:
                health = resp.read().decode()
        finally:
            stop(proc)
    eps = {e["address"]: e.get("load") for e in snapshot["endpoints"]}
    assert set(eps) == {"10.0.0.1:8000", "10.0.0.2:8000"}, eps
    assert (eps["10.0.0.1:8000"]["waiting"], eps["10.0.0.1:8000"]["running"]) == (3, 2), eps
    assert eps["10.0.0.2:8000"] is None, eps
    assert health.rstrip("\n") == "ok"


def run_as_the_chart_starts_it(controller_image, controller_container, controller_env, api_server, ca_pem):
    """`run` with the chart's args and env (listen addresses moved to loopback port 0) and a kubeconfig
    naming the API stand-in and `ca_pem`. It must end on its own with an error: not 0, no panic, no hang."""
    kc = kubeconfig(api_server.url(), ca_pem, "not-a-token", namespace="warmpath-system")
    env = {**controller_env, "WARMPATH_HTTP_ADDR": "127.0.0.1:0", "WARMPATH_METRICS_ADDR": "127.0.0.1:0",
           "POD_NAMESPACE": "warmpath-system", "KUBECONFIG": "/in/kubeconfig", "RUST_BACKTRACE": "0"}
    with inside(controller_image, "in", {"kubeconfig": kc}):
        r = controller_image.run(controller_container["args"], env=env, timeout=60)
    assert r.returncode != 0, r.stderr
    assert "panicked" not in r.stderr, r.stderr
    return r


def test_run_verifies_tls_lists_with_its_token_and_hints_at_the_crds(
        controller_image, controller_container, controller_env, api_server, pki):
    """Against an API server without warmpath's CRDs (404s): TLS verified with the kubeconfig's CA
    (rustls in the static binary), the list request sent with the bearer token, then the CRD hint."""
    r = run_as_the_chart_starts_it(controller_image, controller_container, controller_env, api_server,
                                   (pki / "ca.crt").read_bytes())
    assert re.search(r"cannot list InferenceRoutingPolicies.*are the CRDs installed", r.stderr), r.stderr
    lists = [q for q in api_server.requests
             if re.match(r"/apis/warmpath\.dev/v1alpha1/inferenceroutingpolicies\?.*limit=1", q.path)]
    assert any(q.authorization == "Bearer not-a-token" for q in lists), api_server.requests


def test_run_refuses_a_server_certificate_from_another_ca(
        controller_image, controller_container, controller_env, api_server, pki):
    """The controller's message names only the connect error; the server sees the client's TLS alert."""
    run_as_the_chart_starts_it(controller_image, controller_container, controller_env, api_server,
                               (pki / "other.crt").read_bytes())
    assert not [q for q in api_server.requests if q.path.startswith("/apis/")], api_server.requests
    # The server thread records the refused handshake when it reads the client's alert, which may be just
    # after the controller has exited.
    wait_until(lambda: api_server.tls_failures, 10)
    assert api_server.tls_failures and "ALERT" in api_server.tls_failures[0], api_server.tls_failures
