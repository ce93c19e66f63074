//! The endpoint/load feed end to end: a real Envoy whose filter polls a local feed server through an
//! Envoy cluster; endpoints added and removed mid-run, server load joining the overload guard, the feed stopped
//! (last good snapshot kept, failures counted) and restarted.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use warmpath_core::feed::{server_loads_stale_after_ms, FeedEndpoint, FeedLoad, FeedSnapshot};
use warmpath_core::Settings;
use warmpath_harness::{filter_wasm, EnvoyConfig, FeedCluster, FeedServer, Stats, Upstream};

use crate::common::{prompt, turn, Rig, CONCURRENCY};

const INTERVAL_MS: u64 = 200;

fn snapshot(version: u64, eps: &[(SocketAddr, Option<FeedLoad>)]) -> String {
    let snap = FeedSnapshot {
        version,
        endpoints: eps.iter().map(|(a, load)| FeedEndpoint { address: a.to_string(), load: *load }).collect(),
    };
    serde_json::to_string(&snap).expect("json")
}

/// Waits until the filter reports `version` applied (gauge `warmpath.feed.version`) and returns the stats.
async fn wait_version(rig: &Rig, version: u64) -> Stats {
    let s = rig.stats_until(|s| s.filter("feed.version") == version).await;
    assert_eq!(s.filter("feed.version"), version, "feed version not applied; log:\n{}", rig.envoy.log());
    // Every worker VM applies on its own tick; give the others one more interval.
    tokio::time::sleep(Duration::from_millis(3 * INTERVAL_MS)).await;
    s
}

/// An Envoy in front of `upstreams` whose filter (plugin configuration `plugin`) polls `feed` through the
/// `warmpath_feed` cluster; `plugin` names its own `endpoints` (empty: the feed's).
async fn feed_rig(upstreams: Vec<Upstream>, feed: &FeedServer, plugin: serde_json::Value) -> Rig {
    let feed_cluster = FeedCluster { name: "warmpath_feed".into(), address: feed.addr() };
    let cfg = Rig::config(&upstreams, plugin).with_feed(feed_cluster);
    Rig::launch(upstreams, cfg).await
}

