//! State shared by every VM (each Envoy worker's and the two that route nothing) through proxy-wasm shared data:
//! the load table ([`Table`]: per endpoint, requests in flight, pending prefill work in bytes of prompt text, and
//! when that work was last known exactly), the other gateways' pending prefill work as the feed reported it
//! ([`store_remote`], [`Remote`], written only by the feed poller), the feed poller's lease ([`take_lease`],
//! [`release_lease`]) and each plugin's prefill-speed fits ([`add_prefill_sample`]). This is the only
//! compare-and-swap code in the filter.
//!
//! The load table lives under one key ([`LOADS_KEY`]) as a small table of entries ([`Load`], one per endpoint with
//! something in flight or pending), so a request costs one read (the loads of every endpoint, plus the CAS token)
//! and one write to take its slot and charge its prefill work, one read + one write to release that work at its
//! first response byte, and one read + one write to release the slot — independent of the number of endpoints.
//! One entry holds all three values, so every change to an endpoint's load is one atomic write: the moment its
//! queue was last known exactly can never be written apart from the work it dates. Entries whose in-flight count
//! and pending work are both 0 are pruned on the next write, which bounds the table by the busy endpoints.
//!
//! A write carries the CAS token of the read it was computed from; a mismatch (another worker wrote in between)
//! re-reads and retries. Decrements saturate at 0.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use warmpath_core::exchange::{counts, entries, push_count, push_entry};
use warmpath_core::prefill_rate::PrefillFits;
use warmpath_core::Router;

/// Shared-data key of the load table.
const LOADS_KEY: &str = "warmpath.loads";

/// Attempts before an update gives up (counted as a CAS failure by the caller); contention is between a few worker
/// threads, so a handful of retries always suffices in practice.
const MAX_CAS_ATTEMPTS: usize = 64;

/// One endpoint's load as every worker of this Envoy sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests sent to the endpoint that have not ended.
    pub in_flight: u32,
    /// Bytes of prompt text sent to the endpoint whose first response byte has not arrived
    /// (`warmpath_core::EndpointLoad::pending_prefill`).
    pub pending: u32,
    /// When the endpoint's pending work was last known exactly: work arrived with none pending, or a request there
    /// got its first byte or ended. Milliseconds of the host clock, low 32 bits ([`clock32`]); meaningful only while
    /// `pending` is above 0, read through [`Load::pending_for_ms`].
    pub since: u32,
}

/// Bytes of a [`Load`] after its address in the table: three little-endian `u32`s.
const LOAD_BYTES: usize = 12;

impl Load {
    /// Milliseconds from [`Load::since`] to `now_ms` while work is pending (`None` otherwise). A moment ahead of
    /// `now_ms` (another worker wrote a later millisecond after this one read its clock, or the host's wall clock
    /// stepped back) is 0 ms old, not 49 days.
    pub fn pending_for_ms(&self, now_ms: u64) -> Option<u64> {
        (self.pending > 0).then(|| {
            let ms = clock32(now_ms).wrapping_sub(self.since);
            if ms > u32::MAX / 2 {
                0
            } else {
                u64::from(ms)
            }
        })
    }

    /// Takes a request's slot and charges its `bytes` of prefill work at `now_ms` (work arriving with none pending
    /// starts the queue's clock).
    pub fn take(&mut self, bytes: u32, now_ms: u64) {
        self.in_flight = self.in_flight.saturating_add(1);
        if bytes > 0 {
            if self.pending == 0 {
                self.since = clock32(now_ms);
            }
            self.pending = self.pending.saturating_add(bytes);
        }
    }

    /// Gives back `bytes` of prefill work at `now_ms` (a first byte or an end: the queue is known exactly again).
    pub fn release_pending(&mut self, bytes: u32, now_ms: u64) {
        self.pending = self.pending.saturating_sub(bytes);
        self.since = clock32(now_ms);
    }

