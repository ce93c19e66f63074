//! Requests without a usable key are served (200) by the fallback pick and counted by cause.

use serde_json::json;

use crate::common::{post_prompt, Rig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_fail_open_and_are_counted() {
    // max_body_bytes 4096 < Envoy's buffer limit (4 MiB in the harness): bigger bodies are served unparsed.
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE", "max_body_bytes": 4096})).await;
    let chat = "/v1/chat/completions";
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("malformed_json", b"{\"model\": \"m\", \"messages\": [".to_vec(), chat),
        ("not_utf8", vec![0xff, 0xfe, 0x7b, 0x22, 0x80, 0x81], chat),
        ("missing_field", br#"{"model": "m"}"#.to_vec(), chat),
        (
            "body_too_large",
            json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(64 * 1024)}]})
                .to_string()
                .into_bytes(),
            chat,
        ),
    ];
    for (cause, body, path) in &cases {
        for _ in 0..3 {
            let r = rig.post(path, body.clone(), &[("content-type", "application/json")]).await;
            assert_eq!(r.status, 200, "{cause}: {r:?}");
            assert_eq!(r.reason(), "fail_open", "{cause}: {r:?}");
        }
    }
    for _ in 0..3 {
        let r = rig.get("/v1/models", &[]).await;
        assert_eq!((r.status, r.reason()), (200, "fail_open"));
    }
    // Decision counters reach Envoy on the filter's tick.
    let s = rig
        .stats_until(|s| s.filter("fail_open.no_body") >= 3 && s.filter("decisions.prefix_aware.fail_open") >= 15)
        .await;
    for (cause, _, _) in &cases {
        assert_eq!(
            s.filter(&format!("fail_open.{cause}")),
            3,
            "fail_open.{cause}: {:?}",
            s.with_prefix("wasmcustom").collect::<Vec<_>>()
        );
    }
    assert_eq!(s.filter("fail_open.no_body"), 3);
    assert_eq!(s.filter("decisions.prefix_aware.fail_open"), 15);
    // The upstreams got every body intact (nothing truncated or dropped by the filter).
    let sizes: Vec<usize> = rig.upstreams.iter().flat_map(|u| u.requests()).map(|r| r.body_len).collect();
    assert_eq!(sizes.len(), 15);
    assert_eq!(sizes.iter().filter(|&&n| n > 64 * 1024).count(), 3);
    // Fail-open picks spread by least-outstanding rather than piling onto one upstream.
    assert!(rig.counts().iter().filter(|&&c| c > 0).count() >= 2, "{:?}", rig.counts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_completion_bodies_are_routed_by_key() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    let completion = json!({"model": "m", "prompt": "p".repeat(3000)}).to_string();
    let a = rig.post("/v1/completions", completion.clone().into_bytes(), &[]).await;
    let b = rig.post("/v1/completions", completion.into_bytes(), &[]).await;
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(a.upstream, b.upstream);
    assert_ne!(a.reason(), "fail_open");
    let raw = vec![7u8; 5000];
    let c = rig.post("/generate", raw.clone(), &[]).await;
    let d = rig.post("/generate", raw, &[]).await;
    assert_eq!(c.upstream, d.upstream);
    assert_ne!(c.reason(), "fail_open", "raw bodies are keyed by their bytes");
}

/// Default `max_body_bytes` (1 MiB) under a larger listener buffer (4 MiB in the harness): a 1.5 MiB body is
/// served whole and unparsed — not held at all when its `content-length` says it is over the limit, held until it
/// is when it comes chunked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_max_body_bytes_is_served_unparsed() {
    let rig = Rig::start(3, json!({})).await;
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "y".repeat(1536 << 10)}]}).to_string();
    for i in 0..4 {
        let r = if i < 3 {
            rig.post("/v1/chat/completions", big.clone().into_bytes(), &[]).await
        } else {
            rig.post("/v1/chat/completions", crate::common::chunked(big.as_bytes()), &[]).await
        };
        assert_eq!((r.status, r.reason()), (200, "fail_open"), "request {i}: {r:?}");
    }
    let s = rig.stats_until(|s| s.filter("fail_open.body_too_large") >= 4).await;
    assert_eq!(s.filter("fail_open.body_too_large"), 4);
    let sizes: Vec<usize> = rig.upstreams.iter().flat_map(|u| u.requests()).map(|r| r.body_len).collect();
    assert_eq!(sizes, vec![big.len(); 4], "bodies arrive whole");
}

