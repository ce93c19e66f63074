//! Scrapes the metrics of a set of endpoints concurrently (bounded concurrency, per-request
//! timeout) and turns them into feed endpoints. A failed scrape keeps the endpoint in the feed
//! without load: the filter still routes to it, on its own in-flight counts only.

use std::time::Duration;

use futures::stream::{self, StreamExt};

use super::metrics::ServerMetrics;
use super::FeedEndpoint;

/// At most this many scrapes run at once (per feed).
pub const MAX_CONCURRENT_SCRAPES: usize = 16;
/// Per-scrape timeout.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Metrics bodies larger than this (bytes) are refused.
pub const MAX_METRICS_BYTES: usize = 4 << 20;

/// One endpoint to scrape: its serving address (`IP:port`, what the filter routes to) and the
/// `IP:port` its metrics are served on (often the same).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Serving address.
    pub address: String,
    /// Metrics address.
    pub metrics_address: String,
}

/// Result of scraping a set of targets.
#[derive(Debug, Default)]
pub struct ScrapeResult {
    /// One feed endpoint per target (load `None` where the scrape failed).
    pub endpoints: Vec<FeedEndpoint>,
    /// Scrapes that succeeded.
    pub ok: u64,
    /// Scrapes that failed (connection, status, size, or unparseable metrics).
    pub failed: u64,
}

/// Scrapes `http://{metrics_address}{path}` for every target.
pub async fn scrape_all(client: &reqwest::Client, targets: &[Target], path: &str) -> ScrapeResult {
    let results: Vec<(String, Result<ServerMetrics, String>)> = stream::iter(targets.iter().cloned())
        .map(|t| async move {
            let r = scrape_one(client, &t.metrics_address, path).await;
            (t.address, r)
        })
        .buffer_unordered(MAX_CONCURRENT_SCRAPES)
        .collect()
        .await;
    let mut out = ScrapeResult::default();
    for (address, r) in results {
        match r {
            Ok(m) => {
                out.ok += 1;
                out.endpoints.push(FeedEndpoint { address, load: Some(m.load()) });
            }
            Err(e) => {
                tracing::debug!(%address, error = %e, "metrics scrape failed");
                out.failed += 1;
                out.endpoints.push(FeedEndpoint { address, load: None });
            }
        }
    }
    out
}

async fn scrape_one(client: &reqwest::Client, addr: &str, path: &str) -> Result<ServerMetrics, String> {
    let resp = client
        .get(format!("http://{addr}{path}"))
        .timeout(SCRAPE_TIMEOUT)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .error_for_status()
        .map_err(|e| e.to_string())?;
    if resp.content_length().is_some_and(|n| n as usize > MAX_METRICS_BYTES) {
        return Err("metrics body too large".into());
    }
    let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
    if bytes.len() > MAX_METRICS_BYTES {
        return Err("metrics body too large".into());
    }
    ServerMetrics::parse(&String::from_utf8_lossy(&bytes))
}
