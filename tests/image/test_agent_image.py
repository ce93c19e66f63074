"""The agent image (controller/agent/Containerfile). One image, two users: the chart's DaemonSet (`run`)
and the cold-node fallback init container the controller renders into InferenceEndpoint pods (`fetch`).
Both write into kubelet-created, root-owned hostPath directories, hence the root user. Checked: the
config against the chart, the init container as the controller renders it, and the agent run from the
unpacked image: `fetch` from the file stand-in over HTTP and HTTPS and from an hf:// source, `run`
against the HTTPS API stand-in."""
import json
import os
import re
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from support import inside, kubeconfig, sha256_file, stop, wait_until

CACHE = "/cache"
# 20 MiB + 4567 bytes: two ranged reads at the agent's default 16 MiB range size.
WEIGHTS_SIZE = 20 * 1024 * 1024 + 4567
WEIGHTS_PATH = "/models/tiny/model.safetensors"


@pytest.fixture(scope="module")
def agent_image_ref(tag) -> str:
    return f"ghcr.io/warmpath/warmpath-agent:{tag}"


# === config against the chart ====================================================================

def test_daemonset_image_has_the_archive_tag(agent_container, agent_image_ref):
    assert agent_container["image"] == agent_image_ref


def test_controller_is_told_the_same_image_for_the_init_container(controller_container, agent_image_ref):
    env = {e["name"]: e.get("value") for e in controller_container["env"]}
    assert env.get("WARMPATH_AGENT_IMAGE") == agent_image_ref


def test_user_is_numeric_root(agent_image):
    assert agent_image.cfg.get("User") == "0:0"


def test_daemonset_runs_it_as_the_image_user(agent_pod, agent_container):
    """uid 0 = the image user: the hostPath is root-owned."""
    sc = agent_container["securityContext"]
    assert sc["runAsUser"] == 0
    assert "runAsNonRoot" not in sc
    assert not agent_pod.get("securityContext", {}).get("runAsNonRoot")


def test_daemonset_drops_capabilities_and_privilege_escalation_with_a_read_only_root(agent_container):
    sc = agent_container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True


def test_daemonset_keeps_the_entrypoint_and_passes_run(agent_container):
    assert "command" not in agent_container
    assert agent_container["args"][0] == "run"


def test_no_ports(agent_image, agent_container):
    """The agent serves nothing."""
    assert not agent_image.cfg.get("ExposedPorts")
    assert "ports" not in agent_container


def test_home_is_set(agent_image):
    """hf-hub needs a home directory and there is no /etc/passwd to look it up in."""
    assert agent_image.env.get("HOME", "").startswith("/")


def test_cache_host_path_is_mounted_at_the_root(agent_container):
    mounts = {m["name"]: m["mountPath"] for m in agent_container["volumeMounts"]}
    assert mounts["cache"] == CACHE
    assert f"--root={CACHE}" in agent_container["args"]