    /// Gives back a request's slot.
    pub fn release_slot(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

/// Appends `address`'s entry to `out`: the address's length (one byte), the address, then the [`Load`]'s three
/// values; false (nothing written) for an address longer than 255 bytes.
fn push_load(out: &mut Vec<u8>, address: &[u8], load: Load) -> bool {
    let mut values = [0u8; LOAD_BYTES];
    for (i, v) in [load.in_flight, load.pending, load.since].iter().enumerate() {
        values[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    push_entry(out, address, &values)
}

/// The entries of a load table in order; stops at the first truncated entry.
fn loads(bytes: &[u8]) -> impl Iterator<Item = (&[u8], Load)> + '_ {
    entries(bytes, LOAD_BYTES).map(|(address, values)| {
        let v = |i: usize| u32::from_le_bytes(values[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        (address, Load { in_flight: v(0), pending: v(1), since: v(2) })
    })
}

/// Calls `f(position, value)` for each entry whose address is one of `router`'s endpoints, in table order: one hash
/// lookup per entry, not a scan of the table per endpoint.
fn by_position<'a, T>(router: &Router, entries: impl Iterator<Item = (&'a [u8], T)>, mut f: impl FnMut(usize, T)) {
    for (a, v) in entries {
        if let Some(i) = std::str::from_utf8(a).ok().and_then(|a| router.position(a)) {
            f(i, v);
        }
    }
}

/// One read of the load table.
pub struct Table {
    bytes: Vec<u8>,
    cas: Option<u32>,
}

impl Table {
    /// Reads the load table (empty on a missing key or a host error).
    pub fn read() -> Table {
        match hostcalls::get_shared_data(LOADS_KEY) {
            Ok((bytes, cas)) => Table { bytes: bytes.unwrap_or_default(), cas },
            Err(_) => Table { bytes: Vec::new(), cas: None },
        }
    }

    /// Entries `(address, load)` in table order.
    fn entries(&self) -> impl Iterator<Item = (&[u8], Load)> + '_ {
        loads(&self.bytes)
    }

    /// The load of `address` (all 0 when absent).
    pub fn get(&self, address: &str) -> Load {
        self.entries().find(|(a, _)| *a == address.as_bytes()).map(|(_, l)| l).unwrap_or_default()
    }

    /// The load of each of `router`'s endpoints, by position (all 0 when absent). One hash lookup per entry of the
    /// table (the busy endpoints), not a scan of the table per endpoint: at 1,000 endpoints the scans cost more
    /// Envoy CPU per request than the rest of the decision.
    pub fn per_endpoint(&self, router: &Router) -> Vec<Load> {
        let mut out = vec![Load::default(); router.endpoints().len()];
        by_position(router, self.entries(), |i, l| out[i] = l);
        out
    }

    /// The pending work of every endpoint that has some, in `warmpath_core::exchange::push_count`'s layout (what
    /// the feed's index exchange carries to the other gateways).
    pub fn pending_counts(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (a, l) in self.entries().filter(|(_, l)| l.pending > 0) {
            push_count(&mut out, a, l.pending);
        }
        out
    }

    /// The table with `change` applied to `address`'s entry, entries with nothing in flight or pending dropped;
    /// `None` for an address longer than 255 bytes (cannot be an `IP:port`). Returns the new bytes and the new load.
    fn with(&self, address: &str, change: impl Fn(&mut Load)) -> Option<(Vec<u8>, Load)> {
        u8::try_from(address.len()).ok()?;
        let busy = |l: &Load| l.in_flight > 0 || l.pending > 0;
        let mut out = Vec::with_capacity(self.bytes.len() + address.len() + 1 + LOAD_BYTES);
        let mut current = Load::default();
        for (a, l) in self.entries() {
            if a == address.as_bytes() {
                current = l;
            } else if busy(&l) {
                push_load(&mut out, a, l);
            }
        }
        change(&mut current);
        if busy(&current) {
            push_load(&mut out, address.as_bytes(), current);
        }
        Some((out, current))
    }
}

/// Applies `change` to `address`'s load with compare-and-swap, starting from `read` (the table the caller just read
/// to decide) or a fresh read; `change` may run more than once (once per attempt, each time on a fresh read).
///
/// Returns the new load, or `None` when the host kept refusing the write (`MAX_CAS_ATTEMPTS` mismatches in a row,
/// or another host error) or the address cannot be stored.
pub fn update(address: &str, read: Option<Table>, change: impl Fn(&mut Load)) -> Option<Load> {
    let mut table = read.unwrap_or_else(Table::read);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, load) = table.with(address, &change)?;
        match hostcalls::set_shared_data(LOADS_KEY, Some(&bytes), table.cas) {
            Ok(()) => return Some(load),
            Err(Status::CasMismatch) => table = Table::read(),
            Err(_) => return None,
        }
    }
    None
}

