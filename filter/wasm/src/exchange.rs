//! One prefix index per Envoy, not per worker: every VM (each Envoy worker's, and two more) sends the index
//! record of each request it routes to every other VM of the same plugin, and applies the records it receives before
//! its next pick ([`warmpath_core::exchange`]), so all workers route with the same knowledge.
//!
//! Transport: proxy-wasm shared queues. Each VM registers its own queue (a name unique to the VM) and lists the
//! queue's token in a directory kept in shared data under `warmpath.index_peers.<plugin>`: entries
//! `[token: u32 LE][expiry: u64 LE, ms since the epoch]`, renewed on every tick and dropped once expired, so a VM
//! that went away (a module reload) stops receiving within [`entry_ttl`] (10 s at the default tick). After a pick the VM enqueues the record on
//! each listed peer's queue (the host wakes the peer's root context, which drains its queue); before each pick it
//! drains its own queue, so a record enqueued before a request arrives is applied before that request is routed.
//!
//! Cost per request with W VMs: W − 1 enqueues of one record (≈ 8 bytes per block of the key) after the pick, and
//! one dequeue per record waiting (plus one that finds the queue empty) before it. Everything fails soft: a host
//! error loses that record (the peer then routes as it would without exchange), never a request.
//!
//! Between gateways: the VM that holds the feed poller's lease also keeps a copy of every record it routes or
//! receives from the other VMs ([`Exchange::collect`]), which the poller reports to the feed server; the records
//! of the other gateways that come back are applied there and forwarded to the other VMs ([`Exchange::forward`]),
//! which do not keep them, so nothing is reported twice while the lease stays put.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use warmpath_core::exchange::MAX_REPORT_BYTES;
use warmpath_core::Router;

use crate::metrics::Metrics;

/// Shortest life of a directory entry without renewal. Entries are renewed every tick (at most 200 ms), and live
/// for the larger of this and four ticks ([`entry_ttl`]), so the entry of a live VM never expires between two
/// renewals.
pub const PEER_TTL: Duration = Duration::from_secs(10);

/// Life of a directory entry for a VM that renews it every `tick`: the larger of [`PEER_TTL`] and four ticks.
pub fn entry_ttl(tick: Duration) -> Duration {
    PEER_TTL.max(tick.saturating_mul(4))
}

/// Compare-and-swap attempts on the directory per renewal (a few VMs contend; the next tick retries).
const MAX_CAS_ATTEMPTS: usize = 16;

/// Counters (see `metrics`).
mod metric {
    /// Index records sent to other VMs (one per peer and request).
    pub const SENT: &str = "warmpath.index_exchange.sent";
    /// Records received and applied to this VM's index.
    pub const APPLIED: &str = "warmpath.index_exchange.applied";
    /// Records dropped: malformed, or the host refused the enqueue.
    pub const DROPPED: &str = "warmpath.index_exchange.dropped";
}

/// This VM's membership in the exchange of one plugin.
pub struct Exchange {
    directory: String,
    queue_name: String,
    own: u32,
    /// Tokens of the other VMs' queues and the directory's CAS token they were read at.
    peers: RefCell<(Vec<u32>, Option<u32>)>,
    /// Life of this VM's directory entry, ms ([`entry_ttl`] of the tick in force).
    ttl_ms: Cell<u64>,
    /// This Envoy's records kept for the feed while this VM polls it (`None`: not polling).
    collected: RefCell<Option<Vec<u8>>>,
}

impl Exchange {
    /// Registers this VM's queue for `plugin` (the caller's root context receives its wake-ups) and enters it in
    /// the directory, to be renewed every `tick`. `unique` distinguishes this VM from the others (any per-VM
    /// random value).
    pub fn join(plugin: &str, unique: u64, now_ms: u64, tick: Duration) -> Exchange {
        let queue_name = format!("warmpath.index.{plugin}.{unique:016x}");
        let own = hostcalls::register_shared_queue(&queue_name).unwrap_or(0);
        let x = Exchange {
            directory: format!("warmpath.index_peers.{plugin}"),
            queue_name,
            own,
            peers: RefCell::new((Vec::new(), None)),
            ttl_ms: Cell::new(entry_ttl(tick).as_millis() as u64),
            collected: RefCell::new(None),
        };
        x.renew(now_ms);
        x
    }

    /// Makes the calling root context the one woken for this VM's queue and renewing its entry every `tick` (after
    /// a reconfiguration created a new root context; the queue and its contents stay).
    pub fn rebind(&self, tick: Duration) {
        let _ = hostcalls::register_shared_queue(&self.queue_name);
        self.ttl_ms.set(entry_ttl(tick).as_millis() as u64);
    }

    /// True when `queue_id` is this VM's queue.
    pub fn owns(&self, queue_id: u32) -> bool {
        self.own != 0 && queue_id == self.own
    }

