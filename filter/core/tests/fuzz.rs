//! Arbitrary-input "fuzz" tests without nightly: proptest feeds random bytes and mutated valid bodies /
//! configurations / feed documents to key extraction, plugin-configuration and feed parsing and routing, and asserts no panic and a
//! bounded output size. Runs a small number of cases by default; `scripts/test.d/10-core.sh` runs it longer:
//!
//! `WARMPATH_FUZZ_CASES=200000 WARMPATH_FUZZ_SECS=60 cargo test -p warmpath-core --release --test fuzz -- --nocapture`
//!
//! Each target stops at the case count or the time budget, whichever comes first, and prints how many inputs
//! it tried.
#![cfg(not(target_arch = "wasm32"))]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use warmpath_core::{extract_key, EndpointLoad, PickInput, Router, Settings};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const BODIES: &[&str] = &[
    r#"{"model":"m","messages":[{"role":"system","content":"You are \"helpful\"\n"},{"role":"user","content":[{"type":"text","text":"hi \u00e9"},{"type":"image_url","image_url":{"url":"data:"}}]}],"prompt_cache_key":"t"}"#,
    r#"{"model":"m","prompt":["a","b\\c"],"max_tokens":5}"#,
    r#"{"prompt":[[1,2,3],[4]],"model":"x"}"#,
    r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"user","content":"𝄞"}]}"#,
];

const CONFIGS: &[&str] = &[
    r#"{"strategy":"PREFIX_AWARE","prefix_length":2048,"block_size":64,"concurrency_threshold":4,"tenant_header":"x-t","max_body_bytes":65536,"endpoints":["127.0.0.1:1","[::1]:2"],"index_capacity":128,"debug_header":true,"feed":{"cluster":"c","path":"/v1/endpoints","interval_ms":500}}"#,
    r#"{"strategy":"RANDOM","endpoints":["10.0.0.1:8000"]}"#,
    r#"{"endpoints":["10.0.0.1:8000"],"upstream_clusters":["outbound|8000||vllm.llm.svc.cluster.local","httproute/llm/chat/rule/0","pool-a"]}"#,
];

const FEEDS: &[&str] = &[
    r#"{"version":7,"endpoints":[{"address":"10.0.0.5:8000","load":{"waiting":2,"running":5,"kv_cache_usage":0.41}},{"address":"[::1]:9"}]}"#,
];

/// Random bytes, or a valid sample with byte edits / a cut (reaches the deeper parser states).
fn input(samples: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    let random = prop::collection::vec(any::<u8>(), 0..2048);
    let mutated = (
        prop::sample::select(samples),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..8),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(s, edits, cut, do_cut)| {
            let mut b = s.as_bytes().to_vec();
            for (at, byte, op) in edits {
                if b.is_empty() {
                    b.push(byte);
                    continue;
                }
                let i = at.index(b.len());
                match op {
                    0 => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            if do_cut && !b.is_empty() {
                b.truncate(cut.index(b.len()));
            }
            b
        });
    prop_oneof![random, mutated]
}

/// Runs `check` over inputs from `strategy` until the case count or time budget is used; returns inputs tried.
fn fuzz<S: Strategy>(name: &str, strategy: S, check: impl Fn(S::Value) -> Result<(), TestCaseError>) -> u64
where
    S::Value: std::fmt::Debug,
{
    let cases = env_u64("WARMPATH_FUZZ_CASES", 256);
    let budget = Duration::from_secs(env_u64("WARMPATH_FUZZ_SECS", 20));
    let start = Instant::now();
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let mut tried = 0u64;
    while tried < cases && start.elapsed() < budget {
        let case = strategy.new_tree(&mut runner).unwrap_or_else(|e| panic!("fuzz target {name}: {e}"));
        tried += 1;
        // run_one catches panics and shrinks a failing input before reporting it.
        if let Err(e) = runner.run_one(case, &check) {
            panic!("fuzz target {name} failed after {tried} inputs: {e}");
        }
    }
    let n = tried;
    println!("fuzz target {name}: {n} inputs tried in {:.1} s, no panic", start.elapsed().as_secs_f64());
    n
}

#[test]
fn fuzz_extract_key() {
    let n =
        fuzz("extract_key", (input(BODIES), 0usize..3, 1usize..300, any::<bool>()), |(body, path, limit, tenant)| {
            let path = ["/v1/chat/completions", "/v1/completions", "/raw"][path];
            let tenant = tenant.then_some("tenant-1");
            if let Ok(k) = extract_key(path, &body, tenant, limit) {
                // Bounded output: at most `limit` characters (4 bytes each) of text, never more than the unit count says.
                prop_assert!(k.text_units <= limit);
                prop_assert!(k.text.len() <= 4 * limit);
                prop_assert!(k.model.as_ref().is_none_or(|m| m.len() <= 256));
                prop_assert!(k.tenant.as_ref().is_none_or(|t| t.len() <= 64));
                // Whatever was extracted can be routed.
                let mut r = Router::new(Settings {
                    endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
                    block_size: 16,
                    ..Settings::default()
                });
                let d = r
                    .route(&PickInput { key: Some(&k), ..PickInput::default() }, &[EndpointLoad::in_flight(1)])
                    .unwrap();
                prop_assert!(d.endpoint < 2);
            }
            Ok(())
        });
    assert!(n > 0);
}

#[test]
fn fuzz_settings_from_json() {
    let n = fuzz("settings_from_json", input(CONFIGS), |bytes| {
        match Settings::from_json(&bytes) {
            Ok(s) => {
                prop_assert!((1024..=65536).contains(&s.prefix_length));
                prop_assert!(s.block_size <= s.prefix_length);
                prop_assert!(s.endpoints.len() <= 4096);
                // Accepted cluster names are usable gate entries: bounded, non-empty, printable, distinct, each
                // one gating in exactly itself.
                prop_assert!(s.upstream_clusters.len() <= 64);
                for (i, c) in s.upstream_clusters.iter().enumerate() {
                    prop_assert!(!c.is_empty() && c.len() <= 512 && c.trim() == c && !c.chars().any(char::is_control));
                    prop_assert!(!s.upstream_clusters[..i].contains(c));
                    prop_assert!(s.acts_on_cluster(Some(c)));
                }
                prop_assert_eq!(s.acts_on_cluster(None), s.upstream_clusters.is_empty());
                // A valid configuration always builds a working router.
                let _ = Router::new(s);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n') && msg.len() < 4096, "one bounded line: {msg}");
            }
        }
        Ok(())
    });
    assert!(n > 0);
}

#[test]
fn fuzz_feed_snapshot() {
    let n = fuzz("feed_snapshot", input(FEEDS), |bytes| {
        if let Ok(snap) = warmpath_core::feed::FeedSnapshot::from_json(&bytes) {
            prop_assert!(snap.endpoints.len() <= 4096);
            // An accepted snapshot is always a usable endpoint set.
            let mut r = Router::new(Settings { endpoints: vec!["127.0.0.1:1".into()], ..Settings::default() });
            prop_assert!(r.set_endpoints(snap.endpoints.iter().map(|e| e.address.clone()).collect()).is_ok());
        }
        Ok(())
    });
    assert!(n > 0);
}
