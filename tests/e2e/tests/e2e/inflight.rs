//! The shared in-flight counters (proxy-wasm shared data, CAS) go back to zero after finished, client-aborted and
//! upstream-timed-out streams. Read through the `warmpath.in_flight.<endpoint>` gauges the filter refreshes from
//! shared data every tick.

use std::time::Duration;

use serde_json::json;
use warmpath_harness::{EnvoyProcess, Stats};

use crate::common::{prompt, Rig, CONCURRENCY};

fn gauge_name(addr: &str) -> String {
    format!("in_flight.{}", warmpath_core::endpoint::stat_token(addr))
}

fn total_in_flight(rig: &Rig, s: &Stats) -> u64 {
    rig.upstreams.iter().map(|u| s.filter(&gauge_name(&u.addr().to_string()))).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_return_to_zero_after_client_aborts() {
    let rig = Rig::start(3, json!({"strategy": "LEAST_OUTSTANDING_REQUESTS"})).await;
    for u in &rig.upstreams {
        u.hold();
    }
    // 12 clients that give up after 1.5 s; while they wait the filter counts them in flight.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(1500)).build().expect("client");
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (c, url) = (impatient.clone(), format!("{}/v1/chat/completions", rig.envoy.url()));
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": prompt(&format!("abort {i}"), 2000)}]});
        tasks.push(tokio::spawn(async move { c.post(url).body(body.to_string()).send().await.is_err() }));
    }
    let during = rig.stats_until(|s| total_in_flight(&rig, s) == 12).await;
    assert_eq!(total_in_flight(&rig, &during), 12, "held requests are counted in flight");
    // Least-outstanding spread them 4/4/4.
    for u in &rig.upstreams {
        assert_eq!(during.filter(&gauge_name(&u.addr().to_string())), 4);
    }
    for t in tasks {
        assert!(t.await.expect("join"), "client should have timed out");
    }
    let after = rig.stats_until(|s| total_in_flight(&rig, s) == 0).await;
    assert_eq!(total_in_flight(&rig, &after), 0, "aborted streams left in-flight counts");
    for u in &rig.upstreams {
        u.release();
    }
    // Normal traffic afterwards finishes and leaves the counters at zero too.
    for i in 0..9 {
        assert_eq!(rig.chat(&format!("after abort {i}")).await.status, 200);
    }
    let done = rig.stats_until(|s| total_in_flight(&rig, s) == 0).await;
    assert_eq!(total_in_flight(&rig, &done), 0);
    assert_eq!(done.filter("cas_failures"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_return_to_zero_after_upstream_timeouts() {
    let upstreams = warmpath_harness::Upstream::start_many(3).await.expect("upstreams");
    let mut cfg = Rig::config(&upstreams, json!({"strategy": "PREFIX_AWARE"}));
    cfg.route_timeout_s = 1;
    let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
    let rig = Rig { upstreams, envoy, client };
    for u in &rig.upstreams {
        u.set_delay(Duration::from_secs(3));
    }
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (c, url) = (rig.client.clone(), format!("{}/v1/chat/completions", rig.envoy.url()));
        let body = json!({"model": "m", "messages": [{"role": "user", "content": prompt(&format!("slow {i}"), 2000)}]});
        tasks.push(tokio::spawn(async move {
            c.post(url).body(body.to_string()).send().await.map(|r| r.status().as_u16())
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("join").expect("envoy answers"), 504, "route timeout resets the upstream stream");
    }
    let after = rig.stats_until(|s| total_in_flight(&rig, s) == 0).await;
    assert_eq!(total_in_flight(&rig, &after), 0);
    assert!(after.get("cluster.model_servers.upstream_rq_timeout") >= 6);
}

fn pending_gauge_name(addr: &str) -> String {
    format!("pending_prefill.{}", warmpath_core::endpoint::stat_token(addr))
}

fn total_pending(rig: &Rig, s: &Stats) -> u64 {
    rig.upstreams.iter().map(|u| s.filter(&pending_gauge_name(&u.addr().to_string()))).sum()
}

/// PREFIX_AWARE's pending prefill work (bytes of prompt sent to an endpoint whose first response byte has not come
/// back, shared by the workers) is held while the upstream has not answered, and given back by every stream: ones
/// that finish, and ones the client resets while waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_prefill_returns_to_zero_after_every_stream() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    for u in &rig.upstreams {
        u.hold();
    }
    // 6 clients with distinct 2,000-character prompts that give up after 1.5 s.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(1500)).build().expect("client");
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (c, url) = (impatient.clone(), format!("{}/v1/chat/completions", rig.envoy.url()));
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": prompt(&format!("pending {i}"), 2000)}]});
        tasks.push(tokio::spawn(async move { c.post(url).body(body.to_string()).send().await.is_err() }));
    }
    let during = rig.stats_until(|s| total_in_flight(&rig, s) == 6 && total_pending(&rig, s) >= 6 * 2000).await;
    assert_eq!(total_in_flight(&rig, &during), 6);
    assert!(
        total_pending(&rig, &during) >= 6 * 2000,
        "held prompts count as pending prefill: {}",
        total_pending(&rig, &during)
    );
    for t in tasks {
        assert!(t.await.expect("join"), "client should have timed out");
    }
    let after = rig.stats_until(|s| total_pending(&rig, s) == 0 && total_in_flight(&rig, s) == 0).await;
    assert_eq!(total_pending(&rig, &after), 0, "reset streams left pending prefill");
    assert_eq!(total_in_flight(&rig, &after), 0);
    for u in &rig.upstreams {
        u.release();
    }
    // Finished streams (the first body byte releases the work, the end would too) leave nothing either.
    for i in 0..9 {
        assert_eq!(rig.chat(&prompt(&format!("after {i}"), 1500)).await.status, 200);
    }
    let done = rig.stats_until(|s| total_pending(&rig, s) == 0).await;
    assert_eq!(total_pending(&rig, &done), 0);
    assert_eq!(done.filter("cas_failures"), 0);
}