    /// Renews this VM's directory entry and drops expired ones (the peers are read from the directory at each
    /// publish).
    pub fn renew(&self, now_ms: u64) {
        if self.own == 0 {
            return;
        }
        let expiry = now_ms.saturating_add(self.ttl_ms.get());
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (bytes, cas) = match hostcalls::get_shared_data(&self.directory) {
                Ok((b, cas)) => (b.unwrap_or_default(), cas),
                Err(_) => return,
            };
            let live: Vec<(u32, u64)> = entries(&bytes).filter(|&(t, e)| t != self.own && e >= now_ms).collect();
            let mut out = Vec::with_capacity((live.len() + 1) * ENTRY);
            for (t, e) in live.into_iter().chain([(self.own, expiry)]) {
                out.extend_from_slice(&t.to_le_bytes());
                out.extend_from_slice(&e.to_le_bytes());
            }
            match hostcalls::set_shared_data(&self.directory, Some(&out), cas) {
                Ok(()) => return,
                Err(Status::CasMismatch) => continue,
                Err(_) => return,
            }
        }
    }

    /// Re-reads the peers from the directory when it changed since the last read (one host call; the entries are
    /// parsed only after a change). Expired entries are left to the next renewal: a VM that went away receives for
    /// at most one [`entry_ttl`] more.
    fn refresh_peers(&self) {
        let Ok((bytes, cas)) = hostcalls::get_shared_data(&self.directory) else { return };
        let mut peers = self.peers.borrow_mut();
        if cas.is_some() && cas == peers.1 {
            return;
        }
        let bytes = bytes.unwrap_or_default();
        *peers = (entries(&bytes).map(|(t, _)| t).filter(|&t| t != self.own).collect(), cas);
    }

    /// Starts (`true`) or stops keeping a copy of this Envoy's records for the feed: the records this VM routes and
    /// those it receives from the other VMs. Stopping drops what was kept.
    pub fn collect(&self, on: bool) {
        let mut c = self.collected.borrow_mut();
        match (on, c.is_some()) {
            (true, false) => *c = Some(Vec::new()),
            (false, true) => *c = None,
            _ => {}
        }
    }

    /// The records kept since the last call (empty when not collecting).
    pub fn take_collected(&self) -> Vec<u8> {
        self.collected.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Keeps `records` for the feed when collecting, up to [`MAX_REPORT_BYTES`] between two reports (more is
    /// counted as dropped).
    fn keep(&self, records: &[u8], metrics: &Metrics) {
        let mut c = self.collected.borrow_mut();
        let Some(kept) = c.as_mut() else { return };
        if kept.len() + records.len() > MAX_REPORT_BYTES {
            metrics.count(metric::DROPPED, 1);
            return;
        }
        kept.extend_from_slice(records);
    }

    /// Sends `record`, this VM's own, to every peer, as listed in the directory now (a VM that joined since the
    /// last tick included), and keeps it for the feed when collecting.
    pub fn publish(&self, record: &[u8], metrics: &Metrics) {
        self.keep(record, metrics);
        self.send(record, metrics);
    }

    /// Sends `records` that came from the other gateways to every peer (not kept for the feed).
    pub fn forward(&self, records: &[u8], metrics: &Metrics) {
        self.send(records, metrics);
    }

    fn send(&self, record: &[u8], metrics: &Metrics) {
        self.refresh_peers();
        let peers = self.peers.borrow();
        let mut sent = 0;
        let mut dropped = 0;
        for &p in peers.0.iter() {
            match hostcalls::enqueue_shared_queue(p, Some(record)) {
                Ok(()) => sent += 1,
                Err(_) => dropped += 1,
            }
        }
        if sent > 0 {
            metrics.count(metric::SENT, sent);
        }
        if dropped > 0 {
            metrics.count(metric::DROPPED, dropped);
        }
    }

    /// Applies every record waiting in this VM's queue to `router`. Records name endpoints by address, so while
    /// the router has no endpoints yet (a feed-driven list before this VM applied the first snapshot) they stay
    /// queued instead of being skipped.
    pub fn drain(&self, router: &mut Router, metrics: &Metrics) {
        if self.own == 0 || router.endpoints().is_empty() {
            return;
        }
        let mut applied = 0;
        let mut dropped = 0;
        while let Ok(Some(bytes)) = hostcalls::dequeue_shared_queue(self.own) {
            match router.learn(&bytes) {
                Ok(n) => {
                    applied += n as u64;
                    self.keep(&bytes, metrics);
                }
                Err(_) => dropped += 1,
            }
        }
        if applied > 0 {
            metrics.count(metric::APPLIED, applied);
        }
        if dropped > 0 {
            metrics.count(metric::DROPPED, dropped);
        }
    }
}

/// Bytes per directory entry.
const ENTRY: usize = 12;

/// Entries `(token, expiry)` of a directory value; a trailing partial entry is ignored.
fn entries(bytes: &[u8]) -> impl Iterator<Item = (u32, u64)> + '_ {
    bytes.chunks_exact(ENTRY).map(|c| {
        let t = u32::from_le_bytes(c[..4].try_into().expect("4 bytes"));
        let e = u64::from_le_bytes(c[4..].try_into().expect("8 bytes"));
        (t, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_outlive_four_ticks() {
        assert_eq!(entry_ttl(Duration::from_millis(500)), PEER_TTL);
        assert_eq!(entry_ttl(Duration::from_secs(60)), Duration::from_secs(240), "a tick of a minute");
    }

    #[test]
    fn directory_entries_decode_and_ignore_a_partial_tail() {
        let mut b = Vec::new();
        for (t, e) in [(3u32, 10u64), (9, u64::MAX)] {
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&e.to_le_bytes());
        }
        b.extend_from_slice(&[1, 2, 3]);
        assert_eq!(entries(&b).collect::<Vec<_>>(), vec![(3, 10), (9, u64::MAX)]);
        assert_eq!(entries(&[]).count(), 0);
    }
}
