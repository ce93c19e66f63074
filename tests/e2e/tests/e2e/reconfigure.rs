//! Plugin reconfiguration through an LDS file update while traffic flows: a strategy switch takes effect without
//! dropping requests, an invalid plugin config is rejected with a clear message while the old one keeps serving, and
//! a configuration that moves the feed replaces the old feed, although the old configuration lives on while its
//! listener drains.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use warmpath_core::feed::{FeedEndpoint, FeedSnapshot};
use warmpath_harness::{FeedCluster, FeedServer, Upstream};

use crate::common::{prompt, Rig, CONCURRENCY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategy_switch_keeps_serving() {
    let mut rig = Rig::start_dynamic(3, json!({"strategy": "PREFIX_AWARE"})).await;
    let r = rig.chat(&prompt("before", 2000)).await;
    assert!(matches!(r.reason(), "prefix_match" | "consistent_pick"), "{r:?}");

    // Background traffic (bounded: at most 2000 requests / until stopped) across both updates.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let bg = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let (client, url) = (rig.client.clone(), format!("{}/v1/chat/completions", rig.envoy.url()));
        tokio::spawn(async move {
            for i in 0..2000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("bg {i} {}", "x".repeat(1500))}]});
                match client.post(&url).body(body.to_string()).send().await {
                    Ok(r) if r.status().is_success() => ok.fetch_add(1, Ordering::SeqCst),
                    _ => failed.fetch_add(1, Ordering::SeqCst),
                };
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let random = Rig::config(&rig.upstreams, json!({"strategy": "RANDOM"}));
    assert!(
        rig.envoy.update_listener(random).await.expect("lds update"),
        "RANDOM config rejected:\n{}",
        rig.envoy.log()
    );
    let mut reasons = Vec::new();
    for i in 0..10 {
        let r = rig.chat(&prompt(&format!("after {i}"), 2000)).await;
        assert_eq!(r.status, 200);
        reasons.push(r.reason().to_string());
    }
    assert!(reasons.iter().all(|r| r == "random"), "{reasons:?}");

    // An out-of-range prefix_length is refused; Envoy keeps the RANDOM config and says why in its log.
    let bad = Rig::config(&rig.upstreams, json!({"strategy": "PREFIX_AWARE", "prefix_length": 10}));
    assert!(!rig.envoy.update_listener(bad).await.expect("lds update"), "invalid config accepted");
    let log = rig.envoy.log();
    assert!(log.contains("prefix_length") && log.contains("1024..=65536"), "no clear message in log:\n{log}");
    let r = rig.chat(&prompt("still random", 2000)).await;
    assert_eq!((r.status, r.reason()), (200, "random"));

    stop.store(true, Ordering::SeqCst);
    bg.await.expect("join");
    assert!(ok.load(Ordering::SeqCst) > 10, "background traffic barely ran");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "requests failed during reconfiguration");
    let s = rig.stats_until(|s| s.filter("decisions.random.random") >= 11).await;
    assert!(
        s.filter("decisions.random.random") >= 11,
        "{:?}\n{}",
        s.with_prefix("wasmcustom").collect::<Vec<_>>(),
        rig.envoy.log()
    );
}