/// Creates the load table if it does not exist yet, so that later writes always carry a CAS token (Envoy ignores
/// the token when it creates a key). Called at configure time, before traffic.
pub fn init() {
    create_empty(LOADS_KEY);
}

/// Stores an empty value under `key` unless it exists, so that later compare-and-swap writes carry a token.
fn create_empty(key: &str) {
    if let Ok((None, _)) = hostcalls::get_shared_data(key) {
        let _ = hostcalls::set_shared_data(key, Some(&[]), None);
    }
}

/// One read of what the feed last answered about the other gateways ([`store_remote`]): their pending prefill work
/// (entries in `warmpath_core::exchange::push_count`'s layout) or their prefill-speed fits
/// ([`PrefillFits::to_bytes`]), read only.
#[derive(Default)]
pub struct Remote {
    /// The stored value as read — its arrival time ([`STAMP_BYTES`]), then the entries — or empty when it does not
    /// count. Kept whole: the per-request read of the pending work copies it out of shared data once, not twice.
    value: Vec<u8>,
    /// The value's compare-and-swap token while it counts (new on every write), `None` when it does not.
    version: Option<u32>,
}

/// Bytes of the arrival time in front of what [`store_remote`] stores (milliseconds, little-endian `u64`).
const STAMP_BYTES: usize = 8;

impl Remote {
    /// Reads what [`store_remote`] stored under `key`; empty when missing or written more than `max_age_ms` before
    /// `now_ms` (the feed stopped answering: the work it said has long been served, and this Envoy routes on what
    /// it learned itself).
    pub fn read(key: &str, now_ms: u64, max_age_ms: u64) -> Remote {
        match hostcalls::get_shared_data(key) {
            Ok((Some(value), version)) if value.len() >= STAMP_BYTES => {
                let at = u64::from_le_bytes(value[..STAMP_BYTES].try_into().expect("8 bytes"));
                if now_ms.saturating_sub(at) <= max_age_ms {
                    return Remote { value, version };
                }
                Remote::default()
            }
            _ => Remote::default(),
        }
    }

    /// The entries of the value (none when it does not count).
    fn entries(&self) -> &[u8] {
        self.value.get(STAMP_BYTES..).unwrap_or_default()
    }

    /// Which write of the value this is, while it counts (`None` once it is missing or too old): equal versions
    /// hold equal values.
    pub fn version(&self) -> Option<u32> {
        self.version
    }

    /// The stored value read as fits (empty when there is none).
    pub fn fits(&self) -> PrefillFits {
        PrefillFits::from_bytes(self.entries())
    }

    /// The pending work of each of `router`'s endpoints, by position (0 when absent), one hash lookup per entry.
    pub fn per_endpoint(&self, router: &Router) -> Vec<u32> {
        let mut out = vec![0u32; router.endpoints().len()];
        by_position(router, counts(self.entries()), |i, c| out[i] = out[i].saturating_add(c));
        out
    }
}

