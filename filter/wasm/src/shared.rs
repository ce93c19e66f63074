//! State shared by every VM (each Envoy worker's and the two that route nothing) through proxy-wasm shared data:
//! three tables per endpoint ([`Counter`]: requests in flight, pending prefill work in bytes of prompt text, and when
//! that work was last known exactly), the other gateways' pending prefill work as the feed reported it
//! ([`store_remote`], written only by the feed poller), the feed poller's lease ([`take_lease`],
//! [`release_lease`]) and each plugin's prefill-speed fit ([`add_prefill_sample`]). This is the only
//! compare-and-swap code in the filter.
//!
//! Each table lives under one key (`warmpath.in_flight`, `warmpath.pending_prefill`, `warmpath.pending_since`) as a
//! small table of entries
//! (`warmpath_core::exchange::push_count`'s layout, which the gateway leg of the index exchange also carries, see
//! `feed`), so a request costs one read (loads of every endpoint, plus
//! the CAS token) and one write to take its slot, and one read + one write to release it — independent of the
//! number of endpoints. Entries whose count drops to 0 are pruned on the next write, which bounds the table by the
//! endpoints that have requests in flight.
//!
//! A write carries the CAS token of the read it was computed from; a mismatch (another worker wrote in between)
//! re-reads and retries. Decrements saturate at 0.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use warmpath_core::exchange::{counts, push_count};
use warmpath_core::prefill_rate::PrefillRate;
use warmpath_core::Router;

/// A per-endpoint counter shared by every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Requests sent to the endpoint that have not ended.
    InFlight,
    /// Bytes of prompt text sent to the endpoint whose first response byte has not arrived
    /// (`warmpath_core::EndpointLoad::pending_prefill`).
    PendingPrefill,
    /// When the endpoint's pending prefill work was last known exactly: work arrived with none pending, or a request
    /// there got its first byte or ended. Milliseconds of the host clock, low 32 bits ([`clock32`]), compared with a
    /// wrapping difference. Written with [`mark`], read by [`Table::elapsed_per_endpoint`]; an entry means something
    /// only while the endpoint has work pending.
    PendingSince,
}

impl Counter {
    fn key(self) -> &'static str {
        match self {
            Counter::InFlight => "warmpath.in_flight",
            Counter::PendingPrefill => "warmpath.pending_prefill",
            Counter::PendingSince => "warmpath.pending_since",
        }
    }
}
/// Attempts before an update gives up (counted as a CAS failure by the caller); contention is between a few worker
/// threads, so a handful of retries always suffices in practice.
const MAX_CAS_ATTEMPTS: usize = 64;

/// One read of a counter table.
pub struct Table {
    /// The counter read (`None`: a table of the other gateways' pending work, read only, see [`Table::read_remote`]).
    counter: Option<Counter>,
    bytes: Vec<u8>,
    cas: Option<u32>,
}

impl Table {
    /// Reads the in-flight table (empty on a missing key or a host error).
    pub fn read() -> Table {
        Table::read_of(Counter::InFlight)
    }

    /// Reads the table of `counter` (empty on a missing key or a host error).
    pub fn read_of(counter: Counter) -> Table {
        match hostcalls::get_shared_data(counter.key()) {
            Ok((bytes, cas)) => Table { counter: Some(counter), bytes: bytes.unwrap_or_default(), cas },
            Err(_) => Table { counter: Some(counter), bytes: Vec::new(), cas: None },
        }
    }

