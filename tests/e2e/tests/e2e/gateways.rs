//! Several gateways (Envoys) in front of one pool, polling one feed: each reports its index records to the feed
//! and applies the other gateways' (the gateway leg of the index exchange, `warmpath_core::exchange`), so a
//! conversation whose turns reach different gateways stays on one endpoint. The same scenario with the feed's
//! exchange answered by 404 (a feed server without it) moves the turn, so the assertion has teeth. The reports also
//! carry each gateway's pending prefill work: a gateway sees the queue the others put in front of an endpoint; and
//! its prefill-speed fits: a gateway routes with the speeds the others learned.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use warmpath_core::feed::{FeedEndpoint, FeedSnapshot};
use warmpath_harness::{filter_wasm, EnvoyConfig, EnvoyProcess, FeedCluster, FeedServer, Stats, Upstream};

use crate::common::{hold_filler, post_fresh, prompt, spawn_post, turn, upstream_with_one_request, Sent, CONCURRENCY};

/// Feed poll interval of both gateways, ms: longer than the filter's 50 ms tick with a feed, which runs the index
/// exchange (a load feed polled every few seconds must not slow it).
const INTERVAL_MS: u64 = 1500;

/// Upstreams, two gateways with the filter, and the feed both poll.
struct Fleet {
    upstreams: Vec<Upstream>,
    gateways: [EnvoyProcess; 2],
    feed: FeedServer,
}

impl Fleet {
    /// `exchange`: the feed server keeps the index exchange (else 404); `pending`, `fits`: it takes pending or fits
    /// sections (set before the gateways start, so none of them ever sees it take them).
    async fn start(exchange: bool, pending: bool, fits: bool) -> Fleet {
        let upstreams = Upstream::start_many(3).await.expect("upstreams");
        let addrs: Vec<_> = upstreams.iter().map(Upstream::addr).collect();
        let snapshot = FeedSnapshot {
            version: 1,
            endpoints: addrs.iter().map(|a| FeedEndpoint { address: a.to_string(), load: None }).collect(),
        };
        let feed = FeedServer::start(serde_json::to_string(&snapshot).expect("json")).await.expect("feed");
        feed.set_index_exchange(exchange);
        feed.set_pending_exchange(pending);
        feed.set_fits_exchange(fits);
        let plugin = json!({
            "endpoints": [], "strategy": "PREFIX_AWARE",
            "feed": {"cluster": "warmpath_feed", "path": "/v1/feed/pool", "interval_ms": INTERVAL_MS},
        });
        let cfg = EnvoyConfig::new(addrs, plugin.to_string())
            .with_wasm(filter_wasm().expect("filter module"))
            .with_rig_headers()
            .with_feed(FeedCluster { name: "warmpath_feed".into(), address: feed.addr() });
        let a = EnvoyProcess::start(cfg.clone(), CONCURRENCY).await.expect("gateway A");
        // B's listener can be replaced (LDS), to give its plugin another configuration while it serves.
        let b = EnvoyProcess::start_dynamic(cfg, CONCURRENCY).await.expect("gateway B");
        Fleet { upstreams, gateways: [a, b], feed }
    }

    fn index_of(&self, addr: &str) -> usize {
        self.upstreams.iter().position(|u| u.addr().to_string() == addr).expect("answered by an upstream")
    }

