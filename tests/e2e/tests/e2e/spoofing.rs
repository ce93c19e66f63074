//! A client must never choose the destination: client-sent `x-gateway-destination-endpoint` and
//! `x-envoy-original-dst-host` are removed on every request, including fail-open ones.

use serde_json::json;
use warmpath_harness::{DESTINATION_HEADER, ORIGINAL_DST_HEADER};

use crate::common::{prompt, Rig};

const FOREIGN: &str = "10.9.9.9:9999";

/// The filter alone (no native header_mutation in front of it) strips the headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_destination_headers_are_not_honoured() {
    let upstreams = warmpath_harness::Upstream::start_many(3).await.expect("upstreams");
    let mut cfg = Rig::config(&upstreams, json!({"strategy": "PREFIX_AWARE"}));
    cfg.strip_in_envoy = false;
    let envoy = warmpath_harness::EnvoyProcess::start(cfg, crate::common::CONCURRENCY).await.expect("envoy");
    let rig = Rig { upstreams, envoy, client: reqwest::Client::new() };
    let mut spoofed_requests = 0;
    for i in 0..9 {
        let p = prompt(&format!("spoof {i}"), 2000);
        let home = rig.chat(&p).await.upstream;
        // Point the client's header at an upstream that is not the pick.
        let target = rig.upstreams.iter().map(|u| u.addr().to_string()).find(|a| *a != home).expect("other upstream");
        let body = json!({"model": "m", "messages": [{"role": "user", "content": p}]}).to_string();
        let r = rig
            .post(
                "/v1/chat/completions",
                body.into_bytes(),
                &[(DESTINATION_HEADER, &target), (ORIGINAL_DST_HEADER, &target)],
            )
            .await;
        spoofed_requests += 1;
        assert_eq!(r.status, 200);
        assert_eq!(r.upstream, home, "the client's header chose the upstream");
    }
    // Fail-open requests (GET, broken JSON) with a foreign and a member address, header sent twice.
    let member = rig.upstreams[0].addr().to_string();
    for i in 0..12 {
        let headers =
            [(DESTINATION_HEADER, FOREIGN), (DESTINATION_HEADER, member.as_str()), (ORIGINAL_DST_HEADER, FOREIGN)];
        let r = if i % 2 == 0 {
            rig.get("/v1/models", &headers).await
        } else {
            rig.post("/v1/chat/completions", b"{not json".to_vec(), &headers).await
        };
        spoofed_requests += 1;
        assert_eq!(r.status, 200);
    }
    // No upstream ever saw a client's value: the destination header is always the filter's own pick (the address
    // of the upstream that received it), and the original-dst header never arrives.
    for u in &rig.upstreams {
        for req in u.requests() {
            assert_eq!(req.header(DESTINATION_HEADER), Some(u.addr().to_string().as_str()), "{req:?}");
            assert_eq!(req.header(ORIGINAL_DST_HEADER), None, "{req:?}");
        }
    }
    // Fail-open picks are the filter's least-outstanding choice, not the spoofed member upstream 0.
    let fail_open_at_member =
        rig.upstreams[0].requests().iter().filter(|r| r.path == "/v1/models" || r.body_len == 9).count();
    assert!(fail_open_at_member < 12, "all fail-open requests went where the client asked");
    let s = rig.envoy.stats().await.expect("stats");
    assert_eq!(s.filter("spoofed_header_removed"), spoofed_requests);
}

/// The rendered default: Envoy removes the headers before the filter runs (defence in depth); same outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_config_also_strips_in_envoy() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    for i in 0..6 {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": prompt(&format!("d {i}"), 2000)}]})
            .to_string();
        let r = rig
            .post(
                "/v1/chat/completions",
                body.into_bytes(),
                &[(DESTINATION_HEADER, FOREIGN), (ORIGINAL_DST_HEADER, FOREIGN)],
            )
            .await;
        assert_eq!(r.status, 200);
        let r = rig.get("/health", &[(DESTINATION_HEADER, FOREIGN), (ORIGINAL_DST_HEADER, FOREIGN)]).await;
        assert_eq!(r.status, 200);
    }
    for u in &rig.upstreams {
        for req in u.requests() {
            assert_eq!(req.header(DESTINATION_HEADER), Some(u.addr().to_string().as_str()), "{req:?}");
            assert_eq!(req.header(ORIGINAL_DST_HEADER), None, "{req:?}");
        }
    }
    // Nothing reached the filter to strip.
    assert_eq!(rig.envoy.stats().await.expect("stats").filter("spoofed_header_removed"), 0);
}

/// The threat the filter and the native strip close: without either, Envoy's override_host policy obeys a
/// client-sent header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_filter_a_client_header_would_choose() {
    let upstreams = warmpath_harness::Upstream::start_many(3).await.expect("upstreams");
    let addrs: Vec<_> = upstreams.iter().map(|u| u.addr()).collect();
    let mut cfg = warmpath_harness::EnvoyConfig::new(addrs.clone(), "{}");
    cfg.strip_in_envoy = false;
    let envoy = warmpath_harness::EnvoyProcess::start(cfg, crate::common::CONCURRENCY).await.expect("envoy");
    let client = reqwest::Client::new();
    let target = addrs[2].to_string();
    for _ in 0..10 {
        let r = client
            .post(format!("{}/v1/chat/completions", envoy.url()))
            .header(DESTINATION_HEADER, &target)
            .body("{}")
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
    }
    assert_eq!(upstreams[2].count(), 10, "override_host follows the client's header when nothing strips it");
}
