//! The filter's proxy-wasm metrics. Envoy exports each one in `/stats` (and Prometheus) as
//! `wasmcustom.<name>`; every name below starts with `warmpath.`. Metrics are defined lazily by name and cached per
//! VM; a name defined by several VMs refers to one Envoy stat, so counts add up across workers.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `warmpath.decisions.<strategy>.<reason>` | counter | picks by strategy (`random`, `least_outstanding_requests`, `prefix_aware`) and reason (`random`, `least_outstanding`, `prefix_match`, `consistent_pick`, `overflow`, `fail_open`) |
//! | `warmpath.fail_open.<cause>` | counter | requests routed by the fallback, by cause (see `FailOpen`) |
//! | `warmpath.spoofed_header_removed` | counter | client-sent destination headers removed |
//! | `warmpath.matched_prefix.<bucket>` | counter | prefix-aware picks by matched prefix length (characters; bytes for raw bodies): `none`, `le_1k`, `le_4k`, `le_16k`, `gt_16k` |
//! | `warmpath.matched_prefix_chars_total` | counter | sum of matched prefix lengths, so the mean is total / matched picks |
//! | `warmpath.in_flight.<IP>_<port>` | gauge | the shared in-flight counter of each endpoint, refreshed every tick |
//! | `warmpath.endpoints` | gauge | endpoints the router currently picks from |
//! | `warmpath.cas_failures` | counter | in-flight updates the host kept refusing |
//! | `warmpath.feed.polls` | counter | feed requests sent (by the one VM holding the poller lease) |
//! | `warmpath.feed.failures.<cause>` | counter | failed polls: `dispatch` (call not sent), `unreachable` (no response), `status` (non-200, including Envoy's 503 for an unreachable feed), `invalid` (document refused) |
//! | `warmpath.feed.applied` | counter | snapshot applications (per VM) |
//! | `warmpath.feed.version` | gauge | version of the last applied snapshot |
//!
//! Per-request counters (decisions, matched prefix) are added up in the VM and handed to Envoy on the root
//! context's tick (every `feed.interval_ms`, else 500 ms): one host call per metric per tick instead of per
//! request, at the price of stats lagging by up to one tick.

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use warmpath_core::{Reason, Strategy};

thread_local! {
    // One VM = one thread; the cache is per VM.
    static IDS: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
    // Counter increments not yet handed to Envoy, by metric id (flushed on the tick).
    static PENDING: RefCell<HashMap<u32, u64>> = RefCell::new(HashMap::new());
}

fn add_later(id: u32, n: u64) {
    PENDING.with(|p| *p.borrow_mut().entry(id).or_insert(0) += n);
}

/// Hands the batched per-request counts to Envoy (called on every tick).
pub fn flush() {
    PENDING.with(|p| {
        for (id, n) in p.borrow_mut().iter_mut() {
            if *n > 0 {
                let _ = hostcalls::increment_metric(*id, *n as i64);
                *n = 0;
            }
        }
    });
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
    /// `warmpath.matched_prefix.<bucket>` for [`MATCH_BUCKETS`] plus the last bucket.
    matched: [Option<u32>; MATCH_BUCKETS.len() + 1],
    matched_total: Option<u32>,
}

/// Upper bounds (inclusive, characters) and names of the matched-prefix buckets; longer matches are `gt_16k`.
const MATCH_BUCKETS: [(usize, &str); 4] = [(0, "none"), (1024, "le_1k"), (4096, "le_4k"), (16384, "le_16k")];

impl DecisionMetrics {
    /// Defines `warmpath.decisions.<strategy>.<reason>` for every reason, and the matched-length histogram.
    pub fn new(strategy: Strategy) -> Self {
        let s = strategy.as_str().to_ascii_lowercase();
        let by_reason = Reason::ALL.map(|r| id(MetricType::Counter, &format!("warmpath.decisions.{s}.{}", r.as_str())));
        let mut matched = [None; MATCH_BUCKETS.len() + 1];
        for (i, (_, name)) in MATCH_BUCKETS.iter().enumerate() {
            matched[i] = id(MetricType::Counter, &format!("warmpath.matched_prefix.{name}"));
        }
        matched[MATCH_BUCKETS.len()] = id(MetricType::Counter, "warmpath.matched_prefix.gt_16k");
        DecisionMetrics { by_reason, matched, matched_total: id(MetricType::Counter, "warmpath.matched_prefix_chars_total") }
    }

    /// Counts one decision with `reason`; for prefix-aware strategies also its matched prefix length
    /// (`matched_len`: characters, bytes for raw bodies). Batched until the next [`flush`].
    pub fn record(&self, reason: Reason, matched_len: Option<usize>) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        if let Some(id) = self.by_reason[i] {
            add_later(id, 1);
        }
        if let Some(len) = matched_len {
            let b = MATCH_BUCKETS.iter().position(|(max, _)| len <= *max).unwrap_or(MATCH_BUCKETS.len());
            if let Some(id) = self.matched[b] {
                add_later(id, 1);
            }
            if let (Some(id), true) = (self.matched_total, len > 0) {
                add_later(id, len as u64);
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
