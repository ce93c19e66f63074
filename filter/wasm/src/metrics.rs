//! The filter's proxy-wasm metrics. Envoy exports each one in `/stats` (and Prometheus) as
//! `wasmcustom.<name>`; every name below starts with `warmpath.`. A name defined by several VMs refers to one Envoy
//! stat, so counts add up across workers.
//!
//! Metric ids belong to the Envoy-side plugin instance, not to the wasm memory: after a reconfiguration, the old
//! and the new root context can share one VM while each has its own id table. So every root context owns its
//! [`Metrics`] (id cache and pending counts), hands it to its HTTP contexts, and flushes it on its own tick.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `warmpath.decisions.<strategy>.<reason>` | counter | picks by strategy (`random`, `least_outstanding_requests`, `prefix_aware`) and reason (`random`, `least_outstanding`, `prefix_match`, `consistent_pick`, `overflow`, `fail_open`) |
//! | `warmpath.fail_open.<cause>` | counter | requests routed by the fallback, by cause (see `FailOpen`) |
//! | `warmpath.spoofed_header_removed` | counter | client-sent destination headers removed |
//! | `warmpath.requests_skipped_other_cluster` | counter | requests left alone because their upstream cluster (`xds.cluster_name`) is not in this instance's `upstream_clusters` (or unknown) |
//! | `warmpath.matched_prefix.<bucket>` | counter | prefix-aware picks by matched prefix length (characters; bytes for raw bodies): `none`, `le_1k`, `le_4k`, `le_16k`, `gt_16k` |
//! | `warmpath.matched_prefix_chars_total` | counter | sum of matched prefix lengths, so the mean is total / matched picks |
//! | `warmpath.in_flight.<IP>_<port>` | gauge | the shared in-flight counter of each endpoint, refreshed every tick (written when it changed, [`EndpointGauges`]) |
//! | `warmpath.pending_prefill.<IP>_<port>` | gauge | this Envoy's pending prefill work on each endpoint (bytes), refreshed every tick like the in-flight gauge |
//! | `warmpath.remote_pending_prefill.<IP>_<port>` | gauge | with a feed: the other gateways' pending prefill work on each endpoint (bytes), as the feed last reported it |
//! | `warmpath.prefill_speed.<IP>_<port>` | gauge | PREFIX_AWARE: each endpoint's own prefill speed, learned like `warmpath.prefill.bytes_per_s` from the requests it served alone (bytes of prompt text per second); absent until its own samples give one (the pool's speed stands in for it meanwhile), 0 once the endpoint left the pool |
//! | `warmpath.endpoints` | gauge | endpoints the router currently picks from |
//! | `warmpath.prefill.bytes_per_s` | gauge | PREFIX_AWARE: the pool's prefill speed learned from this Envoy's requests (every worker's, one shared fit) that matched nothing in the index and found their endpoint with none of this Envoy's prefill work pending (bytes of prompt text per second; `warmpath_core::prefill_rate`); absent until 16 such requests of different sizes, and while the line does not explain them (`MAX_SLOPE_ERROR`) |
//! | `warmpath.prefill.overhead_us` | gauge | the same fit's time to first byte of a request with nothing to prefill (µs): the server's fixed cost plus the network and proxy path |
//! | `warmpath.prefill.slope_error_ppm` | gauge | the same fit's standard error of the slope relative to the slope, parts per million, once a line is fitted (16 such requests of different sizes), also while it is above the bound (`MAX_SLOPE_ERROR`, 100,000) and no speed is given: it says why |
//! | `warmpath.cas_failures` | counter | shared-table updates (in flight, pending prefill work and its moment) and prefill-speed samples the host kept refusing |
//! | `warmpath.feed.polls` | counter | feed requests sent (by the one VM holding the poller lease) |
//! | `warmpath.feed.failures.<cause>` | counter | failed polls: `dispatch` (call not sent), `unreachable` (no response), `status` (non-200, including Envoy's 503 for an unreachable feed), `invalid` (document refused), `index` (the index exchange with the other gateways failed: not sent, non-200, no cursor, malformed records) |
//! | `warmpath.feed.applied` | counter | snapshot applications (per VM) |
//! | `warmpath.feed.version` | gauge | version of the last applied snapshot |
//! | `warmpath.index_exchange.sent` | counter | index records appended to the log for the other VMs of this Envoy (one per request routed; `exchange`) |
//! | `warmpath.index_exchange.applied` | counter | index records of other VMs read from the log and applied |
//! | `warmpath.index_exchange.dropped` | counter | index records lost: malformed, overwritten in the log before this VM read them, refused by the host, or more than the feed takes in one report |
//! | `warmpath.index_exchange.reported` | counter | index records this Envoy reported to the feed for the other gateways (`feed`) |
//! | `warmpath.index_exchange.received` | counter | index records of other gateways received from the feed and applied |
//!
//! Per-request counters (decisions, matched prefix, skipped requests) are added up in the VM and handed to Envoy on the root
//! context's tick (every 200 ms; with a feed every 50 ms, or `feed.interval_ms` when shorter): one host call per metric per tick instead of per
//! request, at the price of stats lagging by up to one tick.

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use warmpath_core::{Reason, Strategy};

