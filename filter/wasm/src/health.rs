//! The endpoints' failure state shared by every VM (each Envoy worker's and the two that route nothing) through proxy-wasm shared
//! data, for passive failure learning ([`warmpath_core::health`] holds the back-off rules). Like `shared`, every
//! write is a compare-and-swap against the read it was computed from.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use warmpath_core::exchange::entries;
use warmpath_core::health::Health;
use warmpath_core::{Endpoint, EndpointLoad};

use crate::outcome::{classify, Observed, Outcome};

/// Attempts before an update gives up (contention is between a few worker threads).
const MAX_CAS_ATTEMPTS: usize = 64;

const HEALTH_KEY: &str = "warmpath.health";
/// Bytes of one health entry after the address: consecutive failures (u32 LE), end of the back-off or probe window
/// (u64 LE, ms), probe under way (u8, 0 or 1).
const HEALTH_VALUE_LEN: usize = 13;

/// One read of the failure-state table (`warmpath.health`): entries `[address length: u8][address bytes]
/// [failures: u32 LE][down until: u64 LE, ms since the epoch][probing: u8]`, only for endpoints that are not clear (a success
/// removes the entry), so the table is empty — one read per request, no write — while everything is healthy.
pub struct HealthTable {
    bytes: Vec<u8>,
    cas: Option<u32>,
}

impl HealthTable {
    /// Reads the table (empty on a missing key or a host error).
    pub fn read() -> HealthTable {
        match hostcalls::get_shared_data(HEALTH_KEY) {
            Ok((bytes, cas)) => HealthTable { bytes: bytes.unwrap_or_default(), cas },
            Err(_) => HealthTable { bytes: Vec::new(), cas: None },
        }
    }

    /// True when no endpoint has a failure on record.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Entries `(address, state)`; stops at the first malformed entry.
    fn entries(&self) -> impl Iterator<Item = (&[u8], Health)> + '_ {
        entries(&self.bytes, HEALTH_VALUE_LEN).map(|(addr, v)| {
            let failures = u32::from_le_bytes(v[0..4].try_into().expect("4 bytes"));
            let down_until_ms = u64::from_le_bytes(v[4..12].try_into().expect("8 bytes"));
            (addr, Health { failures, down_until_ms, probing: v[12] == 1 })
        })
    }

    /// The state of `address` (clear when absent).
    pub fn get(&self, address: &str) -> Health {
        self.entries().find(|(a, _)| *a == address.as_bytes()).map(|(_, h)| h).unwrap_or_default()
    }

    /// The table with `address` set to `health` (dropped when clear); `None` for an address over 255 bytes.
    fn with(&self, address: &str, health: Health) -> Option<Vec<u8>> {
        let len = u8::try_from(address.len()).ok()?;
        let mut out = Vec::with_capacity(self.bytes.len() + address.len() + 1 + HEALTH_VALUE_LEN);
        for (a, h) in self.entries().filter(|(a, _)| *a != address.as_bytes()) {
            push_health(&mut out, a, h);
        }
        if !health.is_clear() {
            out.push(len);
            out.extend_from_slice(address.as_bytes());
            out.extend_from_slice(&health.failures.to_le_bytes());
            out.extend_from_slice(&health.down_until_ms.to_le_bytes());
            out.push(u8::from(health.probing));
        }
        Some(out)
    }
}

fn push_health(out: &mut Vec<u8>, address: &[u8], h: Health) {
    // Entries come from a table we wrote, so the length fits in a byte.
    out.push(address.len() as u8);
    out.extend_from_slice(address);
    out.extend_from_slice(&h.failures.to_le_bytes());
    out.extend_from_slice(&h.down_until_ms.to_le_bytes());
    out.push(u8::from(h.probing));
}

/// Applies `change` to the failure state of `address` with compare-and-swap; writes nothing when the state does
/// not change (the common case: a success on a clear endpoint). Returns the new state, or `None` when the host kept
/// refusing the write.
pub fn update(address: &str, change: impl Fn(&mut Health)) -> Option<Health> {
    let mut table = HealthTable::read();
    if table.cas.is_none() {
        // First write of this Envoy: create the key so that writes carry a CAS token (Envoy ignores the token when
        // it creates a key).
        let _ = hostcalls::set_shared_data(HEALTH_KEY, Some(&[]), None);
        table = HealthTable::read();
    }
    for _ in 0..MAX_CAS_ATTEMPTS {
        let before = table.get(address);
        let mut after = before;
        change(&mut after);
        if after == before {
            return Some(after);
        }
        let bytes = table.with(address, after)?;
        match hostcalls::set_shared_data(HEALTH_KEY, Some(&bytes), table.cas) {
            Ok(()) => return Some(after),
            Err(Status::CasMismatch) => table = HealthTable::read(),
            Err(_) => return None,
        }
    }
    None
}

/// Where a pick goes once endpoint health is taken into account.
#[derive(Debug, Default)]
pub struct Placement {
    /// Send the request here instead of the pick (the pick is down, this one is up).
    pub instead: Option<String>,
    /// The request is the probe of an endpoint whose back-off expired: learn from its response headers.
    pub probe: bool,
}