    /// Reads the other gateways' pending prefill work stored under `key` by [`store_remote`]; empty when missing or
    /// written more than `max_age_ms` before `now_ms` (the feed stopped answering: the work it said has long been
    /// served).
    pub fn read_remote(key: &str, now_ms: u64, max_age_ms: u64) -> Table {
        let bytes = match hostcalls::get_shared_data(key) {
            Ok((Some(b), _)) if b.len() >= 8 => {
                let at = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                if now_ms.saturating_sub(at) <= max_age_ms {
                    b[8..].to_vec()
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        Table { counter: None, bytes, cas: None }
    }

    /// The table's bytes (entries as `warmpath_core::exchange::push_count` writes them).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Entries `(address, count)` in table order; stops at the first malformed entry.
    fn entries(&self) -> impl Iterator<Item = (&[u8], u32)> + '_ {
        counts(&self.bytes)
    }

    /// In-flight count of `address` (0 when absent).
    pub fn get(&self, address: &str) -> u32 {
        self.entries().find(|(a, _)| *a == address.as_bytes()).map(|(_, c)| c).unwrap_or(0)
    }

    /// The count of each of `router`'s endpoints, by position (0 when absent). One hash lookup per entry of the
    /// table (the endpoints with work outstanding), not a scan of the table per endpoint: at 1,000 endpoints the
    /// scans cost more Envoy CPU per request than the rest of the decision.
    pub fn per_endpoint(&self, router: &Router) -> Vec<u32> {
        let mut out = vec![0u32; router.endpoints().len()];
        self.by_position(router, |i, c| out[i] = out[i].saturating_add(c));
        out
    }

    /// Calls `f(position, value)` for each entry whose address is one of `router`'s endpoints, in table order.
    fn by_position(&self, router: &Router, mut f: impl FnMut(usize, u32)) {
        for (a, c) in self.entries() {
            if let Some(i) = std::str::from_utf8(a).ok().and_then(|a| router.position(a)) {
                f(i, c);
            }
        }
    }

    /// Milliseconds from each of `router`'s endpoints' [`Counter::PendingSince`] entry to `now_ms`, by position
    /// (`None` without an entry). The table must be the `PendingSince` one. An entry ahead of `now_ms` (another
    /// worker wrote a later millisecond after this one read its clock, or the host's wall clock stepped back) is 0 ms
    /// old, not 49 days.
    pub fn elapsed_per_endpoint(&self, router: &Router, now_ms: u64) -> Vec<Option<u64>> {
        let mut out = vec![None; router.endpoints().len()];
        self.by_position(router, |i, since| {
            let ms = clock32(now_ms).wrapping_sub(since);
            out[i] = Some(if ms > u32::MAX / 2 { 0 } else { u64::from(ms) });
        });
        out
    }

    /// The table with `address`'s entry set to `value` and the other entries kept where `keep` says so; `None` for an
    /// address longer than 255 bytes.
    fn with_marked(&self, address: &str, value: u32, keep: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        u8::try_from(address.len()).ok()?;
        let mut out = Vec::with_capacity(self.bytes.len() + address.len() + 5);
        for (a, c) in self.entries() {
            if a != address.as_bytes() && keep(a) {
                push_count(&mut out, a, c);
            }
        }
        push_count(&mut out, address.as_bytes(), value);
        Some(out)
    }

    /// The table with `delta` added to `address` (saturating), zero entries dropped; `None` for an address longer
    /// than 255 bytes (cannot be an `IP:port`). Returns the new bytes and the new count.
    fn with_delta(&self, address: &str, delta: i32) -> Option<(Vec<u8>, u32)> {
        u8::try_from(address.len()).ok()?;
        let mut out = Vec::with_capacity(self.bytes.len() + address.len() + 5);
        let mut current = 0;
        for (a, c) in self.entries() {
            if a == address.as_bytes() {
                current = c;
            } else if c > 0 {
                push_count(&mut out, a, c);
            }
        }
        let next = if delta >= 0 {
            current.saturating_add(delta.unsigned_abs())
        } else {
            current.saturating_sub(delta.unsigned_abs())
        };
        if next > 0 {
            push_count(&mut out, address.as_bytes(), next);
        }
        Some((out, next))
    }
}

/// Stores the other gateways' pending prefill work (`entries`, as the feed answered it) under `key` with the time
/// it arrived, for every VM to add to its own ([`Table::read_remote`]).
pub fn store_remote(key: &str, entries: &[u8], now_ms: u64) {
    let mut v = Vec::with_capacity(8 + entries.len());
    v.extend_from_slice(&now_ms.to_le_bytes());
    v.extend_from_slice(entries);
    let _ = hostcalls::set_shared_data(key, Some(&v), None);
}

/// Key whose compare-and-swap token each VM takes one of, to draw an id no other VM of this Envoy holds.
const VM_IDS_KEY: &str = "warmpath.vm_ids";

/// An id that no other VM of this Envoy holds: the compare-and-swap token from which this VM updated a shared-data
/// entry, in the low 32 bits, and `random` in the high ones. The host draws every token from one counter over all
/// of its shared data, never 0, and a swap from a token succeeds for one writer only (proxy-wasm-cpp-host,
/// `SharedData::set` and `nextCas`), so no two VMs take the same token while the counter does not wrap. An id drawn
/// from each VM's own clock-seeded generator is not enough: two of an Envoy's workers did draw the same one, and
/// then each took the other's index records for its own and skipped them. Falls back to `random` (made nonzero)
/// when the host keeps refusing.
pub fn unique_id(random: u64) -> u64 {
    for _ in 0..MAX_CAS_ATTEMPTS {
        match hostcalls::get_shared_data(VM_IDS_KEY) {
            Ok((_, Some(token))) => match hostcalls::set_shared_data(VM_IDS_KEY, Some(&[1]), Some(token)) {
                Ok(()) => return (random & !u64::from(u32::MAX)) | u64::from(token),
                Err(Status::CasMismatch) => continue,
                Err(_) => break,
            },
            // Not created yet (or stored without a token): create it, then swap from its token.
            Ok((_, None)) => {
                if hostcalls::set_shared_data(VM_IDS_KEY, Some(&[0]), None).is_err() {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    random | 1
}

/// Creates the table if it does not exist yet, so that later writes always carry a CAS token (Envoy ignores the
/// token when it creates a key). Called at configure time, before traffic.
pub fn init() {
    for c in [Counter::InFlight, Counter::PendingPrefill, Counter::PendingSince] {
        if let Ok((None, _)) = hostcalls::get_shared_data(c.key()) {
            let _ = hostcalls::set_shared_data(c.key(), Some(&[]), None);
        }
    }
}

/// Adds `delta` to the counter of `address` with compare-and-swap, starting from `read` (the table the caller just
/// read to decide) or a fresh read.
///
/// Returns the new count, or `None` when the host kept refusing the write (`MAX_CAS_ATTEMPTS` mismatches in a row,
/// or another host error).
pub fn add(address: &str, delta: i32, read: Option<Table>) -> Option<u32> {
    add_to(Counter::InFlight, address, delta, read)
}

/// [`add`] for the table of `counter` (`read`, if given, must be that table).
pub fn add_to(counter: Counter, address: &str, delta: i32, read: Option<Table>) -> Option<u32> {
    let mut table = read.filter(|t| t.counter == Some(counter)).unwrap_or_else(|| Table::read_of(counter));
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, next) = table.with_delta(address, delta)?;
        match hostcalls::set_shared_data(counter.key(), Some(&bytes), table.cas) {
            Ok(()) => return Some(next),
            Err(Status::CasMismatch) => table = Table::read_of(counter),
            Err(_) => return None,
        }
    }
    None
}

/// Records `now_ms` as the moment `address`'s pending work was last known exactly ([`Counter::PendingSince`]), with
/// compare-and-swap; `false` when the host kept refusing the write.
///
/// The entry is never removed when the endpoint's work drops to 0: the two tables are written one after the other,
/// so a removal could land after another worker's new work had written its moment, which would leave pending work
/// without one. With `prune`, entries of endpoints with no pending work in a fresh read of that table are dropped
/// instead, which bounds the table by the endpoints with work pending; the caller prunes when an endpoint goes from
/// idle to busy, not on every request.
pub fn mark(address: &str, now_ms: u64, prune: bool) -> bool {
    let mut table = Table::read_of(Counter::PendingSince);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let pending = prune.then(|| Table::read_of(Counter::PendingPrefill));
        let busy = |a: &[u8]| pending.as_ref().is_none_or(|p| p.entries().any(|(b, c)| b == a && c > 0));
        let Some(bytes) = table.with_marked(address, clock32(now_ms), busy) else { return false };
        match hostcalls::set_shared_data(Counter::PendingSince.key(), Some(&bytes), table.cas) {
            Ok(()) => return true,
            Err(Status::CasMismatch) => table = Table::read_of(Counter::PendingSince),
            Err(_) => return false,
        }
    }
    false
}

/// Shared-data key of `plugin`'s prefill-speed fit ([`add_prefill_sample`], [`read_prefill_fit`]): one fit per plugin
/// and Envoy, fed by every worker.
pub fn prefill_fit_key(plugin: &str) -> String {
    format!("warmpath.prefill_fit.{plugin}")
}

/// Creates the fit under `key` ([`prefill_fit_key`]) empty if it does not exist yet, so later writes always carry a
/// CAS token (called at configure time, before traffic).
pub fn init_prefill_fit(key: &str) {
    if let Ok((None, _)) = hostcalls::get_shared_data(key) {
        let _ = hostcalls::set_shared_data(key, Some(&[]), None);
    }
}

/// The fit stored under `key` (an empty fit when there is none yet or its value is not a fit).
pub fn read_prefill_fit(key: &str) -> PrefillRate {
    hostcalls::get_shared_data(key).map_or_else(|_| PrefillRate::default(), |(value, _)| stored_fit(value))
}

/// A stored fit's value read back (an empty fit for a missing or malformed value).
fn stored_fit(value: Option<Vec<u8>>) -> PrefillRate {
    value.as_deref().and_then(PrefillRate::from_bytes).unwrap_or_default()
}

/// Adds one sample (`bytes` charged, first byte `ms` later) to the fit stored under `key`, with compare-and-swap;
/// returns the fit written, or `None` when the host kept refusing the write (the sample is lost).
pub fn add_prefill_sample(key: &str, bytes: u32, ms: u64) -> Option<PrefillRate> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cas) = hostcalls::get_shared_data(key).ok()?;
        let mut fit = stored_fit(value);
        fit.observe(bytes, ms);
        match hostcalls::set_shared_data(key, Some(&fit.to_bytes()), cas) {
            Ok(()) => return Some(fit),
            Err(Status::CasMismatch) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// `now_ms` as a [`Counter::PendingSince`] entry: its low 32 bits.
pub fn clock32(now_ms: u64) -> u32 {
    now_ms as u32
}

/// Takes or renews the lease stored under `key` for `owner` until `now_ms + ttl_ms` (ms since the epoch).
///
/// Value layout: owner id (u64 LE) then expiry (u64 LE). Succeeds when the lease is free, expired or already ours and
/// our compare-and-swap write wins; false otherwise (someone else holds it, or another VM won the race).
pub fn take_lease(key: &str, owner: u64, now_ms: u64, ttl_ms: u64) -> bool {
    let Ok((bytes, cas)) = hostcalls::get_shared_data(key) else { return false };
    let (holder, expiry) = lease(bytes.as_deref());
    if holder != owner && expiry > now_ms {
        return false;
    }
    hostcalls::set_shared_data(key, Some(&lease_value(owner, now_ms.saturating_add(ttl_ms))), cas).is_ok()
}

/// Gives up the lease under `key` if `owner` holds it, so that another VM takes it on its next try instead of after
/// the lease ran out. A lost race means someone else wrote it: nothing to give up.
pub fn release_lease(key: &str, owner: u64) {
    let Ok((bytes, cas)) = hostcalls::get_shared_data(key) else { return };
    if lease(bytes.as_deref()).0 == owner {
        let _ = hostcalls::set_shared_data(key, Some(&lease_value(0, 0)), cas);
    }
}

/// A lease value's holder and expiry (`(0, 0)`: free, or not a lease).
fn lease(bytes: Option<&[u8]>) -> (u64, u64) {
    match bytes {
        Some(b) if b.len() == 16 => {
            let holder = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
            let expiry = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
            (holder, expiry)
        }
        _ => (0, 0),
    }
}

/// The value of a lease held by `owner` until `expiry` (ms since the epoch).
fn lease_value(owner: u64, expiry: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&owner.to_le_bytes());
    v[8..].copy_from_slice(&expiry.to_le_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_value_reads_back_and_anything_else_is_free() {
        assert_eq!(lease(Some(&lease_value(7, 1_000))), (7, 1_000));
        assert_eq!(lease(Some(&lease_value(0, 0))), (0, 0), "a released lease is free");
        assert_eq!(lease(None), (0, 0));
        assert_eq!(lease(Some(&[1, 2, 3])), (0, 0), "not a lease");
    }

    fn table(bytes: Vec<u8>) -> Table {
        Table { counter: Some(Counter::InFlight), bytes, cas: None }
    }

    #[test]
    fn counts_round_trip_and_zero_entries_are_pruned() {
        let t = table(Vec::new());
        assert_eq!(t.get("127.0.0.1:1"), 0);
        let (b, n) = t.with_delta("127.0.0.1:1", 1).expect("fits");
        assert_eq!(n, 1);
        let (b, n) = table(b).with_delta("127.0.0.1:2", 1).expect("fits");
        assert_eq!(n, 1);
        let (b, n) = table(b).with_delta("127.0.0.1:1", 1).expect("fits");
        assert_eq!(n, 2);
        let t = table(b);
        assert_eq!((t.get("127.0.0.1:1"), t.get("127.0.0.1:2")), (2, 1));
        let (b, n) = t.with_delta("127.0.0.1:2", -1).expect("fits");
        assert_eq!(n, 0);
        let t = table(b);
        assert_eq!(t.entries().count(), 1, "zero entry pruned");
        assert_eq!(t.get("127.0.0.1:1"), 2);
    }

    #[test]
    fn per_endpoint_counts_follow_the_router_s_positions() {
        let settings = warmpath_core::Settings {
            endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into(), "127.0.0.1:3".into()],
            ..warmpath_core::Settings::default()
        };
        let router = Router::new(settings);
        let (b, _) = table(Vec::new()).with_delta("127.0.0.1:3", 4).expect("fits");
        let (b, _) = table(b).with_delta("127.0.0.1:9", 7).expect("fits");
        let (b, _) = table(b).with_delta("127.0.0.1:1", 1).expect("fits");
        assert_eq!(table(b).per_endpoint(&router), vec![1, 0, 4], "an address not in the set is left out");
        assert_eq!(table(vec![200, 1, 2]).per_endpoint(&router), vec![0, 0, 0], "garbage reads as empty");
    }

    #[test]
    fn elapsed_time_survives_the_32_bit_wrap_and_a_missing_entry_is_none() {
        let settings = warmpath_core::Settings {
            endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into(), "127.0.0.1:3".into()],
            ..warmpath_core::Settings::default()
        };
        let router = Router::new(settings);
        let before_wrap = (1u64 << 32) - 5;
        let all = |_: &[u8]| true;
        let b = table(Vec::new()).with_marked("127.0.0.1:1", clock32(before_wrap), all).expect("fits");
        let now = (1u64 << 32) + 15;
        let b = table(b).with_marked("127.0.0.1:3", clock32(now - 900), all).expect("fits");
        let b = table(b).with_marked("127.0.0.1:3", clock32(now - 300), all).expect("fits");
        assert_eq!(table(b.clone()).elapsed_per_endpoint(&router, now), vec![Some(20), None, Some(300)]);
        let b = table(b).with_marked("127.0.0.1:2", clock32(now + 3), all).expect("fits");
        assert_eq!(table(b).elapsed_per_endpoint(&router, now)[1], Some(0), "a moment ahead of the clock is now");
    }

    #[test]
    fn marking_an_endpoint_keeps_the_entries_the_caller_keeps() {
        let all = |_: &[u8]| true;
        let b = table(Vec::new()).with_marked("10.0.0.1:80", 5, all).expect("fits");
        let b = table(b).with_marked("10.0.0.2:80", 6, all).expect("fits");
        let b = table(b).with_marked("10.0.0.3:80", 7, all).expect("fits");
        let t = table(b.clone());
        assert_eq!((t.get("10.0.0.1:80"), t.get("10.0.0.2:80"), t.get("10.0.0.3:80")), (5, 6, 7));
        // Only 10.0.0.3 still has work pending: marking 10.0.0.1 again prunes 10.0.0.2.
        let b = table(b).with_marked("10.0.0.1:80", 9, |a| a == b"10.0.0.3:80").expect("fits");
        let t = table(b);
        assert_eq!((t.get("10.0.0.1:80"), t.get("10.0.0.2:80"), t.get("10.0.0.3:80")), (9, 0, 7));
        assert_eq!(t.entries().count(), 2);
    }

    #[test]
    fn decrements_saturate_and_garbage_reads_as_empty() {
        let (_, n) = table(Vec::new()).with_delta("10.0.0.1:80", -1).expect("fits");
        assert_eq!(n, 0);
        let t = table(vec![200, 1, 2]);
        assert_eq!(t.get("10.0.0.1:80"), 0);
        assert!(table(Vec::new()).with_delta(&"x".repeat(300), 1).is_none());
    }
}
