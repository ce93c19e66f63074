"""What the image tests share: an unpacked image to run binaries from, the loopback stand-ins, and small
helpers. The fixtures that hand these out are in conftest.py."""
import base64
import hashlib
import http.server
import json
import os
import re
import shutil
import ssl
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import yaml

REPO = Path(__file__).resolve().parents[2]
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


@dataclass
class Image:
    """One image as scripts/test.d/58-image.sh left it: the archive, what skopeo read from it, the
    unpacked root filesystem. Binaries run from there with chroot as a numeric user and, like a container
    runtime, with only the image's env plus what the caller adds (the rootfs has no libc: only a static
    binary starts)."""

    name: str  # warmpath-controller, warmpath-agent
    archive: Path
    config: dict  # skopeo inspect --config
    manifest: dict  # skopeo inspect --raw
    digest: str
    rebuilt_digest: str
    rootfs: Path

    @property
    def cfg(self) -> dict:
        return self.config["config"]

    @property
    def env(self) -> dict:
        return dict(e.split("=", 1) for e in self.cfg.get("Env", []))

    @property
    def uid(self) -> int:
        return int(self.cfg["User"].split(":")[0])

    @property
    def binary(self) -> str:
        return f"/usr/local/bin/{self.name}"

    def argv(self, args, uid=None) -> list:
        u = self.uid if uid is None else uid
        return [CHROOT, f"--userspec={u}:{u}", str(self.rootfs), self.binary, *args]

    def full_env(self, env=None) -> dict:
        return {**self.env, **(env or {})}

    def run(self, args, *, uid=None, env=None, timeout=120) -> subprocess.CompletedProcess:
        """Runs to completion; a run longer than `timeout` seconds is killed and fails the test."""
        return subprocess.run(self.argv(args, uid), env=self.full_env(env), capture_output=True, text=True,
                              timeout=timeout)

    def start(self, args, out: Path, err: Path, *, uid=None, env=None) -> subprocess.Popen:
        """Starts in the background with stdout and stderr going to files (read them while it runs)."""
        with open(out, "wb") as o, open(err, "wb") as e:
            return subprocess.Popen(self.argv(args, uid), env=self.full_env(env), stdout=o, stderr=e)


def stop(proc: subprocess.Popen) -> Optional[int]:
    """SIGTERM, then SIGKILL if it has not exited after 30 s; returns the exit code of the first wait."""
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def wait_until(cond, timeout: float, interval: float = 0.1) -> bool:
    """Polls `cond` until it is true or `timeout` seconds have passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        ok = cond()
        if ok or time.monotonic() >= deadline:
            return bool(ok)
        time.sleep(interval)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def kubeconfig(server: str, ca_pem: bytes, token: str, namespace: Optional[str] = None) -> str:
    context = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                               "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": context}],
        "current-context": "x",
    })


# === loopback stand-ins ===========================================================================

class Request(NamedTuple):
    method: str
    path: str
    authorization: Optional[str]
    range: Optional[str]
    if_match: Optional[str]


class StandIn(http.server.ThreadingHTTPServer):
    """A loopback HTTP(S) server in a thread that records every request and every TLS handshake a client
    refused (the handshake runs on accept, so a refusal shows up here, with the client's alert)."""

    daemon_threads = True

    def __init__(self, handler, tls: Optional[tuple] = None, root: Optional[Path] = None):
        super().__init__(("127.0.0.1", 0), handler)
        self.requests: list = []
        self.tls_failures: list = []  # the SSL error reasons, e.g. TLSV1_ALERT_UNKNOWN_CA
        self.root = root
        self.scheme = "http"
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.socket = ctx.wrap_socket(self.socket, server_side=True)
            self.scheme = "https"

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, path: str = "") -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def get_request(self):
        try:
            return super().get_request()
        except ssl.SSLError as e:
            self.tls_failures.append(str(e.reason))
            raise


class _Handler(http.server.BaseHTTPRequestHandler):
    def record(self):
        self.server.requests.append(Request(self.command, self.path, self.headers.get("Authorization"),
                                            self.headers.get("Range"), self.headers.get("If-Match")))

    def log_message(self, *a):
        pass


class ApiWithoutCrds(_Handler):
    """An API server that has none of warmpath's resources: every GET is a Kubernetes 404 Status."""

    def do_GET(self):
        self.record()
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "code": 404, "message": "the server could not find the requested resource"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class RangedFiles(_Handler):
    """Serves `server.root` with what the agent's object_store client needs: HEAD with size and ETag,
    ranged GETs answered 206, If-Match honoured (412 on a mismatch)."""

    def _file(self):
        root = os.path.realpath(self.server.root)
        p = os.path.realpath(os.path.join(root, self.path.split("?")[0].lstrip("/")))
        if not p.startswith(root + "/") or not os.path.isfile(p):
            self.send_error(404)
            return None
        st = os.stat(p)
        return p, st.st_size, '"%s"' % hashlib.sha256(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]

    def do_HEAD(self):
        self.record()
        f = self._file()
        if f:
            self.send_response(200)
            self.send_header("Content-Length", str(f[1]))
            self.send_header("ETag", f[2])
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

    def do_GET(self):
        self.record()
        f = self._file()
        if not f:
            return
        path, size, etag = f
        if self.headers.get("If-Match") not in (None, etag):
            self.send_error(412)
            return
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
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


@contextmanager
def serving(handler, tls: Optional[tuple] = None, root: Optional[Path] = None):
    srv = StandIn(handler, tls, root)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join()


@contextmanager
def inside(image: Image, rel: str, files: Optional[dict] = None, mode: int = 0o755):
    """A directory `/rel` in the image's root filesystem (root-owned, `mode`) holding `files` (name ->
    text or bytes, mode 0444), removed again afterwards: the tests leave the image as it was unpacked."""
    d = image.rootfs / rel
    d.mkdir(mode=mode)
    os.chmod(d, mode)
    try:
        for name, content in (files or {}).items():
            p = d / name
            p.write_bytes(content.encode() if isinstance(content, str) else content)
            os.chmod(p, 0o444)
        yield d
    finally:
        shutil.rmtree(d)
