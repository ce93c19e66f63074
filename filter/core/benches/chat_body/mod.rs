//! The chat bodies of the decision benchmarks (`benches/decision.rs` and `examples/decision_cost.rs`), and the
//! baseline they measure key extraction against.

use serde_json::{json, Value};

/// A chat body of about `size` bytes (the first message that reaches it ends it): a system prompt, then
/// user/assistant turns of 60 words each, the words numbered from `seed`.
pub fn body(size: usize, seed: u64) -> Vec<u8> {
    let mut msgs = vec![
        json!({"role": "system", "content": "You are a helpful assistant. Answer briefly and cite sources. ".repeat(8)}),
    ];
    let mut i = 0u64;
    while serde_json::to_vec(&json!({"model": "m", "messages": msgs})).unwrap().len() < size {
        let role = if i & 1 == 0 { "user" } else { "assistant" };
        let text: String = (0..60).map(|w| format!("w{}x{} ", (seed + i) * 7 + w, w % 13)).collect();
        msgs.push(json!({"role": role, "content": text}));
        i += 1;
    }
    serde_json::to_vec(&json!({"model": "m", "stream": true, "max_tokens": 256, "messages": msgs})).unwrap()
}

/// The baseline: the whole body parsed into a `serde_json::Value` DOM, then the text the core extracts built from
/// it (`role` U+001F `content` U+001E per message, cut at `limit` characters).
pub fn dom_extract(body: &[u8], limit: usize) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    let mut text = String::new();
    for m in v["messages"].as_array().unwrap() {
        text.push_str(m["role"].as_str().unwrap_or(""));
        text.push('\u{1f}');
        text.push_str(m["content"].as_str().unwrap_or(""));
        text.push('\u{1e}');
    }
    text.chars().take(limit).collect()
}