def test_help_lists_the_subcommands(agent_image):
    r = agent_image.run(["--help"], timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for sub in ("run", "fetch", "remove"):
        assert any(line.startswith(f"  {sub} ") for line in lines), r.stdout


# === the init container, as the controller renders it ============================================

class Weights(NamedTuple):
    sha256: str
    size: int


@pytest.fixture(scope="module")
def weights(www) -> Weights:
    p = www / WEIGHTS_PATH.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(os.urandom(WEIGHTS_SIZE))
    return Weights(sha256_file(p), p.stat().st_size)


@pytest.fixture(scope="module")
def rendered_pod(controller_image, controller_env, file_server, weights) -> dict:
    """`warmpath-controller render`, from the controller image with the chart's env (so the chart's
    WARMPATH_AGENT_IMAGE), of an InferenceEndpoint whose weights are the file stand-in's file. The wasm
    sha256 only matters for routing objects; none are rendered here."""
    endpoint = {
        "apiVersion": "warmpath.dev/v1alpha1", "kind": "InferenceEndpoint",
        "metadata": {"name": "tiny", "namespace": "ml"},
        "spec": {"model": {"http": {"url": file_server.url(WEIGHTS_PATH)}},
                 "sha256": {"model.safetensors": weights.sha256},
                 "image": "registry.example/model-server:1",
                 "modelCacheConfig": {"weightsCache": {"enabled": True}}},
    }
    with inside(controller_image, "in", {"endpoint.yaml": yaml.safe_dump(endpoint)}):
        r = controller_image.run(["render", "-f", "/in/endpoint.yaml", "--wasm-sha256", "0" * 64],
                                 env=controller_env, timeout=60)
    assert r.returncode == 0, r.stderr
    dep = next(d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "Deployment")
    return dep["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def init_container(rendered_pod) -> dict:
    return rendered_pod["initContainers"][0]


@pytest.fixture(scope="module")
def init_args(init_container) -> list:
    return init_container["args"]


def arg(args: list, name: str) -> str:
    return args[args.index(name) + 1]


def with_arg(args: list, name: str, value: str) -> list:
    i = args.index(name)
    return [*args[:i + 1], value, *args[i + 2:]]


@pytest.fixture(scope="module")
def key(init_args) -> str:
    return arg(init_args, "--key")


def test_rendered_pod_has_one_init_container(rendered_pod):
    assert len(rendered_pod["initContainers"]) == 1, rendered_pod["initContainers"]


def test_init_container_uses_the_charts_agent_image(init_container, agent_image_ref):
    assert init_container["image"] == agent_image_ref


def test_init_container_keeps_the_entrypoint_and_passes_fetch(init_container):
    assert "command" not in init_container
    assert init_container["args"][0] == "fetch"


def test_init_container_sets_no_security_context(rendered_pod, init_container):
    """So it runs as the image's user."""
    assert "securityContext" not in init_container
    assert "securityContext" not in rendered_pod


def test_init_container_mounts_its_volume_at_root_and_key(init_container, init_args, key):
    assert arg(init_args, "--root") == CACHE
    assert [m["mountPath"] for m in init_container["volumeMounts"]] == [f"{CACHE}/{key}"]


def test_init_container_volume_is_a_host_path_the_kubelet_creates(rendered_pod, init_container):
    """DirectoryOrCreate: the kubelet creates it root-owned, mode 0755."""
    vol = next(v for v in rendered_pod["volumes"] if v["name"] == init_container["volumeMounts"][0]["name"])
    assert vol["hostPath"]["type"] == "DirectoryOrCreate", vol


# === fetch from the image =========================================================================

@pytest.fixture(scope="module")
def reserve(agent_image, init_args) -> int:
    """Bytes the rendered fetch keeps free on the cache disk: its `--reserve-bytes`, else the agent's default as
    the image's binary states it in its help."""
    if "--reserve-bytes" in init_args:
        return int(arg(init_args, "--reserve-bytes"))
    help_text = agent_image.run([init_args[0], "--help"], uid=0).stdout
    found = re.search(r"--reserve-bytes <RESERVE_BYTES>.*?\[default: (\d+)\]", help_text, re.S)
    assert found, help_text
    return int(found.group(1))


@pytest.fixture
def cache(agent_image, reserve, key) -> Path:
    """A root-owned 0755 /cache/KEY in the image, as the kubelet's hostPath (removed afterwards), on a disk of its
    own: a tmpfs 1 GiB larger than the reserve the fetch keeps free, so the agent's fit check sees a node's disk
    of known size rather than whatever the machine running the tests has free (a tmpfs takes memory only for
    what is written)."""
    size = reserve + (1 << 30)
    with inside(agent_image, CACHE.lstrip("/")) as d:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "warmpath-test-cache", str(d)],
                       check=True)
        try:
            (d / key).mkdir(mode=0o755, parents=True)
            os.chmod(d / key, 0o755)
            yield d
        finally:
            subprocess.run(["umount", str(d)], check=True)


