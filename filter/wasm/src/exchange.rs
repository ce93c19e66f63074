//! One prefix index per Envoy, not per worker: every VM that routes (each Envoy worker's) appends the index record
//! of each request it routes to a log in shared data, and before each pick applies what the other VMs appended
//! since ([`warmpath_core::exchange`]), so all workers route with the same knowledge.
//!
//! The log of one plugin is a ring of [`LOG_SLOTS`] shared-data entries (`warmpath.index_log.<plugin>.<slot>`) and
//! a head (`warmpath.index_log.<plugin>.head`: the number of records ever appended, u64 LE). A writer reserves
//! sequence number `n` by a compare-and-swap of the head from `n` to `n + 1`, then writes slot `n % LOG_SLOTS` as
//! `[n: u64 LE][writer: u64 LE][kind: u8][records]`. A reader keeps the sequence number it has read up to; it reads
//! the head, then each slot up to it, and applies the records other writers appended. A slot that still holds an
//! older sequence number was reserved but not written yet: the reader stops there and goes on at its next read
//! (unless the head ran [`GIVE_UP_AFTER`] records past it: then the host refused the write). A
//! slot that holds a newer one was overwritten before this reader got to it (it fell more than [`LOG_SLOTS`]
//! records behind): that record is lost (counted), and the reader routes as it would without it.
//!
//! Why a log the readers pull, and not a message to each VM: a proxy-wasm shared queue wakes the receiving thread
//! on every enqueue, and at 8 workers those wake-ups cost as much Envoy CPU as the rest of the filter's work per
//! request (BENCHMARKS.md §1, "Cost of the exchange"). Nothing wakes anyone here. Cost per request with W routing
//! VMs: after the pick, a head read and write to reserve a slot and the slot's write; before it, a head read and
//! one slot read per record the others appended (W − 1 per request, as the queues' dequeues were).
//!
//! The main thread's two VMs never route, so they never read the log (except the one holding the feed poller's
//! lease, which reads it to report the records to the feed). A worker that has routed reads the log on every tick
//! too, so an idle worker stays current; one that has not routed yet catches up on what the ring still holds at its
//! first pick. Everything fails soft: a host error loses that record (the other workers then route as they would
//! without it), never a request.
//!
//! Between gateways: the VM that holds the feed poller's lease also keeps a copy of every record it routes or
//! reads from the other VMs ([`Exchange::collect`]), which the poller reports to the feed server; the records of
//! the other gateways that come back are applied there and appended to the log marked as forwarded
//! ([`Exchange::forward`]), which the other VMs apply but do not keep for the feed, so nothing is reported twice
//! while the lease stays put.

use std::cell::{Cell, RefCell};

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use warmpath_core::exchange::MAX_REPORT_BYTES;
use warmpath_core::Router;

use crate::metrics::Metrics;

/// Slots in a plugin's log: how many records a reader may fall behind before it loses the oldest. A worker reads at
/// every pick and every tick (at most 200 ms), so at 2,048 slots one loses records only if the Envoy routes more
/// than about 10,000 requests a second while that worker receives none. Memory: the slots hold the last 2,048
/// records, about 8 bytes per block of each key (0.5–2 MB for prompts of 2,000–8,000 tokens).
pub const LOG_SLOTS: u64 = 2048;

/// How far the head may run past a slot still not written before a reader gives up on it: a writer writes the slot
/// it reserved at once, so this many records later it never will (the host refused the write).
const GIVE_UP_AFTER: u64 = 64;

/// Compare-and-swap attempts to reserve a slot (the workers contend only while appending at the same moment).
const MAX_CAS_ATTEMPTS: usize = 16;

/// Bytes of a slot's header: sequence number, writer, kind.
const HEADER: usize = 17;

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// A record this Envoy routed (kept for the feed by the VM that reports to it).
    Own = 0,
    /// Records of other gateways, received from the feed (not reported again).
    Forwarded = 1,
}

/// Counters (see `metrics`).
mod metric {
    /// Index records appended to the log for the other VMs (one per request routed).
    pub const SENT: &str = "warmpath.index_exchange.sent";
    /// Records of other VMs read from the log and applied to this VM's index.
    pub const APPLIED: &str = "warmpath.index_exchange.applied";
    /// Records lost: malformed, overwritten before this VM read them, refused by the host, or more than the feed
    /// takes in one report.
    pub const DROPPED: &str = "warmpath.index_exchange.dropped";
}

/// A slot's value: `[seq][writer][kind][records]`.
fn slot_value(seq: u64, writer: u64, kind: Kind, records: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + records.len());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&writer.to_le_bytes());
    v.push(kind as u8);
    v.extend_from_slice(records);
    v
}

