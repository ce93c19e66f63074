//! Requests without a usable key are served (200) by the fallback pick and counted by cause.

use serde_json::json;

use crate::common::Rig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_fail_open_and_are_counted() {
    // max_body_bytes 4096 < Envoy's buffer limit (4 MiB in the harness): bigger bodies are served unparsed.
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE", "max_body_bytes": 4096})).await;
    let chat = "/v1/chat/completions";
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("malformed_json", b"{\"model\": \"m\", \"messages\": [".to_vec(), chat),
        ("not_utf8", vec![0xff, 0xfe, 0x7b, 0x22, 0x80, 0x81], chat),
        ("missing_field", br#"{"model": "m"}"#.to_vec(), chat),
        ("body_too_large", json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(64 * 1024)}]}).to_string().into_bytes(), chat),
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
    let s = rig.stats_until(|s| s.filter("fail_open.no_body") >= 3 && s.filter("decisions.prefix_aware.fail_open") >= 15).await;
    for (cause, _, _) in &cases {
        assert_eq!(s.filter(&format!("fail_open.{cause}")), 3, "fail_open.{cause}: {:?}", s.with_prefix("wasmcustom").collect::<Vec<_>>());
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
