"""A real Envoy with the warmpath filter in front of the llama-servers, on loopback.

The bootstrap comes from the project's launcher (`scripts/envoy.sh render`, i.e. `warmpath-envoy render` in
harness/: one listener, the wasm filter, an `override_host` cluster falling back to least-request), so this
module holds no Envoy configuration of its own. It only runs `.venv/bin/envoy` on that file and owns the
process, so that Envoy dies with this client even when the client is killed.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from .servers import REPO, _die_with_parent, free_port, log_tail, stop, wait_http_ready

ENVOY = REPO / ".venv" / "bin" / "envoy"
#: The plugin configuration shipped with the filter (defaults for prefix_length, block_size, guards).
DEFAULT_PLUGIN_CONFIG = REPO / "envoy" / "plugin-config.json"


def plugin_config(strategy: str, endpoints: list[str], overrides: dict | None = None) -> dict:
    """`envoy/plugin-config.json` with `strategy` and `endpoints` set, then `overrides`."""
    cfg = json.loads(DEFAULT_PLUGIN_CONFIG.read_text())
    cfg.update({"strategy": strategy, "endpoints": endpoints})
    cfg.update(overrides or {})
    return cfg


def build_launcher() -> None:
    """Builds the release filter module and the launcher up front, so a stale module is never measured
    (`scripts/envoy.sh` only builds a missing one) and later renders are quick. Uses `$CARGO_TARGET_DIR` like
    `scripts/envoy.sh`. Raises `subprocess.CalledProcessError` on a build failure."""
    subprocess.run(["cargo", "build", "-q", "-p", "warmpath-filter", "--target", "wasm32-wasip1", "--release"],
                   cwd=REPO, check=True)
    subprocess.run(["bash", str(REPO / "scripts" / "envoy.sh"), "render", "--upstream", "127.0.0.1:1",
                    "--plugin-config", "{}"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)


class Envoy:
    """Envoy (`--concurrency` workers) on a free 127.0.0.1 port routing to `endpoints` with the given plugin
    config. `url` is the OpenAI base URL through it. `close()` kills it.

    `route_timeout_s` replaces the launcher's 60 s route timeout: on a shared 2-core machine a cold ~1.3k-token
    prefill queued behind another one can take longer than that, and a 504 would lose the measurement."""

    def __init__(self, endpoints: list[str], plugin: dict, concurrency: int = 2, route_timeout_s: int = 300):
        self.port, self.admin_port = free_port(), free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="warmpath-real-envoy-")
        d = Path(self._dir.name)
        ups = [a for e in endpoints for a in ("--upstream", e)]
        yaml = subprocess.run(
            ["bash", str(REPO / "scripts" / "envoy.sh"), "render", *ups, "--plugin-config", json.dumps(plugin),
             "--listener-port", str(self.port), "--admin-port", str(self.admin_port), "--rig-headers"],
            cwd=REPO, check=True, capture_output=True, text=True).stdout
        if yaml.count("timeout: 60s") != 1:
            raise RuntimeError("rendered bootstrap has no single 'timeout: 60s' route timeout to replace")
        yaml = yaml.replace("timeout: 60s", f"timeout: {route_timeout_s}s")
        (d / "envoy.yaml").write_text(yaml)
        self.log_path = d / "envoy.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(ENVOY), "-c", str(d / "envoy.yaml"), "--concurrency", str(concurrency), "--disable-hot-restart",
             "--base-id", str(os.getpid() % 60000)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent)
        try:
            wait_http_ready(self.proc, "envoy", f"http://127.0.0.1:{self.admin_port}/ready", lambda _: True, 30.0,
                            self.log_tail)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """OpenAI base URL through Envoy."""
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self, prefix: str = "wasmcustom.warmpath") -> dict[str, int]:
        """Counters and gauges from the admin `/stats` whose name starts with `prefix` (name → integer value)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats?filter=^{prefix}", timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(": ")
                if value.strip().lstrip("-").isdigit():
                    out[name] = int(value)
            return out

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of Envoy's log."""
        return log_tail(self.log_path, lines)

    def close(self) -> None:
        """Kills Envoy and removes its working directory; idempotent."""
        stop(self.proc)
        self._log.close()
        self._dir.cleanup()

    def __enter__(self) -> "Envoy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
