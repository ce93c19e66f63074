//! Fixed-iteration driver for counting CPU work per request with `perf stat` (instructions and cycles are
//! counted per process, so they hold up on a busy shared machine where criterion's wall-clock times do not).
//!
//! `cargo run --release -p warmpath-core --example decision_cost -- STAGE SIZE_KB ITERATIONS`
//! with STAGE one of `dom` (serde_json::Value baseline), `extract`, `extract_hash`, `decision`,
//! `decision_lor` (LEAST_OUTSTANDING_REQUESTS); run once with ITERATIONS 0 to measure the setup and subtract.
//! `scripts/bench-core.sh` (in docs/bench/core.md) runs the whole table.

use std::hint::black_box;

use warmpath_core::{extract_key, EndpointLoad, PrefixHashes, Router, Settings, Strategy};

#[path = "../benches/chat_body/mod.rs"]
mod chat_body;
use chat_body::{body, dom_extract};

const CHAT: &str = "/v1/chat/completions";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let stage = args.get(1).map(String::as_str).unwrap_or("decision");
    let size = args.get(2).and_then(|s| s.parse::<usize>().ok()).unwrap_or(4) * 1024;
    let iters = args.get(3).and_then(|s| s.parse::<usize>().ok()).unwrap_or(10_000);
    let s = Settings { endpoints: (0..8).map(|i| format!("10.0.0.{i}:8000")).collect(), ..Settings::default() };
    let bodies: Vec<Vec<u8>> = (0..256).map(|i| body(size, 1000 + i * 97)).collect();
    let loads = vec![EndpointLoad::in_flight(2); 8];
    let strategy = if stage == "decision_lor" { Strategy::LeastOutstandingRequests } else { Strategy::PrefixAware };
    let mut r = Router::new(Settings { strategy, ..s.clone() });
    for b in &bodies {
        let k = extract_key(CHAT, b, None, s.prefix_length).unwrap();
        r.route_key(&k, 0, &loads);
    }
    for n in 0..iters {
        let b = &bodies[n % bodies.len()];
        match stage {
            "dom" => {
                black_box(dom_extract(black_box(b), s.prefix_length));
            }
            "extract" => {
                black_box(extract_key(CHAT, black_box(b), None, s.prefix_length).unwrap());
            }
            "extract_hash" => {
                let k = extract_key(CHAT, black_box(b), None, s.prefix_length).unwrap();
                black_box(PrefixHashes::compute(k.namespace, &k.text, s.block_size));
            }
            _ => {
                let k = extract_key(CHAT, black_box(b), None, s.prefix_length).unwrap();
                black_box(r.route_key(&k, n as u64, &loads));
            }
        }
    }
    eprintln!("{stage} {}KB x{iters}: body {} bytes", size / 1024, bodies[0].len());
}
