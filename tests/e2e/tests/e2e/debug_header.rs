//! The debug header (`debug_header: true`) tells a client only what its own request and the operator's
//! configuration decide — the strategy, and why its own request could not be keyed — never the backend, the matched
//! prefix length, the decision reason or load, which would tell it what other clients sent. The operator still sees
//! the whole decision: the filter writes it to Envoy's filter state, which the rig's Envoy copies into
//! `x-rig-decision` (an access log reads it the same way).

use serde_json::json;

use crate::common::{prompt, Rig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_header_does_not_tell_a_client_what_other_clients_sent() {
    let rig = Rig::start(3, json!({"strategy": "PREFIX_AWARE", "debug_header": true})).await;
    // One client sends a prompt with a secret in it, a few times (each of Envoy's workers has its own index).
    let secret = prompt("account PIN 4711", 2500);
    for _ in 0..4 {
        let r = rig.chat(&secret).await;
        assert_eq!((r.status, r.debug.as_str()), (200, "PREFIX_AWARE"), "{r:?}");
    }
    // Another client guesses: the right prefix and a wrong one, each with its own question after it.
    let mut right = Vec::new();
    let mut wrong = Vec::new();
    for i in 0..6 {
        right.push(rig.chat(&format!("{secret} question {i}")).await);
        wrong.push(rig.chat(&format!("{} question {i}", prompt("account PIN 1234", 2500))).await);
    }
    // The operator's record shows the right guess matched what the first client sent...
    assert!(
        right.iter().any(|r| r.reason() == "prefix_match" && !r.decision.ends_with(";matched=0")),
        "no right guess matched the first client's prefix: {right:?}"
    );
    // ...and the guessing client cannot tell the right guess from the wrong one: the same header, naming no
    // backend, reason or matched length.
    for r in right.iter().chain(&wrong) {
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.debug, "PREFIX_AWARE", "{r:?}");
    }
    // A request the filter could not key says why (its own body), still nothing else.
    let bad = rig.post("/v1/chat/completions", b"{not json".to_vec(), &[]).await;
    assert_eq!((bad.status, bad.debug.as_str()), (200, "PREFIX_AWARE;fail_open=malformed_json"), "{bad:?}");
    assert!(bad.decision.contains(";fail_open;"), "the operator's record names the reason: {bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_debug_header_the_response_carries_no_decision_from_the_filter() {
    let rig = Rig::start(3, json!({"strategy": "RANDOM"})).await;
    for i in 0..5 {
        let r = rig.chat(&format!("hello {i}")).await;
        assert_eq!((r.status, r.debug.as_str()), (200, ""), "{r:?}");
        // The operator's record is there (filter state, copied by the rig's Envoy) and names the backend that
        // answered.
        assert_eq!(r.decision, format!("{};random;matched=0", r.upstream), "{r:?}");
    }
}