class Fetch(NamedTuple):
    returncode: int
    report: dict  # the last stdout line, JSON
    stdout: str
    stderr: str


def fetch(agent_image, args, uid=0, env=None) -> Fetch:
    """The agent from the image as `uid` with the image's env (plus `env`); it must not panic."""
    r = agent_image.run(args, uid=uid, env={**(env or {}), "RUST_BACKTRACE": "0"}, timeout=120)
    assert "panicked" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert lines, (r.returncode, r.stderr)
    return Fetch(r.returncode, json.loads(lines[-1]), r.stdout, r.stderr)


def current_sha256(cache: Path, key: str) -> str:
    return sha256_file(cache / key / "current/model.safetensors")


def test_fetch_with_the_rendered_args(agent_image, init_args, key, cache, file_server, weights):
    """As uid 0 into the root-owned directory: Ready, the file's bytes in two ranged GETs each with
    If-Match, the JSON report on the last line."""
    file_server.requests.clear()
    f = fetch(agent_image, init_args)
    assert f.returncode == 0, (f.stdout, f.stderr)
    assert f.report["phase"] == "Ready", f.report
    r = f.report["report"]
    assert (r["key"], r["files"], r["bytesTotal"], r["bytesFetched"], r["alreadyCurrent"], r["path"]) \
        == (key, 1, weights.size, weights.size, False, f"{CACHE}/{key}/current"), f.report
    assert current_sha256(cache, key) == weights.sha256
    gets = [q for q in file_server.requests if q.method == "GET"]
    ranged = [q for q in gets if q.path == WEIGHTS_PATH and (q.range or "").startswith("bytes=")]
    assert len(ranged) == 2, file_server.requests
    assert all(q.if_match is not None for q in gets), file_server.requests


def test_fetch_again_on_a_warm_cache_fetches_nothing(agent_image, init_args, cache, file_server):
    first = fetch(agent_image, init_args)
    assert first.returncode == 0 and first.report["phase"] == "Ready", (first.stdout, first.stderr)
    file_server.requests.clear()
    f = fetch(agent_image, init_args)
    assert f.returncode == 0, (f.stdout, f.stderr)
    r = f.report["report"]
    assert (f.report["phase"], r["alreadyCurrent"], r["bytesFetched"], r["version"]) \
        == ("Ready", True, 0, first.report["report"]["version"]), f.report
    assert not [q for q in file_server.requests if q.method == "GET"], file_server.requests


def test_fetch_with_a_wrong_checksum_fails_and_keeps_the_current_version(agent_image, init_args, key, cache, weights):
    first = fetch(agent_image, init_args)
    assert first.returncode == 0 and first.report["phase"] == "Ready", (first.stdout, first.stderr)
    f = fetch(agent_image, with_arg(init_args, "--sha256", f"model.safetensors={'0' * 64}"))
    assert f.returncode != 0, f.report
    assert (f.report["phase"], f.report["reason"]) == ("Failed", "ChecksumMismatch"), f.report
    assert current_sha256(cache, key) == weights.sha256


def test_fetch_as_non_root_fails_with_disk_error(agent_image, init_args, cache):
    """Why the image user is root: uid 65532 cannot write the root-owned 0755 hostPath."""
    f = fetch(agent_image, init_args, uid=65532)
    assert f.returncode != 0, f.report
    assert f.report["reason"] == "DiskError", f.report


def test_fetch_over_https_refuses_a_private_ca_with_the_images_bundle(agent_image, init_args, cache, https_file_server, tmp_path):
    """object_store trusts SSL_CERT_FILE (the image's Debian bundle), so the stand-in's private CA is
    refused. It retries connect errors (10 times, backoff up to 15 s): the agent is stopped once the
    server has seen the first refusal instead of waiting out its retries."""
    args = with_arg(init_args, "--source", https_file_server.url(WEIGHTS_PATH))
    out, err = tmp_path / "out", tmp_path / "err"
    proc = agent_image.start(args, out, err, uid=0, env={"RUST_BACKTRACE": "0"})
    try:
        wait_until(lambda: https_file_server.tls_failures or proc.poll() is not None, 10)
    finally:
        stop(proc)
    failures = https_file_server.tls_failures
    assert failures and "ALERT" in failures[0], (failures, err.read_text())
    assert not https_file_server.requests, "the agent sent a request over an untrusted connection"
    assert "panicked" not in err.read_text()


