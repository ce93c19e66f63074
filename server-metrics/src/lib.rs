//! warmpath-server-metrics: model-server load from Prometheus text exposition, for vLLM, SGLang and
//! llama.cpp — the one parser the controller's feed and the benchmark's replay both use.
//!
//! Metric names (summed over label sets, e.g. SGLang's per-rank series; KV usage takes the max):
//!
//! | load | vLLM | SGLang | llama.cpp (`--metrics`) |
//! |---|---|---|---|
//! | waiting | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `llamacpp:requests_deferred` |
//! | running | `vllm:num_requests_running` | `sglang:num_running_reqs` | `llamacpp:requests_processing` |
//! | KV cache usage (0–1) | `vllm:kv_cache_usage_perc` (V1), `vllm:gpu_cache_usage_perc` (V0) | `sglang:token_usage` | `llamacpp:kv_cache_usage_ratio` (some builds only) |
//! | prefix-cache hits | `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` (tokens) | `sglang:cache_hit_rate` (ratio) | `llamacpp:prompt_tokens_cached_total` / (that + `llamacpp:prompt_tokens_total`) (tokens) |
//! | completed requests | `vllm:request_success_total` | | |
//!
//! Parsing uses the `prometheus-parse` crate. Its 0.2 name pattern (`\w+`) does not accept the `:`
//! the exposition format allows in names, so `:` in a metric name is mapped to `_` before parsing
//! (label values are left alone).

use prometheus_parse::{Scrape, Value};
use warmpath_core::feed::FeedLoad;

/// What one model server's `/metrics` says about its load and cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerMetrics {
    /// Queued requests (count).
    pub waiting: f64,
    /// Requests being processed (count).
    pub running: f64,
    /// KV-cache usage fraction 0–1, when the server exports it.
    pub kv_cache_usage: Option<f64>,
    /// Prefix-cache hit ratio 0–1 (vLLM: hits/queries in tokens since start; SGLang: its own
    /// gauge), when exported.
    pub prefix_cache_hit_ratio: Option<f64>,
    /// vLLM's prefix-cache hits since start, in tokens (`vllm:prefix_cache_hits_total`), when exported.
    pub prefix_cache_hits: Option<f64>,
    /// vLLM's prefix-cache lookups since start, in tokens (`vllm:prefix_cache_queries_total`), when exported.
    pub prefix_cache_queries: Option<f64>,
    /// Requests completed since start (`vllm:request_success_total`), when exported.
    pub requests_completed: Option<f64>,
    /// Which server family the metrics came from (`vllm`, `sglang`, `llamacpp`), if recognised.
    pub server: Option<&'static str>,
}