/// Gauge of the learned prefill speed, bytes per second (see the table above).
pub const PREFILL_BYTES_PER_S: &str = "warmpath.prefill.bytes_per_s";
/// Gauge of the learned fixed time to first byte, µs (see the table above).
pub const PREFILL_OVERHEAD_US: &str = "warmpath.prefill.overhead_us";
/// Gauge of the prefill-speed fit's relative slope error, parts per million (see the table above).
pub const PREFILL_SLOPE_ERROR_PPM: &str = "warmpath.prefill.slope_error_ppm";

/// Every strategy (decision counters are defined for all: the router in force decides which one applies).
const STRATEGIES: [Strategy; 3] = [Strategy::Random, Strategy::LeastOutstandingRequests, Strategy::PrefixAware];

/// Upper bounds (inclusive, characters) and names of the matched-prefix buckets; longer matches are `gt_16k`.
const MATCH_BUCKETS: [(usize, &str); 4] = [(0, "none"), (1024, "le_1k"), (4096, "le_4k"), (16384, "le_16k")];

/// The metrics of one root context (one plugin configuration in one VM).
pub struct Metrics {
    ids: RefCell<HashMap<String, u32>>,
    /// Counter increments not yet handed to Envoy, by metric id (flushed on the tick).
    pending: RefCell<HashMap<u32, u64>>,
    /// `warmpath.decisions.<strategy>.<reason>` by `STRATEGIES` then `Reason::ALL` position.
    by_reason: [[Option<u32>; Reason::ALL.len()]; STRATEGIES.len()],
    /// `warmpath.matched_prefix.<bucket>` for `MATCH_BUCKETS` plus the last bucket.
    matched: [Option<u32>; MATCH_BUCKETS.len() + 1],
    matched_total: Option<u32>,
    /// `warmpath.requests_skipped_other_cluster`.
    skipped: Option<u32>,
}

impl Metrics {
    /// Defines the per-request metrics up front, so a request costs no string formatting.
    pub fn new() -> Self {
        let mut m = Metrics {
            ids: RefCell::new(HashMap::new()),
            pending: RefCell::new(HashMap::new()),
            by_reason: [[None; Reason::ALL.len()]; STRATEGIES.len()],
            matched: [None; MATCH_BUCKETS.len() + 1],
            matched_total: None,
            skipped: None,
        };
        for (i, strategy) in STRATEGIES.iter().enumerate() {
            let s = strategy.as_str().to_ascii_lowercase();
            m.by_reason[i] =
                Reason::ALL.map(|r| m.id(MetricType::Counter, &format!("warmpath.decisions.{s}.{}", r.as_str())));
        }
        for (i, (_, name)) in MATCH_BUCKETS.iter().enumerate() {
            m.matched[i] = m.id(MetricType::Counter, &format!("warmpath.matched_prefix.{name}"));
        }
        m.matched[MATCH_BUCKETS.len()] = m.id(MetricType::Counter, "warmpath.matched_prefix.gt_16k");
        m.matched_total = m.id(MetricType::Counter, "warmpath.matched_prefix_chars_total");
        m.skipped = m.id(MetricType::Counter, "warmpath.requests_skipped_other_cluster");
        m
    }

    fn id(&self, kind: MetricType, name: &str) -> Option<u32> {
        if let Some(id) = self.ids.borrow().get(name) {
            return Some(*id);
        }
        let id = hostcalls::define_metric(kind, name).ok()?;
        self.ids.borrow_mut().insert(name.to_string(), id);
        Some(id)
    }

    fn add_later(&self, id: Option<u32>, n: u64) {
        if let Some(id) = id {
            *self.pending.borrow_mut().entry(id).or_insert(0) += n;
        }
    }

    /// Adds `n` to counter `name` now (rare events; host errors are ignored: metrics never fail a request).
    pub fn count(&self, name: &str, n: u64) {
        if let Some(id) = self.id(MetricType::Counter, name) {
            let _ = hostcalls::increment_metric(id, n as i64);
        }
    }

    /// Sets gauge `name` to `value`.
    pub fn gauge(&self, name: &str, value: u64) {
        if let Some(id) = self.id(MetricType::Gauge, name) {
            let _ = hostcalls::record_metric(id, value);
        }
    }

