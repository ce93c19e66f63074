//! Index exchange between routers serving the same traffic (the workers of one Envoy): a router that applied
//! another's records routes as if it had seen those requests itself.

use warmpath_core::{extract_key, EndpointLoad, Reason, Router, Settings, Strategy};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn settings(block_size: usize) -> Settings {
    Settings {
        strategy: Strategy::PrefixAware,
        block_size,
        endpoints: (0..8).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect(),
        ..Settings::default()
    }
}

/// The body of turn `turns` of conversation `conv` (every turn repeats the earlier ones, as chat clients do).
fn turn(conv: usize, turns: usize) -> Vec<u8> {
    let mut msgs = vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    for t in 0..turns {
        msgs.push(serde_json::json!({"role": "user", "content": format!("conversation {conv} question {t} {}", "words ".repeat(40))}));
        msgs.push(
            serde_json::json!({"role": "assistant", "content": format!("answer {t} of {conv} {}", "more ".repeat(30))}),
        );
    }
    msgs.push(serde_json::json!({"role": "user", "content": format!("conversation {conv} next question")}));
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": msgs})).unwrap()
}

/// Routes `body` on `router` under `loads` (a holder with a little prefill waiting keeps a request only when the
/// router knows it holds the request's prefix; a miss is placed away from it by load).
fn route(router: &mut Router, body: &[u8], loads: &[EndpointLoad]) -> (usize, Reason) {
    let key = extract_key("/v1/chat/completions", body, None, router.settings().prefix_length).unwrap();
    let d = router.route_key(&key, 7, loads).expect("endpoints");
    (d.endpoint, d.reason)
}

#[test]
fn a_conversation_alternating_between_routers_stays_on_one_endpoint_once_they_exchange() {
    // Two workers; turn k goes to worker k % 2, each turn's record is applied by the other worker before its pick.
    let mut workers = [Router::new(settings(128)), Router::new(settings(128))];
    let mut loads = vec![EndpointLoad::default(); 8];
    let mut home = None;
    for t in 1..=6 {
        let w = t % 2;
        let (i, reason) = route(&mut workers[w], &turn(1, t), &loads);
        if let Some(h) = home {
            assert_eq!(i, h, "turn {t} left the conversation's endpoint");
            assert_eq!(reason, Reason::PrefixMatch, "turn {t}");
        }
        home = Some(i);
        let rec = workers[w].take_index_record().expect("PREFIX_AWARE records the chain");
        assert!(workers[w].take_index_record().is_none(), "a record is handed out once");
        assert_eq!(workers[1 - w].learn(&rec), Ok(1));
        // The endpoint now has work queued: without the record the other worker would place the next turn by load
        // elsewhere.
        loads[i].pending_prefill = 100;
    }
}

#[test]
fn without_exchange_the_other_router_sees_a_miss() {
    let mut a = Router::new(settings(128));
    let mut b = Router::new(settings(128));
    let mut loads = vec![EndpointLoad::default(); 8];
    let (i, _) = route(&mut a, &turn(2, 1), &loads);
    loads[i].pending_prefill = 100;
    let (j, reason) = route(&mut b, &turn(2, 2), &loads);
    assert_ne!(reason, Reason::PrefixMatch);
    assert_ne!(j, i, "placed by load, away from the busy holder it does not know");
}

#[test]
fn records_for_another_block_size_or_unknown_endpoint_are_skipped() {
    let mut a = Router::new(settings(128));
    let loads = vec![EndpointLoad::default(); 8];
    route(&mut a, &turn(3, 2), &loads);
    let rec = a.take_index_record().expect("record");
    let mut other_block = Router::new(settings(64));
    assert_eq!(other_block.learn(&rec), Ok(0));
    let mut fewer = Router::new(Settings { endpoints: vec!["10.9.9.9:1".into()], ..settings(128) });
    assert_eq!(fewer.learn(&rec), Ok(0));
    assert!(Router::new(settings(128)).learn(&rec[..rec.len() - 1]).is_err(), "truncated record");
    // Strategies without an index hand out nothing.
    let mut lor = Router::new(Settings { strategy: Strategy::LeastOutstandingRequests, ..settings(128) });
    route(&mut lor, &turn(3, 2), &loads);
    assert!(lor.take_index_record().is_none());
}
