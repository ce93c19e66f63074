//! Envoy's timing log (`warmpath_harness::timing`): a real Envoy writes one line per request, and every line reads
//! back with both of its parts.
//!
//! Needs `.venv/bin/envoy`, like the other end-to-end tests.

use std::time::{Duration, Instant};

use warmpath_harness::timing::{self, FLUSH_INTERVAL_MS};
use warmpath_harness::{EnvoyConfig, EnvoyProcess, Upstream, DESTINATION_HEADER};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_logs_its_own_timing_of_every_request() {
    let upstream = Upstream::start().await.expect("upstream");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("timing.log");
    let mut cfg = EnvoyConfig::new(vec![upstream.addr()], "{}").with_timing_log(&log);
    // No filter: the client names the server, as the harness's own routers do.
    cfg.strip_in_envoy = false;
    let envoy = EnvoyProcess::start(cfg, 1).await.expect("envoy");
    let client = reqwest::Client::new();
    const REQUESTS: usize = 3;
    for _ in 0..REQUESTS {
        let r = client
            .post(format!("{}/v1/chat/completions", envoy.url()))
            .header(DESTINATION_HEADER, upstream.addr().to_string())
            .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await
            .expect("request");
        assert!(r.status().is_success(), "status {}", r.status());
        r.bytes().await.expect("body");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let lines = timing::parse(&std::fs::read_to_string(&log).unwrap_or_default(), "/v1/");
        if lines.len() >= REQUESTS || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(FLUSH_INTERVAL_MS)).await;
    };
    assert_eq!(lines.len(), REQUESTS, "one line per request: {lines:?}");
    for l in &lines {
        assert!(l.request_us.is_some() && l.first_byte_us.is_some(), "both parts logged: {l:?}");
    }
}
