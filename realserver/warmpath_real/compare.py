"""Compare routing strategies on real llama-servers through Envoy with the warmpath filter.

For each strategy: start `--servers` fresh llama-servers (empty caches, pinned cache settings, see
`servers.py`), start Envoy with the filter configured for that strategy (`envoy.py`), replay the same
multi-turn chat workload (`workload.py`) with `--concurrency` client threads using the `openai` client
(`client.py`), then read each server's `/metrics` and Envoy's filter stats, and stop everything.

`SMG_CACHE_AWARE` and `VLLM_ROUTER_CACHE_AWARE` run the peers' real routers (`peers.py`) in Envoy's place.

Reported per strategy: TTFT p50/p90 (client-side, ms), cached prompt tokens per request (`timings.cache_n`,
server-side), share of prompt tokens served from cache, requests per server (from the measuring Envoy's
`x-rig-upstream-host` header; a peer router sends none, so its requests show as unattributed), filter
decisions by reason (`x-rig-decision`), errors, and requests skipped at the time limit.

Exit status: 0 on success, 3 when the llama-server binary cannot run on this CPU (message on stderr),
1 on any other failure (including a strategy run with failed requests).

Usage: python -m warmpath_real.compare [--strategies RANDOM,LEAST_OUTSTANDING_REQUESTS,PREFIX_AWARE]
       [--servers 3] [--concurrency 2] [--time-limit-s 150] [--markdown FILE] [--json FILE] [workload sizes]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from .client import ChatResult, make_client, stream_chat
from .envoy import Envoy, build_launcher, plugin_config
from .metrics import server_load
from .peers import PEERS, PeerRouter
from .servers import ServerCannotRun, ServerGroup, ServerSpec, configured_model
from .workload import Request, WorkloadSpec, build

STRATEGIES = ("RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE")


@dataclass
class RequestRecord:
    """One replayed request: workload coordinates plus what the client measured."""

    conv: int
    turn: int
    prefix: int
    result: ChatResult


@dataclass
class StrategyRun:
    """Everything measured for one strategy (`label` may name a variant, e.g. `PREFIX_AWARE lf=0`)."""

    label: str
    strategy: str
    plugin: dict
    servers: list[str]
    records: list[RequestRecord] = field(default_factory=list)
    skipped: int = 0
    wall_s: float = 0.0
    server_cached_tokens: dict[str, float] = field(default_factory=dict)
    server_prompt_tokens: dict[str, float] = field(default_factory=dict)
    filter_stats: dict[str, int] = field(default_factory=dict)
    #: 1-minute load average of the machine at the start and end of the replay (other work shares the CPU).
    loadavg: tuple[float, float] = (0.0, 0.0)

    def ok(self) -> list[ChatResult]:
        """Results of requests that completed without error."""
        return [r.result for r in self.records if r.result.error is None]

    def errors(self) -> list[str]:
        """Error texts of failed requests."""
        return [r.result.error for r in self.records if r.result.error is not None]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0 < q < 100) by linear interpolation between closest ranks (`statistics.quantiles`,
    method "inclusive"); None for no values, the value itself for one."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def replay(base_url: str, requests: list[Request], concurrency: int, max_tokens: int,
           deadline: float) -> tuple[list[RequestRecord], int]:
    """Sends `requests` in order from `concurrency` threads; a conversation's turn waits for its previous turn.
    No request starts after `deadline` (time.monotonic); returns (records in completion order, skipped)."""
    lock = threading.Lock()
    nxt = [0]
    done: dict[tuple[int, int], threading.Event] = {(r.conv, r.turn): threading.Event() for r in requests}
    records: list[RequestRecord] = []
    skipped = [0]

    def worker() -> None:
        client = make_client(base_url)
        while True:
            with lock:
                if nxt[0] >= len(requests):
                    return
                r = requests[nxt[0]]
                nxt[0] += 1
            prev = done.get((r.conv, r.turn - 1))
            while prev is not None and not prev.wait(0.5):
                if time.monotonic() > deadline:
                    break
            if time.monotonic() > deadline:
                with lock:
                    skipped[0] += 1
                done[(r.conv, r.turn)].set()
                continue
            res = stream_chat(client, list(r.messages), max_tokens)
            with lock:
                records.append(RequestRecord(r.conv, r.turn, r.prefix, res))
            done[(r.conv, r.turn)].set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, skipped[0]


def run_strategy(label: str, strategy: str, overrides: dict, spec: ServerSpec, n_servers: int,
                 workload: WorkloadSpec, concurrency: int, time_limit_s: float) -> StrategyRun:
    """Fresh servers + Envoy with the filter (or a peer's real router, `peers.PEERS`) for one strategy, replay,
    collect; everything is stopped before returning."""
    with ServerGroup(spec, n_servers) as group:
        peer = strategy in PEERS
        plugin = {} if peer else plugin_config(strategy, group.addresses, overrides)
        run = StrategyRun(label, strategy, plugin, group.addresses)
        proxy = PeerRouter(strategy, group.addresses) if peer else Envoy(group.addresses, plugin)
        with proxy as envoy:
            before = {s.address: server_load(s.metrics_text()) for s in group.servers}
            t0 = time.monotonic()
            load0 = os.getloadavg()[0]
            run.records, run.skipped = replay(envoy.url, build(workload), concurrency, workload.max_tokens,
                                              t0 + time_limit_s)
            run.wall_s = time.monotonic() - t0
            run.loadavg = (load0, os.getloadavg()[0])
            for s in group.servers:
                s.check_alive()
                after = server_load(s.metrics_text())
                run.server_cached_tokens[s.address] = (after.cached_tokens or 0) - (before[s.address].cached_tokens or 0)
                run.server_prompt_tokens[s.address] = (after.prompt_tokens or 0) - (before[s.address].prompt_tokens or 0)
            # In-flight counters drop when Envoy logs each stream, which can trail the client's end of stream.
            settle = time.monotonic() + 5
            run.filter_stats = envoy.stats()
            while any(v for k, v in run.filter_stats.items() if ".in_flight." in k) and time.monotonic() < settle:
                time.sleep(0.2)
                run.filter_stats = envoy.stats()
    return run


def summarize(run: StrategyRun) -> dict:
    """The reported numbers of one run (see the module doc); milliseconds and tokens."""
    ok = run.ok()
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    cache_n = [r.cache_n or 0 for r in ok]
    prompt_total = sum((r.cache_n or 0) + (r.prompt_n or 0) for r in ok)
    per_server = Counter(r.endpoint for r in ok)
    reasons = Counter(r.reason for r in ok if r.reason)
    return {
        "label": run.label,
        "requests": len(ok),
        "errors": len(run.errors()),
        "skipped": run.skipped,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p90_ms": percentile(ttft, 90),
        "ttft_mean_ms": statistics.fmean(ttft) if ttft else None,
        "cached_tokens_per_request": statistics.fmean(cache_n) if cache_n else None,
        "cached_share": (sum(cache_n) / prompt_total) if prompt_total else None,
        "per_server": [per_server.get(a, 0) for a in run.servers],
        "unattributed": sum(v for k, v in per_server.items() if k not in run.servers),
        "server_cached_tokens": [run.server_cached_tokens.get(a, 0) for a in run.servers],
        "reasons": dict(reasons),
        "wall_s": run.wall_s,
        "loadavg": run.loadavg,
    }


def common_subset(runs: list[StrategyRun]) -> list[dict]:
    """TTFT and cache numbers over only the requests (conversation, turn) that every run completed, so runs cut
    short by the time limit are still compared on identical requests."""
    keys = None
    for run in runs:
        done = {(r.conv, r.turn) for r in run.records if r.result.error is None}
        keys = done if keys is None else keys & done
    rows = []
    for run in runs:
        res = [r.result for r in run.records if (r.conv, r.turn) in (keys or set()) and r.result.error is None]
        ttft = [r.ttft_ms for r in res if r.ttft_ms is not None]
        cache_n = [r.cache_n or 0 for r in res]
        prompt_total = sum((r.cache_n or 0) + (r.prompt_n or 0) for r in res)
        rows.append({"label": run.label, "requests": len(res), "ttft_p50_ms": percentile(ttft, 50),
                     "ttft_p90_ms": percentile(ttft, 90),
                     "cached_tokens_per_request": statistics.fmean(cache_n) if cache_n else None,
                     "cached_share": (sum(cache_n) / prompt_total) if prompt_total else None})
    return rows


def markdown_common(rows: list[dict]) -> str:
    """A Markdown table of `common_subset` rows."""
    def f(v, nd=0):
        return "–" if v is None else f"{v:,.{nd}f}"
    out = ["| strategy (requests every run completed) | requests | TTFT p50 ms | TTFT p90 ms | cached tokens / request | "
           "cached share |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['requests']} | {f(r['ttft_p50_ms'])} | {f(r['ttft_p90_ms'])} | "
                   f"{f(r['cached_tokens_per_request'])} | {f(r['cached_share'], 2)} |")
    return "\n".join(out)


def unattributed(row: dict) -> str:
    """` (+N unattributed)` when N requests carried no endpoint (peer routers add no rig headers)."""
    return f" (+{row['unattributed']} unattributed)" if row["unattributed"] else ""


def markdown(rows: list[dict]) -> str:
    """A Markdown table of `summarize` rows."""
    def f(v, nd=0):
        return "–" if v is None else f"{v:,.{nd}f}"
    out = ["| strategy | requests (err/skipped) | TTFT p50 ms | TTFT p90 ms | cached tokens / request | "
           "cached share of prompt tokens | requests per server | server-side cached tokens per server | "
           "filter decisions | wall s | load avg start→end |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items())) or "–"
        out.append(f"| {r['label']} | {r['requests']} ({r['errors']}/{r['skipped']}) | {f(r['ttft_p50_ms'])} | "
                   f"{f(r['ttft_p90_ms'])} | {f(r['cached_tokens_per_request'])} | {f(r['cached_share'], 2)} | "
                   f"{' / '.join(map(str, r['per_server']))}"
                   f"{unattributed(r)} | "
                   f"{' / '.join(f(v) for v in r['server_cached_tokens'])} | {reasons} | {f(r['wall_s'])} | "
                   f"{r['loadavg'][0]:.1f}→{r['loadavg'][1]:.1f} |")
    return "\n".join(out)


def parse_variant(text: str) -> tuple[str, str, dict]:
    """`STRATEGY` or `STRATEGY:{json overrides}` → (label, strategy, overrides)."""
    name, _, extra = text.partition(":")
    overrides = json.loads(extra) if extra else {}
    label = name + ("" if not overrides else " " + ",".join(f"{k}={v}" for k, v in overrides.items()))
    return label, name, overrides


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated; a strategy may carry plugin overrides: 'PREFIX_AWARE:{\"concurrency_threshold\":4}' "
                         "(use ';' between entries when an override contains a comma)")
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=2, help="client threads (keep low: servers share the CPU)")
    ap.add_argument("--time-limit-s", type=float, default=150.0, help="per strategy: no request starts after this")
    ap.add_argument("--cache-ram", type=int, default=128, help="llama-server --cache-ram (MiB)")
    ap.add_argument("--parallel", type=int, default=1, help="llama-server -np (slots)")
    ap.add_argument("--ctx", type=int, default=4096, help="llama-server -c (tokens)")
    ap.add_argument("--threads", type=int, default=1, help="llama-server -t/-tb")
    ap.add_argument("--prefixes", type=int, default=WorkloadSpec.prefixes)
    ap.add_argument("--prefix-words", type=int, default=WorkloadSpec.prefix_words)
    ap.add_argument("--conversations-per-prefix", type=int, default=WorkloadSpec.conversations_per_prefix)
    ap.add_argument("--turns", type=int, default=WorkloadSpec.turns)
    ap.add_argument("--max-tokens", type=int, default=WorkloadSpec.max_tokens)
    ap.add_argument("--markdown", help="also write the table (with settings) to this file")
    ap.add_argument("--json", help="also write all per-request records to this file")
    args = ap.parse_args(argv)
    # `timeout`/Ctrl-C: unwind so every server and Envoy is stopped by its context manager.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    sep = ";" if ";" in args.strategies else ","
    variants = [parse_variant(s.strip()) for s in args.strategies.split(sep) if s.strip()]
    workload = WorkloadSpec(prefixes=args.prefixes, prefix_words=args.prefix_words,
                            conversations_per_prefix=args.conversations_per_prefix, turns=args.turns,
                            max_tokens=args.max_tokens)
    try:
        spec = ServerSpec(model=configured_model(), parallel=args.parallel, ctx_tokens=args.ctx,
                          cache_ram_mib=args.cache_ram, threads=args.threads)
    except FileNotFoundError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 1
    if any(strategy not in PEERS for _, strategy, _ in variants):
        build_launcher()  # Envoy and the filter are needed only for the filter strategies
    runs = []
    try:
        for label, strategy, overrides in variants:
            print(f"[compare] {label}: {args.servers} servers, {len(build(workload))} requests, "
                  f"concurrency {args.concurrency}", file=sys.stderr)
            run = run_strategy(label, strategy, overrides, spec, args.servers, workload, args.concurrency,
                               args.time_limit_s)
            print(f"[compare] {label}: {len(run.ok())} ok, {len(run.errors())} errors, {run.skipped} skipped "
                  f"in {run.wall_s:.0f} s", file=sys.stderr)
            for e in run.errors()[:3]:
                print(f"[compare]   error: {e}", file=sys.stderr)
            runs.append(run)
    except ServerCannotRun as e:
        print(f"compare: llama-server cannot run on this CPU: {e}", file=sys.stderr)
        return 3
    rows = [summarize(r) for r in runs]
    table = markdown(rows)
    if any(r.skipped or r.errors() for r in runs):
        table += "\n\n" + markdown_common(common_subset(runs))
    print(table)
    settings = (f"servers {args.servers} x llama-server -np {args.parallel} -c {args.ctx} --cache-ram {args.cache_ram} "
                f"-t {args.threads}; model {spec.model.name}; workload {asdict(workload)}; "
                f"client concurrency {args.concurrency}; time limit {args.time_limit_s:.0f} s per strategy")
    print(settings)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table + "\n\n" + settings + "\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"settings": settings, "summary": rows, "common_subset": common_subset(runs),
                       "runs": [{"label": r.label, "plugin": r.plugin, "servers": r.servers,
                                 "filter_stats": r.filter_stats,
                                 "records": [{"conv": x.conv, "turn": x.turn, "prefix": x.prefix,
                                              **asdict(x.result)} for x in r.records]} for r in runs]},
                      fh, indent=1)
    return 1 if any(r.errors() for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
