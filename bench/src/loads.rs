//! Reads each simulated server's `/metrics` (vLLM metric names) into [`ServerLoad`]s and final counters. The
//! same reader works against real vLLM servers.

use std::time::Duration;

use warmpath_core::endpoint::ServerLoad;
use warmpath_core::feed::FeedLoad;

/// Counters and gauges of one server, summed over label sets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerMetrics {
    /// `vllm:num_requests_waiting`, `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`, as the
    /// controller's feed serves them (`warmpath_server_metrics::ServerMetrics::load`).
    pub load: FeedLoad,
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
            load: m.load(),
            prefix_queries: m.prefix_cache_queries.unwrap_or(0.0),
            prefix_hits: m.prefix_cache_hits.unwrap_or(0.0),
            requests: m.requests_completed.unwrap_or(0.0),
        })
    }

    /// [`Self::load`] as the core's [`ServerLoad`] (what the client-side routers compare).
    pub fn server_load(&self) -> ServerLoad {
        self.load.into()
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
            ServerMetrics {
                load: FeedLoad { waiting: 2, running: 3, kv_cache_usage: 0.5 },
                prefix_queries: 100.0,
                prefix_hits: 40.0,
                requests: 7.0
            }
        );
        assert_eq!(p.server_load(), ServerLoad { waiting: 2, running: 3, kv_cache_usage: 0.5 });
    }
}
