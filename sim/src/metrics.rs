//! `/metrics` of the simulated server, with vLLM's metric names so that load readers written for vLLM work
//! unchanged (vLLM `vllm/v1/metrics/loggers.py`: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`, ...).
//! Every series carries the label `model_name`, as vLLM's do.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The server's metric handles plus the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests in their prefill or decode.
    pub running: Gauge,
    /// Requests whose prefill has not started: waiting for a batch slot, or with one, for the prefill lane.
    pub waiting: Gauge,
    /// Fraction of KV blocks pinned by running requests, 0–1.
    pub kv_usage: Gauge<f64, AtomicU64>,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: Counter,
    /// Prompt tokens served from the prefix cache.
    pub prefix_hits: Counter,
    /// Prompt tokens received.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub generation_tokens: Counter,
    /// Requests answered completely.
    pub request_success: Counter,
    /// Requests rejected as malformed (HTTP 400).
    pub request_errors: Counter,
    /// Simulated TTFT, seconds (server side: excludes the network).
    pub ttft_seconds: Histogram,
}

impl Metrics {
    /// Registers every metric, labelled with `model_name`.
    pub fn new(model: &str) -> Self {
        let mut registry = Registry::with_labels(std::iter::once(("model_name".into(), model.to_string().into())));
        let m = Self {
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            request_success: Counter::default(),
            request_errors: Counter::default(),
            ttft_seconds: Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0]),
            registry: Registry::default(),
        };
        registry.register("vllm:num_requests_running", "Requests in their prefill or decode", m.running.clone());
        registry.register("vllm:num_requests_waiting", "Requests whose prefill has not started", m.waiting.clone());
        registry.register("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100 percent", m.kv_usage.clone());
        registry.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens queried in the prefix cache",
            m.prefix_queries.clone(),
        );
        registry.register("vllm:prefix_cache_hits", "Prompt tokens hit in the prefix cache", m.prefix_hits.clone());
        registry.register("vllm:prompt_tokens", "Prompt tokens processed", m.prompt_tokens.clone());
        registry.register("vllm:generation_tokens", "Generated tokens", m.generation_tokens.clone());
        registry.register("vllm:request_success", "Requests finished", m.request_success.clone());
        registry.register("warmpath_sim:request_errors", "Requests rejected as malformed", m.request_errors.clone());
        registry.register("vllm:time_to_first_token_seconds", "Simulated time to first token", m.ttft_seconds.clone());
        Self { registry, ..m }
    }

    /// Prometheus text exposition of all metrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