/// A slot's sequence number, writer, kind and records (`None`: not a slot value).
fn parse_slot(v: &[u8]) -> Option<(u64, u64, Kind, &[u8])> {
    if v.len() < HEADER {
        return None;
    }
    let seq = u64::from_le_bytes(v[..8].try_into().ok()?);
    let writer = u64::from_le_bytes(v[8..16].try_into().ok()?);
    let kind = match v[16] {
        0 => Kind::Own,
        1 => Kind::Forwarded,
        _ => return None,
    };
    Some((seq, writer, kind, &v[HEADER..]))
}

/// What a reader at `next` does with a slot read for sequence number `next`.
#[derive(Debug, PartialEq, Eq)]
enum Slot<'a> {
    /// The record `next`, by its writer, with its kind and records: apply it (unless this VM wrote it) and go on.
    Record(u64, Kind, &'a [u8]),
    /// Still an older record (`next` was reserved but not written yet, or never written): stop, read it later.
    NotYet,
    /// A newer record overwrote it: `next` is lost; go on.
    Overwritten,
}

/// Classifies the slot value `v` (`None`: the entry does not exist yet) read for sequence number `next`.
fn classify(v: Option<&[u8]>, next: u64) -> Slot<'_> {
    match v.and_then(parse_slot) {
        Some((seq, writer, kind, records)) if seq == next => Slot::Record(writer, kind, records),
        Some((seq, ..)) if seq > next => Slot::Overwritten,
        // An empty or foreign value: treat as not written (a writer writes every reserved slot).
        _ => Slot::NotYet,
    }
}

/// Where a reader at `cursor` (`None`: never read) starts for a log whose head is `head`, and how many records it
/// has lost: a reader that never read starts at the oldest record the ring holds, as does one that fell further
/// behind than the ring holds.
fn start(cursor: Option<u64>, head: u64) -> (u64, u64) {
    let oldest = head.saturating_sub(LOG_SLOTS);
    match cursor {
        None => (oldest, 0),
        Some(c) if c < oldest => (oldest, oldest - c),
        Some(c) => (c, 0),
    }
}

/// This VM's part in the exchange of one plugin.
pub struct Exchange {
    /// Key prefix of the plugin's log.
    log: String,
    /// Key of the log's head (`<log>.head`).
    head_key: String,
    /// This VM's writer id: no other VM of this Envoy has it (`shared::unique_id`), never 0.
    writer: u64,
    /// The sequence number this VM has read the log up to (`None`: never read).
    cursor: Cell<Option<u64>>,
    /// True once this VM routed a request: from then on it reads the log on every tick too.
    routes: Cell<bool>,
    /// This Envoy's records kept for the feed while this VM polls it (`None`: not polling).
    collected: RefCell<Option<Vec<u8>>>,
}

impl Exchange {
    /// This VM's part in the exchange of `plugin`; `unique` distinguishes it from the other VMs of this Envoy
    /// (`shared::unique_id`): a reader skips the records that carry its own id. Creates the log's head if it does
    /// not exist yet (called at configure time, before traffic: Envoy ignores the compare-and-swap token when it
    /// creates a key, so the head must exist before writers race on it).
    pub fn join(plugin: &str, unique: u64) -> Exchange {
        let log = format!("warmpath.index_log.{plugin}");
        let x = Exchange {
            head_key: format!("{log}.head"),
            log,
            writer: unique.max(1),
            cursor: Cell::new(None),
            routes: Cell::new(false),
            collected: RefCell::new(None),
        };
        if let Ok((None, _)) = hostcalls::get_shared_data(&x.head_key) {
            let _ = hostcalls::set_shared_data(&x.head_key, Some(&0u64.to_le_bytes()), None);
        }
        x
    }

    /// This VM's writer id (logged at configure time, so a test can check no two VMs share one).
    pub fn writer(&self) -> u64 {
        self.writer
    }

    fn slot_key(&self, seq: u64) -> String {
        format!("{}.{}", self.log, seq % LOG_SLOTS)
    }

