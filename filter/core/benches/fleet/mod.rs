//! The fleets of the endpoint-count benchmarks (`benches/decision.rs`, `endpoints/*`, and
//! `examples/endpoint_cost.rs`): N endpoints whose loads differ, the 4 KB conversation keys routed to them, and
//! prefill fits that tell every fourth endpoint apart as twice as slow.

use warmpath_core::prefill_rate::PrefillFits;
use warmpath_core::{extract_key, EndpointLoad, RequestKey, Router, Settings};

use super::chat_body::body;

/// `n` conversations' keys (4 KB chat bodies): the stream a warmed router sees, one key per conversation.
pub fn keys(n: u64) -> Vec<RequestKey> {
    (0..n).map(|i| extract_key("/v1/chat/completions", &body(4 * 1024, 1000 + i * 97), None, 8192).unwrap()).collect()
}

/// A PREFIX_AWARE router over `n` endpoints at the default settings, and loads that differ per endpoint (in
/// flight 0–6, pending prefill 0–20,000 bytes spread over the list), so candidates are scored, not just the top
/// taken.
pub fn fleet(n: usize) -> (Router, Vec<EndpointLoad>) {
    let s = Settings {
        endpoints: (0..n).map(|i| format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256)).collect(),
        ..Settings::default()
    };
    let loads = (0..n)
        .map(|i| EndpointLoad {
            in_flight: (i % 7) as u32,
            pending_prefill: ((i * 7919) % 20_000) as u32,
            server: None,
        })
        .collect();
    (Router::new(s), loads)
}

/// Prefill fits in which every fourth of `endpoints` serves at 100 bytes per ms and the others at 200 (40 requests
/// of varied sizes each).
pub fn fits_with_slow_quarter(endpoints: &[String]) -> PrefillFits {
    let mut fits = PrefillFits::default();
    for (i, a) in endpoints.iter().enumerate() {
        let speed = if i % 4 == 0 { 100 } else { 200 };
        for j in 0..40u32 {
            let bytes = 2_000 + (j * 7_919) % 40_000;
            fits.observe(a, bytes, 2 + u64::from(bytes / speed), |_| true);
        }
    }
    fits
}
