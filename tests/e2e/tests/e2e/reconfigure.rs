//! Plugin reconfiguration through an LDS file update while traffic flows: a strategy switch takes effect without
//! dropping requests, and an invalid plugin config is rejected with a clear message while the old one keeps serving.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::common::{prompt, Rig};

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
    assert!(rig.envoy.update_listener(random).await.expect("lds update"), "RANDOM config rejected:\n{}", rig.envoy.log());
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
    assert!(s.filter("decisions.random.random") >= 11, "{:?}\n{}", s.with_prefix("wasmcustom").collect::<Vec<_>>(), rig.envoy.log());
}
