//! Property tests (proptest) of the public API: extraction against an oracle built from the same strings,
//! routing determinism, affinity, guard invariants and rendezvous stability. Native only.
#![cfg(not(target_arch = "wasm32"))]

use proptest::prelude::*;
use warmpath_core::{
    extract_key, hrw, Endpoint, EndpointLoad, PickInput, Reason, RequestKey, Router, Settings, Strategy,
};

fn settings(n: usize, threshold: u32) -> Settings {
    Settings {
        strategy: Strategy::PrefixAware,
        prefix_length: 1024,
        block_size: 32,
        concurrency_threshold: threshold,
        endpoints: (0..n).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect(),
        ..Settings::default()
    }
}

fn chat_body(model: &str, msgs: &[(String, String)]) -> Vec<u8> {
    let m: Vec<serde_json::Value> =
        msgs.iter().map(|(r, c)| serde_json::json!({"role": r, "content": c, "name": "ignored"})).collect();
    serde_json::to_vec(&serde_json::json!({"model": model, "stream": true, "messages": m})).unwrap()
}

/// The documented extracted text of a chat body, cut to `limit` characters.
fn oracle(msgs: &[(String, String)], limit: usize) -> String {
    let full: String = msgs.iter().map(|(r, c)| format!("{r}\u{1f}{c}\u{1e}")).collect();
    full.chars().take(limit).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn chat_extraction_matches_oracle(
        msgs in prop::collection::vec(("(system|user|assistant)", any::<String>()), 0..6),
        limit in 1usize..3000,
    ) {
        let body = chat_body("m", &msgs);
        let k = extract_key("/v1/chat/completions", &body, None, limit).unwrap();
        let want = oracle(&msgs, limit);
        prop_assert_eq!(String::from_utf8(k.text.clone()).unwrap(), want.clone());
        prop_assert_eq!(k.text_units, want.chars().count());
        let full_chars = oracle(&msgs, usize::MAX).chars().count();
        prop_assert_eq!(k.truncated, full_chars > limit);
    }

    #[test]
    fn content_part_arrays_equal_joined_text(parts in prop::collection::vec(any::<String>(), 1..5)) {
        let arr: Vec<serde_json::Value> = parts.iter().map(|t| serde_json::json!({"type": "text", "text": t})).collect();
        let body = serde_json::to_vec(&serde_json::json!({"messages": [{"role": "user", "content": arr}]})).unwrap();
        let joined = parts.concat();
        let plain = chat_body("", &[("user".into(), joined.clone())]);
        let a = extract_key("/v1/chat/completions", &body, None, 100_000).unwrap();
        let b = extract_key("/v1/chat/completions", &plain, None, 100_000).unwrap();
        prop_assert_eq!(a.text, b.text);
    }

    #[test]
    fn prompt_arrays_join_with_separator(prompts in prop::collection::vec(any::<String>(), 1..5)) {
        let body = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": prompts})).unwrap();
        let k = extract_key("/v1/completions", &body, None, 100_000).unwrap();
        let want: String = prompts.iter().map(|p| format!("{p}\u{1e}")).collect();
        prop_assert_eq!(String::from_utf8(k.text).unwrap(), want);
    }

    #[test]
    fn raw_prefix_is_bytes(body in prop::collection::vec(any::<u8>(), 0..3000), limit in 1usize..2000) {
        let k = extract_key("/generate", &body, None, limit).unwrap();
        prop_assert_eq!(&k.text[..], &body[..body.len().min(limit)]);
    }

    #[test]
    fn tenants_get_distinct_namespaces(text in ".{1,200}", a in "[a-z0-9-]{1,64}", b in "[a-z0-9-]{1,64}") {
        prop_assume!(a != b);
        let body = chat_body("m", &[("user".into(), text)]);
        let ka = extract_key("/v1/chat/completions", &body, Some(&a), 1024).unwrap();
        let kb = extract_key("/v1/chat/completions", &body, Some(&b), 1024).unwrap();
        prop_assert_eq!(&ka.text, &kb.text);
        prop_assert_ne!(ka.namespace, kb.namespace);
    }

    #[test]
    fn routing_is_deterministic_and_respects_the_guard(
        reqs in prop::collection::vec((prop::collection::vec(any::<u8>(), 0..400), any::<u64>(), prop::collection::vec(0u32..6, 4)), 1..40),
        threshold in 1u32..6,
    ) {
        let run = || {
            let mut r = Router::new(settings(4, threshold));
            reqs.iter().map(|(text, rnd, loads)| {
                let k = RequestKey::new(warmpath_core::BodyKind::Raw, None, None, text.clone());
                let l: Vec<EndpointLoad> = loads.iter().map(|&x| EndpointLoad::in_flight(x)).collect();
                let d = r.route(&PickInput { key: Some(&k), random: *rnd, ..PickInput::default() }, &l).unwrap();
                (d, l)
            }).collect::<Vec<_>>()
        };
        let a = run();
        let b = run();
        for ((da, l), (db, _)) in a.iter().zip(&b) {
            prop_assert_eq!(da, db);
            prop_assert!(da.endpoint < 4);
            prop_assert_eq!(&da.address, &format!("127.0.0.1:{}", 9000 + da.endpoint));
            // Whatever the reason; with every endpoint at the cap the cap cannot choose (any endpoint, any reason).
            if l.iter().any(|x| x.in_flight < threshold) {
                prop_assert!(l[da.endpoint].in_flight < threshold, "the threshold is a hard cap: {:?} {:?}", da, l);
            }
        }
    }

    #[test]
    fn same_text_same_endpoint_when_idle(texts in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 1..20)) {
        let mut r = Router::new(settings(5, 10));
        let keys: Vec<RequestKey> =
            texts.iter().map(|t| RequestKey::new(warmpath_core::BodyKind::Raw, None, None, t.clone())).collect();
        let first: Vec<usize> = keys.iter().map(|k| r.route_key(k, 1, &[]).unwrap().endpoint).collect();
        let again: Vec<usize> = keys.iter().map(|k| r.route_key(k, 2, &[]).unwrap().endpoint).collect();
        prop_assert_eq!(first, again);
    }

    #[test]
    fn rendezvous_moves_only_the_removed_endpoints_keys(key in any::<u64>(), n in 2usize..12, drop in 0usize..12) {
        let eps: Vec<Endpoint> = (0..n).map(|i| Endpoint::new(format!("10.1.0.{i}:80"), i as u32)).collect();
        let drop = drop % n;
        let top = hrw::top(key, &eps).unwrap();
        let mut fewer = eps.clone();
        fewer.remove(drop);
        let new_top = &fewer[hrw::top(key, &fewer).unwrap()];
        if drop == top {
            prop_assert_eq!(&new_top.address, &eps[hrw::order(key, &eps)[1]].address);
        } else {
            prop_assert_eq!(&new_top.address, &eps[top].address);
        }
    }

    #[test]
    fn growing_conversation_stays_on_its_first_endpoint(
        system in prop::option::of("[a-z ]{0,300}"),
        first in "[a-z ]{0,100}",
        turns in prop::collection::vec(("[a-z ]{0,200}", "[a-z ]{0,100}"), 1..6),
        block in prop::sample::select(vec![16usize, 32, 128]),
    ) {
        let mut s = settings(5, 1000);
        s.prefix_length = 8192;
        s.block_size = block;
        let mut r = Router::new(s);
        let mut msgs: Vec<(String, String)> = system.into_iter().map(|t| ("system".to_string(), t)).collect();
        msgs.push(("user".into(), first));
        let k = extract_key("/v1/chat/completions", &chat_body("m", &msgs), None, 8192).unwrap();
        let home = r.route_key(&k, 0, &[]).unwrap().endpoint;
        for (t, (reply, next)) in turns.into_iter().enumerate() {
            msgs.push(("assistant".into(), reply));
            msgs.push(("user".into(), next));
            let k = extract_key("/v1/chat/completions", &chat_body("m", &msgs), None, 8192).unwrap();
            let d = r.route_key(&k, t as u64 + 1, &[]).unwrap();
            prop_assert_eq!(d.endpoint, home, "turn {} left its endpoint: {:?}", t + 2, d);
            prop_assert_eq!(d.reason, Reason::PrefixMatch);
        }
    }
}