impl ServerMetrics {
    /// Parses Prometheus / OpenMetrics text.
    ///
    /// Errors: the text is not parseable exposition format, or it has none of the known metrics
    /// (wrong port/path, or an unsupported server).
    pub fn parse(text: &str) -> Result<Self, String> {
        let lines = text.lines().map(|l| {
            let fixed = if l.starts_with('#') {
                l.replace(':', "_")
            } else {
                let end = l.find(['{', ' ', '\t']).unwrap_or(l.len());
                format!("{}{}", l[..end].replace(':', "_"), &l[end..])
            };
            Ok(fixed)
        });
        let scrape = Scrape::parse(lines).map_err(|e| format!("metrics text: {e}"))?;
        let mut m = ServerMetrics::default();
        let (mut hits, mut queries) = (None::<f64>, None::<f64>);
        // llama.cpp counts computed prompt tokens (excluding cached) and cached ones separately.
        let (mut llama_cached, mut llama_computed) = (None::<f64>, None::<f64>);
        for s in scrape.samples {
            let v = match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => continue,
            };
            if !v.is_finite() {
                continue;
            }
            let name = s.metric.as_str();
            let family = name.split('_').next().unwrap_or("");
            let base = name.strip_suffix("_total").unwrap_or(name);
            let mut seen = true;
            match base {
                "vllm_num_requests_waiting" | "sglang_num_queue_reqs" | "llamacpp_requests_deferred" => m.waiting += v,
                "vllm_num_requests_running" | "sglang_num_running_reqs" | "llamacpp_requests_processing" => {
                    m.running += v
                }
                "vllm_kv_cache_usage_perc"
                | "vllm_gpu_cache_usage_perc"
                | "sglang_token_usage"
                | "llamacpp_kv_cache_usage_ratio" => m.kv_cache_usage = Some(m.kv_cache_usage.unwrap_or(0.0).max(v)),
                "vllm_prefix_cache_hits" | "vllm_gpu_prefix_cache_hits" => *hits.get_or_insert(0.0) += v,
                "vllm_prefix_cache_queries" | "vllm_gpu_prefix_cache_queries" => *queries.get_or_insert(0.0) += v,
                "sglang_cache_hit_rate" => m.prefix_cache_hit_ratio = Some(v),
                "llamacpp_prompt_tokens_cached" => *llama_cached.get_or_insert(0.0) += v,
                "llamacpp_prompt_tokens" => *llama_computed.get_or_insert(0.0) += v,
                "vllm_request_success" => *m.requests_completed.get_or_insert(0.0) += v,
                _ => seen = false,
            }
            if seen && m.server.is_none() {
                m.server = match family {
                    "vllm" => Some("vllm"),
                    "sglang" => Some("sglang"),
                    "llamacpp" => Some("llamacpp"),
                    _ => None,
                };
            }
        }
        (m.prefix_cache_hits, m.prefix_cache_queries) = (hits, queries);
        if let (Some(h), Some(q)) = (hits, queries) {
            m.prefix_cache_hit_ratio = Some(if q > 0.0 { (h / q).clamp(0.0, 1.0) } else { 0.0 });
        } else if let (Some(c), Some(p)) = (llama_cached, llama_computed) {
            m.prefix_cache_hit_ratio = Some(if c + p > 0.0 { (c / (c + p)).clamp(0.0, 1.0) } else { 0.0 });
        }
        if m.server.is_none() {
            return Err("no vLLM, SGLang or llama.cpp load metrics found".into());
        }
        Ok(m)
    }

    /// The feed's load record (counts saturate at `u32::MAX`, KV usage clamped to 0–1, 0 when
    /// the server does not export it).
    pub fn load(&self) -> FeedLoad {
        let count = |v: f64| v.max(0.0).min(u32::MAX as f64) as u32;
        FeedLoad {
            waiting: count(self.waiting),
            running: count(self.running),
            kv_cache_usage: self.kv_cache_usage.unwrap_or(0.0).clamp(0.0, 1.0) as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_v1() {
        let text =
            "# HELP vllm:num_requests_waiting Number of requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 5.0\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1000.0\n\
vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 400.0\n";
        let m = ServerMetrics::parse(text).unwrap();
        assert_eq!(m.server, Some("vllm"));
        assert_eq!(m.load(), FeedLoad { waiting: 3, running: 5, kv_cache_usage: 0.25 });
        assert!((m.prefix_cache_hit_ratio.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(
            (m.prefix_cache_hits, m.prefix_cache_queries, m.requests_completed),
            (Some(400.0), Some(1000.0), None)
        );
    }

    #[test]
    fn sglang_sums_ranks_and_takes_max_usage() {
        let text = "sglang:num_queue_reqs{model_name=\"q\",tp_rank=\"0\"} 4\nsglang:num_queue_reqs{model_name=\"q\",tp_rank=\"1\"} 1\n\
sglang:num_running_reqs{model_name=\"q\"} 8\nsglang:token_usage{model_name=\"q\",tp_rank=\"0\"} 0.52\nsglang:token_usage{model_name=\"q\",tp_rank=\"1\"} 0.61\n\
sglang:cache_hit_rate{model_name=\"q\"} 0.28\n";
        let m = ServerMetrics::parse(text).unwrap();
        assert_eq!(m.server, Some("sglang"));
        assert_eq!(m.load(), FeedLoad { waiting: 5, running: 8, kv_cache_usage: 0.61 });
        assert_eq!(m.prefix_cache_hit_ratio, Some(0.28));
    }

    #[test]
    fn llamacpp_without_kv_gauge() {
        let text = "# HELP llamacpp:requests_processing Number of requests processing.\n# TYPE llamacpp:requests_processing gauge\n\
llamacpp:requests_processing 2\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 7\nllamacpp:tokens_predicted_total 39080\n";
        let m = ServerMetrics::parse(text).unwrap();
        assert_eq!(m.server, Some("llamacpp"));
        assert_eq!(m.kv_cache_usage, None);
        assert_eq!(m.load(), FeedLoad { waiting: 7, running: 2, kv_cache_usage: 0.0 });
    }

    /// A real `llama-server --metrics` scrape captured by the real-server tests.
    #[test]
    fn llamacpp_captured_scrape() {
        let text = include_str!("../../realserver/testdata/llamacpp-metrics.prom");
        let m = ServerMetrics::parse(text).unwrap();
        assert_eq!(m.server, Some("llamacpp"));
        assert_eq!(m.load(), FeedLoad { waiting: 0, running: 1, kv_cache_usage: 0.0 });
        // prompt_tokens_cached_total 391 of 391 + prompt_tokens_total 767.
        assert!((m.prefix_cache_hit_ratio.unwrap() - 391.0 / 1158.0).abs() < 1e-9);
    }

    #[test]
    fn unknown_or_garbage_text_is_an_error() {
        assert!(ServerMetrics::parse("process_cpu_seconds_total 12\n").is_err());
        assert!(ServerMetrics::parse("<html>not metrics</html>").is_err());
        assert!(ServerMetrics::parse("").is_err());
    }
}