/// An LDS update that moves the feed to another path. Envoy keeps the superseded plugin configuration — its root
/// context in every VM, with its feed poller and tick — while the old listener drains (Envoy's default drain time,
/// 600 s, in this rig). Both configurations share the plugin's router, so an old poller still polling would bring
/// the old feed's endpoint set back with every new version of that feed (a feed with server loads changes on most
/// polls).
/// Only the newest configuration of a plugin polls: after the update the old path is polled no more and every
/// request goes to the new feed's endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_feed_replaces_the_old_one() {
    const INTERVAL_MS: u64 = 100;
    const OLD: &str = "/v1/feed/old";
    const NEW: &str = "/v1/feed/new";
    let upstreams = Upstream::start_many(4).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    // Each feed counts its own versions.
    let snapshot = |version: u64, eps: &[SocketAddr]| {
        let endpoints = eps.iter().map(|e| FeedEndpoint { address: e.to_string(), load: None }).collect();
        serde_json::to_string(&FeedSnapshot { version, endpoints }).expect("json")
    };
    let feed = FeedServer::start(String::new()).await.expect("feed");
    feed.set_snapshot_at(OLD, snapshot(1, &a[..2]));
    feed.set_snapshot_at(NEW, snapshot(7, &a[2..]));
    let config = |upstreams: &[Upstream], path: &str| {
        let plugin = json!({
            "endpoints": [], "strategy": "LEAST_OUTSTANDING_REQUESTS",
            "feed": {"cluster": "warmpath_feed", "path": path, "interval_ms": INTERVAL_MS},
        });
        // Envoy's cluster knows all four hosts (as EDS would); the filter picks only among the feed's endpoints.
        Rig::config(upstreams, plugin).with_feed(FeedCluster { name: "warmpath_feed".into(), address: feed.addr() })
    };
    let cfg = config(&upstreams, OLD);
    let mut rig = Rig::launch_dynamic(upstreams, cfg).await;
    let vms = u64::from(CONCURRENCY);
    let s = rig.stats_until(|s| s.filter("feed.applied") >= vms).await;
    assert!(s.filter("feed.applied") >= vms, "old feed not applied; log:\n{}", rig.envoy.log());
    tokio::time::sleep(Duration::from_millis(3 * INTERVAL_MS)).await;
    rig.used();
    for i in 0..10 {
        assert_eq!(rig.chat(&prompt(&format!("old {i}"), 500)).await.status, 200);
    }
    assert_eq!(rig.used(), BTreeSet::from([0, 1]), "the old feed's endpoints");

    let applied = rig.envoy.stats().await.expect("stats").filter("feed.applied");
    assert!(rig.envoy.update_listener(config(&rig.upstreams, NEW)).await.expect("lds update"), "{}", rig.envoy.log());
    let s = rig.stats_until(|s| s.filter("feed.applied") >= applied + vms && feed.hits_at(NEW) > 0).await;
    assert!(
        feed.hits_at(NEW) > 0,
        "new feed never polled; {:?}\n{}",
        s.with_prefix("wasmcustom").collect::<Vec<_>>(),
        rig.envoy.log()
    );
    // A few intervals for every VM to apply the new feed and for the old poller's last call to return.
    tokio::time::sleep(Duration::from_millis(5 * INTERVAL_MS)).await;
    let old_polls = feed.hits_at(OLD);
    // The old feed lives on and changes, as a feed carrying server loads does on every poll.
    feed.set_snapshot_at(OLD, snapshot(2, &a[..2]));
    rig.used();
    // Spread over ten intervals, so that any tick of the old configuration would fall between them.
    for i in 0..40 {
        assert_eq!(rig.chat(&prompt(&format!("new {i}"), 500)).await.status, 200);
        tokio::time::sleep(Duration::from_millis(INTERVAL_MS / 4)).await;
    }
    let hosts = rig.used();
    let polled = feed.hits_at(OLD) - old_polls;
    assert_eq!(hosts, BTreeSet::from([2, 3]), "after the update only the new feed's endpoints may serve");
    assert_eq!(polled, 0, "the superseded configuration kept polling the old feed");
}

/// An LDS update that keeps the feed but polls it less often: the superseded configuration, which held the poller's
/// lease and would have kept renewing it, gives it up, and the feed is polled at the new interval by one poller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_feed_interval_takes_effect() {
    const PATH: &str = "/v1/endpoints";
    let upstreams = Upstream::start_many(2).await.expect("upstreams");
    let eps = upstreams.iter().map(|u| FeedEndpoint { address: u.addr().to_string(), load: None }).collect();
    let feed = FeedServer::start(serde_json::to_string(&FeedSnapshot { version: 1, endpoints: eps }).expect("json"))
        .await
        .expect("feed");
    let config = |upstreams: &[Upstream], interval_ms: u64| {
        let plugin = json!({
            "endpoints": [], "strategy": "LEAST_OUTSTANDING_REQUESTS",
            "feed": {"cluster": "warmpath_feed", "path": PATH, "interval_ms": interval_ms},
        });
        Rig::config(upstreams, plugin).with_feed(FeedCluster { name: "warmpath_feed".into(), address: feed.addr() })
    };
    let polls_in = |ms: u64| {
        let feed = &feed;
        async move {
            let (h0, t0) = (feed.hits_at(PATH), std::time::Instant::now());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            (feed.hits_at(PATH) - h0, t0.elapsed().as_millis() as u64)
        }
    };
    let cfg = config(&upstreams, 100);
    let mut rig = Rig::launch_dynamic(upstreams, cfg).await;
    let s = rig.stats_until(|s| s.filter("feed.applied") >= 1).await;
    assert!(s.filter("feed.applied") >= 1, "feed not applied; log:\n{}", rig.envoy.log());
    let (before, ms) = polls_in(1500).await;
    assert!(before >= ms / 100 / 2, "{before} polls in {ms} ms at a 100 ms interval");

    assert!(rig.envoy.update_listener(config(&rig.upstreams, 500)).await.expect("lds update"), "{}", rig.envoy.log());
    // The handover takes a tick of each configuration.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (after, ms) = polls_in(3000).await;
    assert!(after >= 2 && after <= ms / 500 + 2, "{after} polls in {ms} ms after the update to a 500 ms interval");
    assert_eq!(rig.chat(&prompt("after", 500)).await.status, 200);
}
