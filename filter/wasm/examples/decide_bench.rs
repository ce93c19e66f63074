//! Benchmark (not a test): the cost of the filter's per-request core work — key extraction and the routing
//! decision — for 4 KB and 64 KB chat bodies, natively or inside a wasm engine.
//!
//! The same code runs where the filter runs, so the wasm build under Node (V8, the engine Envoy uses) shows what
//! the filter pays per request inside Envoy, without Envoy's own noise:
//!
//! ```text
//! cargo run -p warmpath-filter --example decide_bench --release                       # native
//! cargo build -p warmpath-filter --example decide_bench --target wasm32-wasip1 --release
//! node filter/wasm/examples/run-wasi.mjs $CARGO_TARGET_DIR/wasm32-wasip1/release/examples/decide_bench.wasm
//! ```
//! Each line: operation, body size, mean µs per request (best of 7 bounded rounds).

use std::time::Instant;

use warmpath_core::{extract_key, EndpointLoad, PickInput, Router, Settings};

/// `n` distinct chat bodies of about `size` bytes: a long system prompt unique per body, then a short user turn.
fn bodies(n: usize, size: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut text = format!("You are assistant number {i}. ");
            while text.len() + 64 < size {
                text.push_str(&format!("Context line {} for prompt {i} with some words. ", text.len()));
            }
            serde_json::json!({"model": "bench", "messages": [
                {"role": "system", "content": text}, {"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes()
        })
        .collect()
}

fn settings(strategy: &str) -> Settings {
    let cfg = format!(
        r#"{{"strategy":"{strategy}","endpoints":["10.0.0.1:8000","10.0.0.2:8000","10.0.0.3:8000","10.0.0.4:8000"]}}"#
    );
    match Settings::from_json(cfg.as_bytes()) {
        Ok(s) => s,
        Err(e) => panic!("benchmark config: {e}"),
    }
}

/// Mean µs per call of `f`, the best of `ROUNDS` timed rounds of `iters` calls after a warm-up round (wall clock;
/// the best round is the one least disturbed by other processes and by the engine's background compilation).
fn time(label: &str, size: usize, iters: usize, mut f: impl FnMut(usize)) {
    const ROUNDS: usize = 7;
    for i in 0..iters {
        f(i); // warm-up: lets the wasm engine tier up to optimised code
    }
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for i in 0..iters {
            f(i);
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    println!("{label:<34} {:>3} KB  {best:>8.2} µs", size / 1024);
}

fn main() {
    let loads = vec![EndpointLoad::default(); 4];
    for (size, iters) in [(4096usize, 20_000usize), (65_536, 2_000)] {
        let bodies = bodies(256, size);
        let s = settings("PREFIX_AWARE");
        time("extract_key", size, iters, |i| {
            let k = extract_key("/v1/chat/completions", &bodies[i % 256], None, s.prefix_length);
            std::hint::black_box(&k);
        });
        let mut router = Router::new(s.clone());
        time("extract_key + route (PREFIX_AWARE)", size, iters, |i| {
            if let Ok(k) = extract_key("/v1/chat/completions", &bodies[i % 256], None, s.prefix_length) {
                let d = router.route(&PickInput { key: Some(&k), random: i as u64, ..PickInput::default() }, &loads);
                std::hint::black_box(&d);
            }
        });
    }
}