/// Stores what the feed answered about the other gateways (their pending prefill work or their fits, as the
/// answer's section holds it) under `key` with the time it arrived, for every VM to read ([`Remote::read`]).
pub fn store_remote(key: &str, entries: &[u8], now_ms: u64) {
    let mut v = Vec::with_capacity(STAMP_BYTES + entries.len());
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

/// Shared-data key of `plugin`'s prefill-speed fits ([`add_prefill_sample`], [`read_prefill_fits`]): the pool's and
/// each endpoint's, one set per plugin and Envoy, fed by every worker.
pub fn prefill_fit_key(plugin: &str) -> String {
    format!("warmpath.prefill_fit.{plugin}")
}

/// Creates the fits under `key` ([`prefill_fit_key`]) empty if they do not exist yet, so later writes always carry
/// a CAS token (called at configure time, before traffic).
pub fn init_prefill_fit(key: &str) {
    create_empty(key);
}

/// The fits stored under `key` (empty when there are none yet or the value is not fits).
pub fn read_prefill_fits(key: &str) -> PrefillFits {
    hostcalls::get_shared_data(key).map_or_else(|_| PrefillFits::default(), |(value, _)| stored_fits(value))
}

/// The fits stored under `key` with their version (the compare-and-swap token, new on every write), or `None` when
/// the version is still `seen`: the caller has them already.
pub fn read_prefill_fits_since(key: &str, seen: Option<u32>) -> Option<(Option<u32>, PrefillFits)> {
    let (value, version) = hostcalls::get_shared_data(key).unwrap_or((None, None));
    (version != seen).then(|| (version, stored_fits(value)))
}

/// A stored value read back as fits (empty for a missing or malformed value).
fn stored_fits(value: Option<Vec<u8>>) -> PrefillFits {
    value.as_deref().map(PrefillFits::from_bytes).unwrap_or_default()
}

/// Adds one sample of `address` (`bytes` charged, first byte `ms` later) to the fits stored under `key`, with
/// compare-and-swap, dropping the fits of addresses `keep` rejects; returns the fits written, or `None` when the
/// host kept refusing the write (the sample is lost).
pub fn add_prefill_sample(
    key: &str,
    address: &str,
    bytes: u32,
    ms: u64,
    keep: impl Fn(&str) -> bool,
) -> Option<PrefillFits> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cas) = hostcalls::get_shared_data(key).ok()?;
        let mut fits = stored_fits(value);
        fits.observe(address, bytes, ms, &keep);
        match hostcalls::set_shared_data(key, Some(&fits.to_bytes()), cas) {
            Ok(()) => return Some(fits),
            Err(Status::CasMismatch) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// `now_ms` as a [`Load::since`]: its low 32 bits, compared with a wrapping difference.
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
        Table { bytes, cas: None }
    }

    fn router(n: u16) -> Router {
        let endpoints = (1..=n).map(|p| format!("127.0.0.1:{p}")).collect();
        Router::new(warmpath_core::Settings { endpoints, ..warmpath_core::Settings::default() })
    }

    /// `t` with `change` applied to `address` (the bytes a successful write stores).
    fn changed(t: &Table, address: &str, change: impl Fn(&mut Load)) -> Table {
        table(t.with(address, change).expect("fits").0)
    }

    #[test]
    fn slots_and_pending_work_round_trip_and_idle_entries_are_pruned() {
        let t = table(Vec::new());
        assert_eq!(t.get("127.0.0.1:1"), Load::default());
        let t = changed(&t, "127.0.0.1:1", |l| l.take(0, 5));
        let t = changed(&t, "127.0.0.1:2", |l| l.take(300, 7));
        let t = changed(&t, "127.0.0.1:1", |l| l.take(100, 9));
        assert_eq!(t.get("127.0.0.1:1"), Load { in_flight: 2, pending: 100, since: 9 });
        assert_eq!(t.get("127.0.0.1:2"), Load { in_flight: 1, pending: 300, since: 7 });
        let t = changed(&t, "127.0.0.1:2", |l| l.take(50, 11));
        assert_eq!(t.get("127.0.0.1:2"), Load { in_flight: 2, pending: 350, since: 7 }, "the queue's clock runs on");
        let t = changed(&t, "127.0.0.1:2", |l| l.release_pending(300, 20));
        assert_eq!(t.get("127.0.0.1:2"), Load { in_flight: 2, pending: 50, since: 20 }, "a first byte restarts it");
        let t = changed(&t, "127.0.0.1:2", |l| l.release_slot());
        let t = changed(&t, "127.0.0.1:2", |l| {
            l.release_pending(50, 30);
            l.release_slot();
        });
        assert_eq!(t.get("127.0.0.1:2"), Load::default());
        assert_eq!(t.entries().count(), 1, "an idle entry is pruned");
        let t = changed(&t, "127.0.0.1:1", |l| l.release_slot());
        let t = changed(&t, "127.0.0.1:1", |l| l.release_slot());
        assert_eq!(t.get("127.0.0.1:1"), Load { in_flight: 0, pending: 100, since: 9 }, "pending work keeps it");
    }

    #[test]
    fn per_endpoint_loads_follow_the_router_s_positions() {
        let t = changed(&table(Vec::new()), "127.0.0.1:3", |l| l.take(40, 1));
        let t = changed(&t, "127.0.0.1:9", |l| l.take(70, 1));
        let t = changed(&t, "127.0.0.1:1", |l| l.take(0, 1));
        let in_flight: Vec<u32> = t.per_endpoint(&router(3)).iter().map(|l| l.in_flight).collect();
        let pending: Vec<u32> = t.per_endpoint(&router(3)).iter().map(|l| l.pending).collect();
        assert_eq!(in_flight, vec![1, 0, 1], "an address not in the set is left out");
        assert_eq!(pending, vec![0, 0, 40]);
        assert_eq!(table(vec![200, 1, 2]).per_endpoint(&router(3)), vec![Load::default(); 3], "garbage reads as empty");
    }

    #[test]
    fn pending_work_reads_as_the_feed_s_counts() {
        let t = changed(&table(Vec::new()), "127.0.0.1:1", |l| l.take(0, 1));
        let t = changed(&t, "127.0.0.1:2", |l| l.take(250, 1));
        let mut value = 1_000u64.to_le_bytes().to_vec();
        value.extend(t.pending_counts());
        let remote = Remote { value, version: None };
        assert_eq!(remote.per_endpoint(&router(2)), vec![0, 250], "only the endpoints with work pending");
        assert_eq!(counts(&t.pending_counts()).count(), 1);
    }

    #[test]
    fn time_pending_survives_the_32_bit_wrap_and_idle_endpoints_have_none() {
        let before_wrap = (1u64 << 32) - 5;
        let now = (1u64 << 32) + 15;
        let mut l = Load::default();
        assert_eq!(l.pending_for_ms(now), None);
        l.take(10, before_wrap);
        assert_eq!(l.pending_for_ms(now), Some(20));
        l.release_pending(4, now + 3);
        assert_eq!(l.pending_for_ms(now), Some(0), "a moment ahead of the clock is now");
        l.release_pending(6, now);
        assert_eq!(l.pending_for_ms(now + 100), None, "nothing pending: no age");
    }

    #[test]
    fn decrements_saturate_and_garbage_reads_as_empty() {
        let t = changed(&table(Vec::new()), "10.0.0.1:80", |l| {
            l.release_slot();
            l.release_pending(5, 1);
        });
        assert_eq!(t.get("10.0.0.1:80"), Load::default());
        assert_eq!(t.entries().count(), 0);
        assert_eq!(table(vec![200, 1, 2]).get("10.0.0.1:80"), Load::default());
        assert_eq!(table(vec![3, b'a', b'b', b'c', 1, 0]).entries().count(), 0, "a truncated entry is dropped");
        assert!(table(Vec::new()).with(&"x".repeat(300), |l| l.take(1, 1)).is_none());
    }
}
