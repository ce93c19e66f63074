//! Where requests land: affinity, spread, multi-turn stickiness, overflow under a slow upstream, a holder whose
//! queue is nearly prefilled.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::common::{learn_prefill_speed, prompt, upstream_with_one_request, Connections, Rig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_prefix_lands_on_one_upstream() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    for seed in ["alpha", "bravo", "charlie", "delta", "echo"] {
        let p = prompt(seed, 3000);
        let mut seen = BTreeSet::new();
        for _ in 0..6 {
            let r = rig.chat(&p).await;
            assert_eq!(r.status, 200, "{r:?}");
            seen.insert(r.upstream.clone());
        }
        assert_eq!(seen.len(), 1, "prefix {seed} spread over {seen:?}");
    }
    // Every upstream received exactly the destination header naming itself: the pick is what Envoy honoured.
    for u in &rig.upstreams {
        for req in u.requests() {
            assert_eq!(req.header(warmpath_harness::DESTINATION_HEADER), Some(u.addr().to_string().as_str()));
        }
    }
    let picks = |s: &warmpath_harness::Stats| s.sum_prefix("wasmcustom.warmpath.decisions.prefix_aware.");
    let s = rig.stats_until(|s| picks(s) >= 30).await;
    assert_eq!(picks(&s), 30, "30 requests, 30 decisions");
    assert_eq!(
        s.filter("decisions.prefix_aware.prefix_match") + s.filter("decisions.prefix_aware.consistent_pick"),
        30,
        "all 30 picks are prefix-aware decisions: {:?}",
        s.with_prefix("wasmcustom.warmpath.decisions").collect::<Vec<_>>()
    );
    // Repeats of a prefix find it in the index (per worker VM, so at least 5 × (6 − 2 workers) matches), and the
    // matched lengths are counted.
    assert!(
        s.filter("decisions.prefix_aware.prefix_match") >= 20,
        "{:?}",
        s.with_prefix("wasmcustom").collect::<Vec<_>>()
    );
    assert!(s.filter("matched_prefix_chars_total") > 0);
    assert_eq!(s.sum_prefix("wasmcustom.warmpath.matched_prefix."), 30, "every prefix-aware pick lands in one bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_prefixes_spread_over_all_upstreams() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    let n = 60;
    for i in 0..n {
        let r = rig.chat(&prompt(&format!("user-{i}"), 2000)).await;
        assert_eq!(r.status, 200);
    }
    let counts = rig.counts();
    assert_eq!(counts.iter().sum::<usize>(), n);
    // Consistent hashing of 60 keys over 3 endpoints: every endpoint gets a share, none gets most.
    assert!(counts.iter().all(|c| (5..=40).contains(c)), "uneven spread {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_conversation_stays_on_its_upstream() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    for conv in 0..3 {
        let mut messages = vec![json!({"role": "system", "content": prompt(&format!("conv {conv} system"), 1500)})];
        let mut seen = BTreeSet::new();
        for turn in 0..6 {
            messages.push(json!({"role": "user", "content": prompt(&format!("conv {conv} turn {turn}"), 400)}));
            let body = json!({"model": "m", "messages": messages});
            let r = rig.post("/v1/chat/completions", body.to_string().into_bytes(), &[]).await;
            assert_eq!(r.status, 200);
            seen.insert(r.upstream.clone());
            messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        }
        assert_eq!(seen.len(), 1, "conversation {conv} moved: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_the_same_prompt_route_independently() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    let p = prompt("shared prompt", 2000);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": p}]}).to_string();
    let mut per_tenant = Vec::new();
    for t in 0..12 {
        let tenant = format!("tenant-{t}");
        let a = rig.post("/v1/chat/completions", body.clone().into_bytes(), &[("x-warmpath-prefix-id", &tenant)]).await;
        let b = rig.post("/v1/chat/completions", body.clone().into_bytes(), &[("x-warmpath-prefix-id", &tenant)]).await;
        assert_eq!(a.upstream, b.upstream, "tenant {tenant} not sticky");
        per_tenant.push(a.upstream);
    }
    let distinct: BTreeSet<_> = per_tenant.iter().collect();
    assert!(distinct.len() >= 2, "12 tenants with one prompt all landed on {distinct:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_preferred_upstream_overflows() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE", "concurrency_threshold": 2})).await;
    let p = prompt("hot prefix", 3000);
    let first = rig.chat(&p).await;
    let home = rig.index_of(&first.upstream).expect("answered by an upstream");
    rig.upstreams[home].hold();
    // Two held requests fill the preferred upstream to the threshold.
    let rig = std::sync::Arc::new(rig);
    let mut held = Vec::new();
    for _ in 0..2 {
        let (rig, p) = (rig.clone(), p.clone());
        held.push(tokio::spawn(async move { rig.chat(&p).await }));
    }
    for _ in 0..200 {
        if rig.upstreams[home].active() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(rig.upstreams[home].active(), 2, "held requests did not reach the preferred upstream");
    let over = rig.chat(&p).await;
    assert_eq!(over.status, 200);
    assert_ne!(over.upstream, first.upstream, "request went to the overloaded upstream");
    assert_eq!(over.reason(), "overflow", "{over:?}");
    rig.upstreams[home].release();
    for h in held {
        let r = h.await.expect("join");
        assert_eq!((r.status, r.upstream.as_str()), (200, first.upstream.as_str()));
    }
    let s = rig.stats_until(|s| s.filter("decisions.prefix_aware.overflow") >= 1).await;
    assert!(s.filter("decisions.prefix_aware.overflow") >= 1);
    // Once the load is gone the prefix goes to an upstream that served it (home, or where it overflowed to —
    // both hold it now), never to the third.
    let back = rig.chat(&p).await;
    assert!(back.upstream == first.upstream || back.upstream == over.upstream, "{back:?}");
}

