//! The filter's proxy-wasm metrics. Envoy exports each one in `/stats` (and Prometheus) as
//! `wasmcustom.<name>`; every name below starts with `warmpath.`. Metrics are defined lazily by name and cached per
//! VM; a name defined by several VMs refers to one Envoy stat, so counts add up across workers.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `warmpath.decisions.<strategy>.<reason>` | counter | picks by strategy (`random`, `least_outstanding_requests`, `prefix_aware`) and reason (`random`, `least_outstanding`, `prefix_match`, `consistent_pick`, `overflow`, `fail_open`) |
//! | `warmpath.fail_open.<cause>` | counter | requests routed by the fallback, by cause (see `FailOpen`) |
//! | `warmpath.spoofed_header_removed` | counter | client-sent destination headers removed |
//! | `warmpath.matched_prefix_chars` | histogram | matched prefix length (characters; bytes for raw bodies) of prefix-aware picks |
//! | `warmpath.in_flight.<IP>_<port>` | gauge | the shared in-flight counter of each endpoint, refreshed every tick |
//! | `warmpath.endpoints` | gauge | endpoints the router currently picks from |
//! | `warmpath.cas_failures` | counter | in-flight updates the host kept refusing |
//! | `warmpath.feed.*` | counters/gauge | feed polls, failures by cause, applied snapshots, snapshot version |

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use warmpath_core::{Reason, Strategy};

thread_local! {
    // One VM = one thread; the cache is per VM.
    static IDS: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
}

fn id(kind: MetricType, name: &str) -> Option<u32> {
    IDS.with(|ids| {
        let mut ids = ids.borrow_mut();
        if let Some(id) = ids.get(name) {
            return Some(*id);
        }
        let id = hostcalls::define_metric(kind, name).ok()?;
        ids.insert(name.to_string(), id);
        Some(id)
    })
}

/// Adds `n` to counter `name` (host errors are ignored: metrics never fail a request).
pub fn count(name: &str, n: u64) {
    if let Some(id) = id(MetricType::Counter, name) {
        let _ = hostcalls::increment_metric(id, n as i64);
    }
}

/// Sets gauge `name` to `value`.
pub fn gauge(name: &str, value: u64) {
    if let Some(id) = id(MetricType::Gauge, name) {
        let _ = hostcalls::record_metric(id, value);
    }
}

/// The per-request metrics of one strategy, defined once at configure time so a request costs one host call per
/// metric and no string formatting.
pub struct DecisionMetrics {
    by_reason: [Option<u32>; Reason::ALL.len()],
    matched: Option<u32>,
}

impl DecisionMetrics {
    /// Defines `warmpath.decisions.<strategy>.<reason>` for every reason, and the matched-length histogram.
    pub fn new(strategy: Strategy) -> Self {
        let s = strategy.as_str().to_ascii_lowercase();
        let by_reason = Reason::ALL.map(|r| id(MetricType::Counter, &format!("warmpath.decisions.{s}.{}", r.as_str())));
        DecisionMetrics { by_reason, matched: id(MetricType::Histogram, "warmpath.matched_prefix_chars") }
    }

    /// Counts one decision with `reason`; records `matched_len` (characters, bytes for raw bodies) when non-zero.
    pub fn record(&self, reason: Reason, matched_len: usize) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        if let Some(id) = self.by_reason[i] {
            let _ = hostcalls::increment_metric(id, 1);
        }
        if matched_len > 0 {
            if let Some(id) = self.matched {
                let _ = hostcalls::record_metric(id, matched_len as u64);
            }
        }
    }
}

/// `warmpath.fail_open.<cause>`.
pub fn fail_open(cause: &str) {
    count(&format!("warmpath.fail_open.{cause}"), 1);
}

/// The gauge name of an endpoint's in-flight counter: dots and colons become `_` so Envoy's stat name stays one
/// token (`127.0.0.1:8001` → `warmpath.in_flight.127_0_0_1_8001`).
pub fn in_flight_gauge_name(address: &str) -> String {
    let mut s = String::from("warmpath.in_flight.");
    s.extend(address.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauge_names_are_single_tokens() {
        assert_eq!(in_flight_gauge_name("127.0.0.1:8001"), "warmpath.in_flight.127_0_0_1_8001");
        assert_eq!(in_flight_gauge_name("[::1]:80"), "warmpath.in_flight.___1__80");
    }
}
