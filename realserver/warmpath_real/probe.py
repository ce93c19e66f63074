"""Probe one llama-server's prefix-cache behaviour: cold vs warm prefill, and what `--cache-ram` restores.

For each `--cache-ram` value given, starts a fresh server and sends, in order:
1. doc A, conversation 1, turn 1  (cold: nothing cached)
2. doc A, conversation 1, turn 2  (warm: extends request 1, still in the slot)
3. doc B, conversation 1, turn 1  (cold; evicts A from the single slot)
4. doc A, conversation 2, turn 1  (shares doc A with 1–2: only a host-RAM prompt cache can serve it)
and prints TTFT (client-side), `cache_n` and `prompt_n` for each.
With `--capture FILE` it also saves a `/metrics` scrape taken while two requests are in flight (one running,
one deferred), the fixture for metric-name parsers.

Usage: python -m warmpath_real.probe [--cache-ram 0 --cache-ram 128] [--prefix-words 900] [--capture FILE]
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from .client import make_client, stream_chat
from .servers import LlamaServer, ServerSpec, configured_model
from .workload import WorkloadSpec, build


def run_probe(cache_ram: int, words: int) -> list[tuple[str, object]]:
    """Runs the 4-request sequence on a fresh server; returns (label, ChatResult) pairs."""
    spec = WorkloadSpec(prefixes=2, prefix_words=words, conversations_per_prefix=2, turns=2)
    reqs = {(r.conv, r.turn): r for r in build(spec)}
    # conversations 0,1 are on doc 0; 2,3 on doc 1
    plan = [("A conv1 turn1 (cold)", reqs[(0, 0)]), ("A conv1 turn2 (extends)", reqs[(0, 1)]),
            ("B conv1 turn1 (cold)", reqs[(2, 0)]), ("A conv2 turn1 (doc A again)", reqs[(1, 0)])]
    with LlamaServer(ServerSpec(model=configured_model(), cache_ram_mib=cache_ram)) as server:
        server.wait_ready()
        client = make_client(server.base_url + "/v1")
        return [(label, stream_chat(client, list(r.messages), max_tokens=4)) for label, r in plan]


def capture(path: Path, words: int) -> None:
    """Scrapes `/metrics` while one request runs and one waits (single slot), and writes it to `path`."""
    spec = WorkloadSpec(prefixes=2, prefix_words=words, conversations_per_prefix=1, turns=1)
    reqs = build(spec)
    with LlamaServer(ServerSpec(model=configured_model())) as server:
        server.wait_ready()
        client = make_client(server.base_url + "/v1")
        stream_chat(client, list(reqs[0].messages), max_tokens=2)  # so the counters are not all zero
        # Long enough completions that the scrape (served between decode steps) sees them in flight.
        threads = [threading.Thread(target=stream_chat, args=(client, list(r.messages), 64)) for r in reqs]
        for t in threads:
            t.start()
        text = best = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(t.is_alive() for t in threads):
            text = server.metrics_text()
            if "llamacpp:requests_processing 1" in text:
                best = text
                if "llamacpp:requests_deferred 1" in text:
                    break
            time.sleep(0.05)
        text = best or text
        for t in threads:
            t.join()
        path.write_text(text)
        print(f"wrote {path}")


def main() -> None:
    """CLI entry point (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-ram", type=int, action="append", help="MiB; repeatable (default: 0 and 128)")
    ap.add_argument("--prefix-words", type=int, default=900)
    ap.add_argument("--capture", type=Path)
    args = ap.parse_args()
    for cram in args.cache_ram or [0, 128]:
        print(f"--cache-ram {cram}:")
        print(f"  {'request':32} {'TTFT ms':>8} {'cache_n':>8} {'prompt_n':>8}")
        for label, r in run_probe(cram, args.prefix_words):
            print(f"  {label:32} {r.ttft_ms:8.0f} {r.cache_n!s:>8} {r.prompt_n!s:>8}" + (f"  {r.error}" if r.error else ""))
    if args.capture:
        capture(args.capture, args.prefix_words)


if __name__ == "__main__":
    main()
