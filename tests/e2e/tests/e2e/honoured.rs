//! What the filter cannot check at configure time (it cannot see Envoy's clusters) is counted and logged once when
//! it shows: an endpoint that is not a member of the Envoy cluster (every pick of it that Envoy sends elsewhere is
//! counted in `warmpath.picks_not_honoured`, from the upstream address Envoy reports), and a feed cluster that does
//! not exist (`warmpath.feed.failures.dispatch`).

use std::time::Duration;

use serde_json::json;
use warmpath_harness::{filter_wasm, free_port, EnvoyConfig, EnvoyProcess, Upstream};

use crate::common::CONCURRENCY;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_of_a_non_member_are_counted_and_logged_once() {
    let upstreams = Upstream::start_many(2).await.expect("upstreams");
    let members: Vec<_> = upstreams.iter().map(Upstream::addr).collect();
    let outsider = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut endpoints: Vec<String> = members.iter().map(|a| a.to_string()).collect();
    endpoints.push(outsider.clone());
    let plugin = json!({"strategy": "RANDOM", "endpoints": endpoints}).to_string();
    let cfg = EnvoyConfig::new(members.clone(), plugin).with_wasm(filter_wasm().expect("module"));
    let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
    let requests = 60;
    for i in 0..requests {
        let r = client
            .post(format!("{}/v1/completions", envoy.url()))
            .body(format!(r#"{{"prompt":"{i}"}}"#))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200, "Envoy's fallback serves the request");
    }
    // Counters reach Envoy on the tick.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut s = envoy.stats().await.expect("stats");
    while s.sum_prefix("wasmcustom.warmpath.decisions.") < requests && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = envoy.stats().await.expect("stats");
    }
    let served: usize = upstreams.iter().map(Upstream::count).sum();
    let not_honoured = s.filter("picks_not_honoured");
    // RANDOM over three endpoints, one of them outside the cluster: about a third of the picks.
    assert!(not_honoured >= 5 && not_honoured < requests, "picks_not_honoured = {not_honoured} of {requests}");
    assert_eq!(served as u64, requests, "every request was served by a member");
    assert_eq!(s.filter("endpoint_failures"), 0, "a pick not honoured is not an endpoint failure");
    let log = envoy.log();
    let lines = log.lines().filter(|l| l.contains("did not honour the pick") && l.contains(&outsider)).count();
    assert!((1..=CONCURRENCY as usize).contains(&lines), "{lines} log lines (once per worker VM at most):\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_feed_cluster_is_logged_once() {
    let upstreams = Upstream::start_many(1).await.expect("upstreams");
    let members: Vec<_> = upstreams.iter().map(Upstream::addr).collect();
    let plugin = json!({"endpoints": [members[0].to_string()],
        "feed": {"cluster": "no_such_cluster", "path": "/v1/endpoints", "interval_ms": 100}});
    let cfg = EnvoyConfig::new(members.clone(), plugin.to_string()).with_wasm(filter_wasm().expect("module"));
    let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy");
    // Many poll intervals.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut s = envoy.stats().await.expect("stats");
    while s.filter("feed.failures.dispatch") < 10 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = envoy.stats().await.expect("stats");
    }
    assert!(s.filter("feed.failures.dispatch") >= 10, "{}", envoy.log());
    let log = envoy.log();
    let lines = log.lines().filter(|l| l.contains("cannot call cluster") && l.contains("no_such_cluster")).count();
    // Once per poller VM. The lease rarely moves, so at most one more than the workers, though Envoy runs two more
    // VMs than workers (docs/filter.md, "Shared state").
    assert!(
        (1..=CONCURRENCY as usize + 1).contains(&lines),
        "{lines} log lines for {} failed dispatches:\n{log}",
        s.filter("feed.failures.dispatch")
    );
}
