//! No failure of the wasm VM lets a client choose the destination: with a module Envoy cannot fetch (the filter is
//! then passed through under `FAIL_OPEN`), the native strip placed before the wasm filter still removes client-sent
//! destination headers, so Envoy's `override_host` policy never sees them and its fallback routes. (A local module
//! that is not wasm makes Envoy refuse the whole configuration, which lets nobody choose.)

use std::net::SocketAddr;

use serde_json::json;
use warmpath_harness::{
    filter_wasm, free_port, EnvoyConfig, EnvoyProcess, RemoteModule, Upstream, DESTINATION_HEADER, ORIGINAL_DST_HEADER,
};

use crate::common::CONCURRENCY;

/// Requests sent with a spoofed header, all naming the same upstream.
const REQUESTS: usize = 12;

/// A bootstrap whose wasm filter fetches its module from a loopback port nothing listens on.
async fn unfetchable_module_rig(strip_in_envoy: bool) -> (Vec<Upstream>, EnvoyProcess) {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    let addrs: Vec<_> = upstreams.iter().map(Upstream::addr).collect();
    let mut cfg = EnvoyConfig::new(addrs.clone(), EnvoyConfig::plugin_json(&addrs, json!({})))
        .with_wasm(filter_wasm().expect("module"));
    let address = SocketAddr::from(([127, 0, 0, 1], free_port().expect("port")));
    cfg.wasm_remote = Some(RemoteModule { address, path: "/warmpath_filter.wasm".into(), sha256: "0".repeat(64) });
    cfg.strip_in_envoy = strip_in_envoy;
    let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy starts with a module it cannot fetch");
    (upstreams, envoy)
}

/// Sends [`REQUESTS`] requests carrying both destination headers naming upstream 0; returns how many upstream 0
/// answered.
async fn spoofed_requests_to_first(upstreams: &[Upstream], envoy: &EnvoyProcess) -> usize {
    let client = reqwest::Client::new();
    let target = upstreams[0].addr().to_string();
    for i in 0..REQUESTS {
        let r = client
            .post(format!("{}/v1/chat/completions", envoy.url()))
            .header(DESTINATION_HEADER, &target)
            .header(ORIGINAL_DST_HEADER, &target)
            .body(json!({"model": "m", "messages": [{"role": "user", "content": format!("spoof {i}")}]}).to_string())
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200, "fail open: the request is still served");
    }
    upstreams[0].count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_that_cannot_be_fetched_does_not_let_the_client_choose() {
    let (upstreams, envoy) = unfetchable_module_rig(true).await;
    let at_target = spoofed_requests_to_first(&upstreams, &envoy).await;
    for u in &upstreams {
        for req in u.requests() {
            assert_eq!(req.header(DESTINATION_HEADER), None, "a client's header reached the upstream: {req:?}");
            assert_eq!(req.header(ORIGINAL_DST_HEADER), None, "{req:?}");
        }
    }
    assert!(at_target < REQUESTS, "all {REQUESTS} spoofed requests went where the client asked");
}

/// The control: without the native strip, the same broken module hands the client the destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_native_strip_a_failed_module_lets_the_client_choose() {
    let (upstreams, envoy) = unfetchable_module_rig(false).await;
    assert_eq!(
        spoofed_requests_to_first(&upstreams, &envoy).await,
        REQUESTS,
        "the client's header chose every upstream"
    );
}
