"""Streaming OpenAI chat client that measures time to first token (TTFT) client-side.

Uses the real `openai` package against any OpenAI-compatible base URL (a llama-server directly, or Envoy in
front of several). From the stream it takes:
- TTFT: wall time (ms, `time.perf_counter`) from sending the request to the first chunk whose delta carries
  non-empty text (llama.cpp first sends a role-only chunk, which is not a token);
- llama.cpp's `timings` object in the final chunk: `cache_n` (prompt tokens reused from the KV/prompt cache),
  `prompt_n` (prompt tokens computed), `prompt_ms`;
- the serving endpoint and the filter's decision from the response headers the measuring Envoy adds
  (`scripts/envoy.sh render --rig-headers`): `x-rig-upstream-host` (Envoy's `%UPSTREAM_HOST%`) and
  `x-rig-decision` (`IP:port;reason;matched=N`, the filter's record in Envoy's filter state), when present.
  The filter itself never tells a client these.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import openai

from .servers import MODEL_ALIAS

#: Response header of the measuring Envoy (rig headers): the filter's decision, `IP:port;reason;matched=N`.
DECISION_HEADER = "x-rig-decision"
#: Response header of the measuring Envoy (rig headers): the upstream host that answered, `IP:port`.
UPSTREAM_HEADER = "x-rig-upstream-host"


@dataclass
class ChatResult:
    """One streamed chat completion as seen by the client.

    `ttft_ms`/`total_ms`: milliseconds from request start to first token / end of stream.
    `cache_n`/`prompt_n`: prompt tokens served from cache / computed, from llama.cpp's `timings` (None if absent).
    `endpoint`: the upstream that answered (`x-rig-upstream-host`); `reason`/`matched_chars`: the filter's
    decision (`x-rig-decision`). None without the measuring Envoy's rig headers (e.g. a peer router).
    `error`: the exception text when the request failed (the other fields are then partial).
    """

    ttft_ms: float | None = None
    total_ms: float | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    completion_tokens: int | None = None
    endpoint: str | None = None
    reason: str | None = None
    matched_chars: int | None = None
    error: str | None = None


def parse_decision(value: str | None) -> tuple[str | None, str | None, int | None]:
    """Splits `IP:port;reason;matched=N` into (endpoint, reason, matched characters); Nones for missing parts."""
    if not value:
        return None, None, None
    parts = value.split(";")
    endpoint = parts[0] or None
    reason = parts[1] if len(parts) > 1 else None
    matched = None
    for p in parts[2:]:
        if p.startswith("matched="):
            try:
                matched = int(p.split("=", 1)[1])
            except ValueError:
                pass
    return endpoint, reason, matched


def make_client(base_url: str, timeout_s: float = 120.0) -> openai.OpenAI:
    """An OpenAI client for `base_url` (e.g. `http://127.0.0.1:10000/v1`); no retries, so every request
    measured is exactly one request sent."""
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout_s)


def stream_chat(client: openai.OpenAI, messages: list[dict], max_tokens: int, model: str = MODEL_ALIAS,
                headers: dict[str, str] | None = None) -> ChatResult:
    """Sends one streamed chat completion (temperature 0) and returns what was measured; never raises for
    request errors (they are recorded in `ChatResult.error`)."""
    res = ChatResult()
    t0 = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_headers=headers or None,
        )
        picked, res.reason, res.matched_chars = parse_decision(stream.response.headers.get(DECISION_HEADER))
        res.endpoint = stream.response.headers.get(UPSTREAM_HEADER) or picked
        with stream:
            for chunk in stream:
                if res.ttft_ms is None and chunk.choices and chunk.choices[0].delta.content:
                    res.ttft_ms = (time.perf_counter() - t0) * 1e3
                timings = (chunk.model_extra or {}).get("timings")
                if timings:
                    res.cache_n = timings.get("cache_n")
                    res.prompt_n = timings.get("prompt_n")
                    res.prompt_ms = timings.get("prompt_ms")
                if chunk.usage is not None:
                    res.completion_tokens = chunk.usage.completion_tokens
        res.total_ms = (time.perf_counter() - t0) * 1e3
        if res.ttft_ms is None:
            # No text at all (e.g. the model emitted only an end token): the first token was the end.
            res.ttft_ms = res.total_ms
    except (openai.OpenAIError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"
        res.total_ms = (time.perf_counter() - t0) * 1e3
    return res
