"""Read model-server load and prefix-cache counters from a Prometheus scrape, for llama.cpp and vLLM.

Parsing is `prometheus_client.parser` (the text exposition format); this module only maps names.

llama.cpp (`llama-server --metrics`, names as scraped from build b1-7e4c0a9, see
`realserver/testdata/llamacpp-metrics.prom`; no labels):
- `llamacpp:requests_processing` (gauge): requests being processed — in-flight on the server.
- `llamacpp:requests_deferred` (gauge): requests waiting for a free slot — queued.
- `llamacpp:prompt_tokens_total` (counter): prompt tokens computed (excluding cached ones).
- `llamacpp:prompt_tokens_cached_total` (counter): prompt tokens reused from the cache.
- also `llamacpp:prompt_seconds_total`, `tokens_predicted_total`, `tokens_predicted_seconds_total`,
  `n_decode_total`, `n_tokens_max`, `prompt_tokens_seconds`, `predicted_tokens_seconds`,
  `n_busy_slots_per_decode`, `spec_decode_*`. Unlike older builds there is no `kv_cache_usage_ratio`.

vLLM (v1 engine metric names, label `model_name`; summed over label sets here):
- `vllm:num_requests_running`, `vllm:num_requests_waiting` (gauges),
- `vllm:kv_cache_usage_perc` (0–1; older `vllm:gpu_cache_usage_perc`),
- `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[str, float]:
    """Sample name → value, summed over label sets. Raises `ValueError` on text that is not the exposition format."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


@dataclass
class ServerLoad:
    """One server's load and cache counters, whichever engine exported them.

    `running`/`waiting`: requests (gauges). `kv_usage`: fraction 0–1, None when not exported (llama.cpp).
    `prompt_tokens`/`cached_tokens`: cumulative prompt tokens looked up / served from cache (counters; for
    llama.cpp `prompt_tokens` = computed + cached). `engine`: "llamacpp", "vllm" or "unknown".
    """

    engine: str
    running: float
    waiting: float
    kv_usage: float | None
    prompt_tokens: float | None
    cached_tokens: float | None


def server_load(text: str) -> ServerLoad:
    """Maps a scrape to a `ServerLoad` (llama.cpp names first, then vLLM's; zeros when neither is present)."""
    s = samples(text)
    if "llamacpp:requests_processing" in s:
        computed = s.get("llamacpp:prompt_tokens_total")
        cached = s.get("llamacpp:prompt_tokens_cached_total")
        total = computed + cached if computed is not None and cached is not None else None
        return ServerLoad("llamacpp", s["llamacpp:requests_processing"], s.get("llamacpp:requests_deferred", 0.0),
                          s.get("llamacpp:kv_cache_usage_ratio"), total, cached)
    if "vllm:num_requests_running" in s:
        kv = s.get("vllm:kv_cache_usage_perc", s.get("vllm:gpu_cache_usage_perc"))
        return ServerLoad("vllm", s["vllm:num_requests_running"], s.get("vllm:num_requests_waiting", 0.0), kv,
                          s.get("vllm:prefix_cache_queries_total"), s.get("vllm:prefix_cache_hits_total"))
    return ServerLoad("unknown", 0.0, 0.0, None, None, None)
