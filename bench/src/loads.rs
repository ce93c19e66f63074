//! Reads each simulated server's `/metrics` (vLLM metric names) into [`ServerLoad`]s and final counters. The
//! same reader works against real vLLM servers.

use std::time::Duration;

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
    /// Parses Prometheus/OpenMetrics text with the parser the controller's feed uses
    /// (`warmpath-server-metrics`); counters a server does not export read as 0.
    ///
    /// Errors: the text is not exposition format, or has none of the known model-server metrics.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let m = warmpath_server_metrics::ServerMetrics::parse(text).map_err(anyhow::Error::msg)?;
        Ok(ServerMetrics {
            running: m.running,
            waiting: m.waiting,
            kv_usage: m.kv_cache_usage.unwrap_or(0.0),
            prefix_queries: m.prefix_cache_queries.unwrap_or(0.0),
            prefix_hits: m.prefix_cache_hits.unwrap_or(0.0),
            requests: m.requests_completed.unwrap_or(0.0),
        })
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
