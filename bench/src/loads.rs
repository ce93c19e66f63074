//! Reads each simulated server's `/metrics` (vLLM metric names) into [`ServerLoad`]s and final counters. The
//! same reader works against real vLLM servers.

use std::time::Duration;

use prometheus_parse::{Scrape, Value};
use warmpath_core::endpoint::ServerLoad;

/// Counters and gauges of one server, summed over label sets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerMetrics {
    /// `vllm:num_requests_running`.
    pub running: f64,
    /// `vllm:num_requests_waiting`.
    pub waiting: f64,
    /// `vllm:kv_cache_usage_perc` (0–1).
    pub kv_usage: f64,
    /// `vllm:prefix_cache_queries_total`, tokens.
    pub prefix_queries: f64,
    /// `vllm:prefix_cache_hits_total`, tokens.
    pub prefix_hits: f64,
    /// `vllm:request_success_total`.
    pub requests: f64,
}

impl ServerMetrics {
    /// Parses Prometheus/OpenMetrics text.
    ///
    /// prometheus-parse 0.2 matches metric names with `\w+`, which omits the `:` the exposition format allows
    /// (and vLLM uses), so `:` in names is mapped to `_` before parsing; label values are untouched.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let lines = text.lines().map(|l| {
            let name_end = l.find(['{', ' ']).unwrap_or(l.len());
            let fixed = if l.starts_with('#') {
                l.replace(':', "_")
            } else {
                format!("{}{}", l[..name_end].replace(':', "_"), &l[name_end..])
            };
            Ok(fixed)
        });
        let scrape = Scrape::parse(lines)?;
        let mut m = ServerMetrics::default();
        for s in scrape.samples {
            let v = match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => continue,
            };
            let metric = s.metric.as_str();
            let slot = match metric.strip_suffix("_total").unwrap_or(metric) {
                "vllm_num_requests_running" => &mut m.running,
                "vllm_num_requests_waiting" => &mut m.waiting,
                "vllm_kv_cache_usage_perc" | "vllm_gpu_cache_usage_perc" => &mut m.kv_usage,
                "vllm_prefix_cache_queries" => &mut m.prefix_queries,
                "vllm_prefix_cache_hits" => &mut m.prefix_hits,
                "vllm_request_success" => &mut m.requests,
                _ => continue,
            };
            *slot += v;
        }
        Ok(m)
    }

    /// The load part, as the core's [`ServerLoad`].
    pub fn load(&self) -> ServerLoad {
        ServerLoad { waiting: self.waiting as u32, running: self.running as u32, kv_cache_usage: self.kv_usage as f32 }
    }
}

/// GETs `http://{addr}/metrics` and parses it.
pub async fn scrape(client: &reqwest::Client, addr: &str) -> anyhow::Result<ServerMetrics> {
    let text = client
        .get(format!("http://{addr}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    ServerMetrics::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_names_from_the_simulator_encoding() {
        let m = warmpath_sim::metrics::Metrics::new("m");
        m.running.set(3);
        m.waiting.set(2);
        m.kv_usage.set(0.5);
        m.prefix_queries.inc_by(100);
        m.prefix_hits.inc_by(40);
        m.request_success.inc_by(7);
        let p = ServerMetrics::parse(&m.encode()).unwrap();
        assert_eq!(
            p,
            ServerMetrics { running: 3.0, waiting: 2.0, kv_usage: 0.5, prefix_queries: 100.0, prefix_hits: 40.0, requests: 7.0 }
        );
        assert_eq!(p.load(), ServerLoad { waiting: 2, running: 3, kv_cache_usage: 0.5 });
    }
}