    /// `warmpath.fail_open.<cause>`.
    pub fn fail_open(&self, cause: &str) {
        self.count(&format!("warmpath.fail_open.{cause}"), 1);
    }

    /// Counts one decision of `strategy` with `reason`; for prefix-aware decisions also its matched prefix length
    /// (`matched_len`: characters, bytes for raw bodies). Batched until the next [`Metrics::flush`].
    pub fn decision(&self, strategy: Strategy, reason: Reason, matched_len: Option<usize>) {
        let s = STRATEGIES.iter().position(|x| *x == strategy).unwrap_or(0);
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.add_later(self.by_reason[s][i], 1);
        if let Some(len) = matched_len {
            let b = MATCH_BUCKETS.iter().position(|(max, _)| len <= *max).unwrap_or(MATCH_BUCKETS.len());
            self.add_later(self.matched[b], 1);
            if len > 0 {
                self.add_later(self.matched_total, len as u64);
            }
        }
    }

    /// Counts one request left alone for another upstream cluster (batched: on a shared listener this is as
    /// frequent as the other policies' requests).
    pub fn skipped_other_cluster(&self) {
        self.add_later(self.skipped, 1);
    }

    /// Hands the batched per-request counts to Envoy (called on every tick of the owning root context).
    pub fn flush(&self) {
        for (id, n) in self.pending.borrow_mut().iter_mut() {
            if *n > 0 {
                let _ = hostcalls::increment_metric(*id, *n as i64);
                *n = 0;
            }
        }
    }
}

/// The gauge name of an endpoint's in-flight counter: dots and colons become `_` so Envoy's stat name stays one
/// token (`127.0.0.1:8001` → `warmpath.in_flight.127_0_0_1_8001`).
pub fn in_flight_gauge_name(address: &str) -> String {
    endpoint_gauge_name("warmpath.in_flight.", address)
}

/// The gauge name of an endpoint's pending prefill work in bytes (`warmpath.pending_prefill.<endpoint>`, named
/// like [`in_flight_gauge_name`]).
pub fn pending_prefill_gauge_name(address: &str) -> String {
    endpoint_gauge_name("warmpath.pending_prefill.", address)
}

/// The gauge name of the other gateways' pending prefill work on an endpoint in bytes, as the feed last reported
/// it (`warmpath.remote_pending_prefill.<endpoint>`, named like [`in_flight_gauge_name`]).
pub fn remote_pending_prefill_gauge_name(address: &str) -> String {
    endpoint_gauge_name("warmpath.remote_pending_prefill.", address)
}

/// The gauge name of an endpoint's own prefill speed in bytes per second (`warmpath.prefill_speed.<endpoint>`,
/// named like [`in_flight_gauge_name`]).
pub fn prefill_speed_gauge_name(address: &str) -> String {
    endpoint_gauge_name("warmpath.prefill_speed.", address)
}

fn endpoint_gauge_name(prefix: &str, address: &str) -> String {
    format!("{prefix}{}", warmpath_core::endpoint::stat_token(address))
}

/// The gauges kept per endpoint, in the order of [`EndpointGauges::update`]'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointGauge {
    InFlight = 0,
    PendingPrefill = 1,
    RemotePendingPrefill = 2,
    PrefillSpeed = 3,
}

impl EndpointGauge {
    /// The gauge's name for `address`.
    pub fn name(self, address: &str) -> String {
        match self {
            EndpointGauge::InFlight => in_flight_gauge_name(address),
            EndpointGauge::PendingPrefill => pending_prefill_gauge_name(address),
            EndpointGauge::RemotePendingPrefill => remote_pending_prefill_gauge_name(address),
            EndpointGauge::PrefillSpeed => prefill_speed_gauge_name(address),
        }
    }
}

/// What one VM last wrote to the endpoint gauges of one plugin, so that a tick writes only the gauges whose value
/// changed. Every VM writes the same Envoy gauges from the same shared counts, so a value another VM wrote last is
/// corrected at that VM's next tick. Writing every gauge on every tick of every VM cost an idle Envoy about 5 % of
/// a core at 1,000 endpoints (BENCHMARKS.md §4).
#[derive(Debug, Default)]
pub struct EndpointGauges {
    last: HashMap<String, [u32; 4]>,
}