/// Once PREFIX_AWARE has learned the pool's prefill speed, the work pending on an endpoint drains at that speed: a
/// holder whose long request has been prefilling for a while keeps the next request of its prefix, where counting
/// the whole long request as still waiting would send it to the idle endpoint. The upstreams answer 5 ms plus 1 ms
/// per 50 bytes of body after a request arrives. One Envoy worker, so one router learns from every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_queue_is_nearly_prefilled_keeps_its_prefix() {
    let rig = Rig::start_workers(2, json!({"strategy": "PREFIX_AWARE"}), 1).await;
    learn_prefill_speed(&rig, 24, Connections::Pooled).await;
    // A long request: a 12,000-character shared part (past `prefix_length`, so its key is cut there and a later
    // request with the same start counts as cached whole on its holder) and 30,000 characters of its own, about
    // 42 KB of work: its first byte comes ~850 ms after it reaches its upstream.
    let shared = prompt("shared document", 12_000);
    let rig = std::sync::Arc::new(rig);
    let long = {
        let (rig, body) = (rig.clone(), format!("{shared}{}", prompt("first question", 30_000)));
        tokio::spawn(async move { rig.chat(&body).await })
    };
    let holder = upstream_with_one_request(&rig.upstreams, Duration::from_millis(5)).await;
    let holder = holder.expect("the long request reached an upstream");
    // 400 ms after it arrived, ~20 KB of it is done (~14 KB at the slowest speed accepted above). Counted whole, the
    // 42 KB still waiting on the holder is more than prefilling the next request on the idle endpoint (~12 KB,
    // charged three times for duplicating a prefix: ~36 KB); drained, the 16–28 KB left is less. The first byte is
    // still ~450 ms away, so the holder's work has not been released yet.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!long.is_finished() && rig.upstreams[holder].active() == 1, "the long request was answered too soon");
    let next = rig.chat(&format!("{shared} second question")).await;
    let long = long.await.expect("join");
    assert_eq!((long.status, next.status), (200, 200));
    assert_eq!(rig.index_of(&long.upstream), Some(holder));
    assert_eq!(next.upstream, long.upstream, "the next request left the holder: {next:?}");
    assert_eq!(next.reason(), "prefix_match", "{next:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_outstanding_avoids_the_busy_upstream() {
    let rig = Rig::start(3, json!({"strategy": "LEAST_OUTSTANDING_REQUESTS"})).await;
    rig.upstreams[0].hold();
    // (Counts are shared by both Envoy workers, so which worker takes a request does not matter.)
    let rig = std::sync::Arc::new(rig);
    let mut held = Vec::new();
    // Send until one request is held at upstream 0; the others answer at once, so their in-flight stays 0.
    for i in 0..30 {
        if rig.upstreams[0].active() >= 1 {
            break;
        }
        let rig2 = rig.clone();
        held.push(tokio::spawn(async move { rig2.chat(&format!("lor {i}")).await }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(rig.upstreams[0].active(), 1);
    let before = rig.upstreams[0].count();
    for i in 0..20 {
        let r = rig.chat(&format!("after {i}")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.reason(), "least_outstanding");
    }
    assert_eq!(
        rig.upstreams[0].count(),
        before,
        "least-outstanding sent work to the upstream with a request in flight"
    );
    rig.upstreams[0].release();
    for h in held {
        assert_eq!(h.await.expect("join").status, 200);
    }
}
