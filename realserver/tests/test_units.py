"""Fast tests of the real-server tooling that need no server: metric names, workload shape, parsing helpers."""
import http.server
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from warmpath_real import metrics, workload
from warmpath_real.client import parse_decision
from warmpath_real.compare import parse_variant, percentile
from warmpath_real.servers import ServerSpec, _cannot_run, log_tail, stop, wait_http_ready

FIXTURE = Path(__file__).resolve().parents[1] / "testdata" / "llamacpp-metrics.prom"

#: The llama.cpp metric names a load reader relies on (as scraped from the real server into FIXTURE).
LLAMACPP_LOAD_NAMES = ("llamacpp:requests_processing", "llamacpp:requests_deferred",
                       "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")


def test_fixture_is_a_real_llamacpp_scrape_with_the_load_names():
    s = metrics.samples(FIXTURE.read_text())
    for name in LLAMACPP_LOAD_NAMES:
        assert name in s, name
    assert all(k.startswith("llamacpp:") for k in s)


def test_llamacpp_scrape_maps_to_load():
    load = metrics.server_load(FIXTURE.read_text())
    s = metrics.samples(FIXTURE.read_text())
    assert load.engine == "llamacpp"
    assert load.running == s["llamacpp:requests_processing"] == 1  # captured with a request in flight
    assert load.waiting == s["llamacpp:requests_deferred"]
    assert load.cached_tokens == s["llamacpp:prompt_tokens_cached_total"] > 0
    assert load.prompt_tokens == s["llamacpp:prompt_tokens_total"] + s["llamacpp:prompt_tokens_cached_total"]
    assert load.kv_usage is None  # this llama.cpp build exports no KV-usage gauge


def test_vllm_names_map_to_load_summed_over_labels():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 2\nvllm:num_requests_running{model_name="b"} 1\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="a"} 4\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="a"} 0.5\n'
    )
    load = metrics.server_load(text)
    assert (load.engine, load.running, load.waiting, load.kv_usage) == ("vllm", 3, 4, 0.5)


def test_unknown_scrape_is_idle_and_garbage_is_an_error():
    assert metrics.server_load("# TYPE foo gauge\nfoo 1\n").engine == "unknown"
    try:
        metrics.samples("this is { not prometheus")
    except ValueError:
        pass
    else:
        raise AssertionError("garbage parsed")


def test_workload_is_deterministic_and_turns_extend_their_conversation():
    spec = workload.WorkloadSpec(prefixes=3, prefix_words=120, conversations_per_prefix=2, turns=3)
    a, b = workload.build(spec), workload.build(spec)
    assert a == b
    assert len(a) == 3 * 2 * 3
    by_conv = {}
    for r in a:
        by_conv.setdefault(r.conv, []).append(r)
    for conv, reqs in by_conv.items():
        assert [r.turn for r in reqs] == [0, 1, 2], "turns are issued in order"
        for prev, cur in zip(reqs, reqs[1:]):
            # turn k+1 = turn k's messages (with its user message), the assistant reply, a new user message
            assert cur.messages[: len(prev.messages)] == prev.messages
            assert len(cur.messages) == len(prev.messages) + 2
        assert len({r.prefix for r in reqs}) == 1
    docs = workload.documents(spec)
    assert len({d[:40] for d in docs}) == 3, "documents differ early"
    assert all(r.messages[0]["content"] == docs[r.prefix] for r in a)


def test_workload_interleaves_prefixes_within_a_turn():
    reqs = workload.build(workload.WorkloadSpec(prefixes=4, prefix_words=50, conversations_per_prefix=2, turns=1))
    prefixes = [r.prefix for r in reqs]
    assert prefixes != sorted(prefixes)


def test_decision_header_parsing():
    assert parse_decision("127.0.0.1:8001;prefix_match;matched=1024") == ("127.0.0.1:8001", "prefix_match", 1024)
    assert parse_decision("127.0.0.1:8001;consistent_pick") == ("127.0.0.1:8001", "consistent_pick", None)
    assert parse_decision(None) == (None, None, None)


def test_percentiles_and_variants():
    assert percentile([], 50) is None
    assert percentile([7.0], 90) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile(list(map(float, range(1, 11))), 90) == 9.1
    assert parse_variant("RANDOM") == ("RANDOM", "RANDOM", {})
    assert parse_variant('PREFIX_AWARE:{"concurrency_threshold": 4}') == ("PREFIX_AWARE concurrency_threshold=4", "PREFIX_AWARE",
                                                                {"concurrency_threshold": 4})


