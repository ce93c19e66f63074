//! The in-flight gauges of endpoints that leave (here by an LDS update of the plugin configuration) do not freeze
//! at their last value: they keep reporting the shared count until their last request ends, then read 0. The
//! learned prefill speeds, the pool's and each endpoint's own, read what the upstreams do.

use std::sync::Arc;

use serde_json::json;
use warmpath_harness::Stats;

use crate::common::{learn_prefill_speed, prompt, Connections, Rig};

fn gauge(s: &Stats, addr: &str) -> u64 {
    s.filter(&format!("in_flight.{}", warmpath_core::endpoint::stat_token(addr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_of_removed_endpoints_drop_to_zero() {
    let mut rig = Rig::start_dynamic(3, json!({"strategy": "LEAST_OUTSTANDING_REQUESTS"})).await;
    rig.upstreams.iter().for_each(|u| u.hold());
    let removed = rig.upstreams[2].addr().to_string();
    // Six held requests, two per endpoint (least outstanding requests spreads them).
    let url = format!("{}/v1/completions", rig.envoy.url());
    let held: Vec<_> = (0..6)
        .map(|i| {
            let (client, url) = (rig.client.clone(), url.clone());
            tokio::spawn(async move {
                client.post(url).body(format!(r#"{{"prompt":"{i}"}}"#)).send().await.map(|r| r.status().as_u16())
            })
        })
        .collect();
    let s = rig.stats_until(|s| gauge(s, &removed) == 2).await;
    assert_eq!(gauge(&s, &removed), 2, "two requests in flight on the endpoint to remove");

    // The new configuration no longer names the third endpoint.
    let two = Rig::config(&rig.upstreams[..2], json!({"strategy": "LEAST_OUTSTANDING_REQUESTS"}));
    assert!(rig.envoy.update_listener(two).await.expect("lds update"), "update rejected:\n{}", rig.envoy.log());
    let rig = Arc::new(rig);
    rig.upstreams.iter().for_each(|u| u.release());
    for h in held {
        assert_eq!(h.await.expect("task").expect("request"), 200);
    }
    let s = rig.stats_until(|s| gauge(s, &removed) == 0 && s.filter("endpoints") == 2).await;
    assert_eq!(s.filter("endpoints"), 2, "the update took effect");
    assert_eq!(gauge(&s, &removed), 0, "the removed endpoint's gauge froze at its last value");
}

/// An IPv6 endpoint's gauge has the documented name in Envoy's stats: every character other than a letter or digit
/// becomes `_` (`[::1]:18011` → `in_flight.___1__18011`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_endpoints_gauge_has_the_documented_name() {
    let upstreams = warmpath_harness::Upstream::start_many(2).await.expect("upstreams");
    let v4: Vec<String> = upstreams.iter().map(|u| u.addr().to_string()).collect();
    let rig = {
        let endpoints = json!([v4[0], v4[1], "[::1]:18011"]);
        let cfg = Rig::config(&upstreams, json!({"strategy": "LEAST_OUTSTANDING_REQUESTS", "endpoints": endpoints}));
        let envoy = warmpath_harness::EnvoyProcess::start(cfg, crate::common::CONCURRENCY).await.expect("envoy");
        let client = reqwest::Client::builder().build().expect("client");
        Rig { upstreams, envoy, client }
    };
    let name = "wasmcustom.warmpath.in_flight.___1__18011";
    let s = rig.stats_until(|s| s.with_prefix(name).any(|(k, _)| k == name)).await;
    let gauges: Vec<_> = s.with_prefix("wasmcustom.warmpath.in_flight.").collect();
    assert!(gauges.iter().any(|(k, _)| *k == name), "{gauges:?}");
}

/// PREFIX_AWARE learns the pool's prefill speed from its own requests. The upstreams answer 5 ms plus 1 ms per 50
/// bytes of request body after a request arrives, so the `prefill.bytes_per_s` gauge reads about 50,000 and
/// `prefill.overhead_us` a few ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_speed_is_learned_from_the_requests() {
    let rig = Rig::start(2, json!({"strategy": "PREFIX_AWARE"})).await;
    let s = learn_prefill_speed(&rig, 40, Connections::Pooled).await;
    let overhead = s.filter("prefill.overhead_us");
    assert!(overhead < 100_000, "{overhead} µs of fixed time to first byte; the upstreams add 5,000");
}

/// PREFIX_AWARE learns each endpoint's own prefill speed beside the pool's: here one upstream answers 1 ms per 50
/// bytes of request body and the other 1 ms per 20, and each one's `prefill_speed.<endpoint>` gauge reads its own
/// (about 50,000 and 20,000 bytes per s). Prompts share nothing, so each request is placed as a miss on an idle
/// pool: by its key's rendezvous order, about half on each upstream, until the speeds tell the second apart as
/// slower. From then on a miss on the idle pool goes where it finishes first: the faster upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_s_prefill_speed_is_learned_and_a_miss_goes_where_it_finishes_first() {
    let rig = Rig::start(2, json!({"strategy": "PREFIX_AWARE"})).await;
    let rates = [50, 20];
    for (u, rate) in rig.upstreams.iter().zip(rates) {
        u.set_delay(std::time::Duration::from_millis(5));
        u.set_body_rate(rate);
    }
    let token = |i: usize| warmpath_core::endpoint::stat_token(&rig.upstreams[i].addr().to_string());
    let speed = |s: &Stats, i: usize| s.filter(&format!("prefill_speed.{}", token(i)));
    let mut learned = None;
    for i in 0..160 {
        let reply = rig.chat(&prompt(&format!("alone {i}"), 1_000 + (i * 3_700) % 7_000)).await;
        assert_eq!(reply.status, 200);
        if i % 8 == 7 {
            let s = rig.envoy.stats().await.expect("stats");
            if speed(&s, 0) > 0 && speed(&s, 1) > 0 {
                learned = Some(s);
                break;
            }
        }
    }
    let s = learned.unwrap_or_else(|| panic!("no speed per endpoint after 160 requests: {:?}", rig.counts()));
    let (fast, slow) = (speed(&s, 0), speed(&s, 1));
    assert!((35_000..=65_000).contains(&fast), "{fast} bytes per s learned; the upstream answers at 50,000");
    assert!((14_000..=26_000).contains(&slow), "{slow} bytes per s learned; the upstream answers at 20,000");
    // Every worker has read the fits on its tick (200 ms).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let fast_address = rig.upstreams[0].addr().to_string();
    for i in 0..12 {
        let reply = rig.chat(&prompt(&format!("after {i}"), 2_000 + i * 300)).await;
        assert_eq!((reply.status, reply.upstream.as_str()), (200, fast_address.as_str()), "miss {i}");
    }
}
