//! One prefix index and one prefill speed per Envoy: with four workers, requests on different connections reach
//! different workers (each with its own VM), and each worker routes with what the others recorded (`exchange` in
//! the filter) and the speed their requests taught (`shared` in the filter).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use warmpath_core::prefill_rate::MIN_SAMPLES;

use crate::common::{hold_filler, learn_prefill_speed, post_fresh, prompt, spawn_post, turn, Connections, Rig};

/// Envoy worker threads in this test.
const WORKERS: u32 = 4;
/// Follow-up turns of the conversation, each on its own connection.
const TURNS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_on_different_connections_stays_on_one_endpoint_across_workers() {
    let rig = Arc::new(Rig::start_workers(3, json!({"strategy": "PREFIX_AWARE"}), WORKERS).await);
    let history = prompt("conversation about warm caches", 3000);
    let (status, first) = post_fresh(&rig.envoy, turn(&history, "first question")).await;
    assert_eq!(status, 200);
    let home = rig.index_of(&first).expect("answered by an upstream");

    // Put prefill work in front of the conversation's endpoint: hold it, and send unrelated requests until one is
    // waiting there. A worker that does not know the conversation sees that work at `home` and an idle endpoint
    // elsewhere, and would place the next turn there; a worker that knows home holds 3,000 cached characters stays.
    // A few fillers' work (about 450 characters each) stays well under the 3,000 cached ones, and three of them
    // with the turns stay under the default `concurrency_threshold`.
    rig.upstreams[home].hold();
    let (filler, waiting) = hold_filler(&rig.upstreams[home], |i| {
        spawn_post(rig.envoy.url(), turn(&prompt(&format!("unrelated filler {i}"), 400), "hello"))
    })
    .await;
    assert!(waiting <= 3, "{waiting} fillers wait at the conversation's endpoint");

    let mut turns = Vec::new();
    for t in 0..TURNS {
        turns.push(spawn_post(rig.envoy.url(), turn(&history, &format!("follow-up question {t}"))));
        // One at a time, so each turn's pick sees the earlier ones (sent by whichever worker routed them).
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for _ in 0..100 {
        if rig.upstreams[home].active() == waiting + TURNS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at_home = rig.upstreams[home].active();
    rig.upstreams[home].release();
    let answered: Vec<(u16, String)> = futures_join(turns).await;
    futures_join(filler).await;
    assert!(answered.iter().all(|(s, _)| *s == 200), "{answered:?}");
    assert!(answered.iter().all(|(_, u)| *u == first), "a turn left the conversation's endpoint {first}: {answered:?}");
    assert_eq!(at_home, waiting + TURNS);
    let s = rig.stats_until(|s| s.filter("index_exchange.applied") >= 1).await;
    assert!(s.filter("index_exchange.applied") >= 1, "no index record was applied across workers");
    assert_eq!(s.filter("index_exchange.dropped"), 0);
    assert!(
        workers_used(&s.worker_connections(rig.envoy.config().listener_port)) >= 2,
        "every connection on one worker: the test proves nothing"
    );
}

/// Every VM of one Envoy writes the index log under its own id: a reader skips the records that carry its own, so
/// two workers sharing an id would each drop all of the other's records (the exchange's `applied` stays 0). Ids
/// drawn from each VM's clock-seeded generator did collide in some starts; they come from shared data now. Several
/// starts, each with four workers and the main thread's VMs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vm_of_an_envoy_writes_the_index_log_under_its_own_id() {
    for _ in 0..3 {
        let rig = Rig::start_workers(2, json!({"strategy": "PREFIX_AWARE"}), WORKERS).await;
        let log = rig.envoy.log();
        let ids: Vec<&str> = log
            .lines()
            .filter_map(|l| l.split("exchange_writer=").nth(1))
            .map(|v| v.split_whitespace().next().unwrap_or(v))
            .collect();
        assert!(ids.len() > WORKERS as usize, "one configure line per VM, the workers' and the main thread's: {ids:?}");
        let distinct: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), ids.len(), "two VMs share an id: {ids:?}");
    }
}

/// The prefill speed is one fit per Envoy: the 16 misses a fit needs, sent on connections of their own, spread over
/// the four workers, and the speed is learned (each worker learning alone, only one that took all 16 would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_feeds_one_prefill_speed() {
    let rig = Rig::start_workers(3, json!({"strategy": "PREFIX_AWARE"}), WORKERS).await;
    let port = rig.envoy.config().listener_port;
    // The start's readiness probe is a connection too.
    let before = rig.envoy.stats().await.expect("stats").worker_connections(port);
    let s = learn_prefill_speed(&rig, MIN_SAMPLES as usize, Connections::Fresh).await;
    let after = s.worker_connections(port);
    let taken: Vec<u64> = after.iter().enumerate().map(|(w, n)| n - before.get(w).copied().unwrap_or(0)).collect();
    assert_eq!(taken.iter().sum::<u64>(), u64::from(MIN_SAMPLES), "{taken:?}");
    assert!(workers_used(&taken) >= 2, "every connection on one worker: the test proves nothing");
}

/// Workers that accepted at least one connection, from connections per worker
/// (`warmpath_harness::Stats::worker_connections`).
fn workers_used(per_worker: &[u64]) -> usize {
    per_worker.iter().filter(|&&n| n > 0).count()
}

/// Idle upstreams: conversations whose every turn comes on a fresh connection (so different turns are handled by
/// different workers) each land on one upstream, and different conversations on different ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_on_fresh_connections_sticks_with_four_workers() {
    let rig = Rig::start_workers(4, json!({"strategy": "PREFIX_AWARE"}), WORKERS).await;
    let mut homes = BTreeSet::new();
    for c in 0..6 {
        // Conversations share no leading text.
        let mut messages = vec![json!({"role": "system", "content": prompt(&format!("persona {c}"), 200)})];
        let mut seen = BTreeSet::new();
        for turn in 0..5 {
            messages.push(json!({"role": "user", "content": prompt(&format!("conv {c} turn {turn}"), 300)}));
            let body = json!({"model": "m", "messages": messages}).to_string().into_bytes();
            // A new connection per turn, accepted by whichever worker the kernel picks.
            let (status, upstream) = post_fresh(&rig.envoy, body).await;
            assert_eq!(status, 200);
            seen.insert(upstream);
            messages.push(json!({"role": "assistant", "content": prompt(&format!("answer {c} {turn}"), 400)}));
        }
        assert_eq!(seen.len(), 1, "conversation {c} spread over {seen:?}");
        homes.extend(seen);
    }
    assert!(homes.len() >= 2, "six conversations all on {homes:?}");
    // The turns really were handled by more than one worker: every worker VM's counters flush into one stat, so
    // this reads the connection count per worker from Envoy's own listener stats instead.
    let s = rig.envoy.stats().await.expect("stats");
    assert!(
        workers_used(&s.worker_connections(rig.envoy.config().listener_port)) >= 2,
        "all 30 connections on one worker: the test proves nothing"
    );
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<(u16, String)>>) -> Vec<(u16, String)> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("join"));
    }
    out
}
