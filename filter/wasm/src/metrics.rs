//! The filter's proxy-wasm metrics. Envoy exports each one in `/stats` (and Prometheus) as
//! `wasmcustom.<name>`; every name below starts with `warmpath.`. Metrics are defined lazily by name and cached per
//! VM; a name defined by several VMs refers to one Envoy stat, so counts add up across workers.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `warmpath.requests` | counter | requests seen by the filter |
//! | `warmpath.decisions.<strategy>.<reason>` | counter | picks by strategy (`random`, `least_outstanding_requests`, `prefix_aware`) and reason (`random`, `least_outstanding`, `prefix_match`, `consistent_pick`, `overflow`, `fail_open`) |
//! | `warmpath.fail_open.<cause>` | counter | requests routed by the fallback, by cause (see `FailOpen`) |
//! | `warmpath.spoofed_header_removed` | counter | client-sent destination headers removed |
//! | `warmpath.matched_prefix_chars` | histogram | matched prefix length (characters; bytes for raw bodies) of prefix-aware picks |
//! | `warmpath.matched_prefix_chars_total` | counter | sum of the same, so a mean is `total / decisions.prefix_aware.*` |
//! | `warmpath.in_flight.<IP>_<port>` | gauge | the shared in-flight counter of each endpoint, refreshed every tick |
//! | `warmpath.endpoints` | gauge | endpoints the router currently picks from |
//! | `warmpath.cas_failures` | counter | in-flight updates the host kept refusing |
//! | `warmpath.feed.*` | counters/gauge | feed polls, failures by cause, applied snapshots, snapshot version |

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

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

/// Records `value` in histogram `name`.
pub fn histogram(name: &str, value: u64) {
    if let Some(id) = id(MetricType::Histogram, name) {
        let _ = hostcalls::record_metric(id, value);
    }
}

/// `warmpath.decisions.<strategy>.<reason>`; both labels are lower-cased.
pub fn decision(strategy: &str, reason: &str) {
    count(&format!("warmpath.decisions.{}.{}", strategy.to_ascii_lowercase(), reason.to_ascii_lowercase()), 1);
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