/// PREFIX_AWARE fed from the feed server's default path.
fn prefix_aware_fed() -> serde_json::Value {
    json!({
        "endpoints": [], "strategy": "PREFIX_AWARE",
        "feed": {"cluster": "warmpath_feed", "path": "/v1/endpoints", "interval_ms": INTERVAL_MS},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_drives_endpoints_and_survives_outages() {
    let upstreams = Upstream::start_many(4).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let mut feed = FeedServer::start(snapshot(1, &[(a[0], None), (a[1], None), (a[2], None)])).await.expect("feed");
    // Envoy's cluster knows all four hosts (as EDS would); the filter picks only among the feed's endpoints.
    let rig = feed_rig(upstreams, &feed, prefix_aware_fed()).await;

    // v1: three endpoints.
    wait_version(&rig, 1).await;
    rig.used();
    let mut home = Vec::new();
    for i in 0..30 {
        let r = rig.chat(&prompt(&format!("feed {i}"), 2000)).await;
        assert_eq!(r.status, 200);
        assert_ne!(r.reason(), "fail_open", "{r:?}");
        home.push(r.upstream);
    }
    assert_eq!(rig.used(), BTreeSet::from([0, 1, 2]), "v1 routes over A, B, C only");

    // One poller per Envoy, not one per VM: over ~2 s the feed sees about one request per interval.
    let (hits0, t0) = (feed.hits(), Instant::now());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let (hits, ms) = (feed.hits() - hits0, t0.elapsed().as_millis() as u64);
    assert!(hits >= 3 && hits <= ms / INTERVAL_MS + 3, "{hits} feed requests in {ms} ms at {INTERVAL_MS} ms interval");

    // v2: D added mid-run. Known prefixes mostly stay (index + rendezvous move ~1/N); new ones reach D too.
    feed.set_snapshot(snapshot(2, &[(a[0], None), (a[1], None), (a[2], None), (a[3], None)]));
    wait_version(&rig, 2).await;
    let mut stayed = 0;
    for (i, h) in home.iter().enumerate() {
        let r = rig.chat(&prompt(&format!("feed {i}"), 2000)).await;
        stayed += usize::from(r.upstream == *h);
    }
    assert!(stayed >= 18, "only {stayed}/30 prefixes kept their upstream after adding one endpoint");
    rig.used();
    for i in 0..60 {
        assert_eq!(rig.chat(&prompt(&format!("feed new {i}"), 2000)).await.status, 200);
    }
    assert!(rig.used().contains(&3), "the added endpoint D got no traffic");

    // v3: B removed.
    feed.set_snapshot(snapshot(3, &[(a[0], None), (a[2], None), (a[3], None)]));
    wait_version(&rig, 3).await;
    rig.used();
    for i in 0..40 {
        assert_eq!(rig.chat(&prompt(&format!("feed {i}"), 2000)).await.status, 200);
    }
    assert!(!rig.used().contains(&1), "removed endpoint B still gets traffic");

    // Feed down: failures are counted, the last good snapshot (A, C, D) keeps routing.
    feed.stop().await;
    // (Envoy answers a call to a cluster with no reachable host with a local 503, counted as `status`.)
    let failures = |s: &Stats| s.sum_prefix("wasmcustom.warmpath.feed.failures.");
    let f0 = failures(&rig.envoy.stats().await.expect("stats"));
    let s = rig.stats_until(|s| failures(s) >= f0 + 3).await;
    assert!(failures(&s) >= f0 + 3, "{:?}", s.with_prefix("wasmcustom.warmpath.feed").collect::<Vec<_>>());
    assert_eq!(s.filter("feed.version"), 3, "the last good snapshot stays in force");
    for i in 0..20 {
        let r = rig.chat(&prompt(&format!("outage {i}"), 2000)).await;
        assert_eq!(r.status, 200);
        assert_ne!(r.reason(), "fail_open");
    }
    let during = rig.used();
    assert!(!during.contains(&1) && !during.is_empty(), "outage routing used {during:?}");

    // Feed back with v4 = A, B where A reports a queue past the default `concurrency_threshold`: the overload guard
    // sends all to B.
    let busy = FeedLoad { waiting: Settings::default().concurrency_threshold + 32, running: 8, kv_cache_usage: 0.9 };
    feed.set_snapshot(snapshot(4, &[(a[0], Some(busy)), (a[1], None)]));
    feed.restart().await.expect("feed restart");
    wait_version(&rig, 4).await;
    rig.used();
    for i in 0..20 {
        assert_eq!(rig.chat(&prompt(&format!("after {i}"), 2000)).await.status, 200);
    }
    assert_eq!(rig.used(), BTreeSet::from([1]), "server load did not steer traffic away from the busy endpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_feed_documents_keep_the_last_good_snapshot() {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let feed = FeedServer::start(snapshot(1, &[(a[0], None)])).await.expect("feed");
    let plugin = json!({
        "endpoints": [],
        "feed": {"cluster": "warmpath_feed", "interval_ms": INTERVAL_MS},
    });
    let rig = feed_rig(upstreams, &feed, plugin).await;
    wait_version(&rig, 1).await;
    for doc in ["{not json", r#"{"version": 9, "endpoints": [{"address": "not-an-address"}]}"#] {
        feed.set_snapshot(doc.to_string());
        let before = rig.envoy.stats().await.expect("stats").filter("feed.failures.invalid");
        let s = rig.stats_until(|s| s.filter("feed.failures.invalid") > before).await;
        assert!(s.filter("feed.failures.invalid") > before);
        assert_eq!(s.filter("feed.version"), 1);
        for i in 0..5 {
            let r = rig.chat(&prompt(&format!("bad feed {i}"), 2000)).await;
            assert_eq!((r.status, r.upstream.as_str()), (200, a[0].to_string().as_str()));
        }
    }
    assert!(rig.envoy.log().contains("feed snapshot rejected"), "no log line for the bad document");
}

/// Two policies on one listener, each with its own feed (one feed cluster, two paths): every feed's server loads
/// stay with its own plugin's router. Both feeds report their pool's first endpoint with a long queue, so
/// LEAST_OUTSTANDING_REQUESTS must never pick it; when one VM-wide table held the loads, each snapshot applied
/// erased the other plugin's loads, and that plugin sent about a third of its requests to its queued endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_plugins_keep_their_own_feeds_server_loads() {
    const PER_POOL: usize = 3;
    let pools = [("pool-a", "/a/", "warmpath-a", "/v1/feed/a"), ("pool-b", "/b/", "warmpath-b", "/v1/feed/b")];
    let upstreams = Upstream::start_many(2 * PER_POOL + 1).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let queued = FeedLoad { waiting: 50, running: 4, kv_cache_usage: 0.5 };
    let feed = FeedServer::start(String::new()).await.expect("feed");
    let mut cfg = EnvoyConfig::new(a[2 * PER_POOL..].to_vec(), "{}")
        .with_wasm(filter_wasm().expect("filter module"))
        .with_rig_headers()
        .with_feed(FeedCluster { name: "warmpath_feed".into(), address: feed.addr() });
    for (i, (cluster, prefix, plugin, path)) in pools.iter().enumerate() {
        let pool = &a[i * PER_POOL..(i + 1) * PER_POOL];
        let eps: Vec<(SocketAddr, Option<FeedLoad>)> =
            pool.iter().enumerate().map(|(k, &addr)| (addr, (k == 0).then_some(queued))).collect();
        feed.set_snapshot_at(path, snapshot(1 + i as u64, &eps));
        let plugin_cfg = json!({
            "endpoints": [], "strategy": "LEAST_OUTSTANDING_REQUESTS",
            "upstream_clusters": [cluster],
            "feed": {"cluster": "warmpath_feed", "path": path, "interval_ms": INTERVAL_MS},
        });
        cfg = cfg.with_plugin(*plugin, plugin_cfg.to_string()).with_pool(*cluster, *prefix, pool.to_vec());
    }
    let rig = Rig::launch(upstreams, cfg).await;
    // Both feeds applied in every worker VM (one count per plugin and VM).
    let vms = u64::from(CONCURRENCY);
    let s = rig.stats_until(|s| s.filter("feed.applied") >= 2 * vms).await;
    assert!(s.filter("feed.applied") >= 2 * vms, "feeds not applied; log:\n{}", rig.envoy.log());
    tokio::time::sleep(Duration::from_millis(3 * INTERVAL_MS)).await;
    rig.used();
    for i in 0..30 {
        for (_, prefix, _, _) in pools {
            let body =
                json!({"model": "m", "messages": [{"role": "user", "content": prompt(&format!("loads {i}"), 500)}]});
            let r = rig.post(&format!("{prefix}v1/chat/completions"), body.to_string().into_bytes(), &[]).await;
            assert_eq!(r.status, 200, "{r:?}");
        }
    }
    let counts: Vec<usize> = rig.upstreams.iter().map(Upstream::count).collect();
    assert_eq!(counts[0], 0, "pool-a's queued endpoint got requests: {counts:?}");
    assert_eq!(counts[PER_POOL], 0, "pool-b's queued endpoint got requests: {counts:?}");
    assert_eq!(counts[1] + counts[2], 30, "{counts:?}");
    assert_eq!(counts[PER_POOL + 1] + counts[PER_POOL + 2], 30, "{counts:?}");
}

/// A server reporting a full KV cache and a short queue keeps its traffic. A full cache is a loaded vLLM server's
/// normal state (it evicts the least recently used blocks), and the report is up to one poll old, so PREFIX_AWARE
/// does not read it as overload: only the reported waiting + running requests count, toward
/// `concurrency_threshold`. Both endpoints report the same short queue, one of them a full cache: distinct
/// prompts still spread over both by their keys, and a repeated prompt stays where it went first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_kv_cache_report_keeps_its_traffic() {
    let upstreams = Upstream::start_many(2).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let full = FeedLoad { waiting: 1, running: 2, kv_cache_usage: 1.0 };
    let roomy = FeedLoad { waiting: 1, running: 2, kv_cache_usage: 0.2 };
    let feed = FeedServer::start(snapshot(1, &[(a[0], Some(full)), (a[1], Some(roomy))])).await.expect("feed");
    let rig = feed_rig(upstreams, &feed, prefix_aware_fed()).await;
    wait_version(&rig, 1).await;
    rig.used();

    let mut first = Vec::new();
    for i in 0..40 {
        let r = rig.chat(&prompt(&format!("kv full {i}"), 2000)).await;
        assert_eq!(r.status, 200);
        assert_ne!(r.reason(), "fail_open", "{r:?}");
        first.push(r.upstream);
    }
    let on_full = rig.upstreams[0].count();
    // Rendezvous over two endpoints: each key lands on either with probability 1/2; below 8 of 40 is 1 in 10^5.
    assert!(on_full >= 8, "the endpoint reporting a full KV cache got {on_full} of 40 requests");
    for (i, home) in first.iter().enumerate().step_by(4) {
        let r = rig.chat(&prompt(&format!("kv full {i}"), 2000)).await;
        assert_eq!(&r.upstream, home, "prompt {i} moved off its first endpoint");
    }
}

/// Every server reporting more requests than `concurrency_threshold` (a busy vLLM fleet runs more than the default
/// 64 at once): the cap cannot choose, so PREFIX_AWARE still places by its keys and predicted time to first token
/// — conversations spread over the endpoints and each stays where it began. Before, the endpoint reporting the
/// fewest requests took every request until the next report (all 24 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reported_over_the_cap_still_spreads_by_prefix() {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let busy = |waiting| Some(FeedLoad { waiting, running: 0, kv_cache_usage: 0.9 });
    let threshold = Settings::default().concurrency_threshold;
    let eps = [(a[0], busy(threshold + 6)), (a[1], busy(threshold + 7)), (a[2], busy(threshold + 8))];
    let feed = FeedServer::start(snapshot(1, &eps)).await.expect("feed");
    let rig = feed_rig(upstreams, &feed, prefix_aware_fed()).await;
    wait_version(&rig, 1).await;
    rig.used();

    let conversations = 24;
    let mut homes = Vec::new();
    for i in 0..conversations {
        let r = rig.chat(&prompt(&format!("busy fleet {i}"), 2000)).await;
        assert_eq!(r.status, 200, "{r:?}");
        homes.push(r.upstream);
    }
    let counts = rig.counts();
    // Keys spread by rendezvous over three endpoints: one taking more than 20 of 24 has probability below 10^-7.
    assert!(counts.iter().all(|&c| c <= 20), "one endpoint took the fleet's traffic: {counts:?}");
    for (i, home) in homes.iter().enumerate().step_by(3) {
        let history = prompt(&format!("busy fleet {i}"), 2000);
        let r = rig.post("/v1/chat/completions", turn(&history, "And then?"), &[]).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(&r.upstream, home, "conversation {i} moved off its endpoint: {r:?}");
    }
}

/// A report the feed no longer confirms stops counting: an endpoint last reported at the cap gets no new
/// conversation while the feed confirms it, and gets its share again once the feed has not answered for three
/// poll intervals (at least a second) (it may be idle by then; before, the last report capped it for as long as the feed was down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_the_feed_stopped_confirming_stops_counting() {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let at_cap = Some(FeedLoad { waiting: Settings::default().concurrency_threshold, running: 0, kv_cache_usage: 0.5 });
    let idle = Some(FeedLoad { waiting: 0, running: 0, kv_cache_usage: 0.0 });
    let mut feed = FeedServer::start(snapshot(1, &[(a[0], at_cap), (a[1], idle), (a[2], idle)])).await.expect("feed");
    let rig = feed_rig(upstreams, &feed, prefix_aware_fed()).await;
    wait_version(&rig, 1).await;
    rig.used();
    for i in 0..24 {
        let r = rig.chat(&prompt(&format!("confirmed {i}"), 2000)).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(rig.upstreams[0].count(), 0, "the endpoint reported at the cap got traffic: {:?}", rig.counts());
    feed.stop().await;
    // Long enough without an answer, and a tick for every VM.
    tokio::time::sleep(Duration::from_millis(server_loads_stale_after_ms(INTERVAL_MS) + 3 * INTERVAL_MS)).await;
    for i in 0..24 {
        let r = rig.chat(&prompt(&format!("unconfirmed {i}"), 2000)).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Rendezvous over three endpoints: none of 24 new keys on one of them has probability below 10^-4.
    assert!(rig.upstreams[0].count() > 0, "the stale report still kept the endpoint out: {:?}", rig.counts());
}
