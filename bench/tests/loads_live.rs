//! The `/metrics` reader against a live simulated server.

use warmpath_bench::loads::scrape;
use warmpath_sim::{LatencyProfile, SimConfig, SimServer};

#[tokio::test]
async fn scrape_reads_counters_of_a_live_server() {
    let cfg = SimConfig { latency: LatencyProfile { time_scale: 0.01, ..Default::default() }, ..Default::default() };
    let s = SimServer::start(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let c = reqwest::Client::new();
    let body = serde_json::json!({"model": "m", "prompt": warmpath_sim::tokens::filler_text(1, 100), "max_tokens": 2});
    for _ in 0..2 {
        c.post(format!("http://{}/v1/completions", s.addr())).json(&body).send().await.unwrap().bytes().await.unwrap();
    }
    let m = scrape(&c, &s.addr().to_string()).await.unwrap();
    assert_eq!(m.requests, 2.0);
    assert_eq!(m.prefix_queries, 200.0);
    assert_eq!(m.prefix_hits, 96.0);
    s.stop().await;
}
