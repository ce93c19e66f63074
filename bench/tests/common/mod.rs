//! Shared by the replay tests: small-fleet settings and the check that every request was answered and counted on
//! both sides.

use std::time::Duration;

use serde_json::json;
use warmpath_bench::harness::{RunSettings, StrategyRun};
use warmpath_bench::report::{client_counts, Summary};
use warmpath_sim::{LatencyProfile, SimConfig};

/// 4 servers with small caches (the fleet cannot hold every conversation four times over, so routing decides
/// hits), time scale 0.05, 60 s wall budget.
pub fn settings() -> RunSettings {
    RunSettings {
        endpoints: 4,
        // Small caches: the fleet cannot hold every conversation four times over, so routing decides hits.
        sim: SimConfig {
            cache_blocks: 768,
            latency: LatencyProfile { time_scale: 0.05, ..Default::default() },
            ..Default::default()
        },
        slow: Default::default(),
        rate_scale: 1.0,
        max_wall: Duration::from_secs(60),
        filter_extra: json!({}),
        prefix_length: 65536,
        envoy_concurrency: 2,
        gateways: 1,
        spread: Default::default(),
        client_hop: Default::default(),
        gateway_exchange: true,
        pending_exchange: true,
        fits_exchange: true,
        feed: false,
        feed_interval_ms: None,
        model: "sim-model".into(),
        progress_every: None,
    }
}

/// Every request sent and answered; the client's per-endpoint counts (`x-sim-endpoint`) equal each server's own
/// counter; client-side and server-side cached tokens agree; every answer carried the server's timing.
pub fn assert_balanced(run: &StrategyRun) {
    let s = Summary::of(run);
    assert_eq!(run.not_sent, 0, "{}: every request is sent", run.label);
    assert_eq!(s.errors, 0, "{}: every request answered: {:?}", run.label, run.outcomes.iter().find(|o| !o.ok));
    assert_eq!(s.server_requests, s.client_ok as u64, "{}: client count == sum of server counts", run.label);
    // Per endpoint too: the x-sim-endpoint header the client saw vs each server's own counter.
    let client = client_counts(run);
    for (addr, m) in &run.servers {
        assert_eq!(client.get(addr).copied().unwrap_or(0), m.requests as u64, "{}: {addr}", run.label);
    }
    // Server truth and client-side usage agree on cached tokens.
    let client_cached: u64 = run.outcomes.iter().map(|o| o.usage.prompt_tokens_details.cached_tokens).sum();
    let server_cached: f64 = run.servers.iter().map(|(_, m)| m.prefix_hits).sum();
    assert_eq!(client_cached as f64, server_cached, "{}", run.label);
    // A pick of the harness's own router reached the server it named.
    assert_eq!(s.misrouted, 0, "{}: answered elsewhere than picked", run.label);
    // Every router on the way passed the server's own timing through, so its latencies are scaled like the others'.
    assert_eq!(s.untimed, 0, "{}: answers without the server's timing", run.label);
}