    /// The endpoints come from the feed: waits until both gateways applied the snapshot, then a few more ticks for
    /// every VM of each (they apply it on their own tick; before that a request is not routed by the filter).
    async fn wait_for_snapshot(&self) {
        for g in 0..2 {
            let s = self.stats_until(g, |s| s.filter("feed.version") == 1).await;
            assert_eq!(s.filter("feed.version"), 1, "gateway {g} did not apply the feed's snapshot");
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }

    /// No exchange report of either gateway failed so far: in particular, none sent a section the feed does not
    /// take (a feed server without it refuses the whole report, as an older one does).
    async fn assert_no_report_failed(&self) {
        for (g, gateway) in self.gateways.iter().enumerate() {
            let s = gateway.stats().await.expect("stats");
            assert_eq!(s.filter("feed.failures.index"), 0, "gateway {g}: an exchange report failed");
        }
    }

    /// Polls gateway `g`'s stats until `pred` holds (up to 10 s); returns the last stats either way.
    async fn stats_until(&self, g: usize, pred: impl Fn(&Stats) -> bool) -> Stats {
        let mut s = self.gateways[g].stats().await.expect("stats");
        for _ in 0..200 {
            if pred(&s) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            s = self.gateways[g].stats().await.expect("stats");
        }
        s
    }
}

/// A conversation's first turn through gateway A, then prefill work held at its endpoint as gateway B sees it
/// (B's own filler requests of `filler_len` characters waiting there, at most three), then its second turn through
/// B. A gateway that does not know where the conversation went sees that work and an idle endpoint elsewhere and
/// moves the turn once the work exceeds the turn's new part (a miss is charged its new part once more where the
/// index lists an endpoint past the load bound, which B's own fillers can do to both idle endpoints); one that
/// learned that the endpoint holds 3,000 cached characters keeps it there while the work is under three times
/// that. Returns the first turn's upstream and the second's.
async fn second_turn_through_the_other_gateway(
    f: Arc<Fleet>,
    name: &str,
    filler_len: usize,
    learned: impl Fn(&Stats) -> bool,
) -> (String, String) {
    f.wait_for_snapshot().await;
    let history = prompt(name, 3000);
    let (status, first) = post_fresh(&f.gateways[0], turn(&history, "first question")).await;
    assert_eq!(status, 200);
    let home = f.index_of(&first);
    // Gateway A reports on its next poll, gateway B fetches on its own.
    let s = f.stats_until(1, &learned).await;
    if !learned(&s) {
        let a = f.gateways[0].stats().await.expect("stats");
        let show = |s: &Stats| {
            format!(
                "{:?}",
                s.with_prefix("wasmcustom.warmpath.")
                    .filter(|(k, _)| k.contains("exchange") || k.contains("feed"))
                    .collect::<Vec<_>>()
            )
        };
        panic!("gateway B did not learn: A {} B {}; feed reports {}", show(&a), show(&s), f.feed.index_reports());
    }

    f.upstreams[home].hold();
    let (filler, waiting) = hold_filler(&f.upstreams[home], |i| {
        spawn_post(f.gateways[1].url(), turn(&prompt(&format!("{name} filler {i}"), filler_len), "hello"))
    })
    .await;
    assert!(waiting <= 3, "{waiting} fillers wait at the conversation's endpoint");
    (first, second_turn_while_held(&f, history, home, waiting, filler).await)
}

/// Sends a conversation's second turn through gateway B while `waiting` requests wait at the held upstream `home`,
/// then releases it; returns the upstream that answered the turn (every filler request is answered with 200).
async fn second_turn_while_held(
    f: &Arc<Fleet>,
    history: String,
    home: usize,
    waiting: usize,
    filler: Vec<Sent>,
) -> String {
    let second = spawn_post(f.gateways[1].url(), turn(&history, "second question"));
    // The turn either waits at the held endpoint or is answered by another one.
    for _ in 0..100 {
        if f.upstreams[home].active() == waiting + 1 || second.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f.upstreams[home].release();
    let (status, upstream) = second.await.expect("join");
    assert_eq!(status, 200);
    for h in filler {
        assert_eq!(h.await.expect("join").0, 200);
    }
    upstream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_stays_on_one_endpoint_across_gateways_through_the_feed() {
    let f = Arc::new(Fleet::start(true, true, true).await);
    // Fillers of 400 characters: at most 1,200 waiting, well under the 9,000 a move would cost.
    let (first, second) = second_turn_through_the_other_gateway(f.clone(), "across gateways", 400, |s| {
        s.filter("index_exchange.received") >= 1
    })
    .await;
    assert_eq!(second, first, "the second turn left the conversation's endpoint");
    assert!(f.feed.index_reports() >= 2, "both gateways report to the feed");
    let a = f.stats_until(0, |s| s.filter("index_exchange.reported") >= 1).await;
    assert!(a.filter("index_exchange.reported") >= 1, "gateway A reported its record");
    assert_eq!(a.filter("feed.failures.index"), 0);
    // The exchange runs every tick (50 ms), the snapshot poll every 30th tick (INTERVAL_MS): two gateways make
    // about 120 reports and 4 polls in 3 s (a 200 ms tick would make 30 and 4).
    let (reports, polls) = (f.feed.index_reports(), f.feed.hits());
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let (reports, polls) = (f.feed.index_reports() - reports, f.feed.hits() - polls);
    assert!(reports >= 10 * polls.max(1), "{reports} exchange reports and {polls} snapshot polls in 3 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_feeds_exchange_each_gateway_routes_on_its_own_index() {
    let f = Arc::new(Fleet::start(false, true, true).await);
    // Nothing to learn: wait until gateway B has polled (and been refused) a few times instead.
    // Fillers of 4,000 characters: more waiting work than the turn's new part (about 3,000), so the turn moves even
    // where B's own fillers put both idle endpoints past the load bound in B's index.
    let (first, second) = second_turn_through_the_other_gateway(f.clone(), "gateways alone", 4_000, |s| {
        s.filter("feed.failures.index") >= 2
    })
    .await;
    assert_ne!(second, first, "gateway B kept a turn it knew nothing of at a loaded endpoint");
    let b = f.stats_until(1, |_| true).await;
    assert_eq!(b.filter("index_exchange.received"), 0);
    // The refused exchange costs nothing else: the feed's snapshot is applied and every request was answered.
    assert_eq!(b.filter("feed.version"), 1);
}

/// Gauge name of the other gateways' pending prefill work on `addr` as gateway stats show it.
fn remote_pending(addr: &str) -> String {
    format!("remote_pending_prefill.{}", warmpath_core::endpoint::stat_token(addr))
}

/// A conversation's first turn through gateway B, then long prompts through gateway A until one waits at the
/// conversation's endpoint (held), then the second turn through B. B sent nothing that waits there; when the feed
/// passes A's pending work on (`told`), the 12,000 bytes queued there outweigh the 3,000 cached and the turn goes
/// to an idle endpoint; when the feed drops it, B sees an idle holder and keeps the turn. Returns the first turn's
/// upstream and the second's.
async fn second_turn_behind_the_other_gateways_work(f: Arc<Fleet>, name: &str, told: bool) -> (String, String) {
    f.wait_for_snapshot().await;
    let history = prompt(name, 3000);
    let (status, first) = post_fresh(&f.gateways[1], turn(&history, "first question")).await;
    assert_eq!(status, 200);
    let home = f.index_of(&first);
    f.upstreams[home].hold();
    let (filler, waiting) = hold_filler(&f.upstreams[home], |i| {
        spawn_post(f.gateways[0].url(), turn(&prompt(&format!("{name} long prompt {i}"), 12_000), "hello"))
    })
    .await;
    assert!(waiting <= 3, "{waiting} long prompts wait at the conversation's endpoint");
    let gauge = remote_pending(&first);
    if told {
        let s = f.stats_until(1, |s| s.filter(&gauge) >= 12_000).await;
        assert!(s.filter(&gauge) >= 12_000, "gateway B was not told A's pending work: {gauge} = {}", s.filter(&gauge));
    } else {
        // Let several exchange rounds pass (each gateway reports every 50 ms tick).
        let reports = f.feed.index_reports();
        for _ in 0..100 {
            if f.feed.index_reports() >= reports + 6 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(f.feed.index_reports() >= reports + 6, "the gateways stopped reporting");
        let s = f.gateways[1].stats().await.expect("stats");
        assert_eq!(s.filter(&gauge), 0, "a feed server without pending sections passed some on");
    }
    (first, second_turn_while_held(&f, history, home, waiting, filler).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_sees_the_prefill_work_other_gateways_queued_at_an_endpoint() {
    let f = Arc::new(Fleet::start(true, true, true).await);
    let (first, second) = second_turn_behind_the_other_gateways_work(f.clone(), "queued elsewhere", true).await;
    assert_ne!(second, first, "the turn waited behind another gateway's work its cached part does not make up for");
    // Once the long prompts are answered, A's report says so and B's view of that endpoint empties again.
    let gauge = remote_pending(&first);
    let s = f.stats_until(1, |s| s.filter(&gauge) == 0).await;
    assert_eq!(s.filter(&gauge), 0, "the other gateway's pending work outlived its requests");
    assert_eq!(s.filter("feed.failures.index"), 0);
}

/// The other gateways' pending work stops counting once the feed stops answering (the work it described is served
/// by then), even while that work still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_gateways_work_stops_counting_when_the_feed_stops() {
    let mut f = Fleet::start(true, true, true).await;
    f.wait_for_snapshot().await;
    for u in &f.upstreams {
        u.hold();
    }
    let sent = spawn_post(f.gateways[0].url(), turn(&prompt("feed stops", 12_000), "hello"));
    // The request waits at one held upstream; gateway B learns of its work there.
    let waiting_at = upstream_with_one_request(&f.upstreams, Duration::from_millis(50)).await;
    let at = waiting_at.expect("the request reached an upstream");
    let gauge = remote_pending(&f.upstreams[at].addr().to_string());
    let s = f.stats_until(1, |s| s.filter(&gauge) >= 12_000).await;
    assert!(s.filter(&gauge) >= 12_000, "gateway B was not told A's pending work: {gauge} = {}", s.filter(&gauge));
    f.feed.stop().await;
    let stopped = std::time::Instant::now();
    // It counts at most REMOTE_PENDING_TICKS ticks, or a report's timeout and a tick (1.05 s here), after it arrived;
    // the gauge shows it a tick later at most.
    let s = f.stats_until(1, |s| s.filter(&gauge) == 0).await;
    assert_eq!(s.filter(&gauge), 0, "the other gateway's work outlived the feed");
    assert!(stopped.elapsed() < Duration::from_secs(4), "it counted {:?} after the feed stopped", stopped.elapsed());
    for u in &f.upstreams {
        u.release();
    }
    assert_eq!(sent.await.expect("join").0, 200);
}

/// With a feed that takes fits sections but not pending ones, a gateway sees only its own queue, and neither
/// gateway sends a section the feed refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_pending_sections_a_gateway_sees_only_its_own_queue() {
    let f = Arc::new(Fleet::start(true, false, true).await);
    let (first, second) = second_turn_behind_the_other_gateways_work(f.clone(), "queued unseen", false).await;
    assert_eq!(second, first, "gateway B moved a turn off an endpoint it saw idle");
    f.assert_no_report_failed().await;
}

/// Gauge name of the learned prefill speed of `addr` as gateway stats show it.
fn speed_gauge(addr: &str) -> String {
    format!("prefill_speed.{}", warmpath_core::endpoint::stat_token(addr))
}

/// Misses (prompts that share nothing) through gateway A only, at upstream speeds of 50, 50 and 20 bytes per ms,
/// until A has learned every upstream's speed. Returns the speed gauges' names, by upstream.
async fn speeds_taught_through_gateway_a(f: &Fleet) -> Vec<String> {
    f.wait_for_snapshot().await;
    for (u, rate) in f.upstreams.iter().zip([50, 50, 20]) {
        u.set_delay(Duration::from_millis(5));
        u.set_body_rate(rate);
    }
    let gauges: Vec<String> = f.upstreams.iter().map(|u| speed_gauge(&u.addr().to_string())).collect();
    let mut learned = false;
    for i in 0..240 {
        let (status, _) =
            post_fresh(&f.gateways[0], turn(&prompt(&format!("alone {i}"), 1_000 + (i * 3_700) % 7_000), "go")).await;
        assert_eq!(status, 200);
        if i % 8 == 7 {
            let s = f.gateways[0].stats().await.expect("stats");
            if gauges.iter().all(|g| s.filter(g) > 0) {
                learned = true;
                break;
            }
        }
    }
    assert!(learned, "gateway A learned no speed for every upstream in 240 requests");
    gauges
}

/// A gateway routes with the prefill speeds the other gateways learned: B, which has served nothing, reports A's
/// speeds on its own gauges, and its misses on an idle pool all go to a faster upstream, never the one A told apart
/// as slower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_routes_with_the_speeds_other_gateways_learned() {
    let f = Fleet::start(true, true, true).await;
    let gauges = speeds_taught_through_gateway_a(&f).await;
    // A reports its fits every FITS_REPORT_MS (1 s); B gets them with the answer to its next report.
    let s = f.stats_until(1, |s| gauges.iter().all(|g| s.filter(g) > 0)).await;
    let speeds: Vec<u64> = gauges.iter().map(|g| s.filter(g)).collect();
    // The gauges come from one VM's tick; every worker has read the fits on its own (50 ms) within this.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(speeds[..2].iter().all(|v| (35_000..=65_000).contains(v)), "gateway B's speeds {speeds:?}");
    assert!((14_000..=26_000).contains(&speeds[2]), "gateway B's speeds {speeds:?}; the third answers at 20,000");
    let slow = f.upstreams[2].addr().to_string();
    for i in 0..12 {
        let (status, upstream) =
            post_fresh(&f.gateways[1], turn(&prompt(&format!("via b {i}"), 2_000 + i * 300), "go")).await;
        assert_eq!(status, 200);
        assert_ne!(upstream, slow, "miss {i} through B went to the upstream A told apart as slower");
    }
    f.assert_no_report_failed().await;
}

/// A gateway whose plugin is given a configuration without a feed forgets the speeds the other gateways taught it
/// through the old one's: the new configuration shares the plugin's router, which would otherwise keep routing with
/// them (nothing renews or ages them without a feed). B, which has served nothing, reports A's speeds, then none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_configured_without_a_feed_forgets_the_speeds_other_gateways_taught() {
    let mut f = Fleet::start(true, true, true).await;
    let gauges = speeds_taught_through_gateway_a(&f).await;
    let s = f.stats_until(1, |s| gauges.iter().all(|g| s.filter(g) > 0)).await;
    assert!(gauges.iter().all(|g| s.filter(g) > 0), "gateway B never got A's speeds");
    let addrs: Vec<_> = f.upstreams.iter().map(Upstream::addr).collect();
    let plugin =
        json!({"endpoints": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(), "strategy": "PREFIX_AWARE"});
    let cfg =
        EnvoyConfig::new(addrs, plugin.to_string()).with_wasm(filter_wasm().expect("filter module")).with_rig_headers();
    let b = &mut f.gateways[1];
    assert!(b.update_listener(cfg).await.expect("lds update"), "configuration refused:\n{}", b.log());
    let s = f.stats_until(1, |s| gauges.iter().all(|g| s.filter(g) == 0)).await;
    let speeds: Vec<u64> = gauges.iter().map(|g| s.filter(g)).collect();
    assert_eq!(speeds, vec![0, 0, 0], "gateway B still routes with the speeds its old feed brought");
    let (status, _) = post_fresh(&f.gateways[1], turn(&prompt("after the update", 2_000), "go")).await;
    assert_eq!(status, 200);
}

/// With a feed that takes pending sections but not fits ones, a gateway learns speeds only from its own requests:
/// B, which has served nothing, has no speed for any upstream while A has them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fits_sections_a_gateway_learns_only_from_its_own_requests() {
    let f = Fleet::start(true, true, false).await;
    let gauges = speeds_taught_through_gateway_a(&f).await;
    // Longer than it takes B to get A's fits when the feed takes them (previous test).
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let s = f.gateways[1].stats().await.expect("stats");
    let speeds: Vec<u64> = gauges.iter().map(|g| s.filter(g)).collect();
    assert_eq!(speeds, vec![0, 0, 0], "gateway B learned speeds it never sampled");
    f.assert_no_report_failed().await;
}