/// Places a pick of `endpoints[picked]`: a down endpoint (in back-off or probe window at `now_ms`) is replaced by
/// the least-loaded up endpoint ([`warmpath_core::health::avoid_down`]); an endpoint whose back-off expired gets
/// this request as its probe if no other request claimed it first. One shared-data read while everything is
/// healthy.
pub fn place(endpoints: &[Endpoint], loads: &[EndpointLoad], picked: usize, now_ms: u64) -> Placement {
    let table = HealthTable::read();
    if table.is_empty() {
        return Placement::default();
    }
    let mut down: Vec<bool> = endpoints.iter().map(|e| table.get(&e.address).is_down(now_ms)).collect();
    let Some(address) = endpoints.get(picked).map(|e| e.address.as_str()) else { return Placement::default() };
    if !down[picked] && table.get(address).failures > 0 {
        // Half-open: claim the probe, compare-and-swap so that one request wins.
        let claimed = std::cell::Cell::new(false);
        let written = update(address, |h| claimed.set(h.claim_probe(now_ms)));
        if claimed.get() && written.is_some_and(|h| h.probing) {
            return Placement { instead: None, probe: true };
        }
        // Another request is the probe: keep away like from a down endpoint.
        down[picked] = true;
    }
    let instead = warmpath_core::health::avoid_down(picked, &down, loads).map(|i| endpoints[i].address.clone());
    Placement { instead, probe: false }
}

/// An attribute of the ended stream as text.
fn property_text(path: &[&str]) -> Option<String> {
    hostcalls::get_property(path.to_vec()).ok().flatten().map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// An integer attribute (Envoy passes ints as 8 bytes, little-endian).
fn property_u64(path: &[&str]) -> Option<u64> {
    let b = hostcalls::get_property(path.to_vec()).ok().flatten()?;
    Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?))
}

/// Learns from a stream that ended on the endpoint `picked` (from the log callback): reads the upstream host, the
/// status, the attempt count and the code details, classifies ([`crate::outcome`]; `oversized`: the request's body
/// was larger than `max_body_bytes`) and records a failure (back-off) or a success (clear) in the shared table; a
/// probe (`probe`: the moment it claimed) whose outcome says nothing about the endpoint gives its claim back.
/// Returns the outcome for the metrics.
pub fn learn(picked: &str, now_ms: u64, oversized: bool, probe: Option<u64>) -> Outcome {
    let upstream = property_text(&["upstream", "address"]);
    let details = property_text(&["response", "code_details"]);
    let observed = Observed {
        picked,
        upstream: upstream.as_deref().and_then(crate::outcome::host_port),
        status: property_u64(&["response", "code"]).and_then(|c| u16::try_from(c).ok()),
        attempts: property_u64(&["upstream", "request_attempt_count"]),
        details: details.as_deref(),
        oversized,
    };
    let outcome = classify(&observed);
    match outcome {
        Outcome::Failed => {
            update(picked, |h| h.failed(now_ms));
        }
        Outcome::Succeeded => {
            update(picked, Health::succeeded);
        }
        Outcome::NotHonoured => warn_not_honoured_once(picked, upstream.as_deref()),
        Outcome::Unknown => {}
    }
    if let Some(claimed) = probe.filter(|_| matches!(outcome, Outcome::NotHonoured | Outcome::Unknown)) {
        update(picked, |h| h.probe_told_nothing(claimed, now_ms));
    }
    outcome
}

thread_local! {
    // Endpoints already reported as not honoured by this VM (bounded by the endpoint count).
    static WARNED: std::cell::RefCell<std::collections::BTreeSet<String>> = const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
}

/// Logs, once per endpoint and VM, that Envoy sent a request picked for `picked` elsewhere: what cannot be checked
/// at configure time — the endpoint is not a member of the Envoy cluster (the counter keeps counting).
fn warn_not_honoured_once(picked: &str, upstream: Option<&str>) {
    let first = WARNED.with(|w| w.borrow_mut().insert(picked.to_string()));
    if first {
        log::warn!(
            "Envoy did not honour the pick {picked} (the request went to {}): is it a member of the route's cluster? \
             Counted in warmpath.picks_not_honoured; logged once per endpoint",
            upstream.unwrap_or("no upstream")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_entries_round_trip_and_clear_ones_are_dropped() {
        let t = HealthTable { bytes: Vec::new(), cas: None };
        assert!(t.get("127.0.0.1:1").is_clear());
        let down = Health { failures: 2, down_until_ms: 1_234_567, probing: true };
        let t = HealthTable { bytes: t.with("127.0.0.1:1", down).expect("fits"), cas: None };
        let t = HealthTable {
            bytes: t.with("[::1]:2", Health { failures: 1, down_until_ms: 9, probing: false }).expect("fits"),
            cas: None,
        };
        assert_eq!(t.get("127.0.0.1:1"), down);
        assert_eq!(t.get("[::1]:2").failures, 1);
        let t = HealthTable { bytes: t.with("127.0.0.1:1", Health::default()).expect("fits"), cas: None };
        assert!(t.get("127.0.0.1:1").is_clear());
        assert_eq!(t.entries().count(), 1, "the cleared entry is gone");
        let t = HealthTable { bytes: t.with("[::1]:2", Health::default()).expect("fits"), cas: None };
        assert!(t.is_empty(), "all clear: empty table");
    }
}