/// The filter must not change which bodies are served: a body gets 200 with the filter exactly when it gets 200
/// without it. A body that declares a `content-length` above `max_body_bytes` is never held, so bodies far beyond
/// the listener's buffer limit still pass; a chunked body (no declared length) is held until it outgrows
/// `max_body_bytes`, and is sent here in sizes whose whole is within the listener's limit, where holding can never
/// reach it (statuses are printed; docs/filter.md quotes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_keeps_envoys_body_limit_behaviour() {
    let upstreams = warmpath_harness::Upstream::start_many(3).await.expect("upstreams");
    let with = Rig::config(&upstreams, json!({}));
    let mut without = with.clone();
    without.wasm = None;
    let limit = with.buffer_limit_bytes as usize;
    let with = warmpath_harness::EnvoyProcess::start(with, crate::common::CONCURRENCY).await.expect("envoy");
    let without = warmpath_harness::EnvoyProcess::start(without, crate::common::CONCURRENCY).await.expect("envoy");
    let client = reqwest::Client::new();
    let sizes = [4 << 10, 512 << 10, 1536 << 10, 3 << 20, 6 << 20, 12 << 20];
    let cases = sizes.iter().map(|&s| (s, false)).chain(sizes.iter().filter(|&&s| s < limit).map(|&s| (s, true)));
    for (size, chunked) in cases {
        let mut statuses = Vec::new();
        for envoy in [&with, &without] {
            statuses.push(post_prompt(&client, envoy, size, chunked).await.status);
        }
        let how = if chunked { "chunked" } else { "with content-length" };
        eprintln!("body of {size} bytes {how}: with filter {}, without {}", statuses[0], statuses[1]);
        assert_eq!(statuses[0] == 200, statuses[1] == 200, "body of {size} bytes {how}: {statuses:?}");
        assert_eq!(statuses[0], 200, "body of {size} bytes {how}");
    }
}

/// On a listener with Envoy Gateway's 32 KiB buffer limit, the route's `request_body_buffer_limit` (what the
/// controller renders there) lets the filter hold every body it reads: prompts of 4 KiB to 1,000 KiB, with a
/// `content-length` or chunked, get 200 and are placed by the filter (not failed open); a 3 MiB prompt, over
/// `max_body_bytes`, gets 200 unparsed. The same listener without the route limit answers 413 to 64 KiB and
/// 1,000 KiB prompts with the filter and 200 without it, so the limit is what makes the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_body_limit_serves_prompts_above_a_small_listener_limit() {
    let upstreams = warmpath_harness::Upstream::start_many(3).await.expect("upstreams");
    let mut limited = Rig::config(&upstreams, json!({}));
    limited.buffer_limit_bytes = warmpath_envoy_config::ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES;
    let mut plain = limited.clone();
    plain.wasm = None;
    let mut routed = limited.clone();
    routed.route_body_buffer_limit_bytes = Some(warmpath_envoy_config::ROUTE_BODY_BUFFER_LIMIT_BYTES);
    let start = |c| warmpath_harness::EnvoyProcess::start(c, crate::common::CONCURRENCY);
    let (limited, plain, routed) =
        (start(limited).await.expect("envoy"), start(plain).await.expect("envoy"), start(routed).await.expect("envoy"));
    let client = reqwest::Client::new();
    for size in [64 << 10, 1000 << 10] {
        assert_eq!(
            post_prompt(&client, &limited, size, false).await.status,
            413,
            "the filter holds a {size}-byte prompt past a 32 KiB listener limit"
        );
        assert_eq!(
            post_prompt(&client, &plain, size, false).await.status,
            200,
            "without the filter nothing holds a {size}-byte prompt"
        );
    }
    let max_body_bytes = warmpath_core::config::DEFAULT_MAX_BODY_BYTES;
    for size in [4 << 10, 64 << 10, 512 << 10, 1000 << 10, 3 << 20] {
        for chunked in [false, true] {
            let r = post_prompt(&client, &routed, size, chunked).await;
            assert_eq!(r.status, 200, "prompt of {size} bytes, chunked {chunked}");
            // Envoy's copy of the filter's decision: placed when the filter read the prompt, failed open past
            // max_body_bytes.
            let placed = !r.decision.is_empty() && r.reason() != "fail_open";
            assert_eq!(placed, size <= max_body_bytes, "prompt of {size} bytes, chunked {chunked}: {r:?}");
        }
    }
}

/// HTTP allows non-UTF-8 (obs-text) header values; they must neither crash the VM nor pass as a tenant id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_header_values_are_harmless() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE"})).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "q".repeat(2000)}]}).to_string();
    let latin1 = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text header value");
    for _ in 0..3 {
        let r = rig
            .client
            .post(format!("{}/v1/chat/completions", rig.envoy.url()))
            .header("x-something", latin1.clone())
            .header("x-warmpath-prefix-id", latin1.clone())
            .body(body.clone())
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
        let decision = r
            .headers()
            .get(warmpath_harness::RIG_DECISION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        assert!(decision.ends_with("fail_open;matched=0"), "{decision:?}");
    }
    // The VM is alive and still decides normal requests.
    let r = rig.chat(&"ok ".repeat(700)).await;
    assert_eq!(r.status, 200);
    assert!(matches!(r.reason(), "prefix_match" | "consistent_pick"), "{r:?}");
    let s = rig.stats_until(|s| s.filter("fail_open.invalid_tenant") >= 3).await;
    assert_eq!(s.filter("fail_open.invalid_tenant"), 3);
}
