"""warmpath against real llama.cpp servers: install check, server launcher, workload, OpenAI client, comparison.

Modules:
- `servers`: start/stop `llama-server` processes on loopback with their cache behaviour pinned.
- `select_model`: pick a model file the prebuilt binary can run on this CPU (Q4_1, else a BF16/F16 copy).
- `workload`: a deterministic multi-turn chat workload with shared prefixes.
- `client`: streaming OpenAI client that measures TTFT and reads llama.cpp's `timings`.
- `metrics`: parse llama.cpp / vLLM Prometheus scrapes (load signal names).
- `envoy`: run the project's Envoy launcher (`warmpath-envoy run`) with a chosen strategy.
- `compare`: the RANDOM / LEAST_OUTSTANDING_REQUESTS / PREFIX_AWARE comparison.
"""