def test_fetch_over_https_trusting_the_ca_with_ssl_cert_file(agent_image, init_args, key, cache, https_file_server, pki, weights):
    args = with_arg(init_args, "--source", https_file_server.url(WEIGHTS_PATH))
    with inside(agent_image, "in", {"test-ca.crt": (pki / "ca.crt").read_bytes()}):
        f = fetch(agent_image, args, env={"SSL_CERT_FILE": "/in/test-ca.crt"})
    assert f.returncode == 0 and f.report["phase"] == "Ready", (f.stdout, f.stderr)
    assert current_sha256(cache, key) == weights.sha256


def test_fetch_from_hf_with_the_images_env_fails_cleanly(agent_image, key, cache, file_server):
    """hf-hub panics without a home directory; the image sets HOME. A Hub without the repo (the file
    stand-in's 404) is a HubError."""
    file_server.requests.clear()
    f = fetch(agent_image, ["fetch", "--source", f"hf://org/tiny?endpoint={file_server.url()}", "--root", CACHE, "--key", key])
    assert f.returncode != 0, f.report
    assert f.report["reason"] == "HubError", f.report
    assert any(q.method == "GET" and q.path.startswith("/api/models/org/tiny/revision/main") for q in file_server.requests), \
        file_server.requests


# === run, as the DaemonSet starts it ==============================================================

def rootfs_outside(agent_image, *skip) -> list:
    """Every path in the image's root filesystem except `skip` and what is below them."""
    root = agent_image.rootfs
    found = []
    for d, dirs, files in os.walk(root):
        rel = Path(d).relative_to(root)
        dirs[:] = [x for x in dirs if str(rel / x) not in skip]
        found += [str(rel / x) for x in dirs + files]
    return sorted(found)


def test_run_polls_the_api_with_its_token_and_stops_on_sigterm(agent_image, agent_container, api_server, pki, tmp_path):
    """The DaemonSet's args and literal env (NODE_NAME comes from the downward API: set here) and a
    kubeconfig for the API stand-in (404 to everything): TLS verified with the kubeconfig's CA, its Node
    asked for with the token, polling goes on through the errors, SIGTERM stops it with exit 0, and
    nothing is written outside /cache (the chart mounts the root filesystem read-only)."""
    ds_env = {e["name"]: str(e["value"]) for e in agent_container["env"] if "value" in e}
    env = {**ds_env, "NODE_NAME": "node-a", "KUBECONFIG": "/in/kubeconfig", "RUST_BACKTRACE": "0"}
    kc = kubeconfig(api_server.url(), (pki / "ca.crt").read_bytes(), "agent-token")
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with inside(agent_image, "cache"), inside(agent_image, "in", {"kubeconfig": kc}):
        before = rootfs_outside(agent_image, "cache", "in")

        def node_get():
            return any(q.path == "/api/v1/nodes/node-a" and q.authorization == "Bearer agent-token"
                       for q in api_server.requests)

        proc = agent_image.start(agent_container["args"], out, err, uid=0, env=env)
        try:
            wait_until(lambda: (node_get() and "node pass failed" in err.read_text()) or proc.poll() is not None, 30, 0.2)
            assert proc.poll() is None, f"exited early ({proc.returncode}): {err.read_text()}"
            assert node_get(), (api_server.requests, err.read_text())
            assert "node pass failed" in err.read_text()
        finally:
            rc = stop(proc)
        assert rc == 0, err.read_text()
        assert "panicked" not in err.read_text()
        assert rootfs_outside(agent_image, "cache", "in") == before