def test_server_args_pin_cache_settings():
    args = ServerSpec(model=Path("m.gguf"), cache_ram_mib=64).args(8001)
    joined = " ".join(args)
    for flag in ("-np 1", "-c 4096", "--cache-ram 64", "-t 1", "-tb 1", "--metrics", "--host 127.0.0.1",
                 "--port 8001", "--alias smollm2"):
        assert flag in joined, flag


def test_cannot_run_classification():
    assert _cannot_run(-signal.SIGILL, "")
    assert _cannot_run(127, "")
    assert _cannot_run(1, "error while loading shared libraries: libfoo.so")
    assert not _cannot_run(1, "error: failed to load model")
    assert not _cannot_run(-signal.SIGTERM, "")


def test_common_subset_compares_identical_requests():
    from warmpath_real.client import ChatResult
    from warmpath_real.compare import RequestRecord, StrategyRun, common_subset

    def rec(conv, turn, ttft, cache_n, error=None):
        return RequestRecord(conv, turn, 0, ChatResult(ttft_ms=ttft, cache_n=cache_n, prompt_n=10, error=error))

    a = StrategyRun("A", "RANDOM", {}, ["s1"], records=[rec(0, 0, 100.0, 0), rec(1, 0, 50.0, 5), rec(0, 1, 10.0, 9)])
    b = StrategyRun("B", "PREFIX_AWARE", {}, ["s1"], records=[rec(0, 0, 80.0, 0), rec(1, 0, 40.0, 7, error="x")],
                    skipped=1)
    rows = common_subset([a, b])
    assert [r["requests"] for r in rows] == [1, 1], "only (0, 0) completed in both"
    assert rows[0]["ttft_p50_ms"] == 100.0 and rows[1]["ttft_p50_ms"] == 80.0


def _fake_binary(tmp_path, body):
    exe = tmp_path / "fake-llama-server"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return exe


def test_sigill_at_start_is_cannot_run(tmp_path):
    from warmpath_real.servers import LlamaServer, ServerCannotRun

    spec = ServerSpec(model=tmp_path / "m.gguf", binary=_fake_binary(tmp_path, "echo loading; kill -ILL $$"))
    with LlamaServer(spec, log_dir=tmp_path) as server:
        with pytest.raises(ServerCannotRun, match="SIGILL"):
            server.wait_ready(10)


def test_ordinary_start_failure_is_not_a_skip(tmp_path):
    from warmpath_real.servers import LlamaServer, ServerCannotRun

    spec = ServerSpec(model=tmp_path / "m.gguf", binary=_fake_binary(tmp_path, "echo 'error: failed to load model'; exit 1"))
    with LlamaServer(spec, log_dir=tmp_path) as server:
        with pytest.raises(RuntimeError, match="failed to load model") as e:
            server.wait_ready(10)
        assert not isinstance(e.value, ServerCannotRun)


def test_peer_routers_listen_on_loopback_with_cache_aware():
    from warmpath_real.peers import PEERS, peer_args
    for strategy in PEERS:
        a = peer_args(strategy, 7000, 7001, ["127.0.0.1:9001", "127.0.0.1:9002"])
        after = {flag: a[a.index(flag) + 1] for flag in ("--host", "--prometheus-host", "--prometheus-port", "--policy")}
        assert after == {"--host": "127.0.0.1", "--prometheus-host": "127.0.0.1", "--prometheus-port": "7001",
                         "--policy": "cache_aware"}, a
        assert "http://127.0.0.1:9002" in a
    assert peer_args("SMG_CACHE_AWARE", 1, 2, [])[0] == "launch"


def test_readiness_probe_and_stop(tmp_path):
    log = tmp_path / "p.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    assert log_tail(log, 2) == "line 28\nline 29"
    assert log_tail(tmp_path / "absent.log", 5) == ""

    # A process that exits before it is ready: the error names it and carries its log tail.
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=r"(?s)probe exited \(3\).*line 29"):
        wait_http_ready(failed, "probe", "http://127.0.0.1:9/", lambda _: True, 10.0, lambda: log_tail(log, 1))

    # Ready only once the probe's body says so; a server that never says so times out with the tail.
    bodies = iter([b"{}", b'{"data": [1]}'])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(bodies, b'{"data": [1]}')
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/models"
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_http_ready(running, "router", url, lambda b: bool(json.loads(b).get("data")), 10.0,
                        lambda: "")
        assert next(bodies, None) is None, "ready only after the second answer"
        with pytest.raises(RuntimeError, match="router not ready after 0.5 s"):
            wait_http_ready(running, "router", url, lambda _: False, 0.5, lambda: "")
    finally:
        server.shutdown()
        stop(running)
    assert running.returncode == -signal.SIGTERM, "stopped by SIGTERM"
    stop(running)  # already stopped: nothing to do