impl EndpointGauges {
    /// The gauge writes that bring the gauges to `current`: each endpoint's address with its in-flight count,
    /// pending prefill, the other gateways' pending prefill (written only when `remote` is true) and its own prefill
    /// speed (0 for none yet: written from its first speed on, so an endpoint that never learns one has no gauge).
    /// `left(address)` is `None` for an address that is still an endpoint, else its in-flight count: an address
    /// written before that is no longer an endpoint keeps its in-flight gauge following that count until it reads 0,
    /// then is forgotten (a gauge must not freeze at its last value); its speed gauge goes to 0 at once.
    pub fn update<'a>(
        &mut self,
        current: impl Iterator<Item = (&'a str, [u32; 4])>,
        remote: bool,
        left: impl Fn(&str) -> Option<u32>,
    ) -> Vec<(EndpointGauge, String, u32)> {
        use EndpointGauge::*;
        let mut writes = Vec::new();
        for (address, now) in current {
            let before = self.last.get(address).copied();
            if before == Some(now) {
                continue;
            }
            for g in [InFlight, PendingPrefill, RemotePendingPrefill, PrefillSpeed] {
                let k = g as usize;
                let changed = match before {
                    Some(b) => b[k] != now[k],
                    None => g != PrefillSpeed || now[k] != 0,
                };
                if changed && (remote || g != RemotePendingPrefill) {
                    writes.push((g, address.to_string(), now[k]));
                }
            }
            self.last.insert(address.to_string(), now);
        }
        self.last.retain(|address, last| {
            let Some(n) = left(address) else { return true };
            if n != last[0] {
                writes.push((InFlight, address.clone(), n));
                last[0] = n;
            }
            if last[3] != 0 {
                writes.push((PrefillSpeed, address.clone(), 0));
                last[3] = 0;
            }
            n > 0
        });
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_gauges_are_written_and_a_left_endpoint_follows_its_count_to_zero() {
        let mut book = EndpointGauges::default();
        let (a, b) = ("127.0.0.1:1", "127.0.0.1:2");
        let both_current = |_: &str| None;
        let w = book.update([(a, [1, 10, 0, 0]), (b, [0, 0, 0, 0])].into_iter(), false, both_current);
        assert_eq!(w.len(), 4, "the first tick writes every gauge: {w:?}");
        assert!(
            book.update([(a, [1, 10, 0, 0]), (b, [0, 0, 0, 0])].into_iter(), false, both_current).is_empty(),
            "nothing changed"
        );
        let w = book.update([(a, [0, 10, 0, 0]), (b, [0, 0, 0, 0])].into_iter(), false, both_current);
        assert_eq!(w, vec![(EndpointGauge::InFlight, a.to_string(), 0)], "only the changed gauge");
        let only_a = || [(a, [0, 10, 7, 0])].into_iter();
        let b_left_with = |n: u32| move |addr: &str| (addr == b).then_some(n);
        let w = book.update(only_a(), true, b_left_with(2));
        assert_eq!(
            w,
            vec![(EndpointGauge::RemotePendingPrefill, a.to_string(), 7), (EndpointGauge::InFlight, b.to_string(), 2)],
            "a's remote gauge is new; b left with 2 requests still in flight"
        );
        assert!(book.update(only_a(), true, b_left_with(2)).is_empty(), "b's count did not change");
        assert_eq!(book.update(only_a(), true, b_left_with(0)), vec![(EndpointGauge::InFlight, b.to_string(), 0)]);
        assert!(book.update(only_a(), true, b_left_with(5)).is_empty(), "b read 0 once and was forgotten");
    }

    #[test]
    fn a_speed_gauge_appears_with_the_first_speed_and_reads_0_once_its_endpoint_left() {
        let mut book = EndpointGauges::default();
        let (a, b) = ("127.0.0.1:1", "127.0.0.1:2");
        let current = |_: &str| None;
        let w = book.update([(a, [0, 0, 0, 0]), (b, [0, 0, 0, 0])].into_iter(), false, current);
        assert!(w.iter().all(|(g, _, _)| *g != EndpointGauge::PrefillSpeed), "no speed, no gauge: {w:?}");
        let w = book.update([(a, [0, 0, 0, 50_000]), (b, [0, 0, 0, 0])].into_iter(), false, current);
        assert_eq!(w, vec![(EndpointGauge::PrefillSpeed, a.to_string(), 50_000)]);
        let w = book.update([(b, [0, 0, 0, 0])].into_iter(), false, |addr: &str| (addr == a).then_some(0));
        assert_eq!(w, vec![(EndpointGauge::PrefillSpeed, a.to_string(), 0)], "a left: its speed is no longer known");
    }

    #[test]
    fn gauge_names_are_single_tokens() {
        assert_eq!(in_flight_gauge_name("127.0.0.1:8001"), "warmpath.in_flight.127_0_0_1_8001");
        assert_eq!(in_flight_gauge_name("[::1]:80"), "warmpath.in_flight.___1__80");
        assert_eq!(pending_prefill_gauge_name("127.0.0.1:8001"), "warmpath.pending_prefill.127_0_0_1_8001");
        assert_eq!(prefill_speed_gauge_name("127.0.0.1:8001"), "warmpath.prefill_speed.127_0_0_1_8001");
    }
}
