//! A dead endpoint stops getting traffic. Three upstreams under a bounded load (20 concurrent clients, time- and
//! count-capped); one is killed mid-load (listener closed, open connections dropped) and restarted later. The
//! filter learns from the failed requests it placed (passive failure learning, shared across Envoy's workers) and
//! keeps its picks away from the dead endpoint for a back-off period; the rendered retry policy serves the
//! requests that reached it before the filter knew. A drained endpoint (it leaves the feed) finishes what it has
//! and gets nothing new. The kill also runs without the filter (same bootstrap, same retry policy and outlier
//! detection): the baseline of the figures in BENCHMARKS.md §6.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use warmpath_core::feed::{FeedEndpoint, FeedSnapshot};
use warmpath_core::health::BACKOFF_BASE_MS;
use warmpath_harness::{filter_wasm, EnvoyConfig, EnvoyProcess, FeedCluster, FeedServer, Upstream};

use crate::common::{prompt, Rig, CONCURRENCY};

/// Concurrent clients.
const CLIENTS: usize = 20;
/// Hard cap on requests per load run.
const MAX_REQUESTS: usize = 20_000;
/// Distinct shared prefixes in the load.
const PREFIXES: usize = 30;
/// Upstream answer delay: keeps requests in flight on every upstream.
const UPSTREAM_DELAY: Duration = Duration::from_millis(20);

/// One finished request of the load.
#[derive(Debug, Clone)]
struct Done {
    started: Instant,
    ok: bool,
    /// Status or transport error of a failed request, for the report.
    what: String,
}

/// A bounded load: [`CLIENTS`] clients send chat requests over [`PREFIXES`] prefixes until `stop` is set or
/// [`MAX_REQUESTS`] were sent.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<Done>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(url: String) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicUsize::new(0));
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
        let prompts: Arc<Vec<String>> =
            Arc::new((0..PREFIXES).map(|p| prompt(&format!("failover {p}"), 1500)).collect());
        let tasks = (0..CLIENTS)
            .map(|_| {
                let (stop, done, sent, client, url, prompts) =
                    (stop.clone(), done.clone(), sent.clone(), client.clone(), url.clone(), prompts.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let i = sent.fetch_add(1, Ordering::SeqCst);
                        if i >= MAX_REQUESTS {
                            return;
                        }
                        let body = json!({"model": "m", "messages": [
                            {"role": "system", "content": prompts[i % PREFIXES]}, {"role": "user", "content": format!("q {i}")}]});
                        let started = Instant::now();
                        let (ok, what) = match client.post(format!("{url}/v1/chat/completions")).body(body.to_string()).send().await {
                            Ok(r) => {
                                let status = r.status();
                                let flags = r.headers().get("x-envoy-response-flags").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                                match r.text().await {
                                    Ok(_) if status == 200 => (true, String::new()),
                                    Ok(t) => (false, format!("{status} {flags} {t}")),
                                    Err(e) => (false, format!("{status} body: {e}")),
                                }
                            }
                            Err(e) => (false, e.to_string()),
                        };
                        if let Ok(mut d) = done.lock() {
                            d.push(Done { started, ok, what });
                        }
                    }
                })
            })
            .collect();
        Load { stop, done, tasks }
    }

    fn completed(&self) -> usize {
        self.done.lock().map(|d| d.len()).unwrap_or(0)
    }

    async fn finish(self) -> Vec<Done> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        self.done.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

/// Waits (at most 20 s) until `n` requests of `load` completed.
async fn until_completed(load: &Load, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while load.completed() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(load.completed() >= n, "load too slow: {} of {n} requests in 20 s", load.completed());
}

/// What one kill run measured (the figures of BENCHMARKS.md §6).
struct KillRun {
    requests: usize,
    failed: usize,
    in_flight_at_kill: usize,
    /// Failed requests sent one back-off period ([`BACKOFF_BASE_MS`]) or more after the kill.
    failed_late: usize,
    /// Time from the restart to the victim's first new request (`None`: none within the 6 s watched).
    back_after: Option<Duration>,
    stats: warmpath_harness::Stats,
}

