//! A request reset by a dying endpoint is retried on another host even under a route retry policy that does not
//! retry resets — Istio's default route policy, which the controller's Istio rendering leaves in place — because
//! the filter sends its retry conditions with every pick (`x-envoy-retry-on`, `warmpath_core::headers::RETRY_ON`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use warmpath_envoy_config::type_url;
use warmpath_harness::{filter_wasm, EnvoyConfig, Upstream};

use crate::common::{prompt, Rig};

/// Istio's default route retry policy (what istiod sets on a route without a VirtualService `retries`, including the
/// routes of a Gateway API HTTPRoute): connect failures and 503s on another host, not resets.
fn istio_default_retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retriable_status_codes": [503],
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": { "@type": type_url::PREVIOUS_HOSTS },
        }],
        "host_selection_retry_max_attempts": 5,
    })
}

/// Sends `n` chat requests while every upstream holds them, kills the upstream holding the most once all arrived
/// (its requests see a reset before any response byte), lets the others answer; returns (requests reset by the
/// kill, the statuses the clients got).
async fn reset_in_flight(rig: &Rig, n: usize) -> (usize, Vec<u16>) {
    rig.upstreams.iter().for_each(Upstream::hold);
    let url = format!("{}/v1/chat/completions", rig.envoy.url());
    let sent: Vec<_> = (0..n)
        .map(|i| {
            let (client, url) = (rig.client.clone(), url.clone());
            let body =
                json!({"model": "m", "messages": [{"role": "user", "content": prompt(&format!("reset {i}"), 1500)}]});
            tokio::spawn(
                async move { client.post(url).body(body.to_string()).send().await.map(|r| r.status().as_u16()) },
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.upstreams.iter().map(Upstream::active).sum::<usize>() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let victim = (0..rig.upstreams.len()).max_by_key(|&i| rig.upstreams[i].active()).expect("upstreams");
    for (i, u) in rig.upstreams.iter().enumerate() {
        if i != victim {
            u.release();
        }
    }
    let reset = rig.upstreams[victim].kill();
    let mut statuses = Vec::new();
    for s in sent {
        statuses.push(s.await.expect("task").unwrap_or(0));
    }
    (reset, statuses)
}

async fn rig(wasm: bool) -> Rig {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let addrs: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let plugin = EnvoyConfig::plugin_json(&addrs, json!({"strategy": "PREFIX_AWARE"}));
    let mut cfg = EnvoyConfig::new(addrs, plugin);
    if wasm {
        cfg = cfg.with_wasm(filter_wasm().expect("filter module"));
    }
    cfg.route_retry_policy = istio_default_retry_policy();
    Rig::launch(upstreams, cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reset_by_a_dying_endpoint_are_retried_under_istios_default_route_policy() {
    // Without the filter, Istio's default policy lets the reset reach the client: the reason the filter sends
    // its own conditions.
    let plain = rig(false).await;
    let (reset, statuses) = reset_in_flight(&plain, 6).await;
    assert!(reset >= 1, "the kill reset nothing: {statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s != 200).count(), reset, "{statuses:?}");

    let with_filter = rig(true).await;
    let (reset, statuses) = reset_in_flight(&with_filter, 6).await;
    assert!(reset >= 1, "the kill reset nothing: {statuses:?}");
    assert!(statuses.iter().all(|&s| s == 200), "{reset} reset requests, statuses {statuses:?}");
    let s = with_filter.envoy.stats().await.expect("stats");
    assert!(s.get("cluster.model_servers.upstream_rq_retry") >= reset as u64, "retried on another host");
}
