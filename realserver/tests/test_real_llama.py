"""CI-sized end-to-end test on real llama.cpp servers through a real Envoy with the warmpath filter.

Two llama-servers (pinned cache settings), Envoy with `PREFIX_AWARE`, twelve streamed chat requests (two
~200-word documents, two conversations each, three turns) sent one at a time with the `openai` client.
Asserts that repeated prefixes are served from the servers' caches (`timings.cache_n` > 0) and that all
requests of one prefix land on one server. Skips only when the llama-server binary cannot run on this CPU.
"""
from __future__ import annotations

import os
from collections import defaultdict

import pytest

from warmpath_real.compare import run_strategy
from warmpath_real.envoy import build_launcher
from warmpath_real.servers import ServerCannotRun, ServerSpec, configured_model
from warmpath_real.workload import WorkloadSpec


@pytest.fixture(scope="module")
def prefix_aware_run():
    if os.environ.get("WARMPATH_LLAMA_CANNOT_RUN"):
        pytest.skip(os.environ["WARMPATH_LLAMA_CANNOT_RUN"])
    workload = WorkloadSpec(prefixes=2, prefix_words=200, conversations_per_prefix=2, turns=3, max_tokens=4)
    try:
        spec = ServerSpec(model=configured_model())
        build_launcher()
        run = run_strategy("PREFIX_AWARE", "PREFIX_AWARE", {}, spec, n_servers=2, workload=workload,
                           concurrency=1, time_limit_s=240.0)
    except ServerCannotRun as e:
        pytest.skip(f"llama-server binary cannot run on this CPU: {e}")
    return run


def test_all_requests_succeed_through_envoy(prefix_aware_run):
    run = prefix_aware_run
    assert run.errors() == []
    assert run.skipped == 0
    assert len(run.records) == 12
    assert all(r.result.endpoint in run.servers for r in run.records), "every response names its endpoint"


def test_each_prefix_lands_on_one_server(prefix_aware_run):
    by_prefix = defaultdict(set)
    for r in prefix_aware_run.records:
        by_prefix[r.prefix].add(r.result.endpoint)
    assert len(by_prefix) == 2
    for prefix, endpoints in by_prefix.items():
        assert len(endpoints) == 1, f"prefix {prefix} spread over {endpoints}"


def test_repeated_prefixes_are_served_from_cache(prefix_aware_run):
    seen = set()
    for r in prefix_aware_run.records:  # completion order = issue order (one client thread)
        res = r.result
        if r.prefix not in seen:
            seen.add(r.prefix)
            assert res.cache_n < res.prompt_n, f"first request of prefix {r.prefix} should be cold: {res}"
        else:
            assert res.cache_n > 0, f"repeat of prefix {r.prefix} not served from cache: {res}"
    hits = [r.result.cache_n for r in prefix_aware_run.records]
    assert sum(h > 0 for h in hits) >= 10


def test_server_metrics_agree_with_stream_timings(prefix_aware_run):
    run = prefix_aware_run
    client_side = sum(r.result.cache_n for r in run.records)
    server_side = sum(run.server_cached_tokens.values())
    assert server_side == client_side
    per_server = defaultdict(int)
    for r in run.records:
        per_server[r.result.endpoint] += r.result.cache_n
    for addr in run.servers:
        assert run.server_cached_tokens[addr] == per_server.get(addr, 0)


def test_filter_counted_every_request_and_released_in_flight(prefix_aware_run):
    run = prefix_aware_run
    stats = run.filter_stats
    decisions = sum(v for k, v in stats.items() if k.startswith("wasmcustom.warmpath.decisions.prefix_aware."))
    assert decisions == 12
    assert stats.get("wasmcustom.warmpath.decisions.prefix_aware.prefix_match", 0) >= 1
    inflight = {k: v for k, v in stats.items() if ".in_flight." in k}
    assert len(inflight) == 2 and all(v == 0 for v in inflight.values()), inflight