impl KillRun {
    fn report(&self, label: &str) -> String {
        let cluster = |k: &str| self.stats.get(&format!("cluster.model_servers.{k}"));
        format!(
            "[{label}] {} requests, {} failed (in flight on the victim at the kill: {}), {} failed after the first \
             back-off; victim back after {:?}; envoy retries={} connect failures={} ejections={}; filter: \
             picks_avoided_down={} endpoint_failures={}",
            self.requests,
            self.failed,
            self.in_flight_at_kill,
            self.failed_late,
            self.back_after,
            cluster("upstream_rq_retry"),
            cluster("upstream_cx_connect_fail"),
            cluster("outlier_detection.ejections_enforced_total"),
            self.stats.filter("picks_avoided_down"),
            self.stats.filter("endpoint_failures"),
        )
    }
}

/// The kill scenario on `rig`: load, kill the busiest upstream after 300 completed requests, restart it on the same
/// address 2.5 s later, watch 6 s more.
async fn kill_run(rig: &Rig, label: &str) -> KillRun {
    rig.upstreams.iter().for_each(|u| u.set_delay(UPSTREAM_DELAY));
    let load = Load::start(rig.envoy.url());
    until_completed(&load, 300).await;

    // Kill the busiest upstream.
    let victim = (0..3).max_by_key(|&i| rig.upstreams[i].count()).expect("three upstreams");
    let in_flight_at_kill = rig.upstreams[victim].kill();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    // Restart it and watch for its first new request.
    let before = rig.upstreams[victim].count();
    rig.upstreams[victim].restart().await.expect("restart on the same address");
    let restarted = Instant::now();
    let mut back_after = None;
    while restarted.elapsed() < Duration::from_secs(6) {
        if back_after.is_none() && rig.upstreams[victim].count() > before {
            back_after = Some(restarted.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = load.finish().await;

    let failed: Vec<&Done> = done.iter().filter(|d| !d.ok).collect();
    let failed_late = failed.iter().filter(|d| d.started >= killed + Duration::from_millis(BACKOFF_BASE_MS)).count();
    let run = KillRun {
        requests: done.len(),
        failed: failed.len(),
        in_flight_at_kill,
        failed_late,
        back_after,
        stats: rig.envoy.stats().await.expect("stats"),
    };
    eprintln!("{}", run.report(label));
    for f in &failed {
        eprintln!("[{label}] failed {:?} after the kill: {}", f.started.saturating_duration_since(killed), f.what);
    }
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_endpoint_stops_getting_traffic_and_comes_back_after_restart() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    let run = kill_run(&rig, "filter").await;
    let report = run.report("filter");
    assert!(run.failed <= run.in_flight_at_kill, "{report}");
    assert_eq!(run.failed_late, 0, "{report}");
    assert!(
        run.stats.filter("endpoint_failures") >= 1 && run.stats.filter("picks_avoided_down") >= 1,
        "the filter did not learn: {report}"
    );
    // Down for 2.5 s: back-off periods of 1 s then 2 s, so the next probe after the restart comes within 2 s (one
    // more base period of slack for the shared machine).
    let bound = Duration::from_millis(3 * BACKOFF_BASE_MS);
    assert!(
        run.back_after.is_some_and(|t| t <= bound),
        "the restarted endpoint got no traffic within {bound:?}: {report}"
    );
}

/// The baseline of the kill figures: the same scenario through the same Envoy bootstrap without the filter — the
/// cluster's least-request fallback with the same retry policy, outlier detection and retry budget. A measurement:
/// it asserts only that the scenario ran without the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_a_killed_endpoint_without_the_filter() {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let addrs: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let envoy = EnvoyProcess::start(EnvoyConfig::new(addrs, "{}"), CONCURRENCY).await.expect("envoy");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    let rig = Rig { upstreams, envoy, client };
    let run = kill_run(&rig, "baseline, no filter").await;
    assert!(run.requests > 300 && run.failed <= run.requests, "{}", run.report("baseline, no filter"));
    assert_eq!(run.stats.filter("endpoint_failures"), 0, "no filter ran");
}

fn snapshot(version: u64, addrs: &[SocketAddr]) -> String {
    let endpoints = addrs.iter().map(|a| FeedEndpoint { address: a.to_string(), load: None }).collect();
    serde_json::to_string(&FeedSnapshot { version, endpoints }).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_endpoint_finishes_its_requests_and_gets_no_new_ones() {
    const INTERVAL_MS: u64 = 200;
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let a: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let feed = FeedServer::start(snapshot(1, &a)).await.expect("feed");
    let plugin = json!({
        "endpoints": [], "strategy": "PREFIX_AWARE",
        "feed": {"cluster": "warmpath_feed", "path": "/v1/endpoints", "interval_ms": INTERVAL_MS},
    });
    let cfg = EnvoyConfig::new(a.clone(), plugin.to_string())
        .with_wasm(filter_wasm().expect("filter module"))
        .with_feed(FeedCluster { name: "warmpath_feed".into(), address: feed.addr() });
    let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy");
    upstreams.iter().for_each(|u| u.set_delay(UPSTREAM_DELAY));
    // Every VM applies the feed on its own tick.
    tokio::time::sleep(Duration::from_millis(5 * INTERVAL_MS)).await;

    let load = Load::start(envoy.url());
    until_completed(&load, 300).await;
    let drained = 2;
    assert!(upstreams[drained].count() > 0, "the endpoint to drain had traffic");
    // Drain: the endpoint leaves the feed; Envoy's cluster still has it, its in-flight requests finish.
    feed.set_snapshot(snapshot(2, &a[..2]));
    tokio::time::sleep(Duration::from_millis(5 * INTERVAL_MS)).await;
    let after_drain = upstreams[drained].count();
    let completed_at_drain = load.completed();
    until_completed(&load, completed_at_drain + 500).await;
    let new_on_drained = upstreams[drained].count() - after_drain;
    // Drained and idle: taking it away now fails nothing either.
    upstreams[drained].kill();
    until_completed(&load, completed_at_drain + 800).await;
    let done = load.finish().await;
    let failed = done.iter().filter(|d| !d.ok).count();
    eprintln!("{} requests, {failed} failed, {new_on_drained} new requests on the drained endpoint", done.len());
    assert_eq!(failed, 0, "requests failed while draining");
    assert_eq!(new_on_drained, 0, "the drained endpoint still got new requests");
}

/// An upload a server refuses says nothing about the server: it answers 413 and closes the connection while the body
/// still streams, which Envoy usually sees as a reset before the answer (503 to the client). Such a reset of an upload
/// larger than `max_body_bytes` is not counted against the endpoint (`outcome::classify`), so a client sending such
/// uploads does not mark healthy endpoints down; the next ordinary request still goes to its pick. Every upload is
/// sent once (no client retry) and bounded in size and time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_a_server_refuses_do_not_mark_it_down() {
    for strategy in ["PREFIX_AWARE", "LEAST_OUTSTANDING_REQUESTS"] {
        let rig = Rig::start(3, json!({"strategy": strategy, "max_body_bytes": 65536})).await;
        rig.upstreams.iter().for_each(|u| u.set_body_limit(128 * 1024));
        let upload = vec![b'x'; 4 << 20];
        let mut outcomes = Vec::new();
        for _ in 0..12 {
            let sent = rig
                .client
                .post(format!("{}/v1/chat/completions", rig.envoy.url()))
                .header("content-type", "application/json")
                .body(upload.clone())
                .send()
                .await;
            outcomes.push(match sent {
                Ok(r) => r.status().as_u16().to_string(),
                Err(e) => format!("transport error: {e}"),
            });
        }
        let stats = rig.envoy.stats().await.expect("stats");
        eprintln!("[{strategy}] uploads: {outcomes:?}; endpoint_failures={}", stats.filter("endpoint_failures"));
        assert!(
            outcomes.iter().all(|o| o != "200"),
            "[{strategy}] an upload over the servers' limit was served: {outcomes:?}"
        );
        // The case this test is about: Envoy saw at least one upload cut short rather than the server's 413.
        assert!(outcomes.iter().any(|o| o != "413"), "[{strategy}] every upload got the server's 413: {outcomes:?}");
        assert_eq!(
            stats.filter("endpoint_failures"),
            0,
            "[{strategy}] refused uploads marked endpoints down: {outcomes:?}"
        );
        // Ordinary requests afterwards go where the filter picks: no endpoint was backed off.
        for i in 0..6 {
            let reply = rig.chat(&prompt(&format!("after the uploads {i}"), 200)).await;
            assert_eq!(reply.status, 200, "[{strategy}] {reply:?}");
            assert!(
                !reply.upstream.is_empty() && reply.decision.starts_with(&reply.upstream),
                "[{strategy}] the pick was not served: {reply:?}"
            );
        }
        let stats = rig.envoy.stats().await.expect("stats");
        assert_eq!(stats.filter("picks_avoided_down"), 0, "[{strategy}] a pick avoided an endpoint marked down");
    }
}