    /// The log's head and its CAS token (`None` on a host error).
    fn head(&self) -> Option<(u64, Option<u32>)> {
        let (bytes, cas) = hostcalls::get_shared_data(&self.head_key).ok()?;
        let head = bytes.and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?))).unwrap_or(0);
        Some((head, cas))
    }

    /// Starts (`true`) or stops keeping a copy of this Envoy's records for the feed: the records this VM routes and
    /// those it reads from the other VMs. Stopping drops what was kept.
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

    /// Appends `record`, this VM's own, to the log for the other VMs, and keeps it for the feed when collecting.
    pub fn publish(&self, record: &[u8], metrics: &Metrics) {
        self.routes.set(true);
        self.keep(record, metrics);
        self.append(record, Kind::Own, metrics);
    }

    /// Appends `records` that came from the other gateways to the log for the other VMs (not kept for the feed).
    pub fn forward(&self, records: &[u8], metrics: &Metrics) {
        self.append(records, Kind::Forwarded, metrics);
    }

    fn append(&self, records: &[u8], kind: Kind, metrics: &Metrics) {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let Some((head, cas)) = self.head() else { break };
            match hostcalls::set_shared_data(&self.head_key, Some(&(head + 1).to_le_bytes()), cas) {
                Ok(()) => {
                    let v = slot_value(head, self.writer, kind, records);
                    match hostcalls::set_shared_data(&self.slot_key(head), Some(&v), None) {
                        Ok(()) => metrics.count(metric::SENT, 1),
                        Err(_) => metrics.count(metric::DROPPED, 1),
                    }
                    return;
                }
                Err(Status::CasMismatch) => continue,
                Err(_) => break,
            }
        }
        metrics.count(metric::DROPPED, 1);
    }

    /// On the tick: a VM that has routed reads the log, so that it stays current while it receives no requests.
    pub fn on_tick(&self, router: &mut Router, metrics: &Metrics) {
        if self.routes.get() {
            self.drain(router, metrics);
        }
    }

    /// Applies to `router` what the other VMs appended to the log since this VM last read it. Records name endpoints
    /// by address, so while the router has no endpoints yet (a feed-driven list before this VM applied the first
    /// snapshot) the log is left unread; the ring keeps the last [`LOG_SLOTS`] records for later.
    pub fn drain(&self, router: &mut Router, metrics: &Metrics) {
        if router.endpoints().is_empty() {
            return;
        }
        let Some((head, _)) = self.head() else { return };
        let (mut next, mut dropped) = start(self.cursor.get(), head);
        let mut applied = 0;
        while next < head {
            let value = hostcalls::get_shared_data(&self.slot_key(next)).ok().and_then(|(v, _)| v);
            match classify(value.as_deref(), next) {
                Slot::NotYet if head - next <= GIVE_UP_AFTER => break,
                Slot::NotYet | Slot::Overwritten => dropped += 1,
                Slot::Record(writer, kind, records) => {
                    if writer != self.writer {
                        match router.learn(records) {
                            Ok(n) => {
                                applied += n as u64;
                                if kind == Kind::Own {
                                    self.keep(records, metrics);
                                }
                            }
                            Err(_) => dropped += 1,
                        }
                    }
                }
            }
            next += 1;
        }
        self.cursor.set(Some(next));
        if applied > 0 {
            metrics.count(metric::APPLIED, applied);
        }
        if dropped > 0 {
            metrics.count(metric::DROPPED, dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_value_reads_back() {
        let v = slot_value(42, 7, Kind::Forwarded, b"rec");
        assert_eq!(parse_slot(&v), Some((42, 7, Kind::Forwarded, &b"rec"[..])));
        assert_eq!(parse_slot(&v[..HEADER - 1]), None, "too short");
        let mut bad = v.clone();
        bad[16] = 9;
        assert_eq!(parse_slot(&bad), None, "unknown kind");
    }

    #[test]
    fn a_reader_applies_its_slot_waits_for_an_unwritten_one_and_skips_an_overwritten_one() {
        let own = |seq| slot_value(seq, 1, Kind::Own, b"r");
        assert_eq!(classify(Some(&own(5)), 5), Slot::Record(1, Kind::Own, &b"r"[..]));
        assert_eq!(classify(Some(&own(5 - 1)), 5), Slot::NotYet, "reserved, not written yet");
        assert_eq!(classify(None, 5), Slot::NotYet, "never written");
        assert_eq!(classify(Some(&[]), 5), Slot::NotYet);
        assert_eq!(classify(Some(&own(5 + LOG_SLOTS)), 5), Slot::Overwritten);
    }

    #[test]
    fn a_reader_starts_at_the_oldest_record_the_ring_holds() {
        assert_eq!(start(None, 10), (0, 0), "a new reader catches up on everything");
        assert_eq!(start(None, 10 + LOG_SLOTS), (10, 0), "as far back as the ring holds");
        assert_eq!(start(Some(7), 10), (7, 0));
        assert_eq!(start(Some(3), 10 + LOG_SLOTS), (10, 7), "fell behind: the 7 records overwritten are lost");
    }
}
