"""The peers' real routers in front of the llama-servers, on loopback: the SGLang Model Gateway (`smg`, PyPI `smg`)
and the vLLM router (`vllm-router`, PyPI `vllm-router`), each with its `cache_aware` policy and its defaults, so one
table compares PREFIX_AWARE through Envoy with them on real KV caches. `scripts/setup.sh` installs both, pinned,
into `.venv` (the same processes `warmpath-bench` runs in front of simulated servers).

Every listener is bound to 127.0.0.1 (`--host`, and `--prometheus-host`/`--prometheus-port`: left out, the metrics
listener binds 0.0.0.0:29000). The routers health-check each server's `/health` and discover its model from
`/v1/models` before they serve; they rename their process (`smg::router`, `vllm::router`), so this module stops them
through their `Popen` handle (their pid), never by name.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from .servers import REPO, _die_with_parent, free_port, log_tail, stop, wait_http_ready

#: Strategy label → (executable, arguments before the common ones).
PEERS = {
    "SMG_CACHE_AWARE": ("smg", ["launch"]),
    "VLLM_ROUTER_CACHE_AWARE": ("vllm-router", []),
}


def peer_args(strategy: str, port: int, metrics_port: int, endpoints: list[str]) -> list[str]:
    """Arguments after the executable: loopback listeners, the servers, `--policy cache_aware`."""
    _, head = PEERS[strategy]
    return [*head, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *[f"http://{e}" for e in endpoints],
            "--policy", "cache_aware",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]


def peer_binary(strategy: str) -> Path:
    """`.venv/bin/<executable>`, else the one on PATH; `FileNotFoundError` naming the setup command otherwise."""
    exe, _ = PEERS[strategy]
    venv = REPO / ".venv" / "bin" / exe
    if venv.is_file():
        return venv
    found = shutil.which(exe)
    if found:
        return Path(found)
    raise FileNotFoundError(f"{exe} not found in {venv.parent} or on PATH: run scripts/setup.sh "
                            "(installs the pinned smg and vllm-router into .venv)")


class PeerRouter:
    """A peer router on a free 127.0.0.1 port routing to `endpoints`; `url` is the OpenAI base URL through it.
    `close()` kills it. Start-up waits (bounded) until its `/v1/models` lists a model."""

    def __init__(self, strategy: str, endpoints: list[str], ready_timeout_s: float = 60.0):
        self.strategy = strategy
        binary = peer_binary(strategy)
        self.port, metrics_port = free_port(), free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="warmpath-real-peer-")
        self.log_path = Path(self._dir.name) / "router.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), *peer_args(strategy, self.port, metrics_port, endpoints)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env={"NO_COLOR": "1", "PATH": str(REPO / ".venv" / "bin") + ":/usr/bin:/bin"},
            preexec_fn=_die_with_parent)
        try:
            wait_http_ready(self.proc, self.strategy, f"http://127.0.0.1:{self.port}/v1/models",
                            lambda body: bool(json.loads(body or b"{}").get("data")), ready_timeout_s, self.log_tail)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """OpenAI base URL through the router."""
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, int]:
        """No filter counters behind a peer router."""
        return {}

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the router's log."""
        return log_tail(self.log_path, lines)

    def close(self) -> None:
        """Stops the router (by its pid) and removes its directory; idempotent."""
        stop(self.proc)
        self._log.close()
        self._dir.cleanup()

    def __enter__(self) -> "PeerRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
