//! Index records exchanged between routers that serve the same traffic — the Envoy workers of one Envoy, each of
//! which runs its own VM and so its own [`crate::Router`] and prefix index.
//!
//! PREFIX_AWARE learns where a prefix went only from the requests it routes itself. With several workers, a
//! conversation's next turn often reaches a worker that did not route the previous one: without exchange that
//! worker sees a miss and may place the turn elsewhere, splitting the conversation's cache. After each pick the
//! router hands out the chain it recorded ([`crate::Router::take_index_record`]); the filter sends it to the other
//! workers, which apply it ([`crate::Router::learn`]) before their next pick, so every worker routes with the
//! same index.
//!
//! Wire format of one record (little-endian), self-delimiting so several can be concatenated in one message:
//! `[VERSION: u8][block_size: u32][address length: u8][address bytes][chain length: u16][chain: u64 × length]`.
//! The block size travels with the record because a chain's hashes mean nothing under another block size (a
//! worker that has not applied a new configuration yet drops the record).
//!
//! ## Between gateways
//! Several gateway replicas (Envoys) serving one pool have the same problem one level up: a conversation's next
//! turn often reaches another Envoy. Each Envoy's feed poller reports the records its workers produced since its
//! last poll to the feed server (`POST <feed path>` + [`INDEX_PATH_SUFFIX`]) and gets back the records the other
//! Envoys reported since its cursor; the feed server keeps them in a [`RecordLog`]. The exchange is best-effort:
//! a record that arrives late or never only costs the hit a local index would have missed anyway.
//!
//! ## Pending work between gateways
//! A gateway predicts each endpoint's queue from the prefill work it sent there itself
//! ([`crate::EndpointLoad::pending_prefill`]); with several gateways that is its share of the queue only. The same
//! report therefore ends with a *pending section* — [`PENDING_SECTION`], then this Envoy's pending prefill work per
//! endpoint as [`counts`] — and the answer to a report that had one ends with the sum of the other gateways' latest
//! sections (each counted for [`PENDING_TTL_MS`] after it arrived), which the gateway adds to its own. A report
//! without the section gets an answer without it, so a filter that does not send one reads records only; and a
//! gateway sends one only to a feed server whose answers carry [`crate::headers::PENDING_HEADER`], so a feed server without
//! sections never sees one.
//!
//! ## Prefill speeds between gateways
//! A gateway learns each endpoint's prefill speed from its own misses ([`crate::prefill_rate`]); with N gateways each
//! sees a N-th of them, so it tells a slower server apart N times later, and follows a change of speed N times
//! more slowly. So a report may also carry a *fits section* before the pending section — [`FITS_SECTION`], the
//! section's length, then this Envoy's own fits ([`PrefillFits::to_bytes`]) — and the answer to a report that had
//! one carries the sum of the other gateways' latest fits ([`PrefillFits::merge`]; each counted for [`FITS_TTL_MS`]
//! after it arrived), which the gateway routes with beside its own. A gateway sends it at most every
//! [`FITS_REPORT_MS`], and only to a feed server whose answers carry [`crate::headers::FITS_HEADER`].

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::config::MAX_ENDPOINTS;
use crate::headers::{CURSOR_HEADER, REPORTER_HEADER};
use crate::prefill_rate::{PrefillFits, ENCODED_LEN};

/// Format version of a record (the first byte).
pub const VERSION: u8 = 1;

/// Most hashes one record carries; a longer chain is cut (its head is what later requests match first).
pub const MAX_CHAIN: usize = 4096;

/// One decoded record: `chain` was recorded under the endpoint at `address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRecord<'a> {
    /// Block size (bytes) the chain was hashed with.
    pub block_size: u32,
    /// `IP:port` of the endpoint the chain went to.
    pub address: &'a str,
    /// The recorded chain (block and checkpoint hashes, in recording order).
    pub chain: Vec<u64>,
}

/// Appends the record of `chain` under `address` to `out`. An address longer than 255 bytes (not an `IP:port`)
/// appends nothing and returns false.
pub fn encode(out: &mut Vec<u8>, block_size: usize, address: &str, chain: &[u64]) -> bool {
    let (Ok(len), Ok(bs)) = (u8::try_from(address.len()), u32::try_from(block_size)) else { return false };
    let chain = &chain[..chain.len().min(MAX_CHAIN)];
    out.reserve(8 + address.len() + 8 * chain.len());
    out.push(VERSION);
    out.extend_from_slice(&bs.to_le_bytes());
    out.push(len);
    out.extend_from_slice(address.as_bytes());
    out.extend_from_slice(&(chain.len() as u16).to_le_bytes());
    for h in chain {
        out.extend_from_slice(&h.to_le_bytes());
    }
    true
}

/// Decodes every record of `bytes`, in order. Stops at the first malformed record (an unknown version, a
/// truncated record, a non-UTF-8 address) and reports it as `Err` after the records before it.
pub fn decode(bytes: &[u8]) -> impl Iterator<Item = Result<IndexRecord<'_>, &'static str>> + '_ {
    let mut rest = bytes;
    let mut failed = false;
    std::iter::from_fn(move || {
        if rest.is_empty() || failed {
            return None;
        }
        let r = decode_one(rest);
        match r {
            Ok((rec, tail)) => {
                rest = tail;
                Some(Ok(rec))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}

fn decode_one(b: &[u8]) -> Result<(IndexRecord<'_>, &[u8]), &'static str> {
    let (&version, b) = b.split_first().ok_or("empty record")?;
    if version != VERSION {
        return Err("unknown record version");
    }
    let (bs, b) = split(b, 4).ok_or("truncated block size")?;
    let block_size = u32::from_le_bytes(bs.try_into().expect("4 bytes"));
    let (&len, b) = b.split_first().ok_or("truncated address length")?;
    let (addr, b) = split(b, usize::from(len)).ok_or("truncated address")?;
    let address = std::str::from_utf8(addr).map_err(|_| "address is not UTF-8")?;
    let (n, b) = split(b, 2).ok_or("truncated chain length")?;
    let n = usize::from(u16::from_le_bytes(n.try_into().expect("2 bytes")));
    let (hashes, rest) = split(b, n * 8).ok_or("truncated chain")?;
    let chain = hashes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok((IndexRecord { block_size, address, chain }, rest))
}

fn split(b: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (b.len() >= n).then(|| b.split_at(n))
}

/// First byte of the pending section that ends a report or an answer (records start with [`VERSION`]; the other
/// end of the byte range, so later record versions do not meet it).
pub const PENDING_SECTION: u8 = 0xff;

/// Most bytes of one pending section: [`MAX_ENDPOINTS`] entries of the longest address.
pub const MAX_PENDING_BYTES: usize = MAX_ENDPOINTS * (1 + 255 + 4);

/// First byte of the fits section, between a report's or an answer's records and its pending section:
/// `[FITS_SECTION][length: u32 LE][fits]`, the fits as [`PrefillFits::to_bytes`] writes them (records start with
/// [`VERSION`], so they do not meet it).
pub const FITS_SECTION: u8 = 0xfe;

/// Most bytes of the fits of one section: the pool's fit and [`MAX_ENDPOINTS`] endpoints' of the longest address.
pub const MAX_FITS_BYTES: usize = ENCODED_LEN + MAX_ENDPOINTS * (1 + 255 + ENCODED_LEN);

/// How long the feed server counts a gateway's fits after they arrived, ms: several of its reports
/// ([`FITS_REPORT_MS`]), so a gateway that is only late keeps counting and one that stopped stops soon after.
pub const FITS_TTL_MS: u64 = 10_000;

/// A gateway sends its fits at most once in this many ms. Fits change slowly (each sample weighs 1/64th of the
/// half-life's, [`crate::prefill_rate::HALF_LIFE`]), and those of a pool of a thousand endpoints take tens of KB.
pub const FITS_REPORT_MS: u64 = 1_000;

/// Most bytes of one report's body: [`MAX_REPORT_BYTES`] of records, a fits section of [`MAX_FITS_BYTES`], and the
/// pending section's first byte and its [`MAX_PENDING_BYTES`]. A feed server must accept bodies this large (web
/// frameworks default to less).
pub const MAX_EXCHANGE_BODY_BYTES: usize = MAX_REPORT_BYTES + 5 + MAX_FITS_BYTES + 1 + MAX_PENDING_BYTES;

/// Gateways whose pending sections a [`RecordLog`] keeps at once (the section that arrived longest ago goes first
/// when another reports): far more gateway replicas than one pool has.
pub const MAX_REPORTERS: usize = 256;

/// How long the feed server counts a gateway's pending section after it arrived, ms. A gateway reports every tick
/// ([`crate::config::FEED_TICK_MS`] or less) once its previous report was answered (within 1 s), so this is several
/// missed reports: a gateway that stopped (crashed, scaled in) stops counting soon after, one that is only late
/// keeps its work counted.
pub const PENDING_TTL_MS: u64 = 2_000;

/// Appends one per-endpoint count, `[address length: u8][address bytes][count: u32 LE]`; false (nothing appended)
/// for an address longer than 255 bytes (not an `IP:port`). The layout of the pending section and of the filter's
/// shared per-endpoint counters.
pub fn push_count(out: &mut Vec<u8>, address: &[u8], count: u32) -> bool {
    push_entry(out, address, &count.to_le_bytes())
}

/// Appends one per-endpoint entry, `[address length: u8][address bytes][value]` (what [`entries`] reads back);
/// false (nothing appended) for an address longer than 255 bytes (not an `IP:port`).
pub fn push_entry(out: &mut Vec<u8>, address: &[u8], value: &[u8]) -> bool {
    let Ok(len) = u8::try_from(address.len()) else { return false };
    out.push(len);
    out.extend_from_slice(address);
    out.extend_from_slice(value);
    true
}

/// The counts of `bytes` ([`push_count`]'s layout) in order, as `(address, count)`; stops at the first truncated
/// entry.
pub fn counts(bytes: &[u8]) -> impl Iterator<Item = (&[u8], u32)> + '_ {
    entries(bytes, 4).map(|(addr, count)| (addr, u32::from_le_bytes(count.try_into().expect("4 bytes"))))
}

/// The entries of a per-endpoint table laid out like [`push_count`]'s but with values of `value_len` bytes
/// (`[address length: u8][address bytes][value]`), in order, as `(address, value)`; stops at the first truncated
/// entry. The filter keeps its shared per-endpoint tables (loads, health) in this layout.
pub fn entries(bytes: &[u8], value_len: usize) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let (&len, tail) = rest.split_first()?;
        let (addr, tail) = split(tail, usize::from(len))?;
        let (value, tail) = split(tail, value_len)?;
        rest = tail;
        Some((addr, value))
    })
}

/// The parts of a report or an answer ([`split_report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sections<'a> {
    /// The records (malformed ones included, for [`decode`] to report).
    pub records: &'a [u8],
    /// The fits of the fits section, when there is one.
    pub fits: Option<&'a [u8]>,
    /// The fits section is shorter than its length says (`fits` holds what there is; a feed server refuses it).
    pub fits_cut: bool,
    /// The entries of the pending section, when there is one.
    pub pending: Option<&'a [u8]>,
    /// Bytes after a fits section that are not a pending section (none in a well-formed report).
    pub trailing: &'a [u8],
}

/// Splits a report or an answer into its records, its fits section and its pending section. Malformed records are
/// left in the records, for [`decode`] to report.
pub fn split_report(bytes: &[u8]) -> Sections<'_> {
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            PENDING_SECTION => {
                return Sections { records: &bytes[..at], pending: Some(&bytes[at + 1..]), ..Sections::default() }
            }
            FITS_SECTION => return split_fits(&bytes[..at], &bytes[at + 1..]),
            _ => {}
        }
        match decode_one(&bytes[at..]) {
            Ok((_, rest)) => at = bytes.len() - rest.len(),
            Err(_) => break,
        }
    }
    Sections { records: bytes, ..Sections::default() }
}

/// The sections from a fits section on (`rest` follows its first byte).
fn split_fits<'a>(records: &'a [u8], rest: &'a [u8]) -> Sections<'a> {
    let whole = split(rest, 4).and_then(|(len, rest)| {
        let len = usize::try_from(u32::from_le_bytes(len.try_into().expect("4 bytes"))).unwrap_or(usize::MAX);
        split(rest, len)
    });
    let Some((fits, after)) = whole else {
        return Sections { records, fits: Some(rest), fits_cut: true, ..Sections::default() };
    };
    match after.split_first() {
        Some((&PENDING_SECTION, pending)) => {
            Sections { records, fits: Some(fits), pending: Some(pending), ..Sections::default() }
        }
        _ => Sections { records, fits: Some(fits), trailing: after, ..Sections::default() },
    }
}

/// Appends a fits section holding `fits` ([`FITS_SECTION`]).
pub fn push_fits(out: &mut Vec<u8>, fits: &PrefillFits) {
    let bytes = fits.to_bytes();
    out.push(FITS_SECTION);
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&bytes);
}

/// Checks the fits of a fits section: at most [`MAX_FITS_BYTES`] and [`MAX_ENDPOINTS`] endpoints, every byte read
/// as fits ([`PrefillFits::from_bytes`] stops at the first malformed entry; what it read must be all).
fn parse_fits(bytes: &[u8]) -> Result<PrefillFits, String> {
    if bytes.len() > MAX_FITS_BYTES {
        return Err(format!("fits section: {} bytes, at most {MAX_FITS_BYTES}", bytes.len()));
    }
    let fits = PrefillFits::from_bytes(bytes);
    if fits.to_bytes().len() != bytes.len() {
        return Err("fits section: a truncated or malformed fit".into());
    }
    if fits.endpoints.len() > MAX_ENDPOINTS {
        return Err(format!("fits section: {} endpoints, at most {MAX_ENDPOINTS}", fits.endpoints.len()));
    }
    Ok(fits)
}

/// Checks a pending section: whole entries, UTF-8 addresses, at most [`MAX_ENDPOINTS`] of them.
fn parse_pending(bytes: &[u8]) -> Result<Vec<(String, u32)>, String> {
    if bytes.len() > MAX_PENDING_BYTES {
        return Err(format!("pending section: {} bytes, at most {MAX_PENDING_BYTES}", bytes.len()));
    }
    let mut out = Vec::new();
    let mut used = 0;
    for (addr, n) in counts(bytes) {
        used += 1 + addr.len() + 4;
        let addr = std::str::from_utf8(addr).map_err(|_| "pending section: an address is not UTF-8".to_string())?;
        out.push((addr.to_string(), n));
    }
    if used != bytes.len() {
        return Err("pending section: truncated entry".into());
    }
    if out.len() > MAX_ENDPOINTS {
        return Err(format!("pending section: {} endpoints, at most {MAX_ENDPOINTS}", out.len()));
    }
    Ok(out)
}

/// Keeps `section` as `reporter`'s latest, arrived at `now_ms`; when [`MAX_REPORTERS`] others are kept, the one that
/// arrived longest ago makes room.
fn keep_latest<T>(latest: &mut HashMap<u64, (u64, T)>, reporter: u64, now_ms: u64, section: T) {
    if !latest.contains_key(&reporter) && latest.len() >= MAX_REPORTERS {
        if let Some(oldest) = latest.iter().min_by_key(|(_, (at, _))| *at).map(|(r, _)| *r) {
            latest.remove(&oldest);
        }
    }
    latest.insert(reporter, (now_ms, section));
}

/// Appended to a feed's path for the gateway leg of the exchange: `POST <feed path>/index`.
pub const INDEX_PATH_SUFFIX: &str = "/index";

/// Most bytes of records one gateway reports in one poll, and most bytes one answer carries: a gateway keeps
/// what it routed between two polls up to this much (more is counted as dropped), and an answer that would be
/// larger stops early, the cursor telling the gateway where to go on at its next poll.
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// Records a [`RecordLog`] keeps (the oldest go first). 16,384 records are a few seconds of a busy pool's
/// requests (a record is ≈ 8 bytes per block of the key, under 1 KB for an 8 KB key), enough for a gateway that
/// polls every second to miss none.
pub const LOG_RECORDS: usize = 16_384;

/// The feed server's side of the gateway leg: the records every gateway reported, in arrival order, each with a
/// sequence number and its reporter, bounded to a number of records.
#[derive(Debug)]
pub struct RecordLog {
    records: VecDeque<(u64, u64, Vec<u8>)>,
    /// Sequence number of the next record (the first is 1, so cursor 0 means "from the start").
    next: u64,
    capacity: usize,
    /// The latest pending section of each reporter and when it arrived (ms, the caller's clock).
    pending: HashMap<u64, (u64, Vec<(String, u32)>)>,
    /// The latest fits of each reporter and when they arrived.
    fits: HashMap<u64, (u64, PrefillFits)>,
}

impl Default for RecordLog {
    fn default() -> Self {
        RecordLog::new(LOG_RECORDS)
    }
}

impl RecordLog {
    /// An empty log keeping the newest `capacity` records (at least 1).
    pub fn new(capacity: usize) -> RecordLog {
        RecordLog {
            records: VecDeque::new(),
            next: 1,
            capacity: capacity.max(1),
            pending: HashMap::new(),
            fits: HashMap::new(),
        }
    }

    /// The cursor after the newest record (what a gateway that has seen everything holds).
    pub fn cursor(&self) -> u64 {
        self.next - 1
    }

    /// Appends each record of `bytes` (concatenated records as [`encode`] writes them) under `reporter`, an id
    /// the reporting gateway keeps for its life. Returns how many were appended, or the reason the bytes are
    /// malformed (the records before the malformed one are kept: what a gateway sends is checked, not trusted).
    pub fn append(&mut self, reporter: u64, bytes: &[u8]) -> Result<usize, &'static str> {
        let mut n = 0;
        for rec in decode(bytes) {
            let rec = rec?;
            let mut one = Vec::new();
            if !encode(&mut one, rec.block_size as usize, rec.address, &rec.chain) {
                continue;
            }
            if self.records.len() == self.capacity {
                self.records.pop_front();
            }
            self.records.push_back((self.next, reporter, one));
            self.next += 1;
            n += 1;
        }
        Ok(n)
    }

    /// One report of a gateway, as the feed server receives it at `now_ms` (any millisecond clock that does not go
    /// back): the values of the [`REPORTER_HEADER`] and [`CURSOR_HEADER`] request headers and the body (records,
    /// then optionally the fits section and the pending section). Appends the records and answers with the other
    /// gateways' records since the cursor (at most [`MAX_REPORT_BYTES`]), then, when the report had a fits section,
    /// the sum of the other gateways' current fits, and when it had a pending section, the sum of the other
    /// gateways' current ones; and the cursor for the answer's [`CURSOR_HEADER`]. The feed server adds
    /// [`crate::headers::PENDING_HEADER`] and [`crate::headers::FITS_HEADER`] to every answer it serves (200).
    ///
    /// Errors (the feed server answers 400 with the text): a missing or malformed header, records over
    /// [`MAX_REPORT_BYTES`], malformed records (the well-formed records before them are kept), a malformed fits or
    /// pending section, or bytes after the fits section that are no pending section (the records are kept; the
    /// gateway's earlier section of that kind stops counting).
    pub fn serve(
        &mut self,
        reporter: Option<&str>,
        cursor: Option<&str>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<(Vec<u8>, u64), String> {
        let reporter = reporter
            .filter(|r| r.len() == 16)
            .and_then(|r| u64::from_str_radix(r, 16).ok())
            .ok_or_else(|| format!("header {REPORTER_HEADER} must be 16 hex digits"))?;
        let cursor = match cursor {
            None => 0,
            Some(c) => {
                c.trim().parse::<u64>().map_err(|_| format!("header {CURSOR_HEADER} must be a decimal number"))?
            }
        };
        let sections = split_report(body);
        if sections.records.len() > MAX_REPORT_BYTES {
            return Err(format!("{} bytes of records, at most {MAX_REPORT_BYTES} per report", sections.records.len()));
        }
        self.append(reporter, sections.records).map_err(|e| format!("index records rejected: {e}"))?;
        if sections.fits_cut {
            self.fits.remove(&reporter);
            return Err("fits section: shorter than its length".into());
        }
        if !sections.trailing.is_empty() {
            self.fits.remove(&reporter);
            return Err("bytes after the fits section that are not a pending section".into());
        }
        self.pending.retain(|_, (at, _)| now_ms.saturating_sub(*at) <= PENDING_TTL_MS);
        self.fits.retain(|_, (at, _)| now_ms.saturating_sub(*at) <= FITS_TTL_MS);
        let (mut answer, next) = self.since(cursor, reporter);
        if let Some(section) = sections.fits {
            let fits = parse_fits(section).inspect_err(|_| {
                self.fits.remove(&reporter);
            })?;
            keep_latest(&mut self.fits, reporter, now_ms, fits);
            let mut others = PrefillFits::default();
            others.merge(self.fits.iter().filter(|(r, _)| **r != reporter).map(|(_, (_, f))| f));
            push_fits(&mut answer, &others);
        }
        if let Some(section) = sections.pending {
            let entries = parse_pending(section).inspect_err(|_| {
                self.pending.remove(&reporter);
            })?;
            keep_latest(&mut self.pending, reporter, now_ms, entries);
            answer.push(PENDING_SECTION);
            for (address, n) in self.pending_of_others(reporter) {
                push_count(&mut answer, address.as_bytes(), n);
            }
        }
        Ok((answer, next))
    }

    /// The sum of the pending sections of reporters other than `reporter`, per endpoint (zero sums left out), for
    /// at most [`MAX_ENDPOINTS`] endpoints (so an answer's section is bounded like a report's).
    fn pending_of_others(&self, reporter: u64) -> BTreeMap<&str, u32> {
        let mut sum = BTreeMap::new();
        for (_, entries) in self.pending.iter().filter(|(r, _)| **r != reporter).map(|(_, v)| v) {
            for (address, n) in entries.iter().filter(|(_, n)| *n > 0) {
                if sum.len() >= MAX_ENDPOINTS && !sum.contains_key(address.as_str()) {
                    continue;
                }
                let s: &mut u32 = sum.entry(address.as_str()).or_default();
                *s = s.saturating_add(*n);
            }
        }
        sum
    }

    /// The records after `cursor` that reporters other than `reporter` sent, concatenated (at most
    /// [`MAX_REPORT_BYTES`], whole records), and the cursor to ask with next time. A cursor past the newest
    /// record (the feed server restarted and counts from the start again) reads from the start.
    pub fn since(&self, cursor: u64, reporter: u64) -> (Vec<u8>, u64) {
        let cursor = if cursor > self.cursor() { 0 } else { cursor };
        let mut out = Vec::new();
        let mut last = self.cursor();
        // Sequence numbers are consecutive, so the first record after `cursor` is found by position.
        let first = self.records.front().map_or(0, |r| r.0);
        let skip = usize::try_from((cursor + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        for (seq, from, bytes) in self.records.iter().skip(skip) {
            if *from == reporter {
                continue;
            }
            if !out.is_empty() && out.len() + bytes.len() > MAX_REPORT_BYTES {
                last = seq - 1;
                break;
            }
            out.extend_from_slice(bytes);
        }
        (out, last)
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn records_round_trip_and_concatenate() {
        let mut out = Vec::new();
        assert!(encode(&mut out, 128, "10.0.0.1:8000", &[1, 2, u64::MAX]));
        assert!(encode(&mut out, 64, "[::1]:9", &[]));
        let recs: Vec<_> = decode(&out).collect::<Result<_, _>>().expect("well-formed");
        assert_eq!(
            recs,
            vec![
                IndexRecord { block_size: 128, address: "10.0.0.1:8000", chain: vec![1, 2, u64::MAX] },
                IndexRecord { block_size: 64, address: "[::1]:9", chain: vec![] },
            ]
        );
    }

    #[test]
    fn long_addresses_and_chains_are_bounded() {
        let mut out = Vec::new();
        assert!(!encode(&mut out, 128, &"x".repeat(256), &[1]));
        assert!(out.is_empty(), "nothing written for a refused address");
        let long: Vec<u64> = (0..MAX_CHAIN as u64 + 10).collect();
        assert!(encode(&mut out, 128, "a:1", &long));
        let rec = decode(&out).next().expect("one").expect("well-formed");
        assert_eq!(rec.chain.len(), MAX_CHAIN);
        assert_eq!(rec.chain[..3], [0, 1, 2], "the head is kept");
    }

    fn chains(bytes: &[u8]) -> Vec<(String, Vec<u64>)> {
        decode(bytes).map(|r| r.expect("well-formed")).map(|r| (r.address.to_string(), r.chain)).collect()
    }

    #[test]
    fn the_log_returns_what_others_reported_since_the_cursor() {
        let mut log = RecordLog::new(100);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode(&mut a, 128, "10.0.0.1:80", &[1, 2]);
        encode(&mut a, 128, "10.0.0.2:80", &[3]);
        encode(&mut b, 128, "10.0.0.3:80", &[4]);
        assert_eq!(log.append(7, &a), Ok(2));
        assert_eq!(log.append(9, &b), Ok(1));
        assert_eq!(log.cursor(), 3);
        // Gateway 7 gets only gateway 9's record; gateway 9 only gateway 7's; a newcomer everything.
        let (got, c) = log.since(0, 7);
        assert_eq!((chains(&got), c), (vec![("10.0.0.3:80".into(), vec![4])], 3));
        let (got, c) = log.since(0, 9);
        assert_eq!(chains(&got).len(), 2);
        assert_eq!(c, 3);
        assert_eq!(chains(&log.since(0, 1).0).len(), 3);
        // Nothing new past the cursor.
        assert_eq!(log.since(3, 7), (Vec::new(), 3));
        // Only what came after the cursor.
        assert_eq!(chains(&log.since(1, 1).0), vec![("10.0.0.2:80".into(), vec![3]), ("10.0.0.3:80".into(), vec![4])]);
        // A cursor from before a restart of the feed server reads from the start.
        assert_eq!(chains(&log.since(1000, 1).0).len(), 3);
    }

    #[test]
    fn the_log_is_bounded_and_refuses_garbage_after_the_good_records() {
        let mut log = RecordLog::new(2);
        let mut recs = Vec::new();
        for i in 0..5u64 {
            encode(&mut recs, 128, "10.0.0.1:80", &[i]);
        }
        assert_eq!(log.append(1, &recs), Ok(5));
        assert_eq!(log.cursor(), 5);
        // Only the newest two are kept; a gateway behind the window gets those.
        assert_eq!(chains(&log.since(0, 2).0), vec![("10.0.0.1:80".into(), vec![3]), ("10.0.0.1:80".into(), vec![4])]);
        let mut bad = Vec::new();
        encode(&mut bad, 128, "10.0.0.9:80", &[9]);
        bad.extend_from_slice(&[9, 9, 9]);
        assert_eq!(log.append(1, &bad), Err("unknown record version"));
        assert_eq!(log.cursor(), 6, "the good record before the garbage is kept");
    }

    #[test]
    fn a_report_is_checked_before_it_is_kept() {
        let mut log = RecordLog::default();
        let mut rec = Vec::new();
        encode(&mut rec, 128, "10.0.0.1:80", &[5]);
        assert!(log.serve(None, None, &rec, 0).unwrap_err().contains(REPORTER_HEADER));
        assert!(log.serve(Some("xyz"), None, &rec, 0).unwrap_err().contains("16 hex digits"));
        assert!(log.serve(Some("00000000000000aa"), Some("-1"), &rec, 0).unwrap_err().contains(CURSOR_HEADER));
        assert!(log
            .serve(Some("00000000000000aa"), None, &vec![1; MAX_REPORT_BYTES + 1], 0)
            .unwrap_err()
            .contains("at most"));
        assert!(log.serve(Some("00000000000000aa"), None, &[7, 7], 0).unwrap_err().contains("rejected"));
        assert_eq!(log.cursor(), 0, "nothing kept from refused reports");
        // A well-formed report: kept, and the reporter's own record is not sent back to it.
        assert_eq!(log.serve(Some("00000000000000aa"), Some("0"), &rec, 0), Ok((Vec::new(), 1)));
        assert_eq!(log.serve(Some("00000000000000bb"), None, &[], 0), Ok((rec.clone(), 1)));
    }

    fn section(entries: &[(&str, u32)]) -> Vec<u8> {
        let mut out = vec![PENDING_SECTION];
        for (a, n) in entries {
            assert!(push_count(&mut out, a.as_bytes(), *n));
        }
        out
    }

    fn pending(answer: &[u8]) -> Option<Vec<(String, u32)>> {
        split_report(answer)
            .pending
            .map(|p| counts(p).map(|(a, n)| (String::from_utf8(a.to_vec()).expect("utf-8"), n)).collect())
    }

    #[test]
    fn a_report_splits_into_records_and_its_pending_section() {
        let mut body = Vec::new();
        encode(&mut body, 128, "10.0.0.1:80", &[u64::from(PENDING_SECTION); 3]);
        let records = body.len();
        body.extend(section(&[("10.0.0.1:80", 7)]));
        // A hash byte equal to the section's first byte inside a record does not end the records.
        let split = split_report(&body);
        assert_eq!((split.records, split.pending, split.fits), (&body[..records], Some(&body[records + 1..]), None));
        assert_eq!(split_report(&body[..records]), Sections { records: &body[..records], ..Sections::default() });
        assert_eq!(split_report(&[]), Sections::default());
        let garbage = [9u8, 2, 2];
        assert_eq!(
            split_report(&garbage),
            Sections { records: &garbage[..], ..Sections::default() },
            "malformed records stay records, for decode to refuse"
        );
    }

    fn fits_of(samples: &[(&str, u32)]) -> PrefillFits {
        let mut fits = PrefillFits::default();
        for &(address, n) in samples {
            for i in 0..n {
                fits.observe(address, 1_000 + i * 997, 2 + u64::from(i), |_| true);
            }
        }
        fits
    }

    #[test]
    fn a_report_splits_into_records_fits_and_pending_sections() {
        let mut body = Vec::new();
        encode(&mut body, 128, "10.0.0.1:80", &[u64::from(FITS_SECTION); 2]);
        let records = body.len();
        let fits = fits_of(&[("10.0.0.1:80", 3)]);
        push_fits(&mut body, &fits);
        let with_fits = body.clone();
        body.extend(section(&[("10.0.0.1:80", 7)]));
        let split = split_report(&body);
        assert_eq!(split.records, &body[..records]);
        assert_eq!(parse_fits(split.fits.expect("fits")).expect("well-formed").to_bytes(), fits.to_bytes());
        assert_eq!(split.pending, Some(&body[with_fits.len() + 1..]));
        assert!(split.trailing.is_empty());
        let split = split_report(&with_fits);
        assert_eq!((split.fits.map(<[u8]>::len), split.pending), (Some(fits.to_bytes().len()), None));
        // Cut short, even at an entry's end (what is there would read as fits with fewer endpoints): the section is
        // cut.
        let cut = split_report(&with_fits[..with_fits.len() - 3]);
        assert!(cut.fits_cut && parse_fits(cut.fits.expect("the section")).is_err());
        let entry = 1 + "10.0.0.1:80".len() + ENCODED_LEN;
        assert!(split_report(&with_fits[..with_fits.len() - entry]).fits_cut, "cut at an entry's end");
        let with_len = |extra: u32| {
            let mut b = body.clone();
            let at = records + 1;
            let len = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
            b[at..at + 4].copy_from_slice(&(len + extra).to_le_bytes());
            b
        };
        let long = with_len(1_000);
        let split = split_report(&long);
        assert!(split.fits_cut && split.pending.is_none(), "a length past the end takes nothing after it");
        // A length that runs into the pending section: the fits do not parse, and what is left is no section.
        let into = with_len(5);
        let split = split_report(&into);
        assert!(parse_fits(split.fits.expect("fits")).is_err() && split.pending.is_none());
        assert!(RecordLog::default().serve(Some("00000000000000aa"), None, &into, 0).is_err());
        assert!(!split_report(&body).fits_cut);
        // Anything but a pending section after the fits is left over.
        let mut odd = with_fits.clone();
        odd.extend_from_slice(&[1, 2]);
        assert_eq!(split_report(&odd).trailing, &[1, 2]);
    }

    #[test]
    fn each_gateway_gets_the_sum_of_the_others_fits_while_they_are_fresh() {
        let mut log = RecordLog::default();
        let (a, b, c) = (Some("00000000000000aa"), Some("00000000000000bb"), Some("00000000000000cc"));
        let report = |fits: &PrefillFits| {
            let mut out = Vec::new();
            push_fits(&mut out, fits);
            out
        };
        let fits = |answer: &[u8]| split_report(answer).fits.map(|f| parse_fits(f).expect("well-formed fits"));
        let samples = |f: &PrefillFits, address: &str| {
            f.endpoints.iter().find(|(a, _)| a == address).map(|(_, fit)| fit.samples())
        };
        let n = Some;
        let (answer, _) = log.serve(a, None, &report(&fits_of(&[("10.0.0.1:80", 20)])), 1_000).expect("served");
        assert_eq!(fits(&answer).map(|f| f.pool.samples()), Some(0), "nobody else reported yet");
        let (answer, _) =
            log.serve(b, None, &report(&fits_of(&[("10.0.0.1:80", 5), ("10.0.0.2:80", 7)])), 1_100).expect("served");
        let got = fits(&answer).expect("B reported fits, so it gets the others'");
        assert_eq!((samples(&got, "10.0.0.1:80"), samples(&got, "10.0.0.2:80")), (n(20), None), "A's only");
        // C gets A's and B's added up; a report without a fits section gets none.
        let (answer, _) = log.serve(c, None, &report(&PrefillFits::default()), 1_200).expect("served");
        let got = fits(&answer).expect("fits");
        assert_eq!((samples(&got, "10.0.0.1:80"), samples(&got, "10.0.0.2:80")), (n(25), n(7)));
        assert_eq!(got.pool.samples(), 32);
        assert!(fits(&log.serve(c, None, &[], 1_300).expect("served").0).is_none());
        // A's fits stop counting FITS_TTL_MS after they arrived.
        let (answer, _) =
            log.serve(c, None, &report(&PrefillFits::default()), 1_000 + FITS_TTL_MS + 1).expect("served");
        let got = fits(&answer).expect("fits");
        assert_eq!((samples(&got, "10.0.0.1:80"), samples(&got, "10.0.0.2:80")), (n(5), n(7)), "B's only");
        // Malformed fits: refused, and the reporter's earlier fits stop counting. A and B report fresh fits first.
        let t = 20_000;
        log.serve(a, None, &report(&fits_of(&[("10.0.0.1:80", 20)])), t).expect("served");
        log.serve(b, None, &report(&fits_of(&[("10.0.0.2:80", 7)])), t).expect("served");
        let mut cut = report(&fits_of(&[("10.0.0.3:80", 2)]));
        cut.truncate(cut.len() - 1);
        assert!(log.serve(b, None, &cut, t + 10).unwrap_err().contains("fits section"));
        let mut garbled = report(&fits_of(&[("10.0.0.3:80", 2)]));
        let end = garbled.len();
        garbled[end - ENCODED_LEN..].fill(0xff);
        assert!(log.serve(b, None, &garbled, t + 10).unwrap_err().contains("fits section"), "non-finite sums");
        let (answer, _) = log.serve(c, None, &report(&PrefillFits::default()), t + 20).expect("served");
        let got = fits(&answer).expect("fits");
        assert_eq!((samples(&got, "10.0.0.1:80"), samples(&got, "10.0.0.2:80")), (n(20), None), "B's were dropped");
        let mut trailing = report(&PrefillFits::default());
        trailing.push(1);
        assert!(log.serve(a, None, &trailing, t + 30).unwrap_err().contains("after the fits section"));
        let (answer, _) = log.serve(c, None, &report(&PrefillFits::default()), t + 40).expect("served");
        assert_eq!(fits(&answer).expect("fits").endpoints.len(), 0, "A's were dropped with its bad report");
    }

    #[test]
    fn each_gateway_gets_the_sum_of_the_others_pending_work_while_it_is_fresh() {
        let mut log = RecordLog::default();
        let (a, b, c) = (Some("00000000000000aa"), Some("00000000000000bb"), Some("00000000000000cc"));
        let mut rec = Vec::new();
        encode(&mut rec, 128, "10.0.0.1:80", &[5]);
        let mut with_rec = rec.clone();
        with_rec.extend(section(&[("10.0.0.1:80", 100), ("10.0.0.2:80", 0)]));
        let (answer, _) = log.serve(a, None, &with_rec, 1_000).expect("served");
        assert_eq!(pending(&answer), Some(vec![]), "nobody else reported yet");
        let (answer, _) =
            log.serve(b, None, &section(&[("10.0.0.1:80", 20), ("10.0.0.3:80", 5)]), 1_100).expect("served");
        assert_eq!(split_report(&answer).records, &rec[..], "B gets A's record before the section");
        assert_eq!(pending(&answer), Some(vec![("10.0.0.1:80".into(), 100)]), "zero counts are left out");
        let (answer, _) = log.serve(c, None, &section(&[]), 1_200).expect("served");
        assert_eq!(pending(&answer), Some(vec![("10.0.0.1:80".into(), 120), ("10.0.0.3:80".into(), 5)]));
        // A's own work is not sent back to it.
        let (answer, _) = log.serve(a, Some("1"), &section(&[("10.0.0.1:80", 100)]), 1_300).expect("served");
        assert_eq!(pending(&answer), Some(vec![("10.0.0.1:80".into(), 20), ("10.0.0.3:80".into(), 5)]));
        // A report without a section gets records only; B's section still counts for others.
        let (answer, _) = log.serve(c, None, &[], 1_400).expect("served");
        assert_eq!(pending(&answer), None);
        // B stops reporting: its work stops counting PENDING_TTL_MS after its last report.
        let (answer, _) = log.serve(c, Some("1"), &section(&[]), 1_100 + PENDING_TTL_MS).expect("served");
        assert_eq!(pending(&answer), Some(vec![("10.0.0.1:80".into(), 120), ("10.0.0.3:80".into(), 5)]));
        let (answer, _) = log.serve(c, Some("1"), &section(&[]), 1_101 + PENDING_TTL_MS).expect("served");
        assert_eq!(pending(&answer), Some(vec![("10.0.0.1:80".into(), 100)]));
    }

    #[test]
    fn a_malformed_pending_section_is_refused_after_the_records_are_kept() {
        let mut log = RecordLog::default();
        let mut body = Vec::new();
        encode(&mut body, 128, "10.0.0.1:80", &[5]);
        let mut truncated = body.clone();
        truncated.extend(section(&[("10.0.0.1:80", 1)]));
        truncated.pop();
        let e = log.serve(Some("00000000000000aa"), None, &truncated, 0).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        assert_eq!(log.cursor(), 1, "the record before the section is kept");
        let mut bad = vec![PENDING_SECTION];
        push_count(&mut bad, &[0xff, 0xfe], 1);
        assert!(log.serve(Some("00000000000000aa"), None, &bad, 0).unwrap_err().contains("UTF-8"));
        let mut many = vec![PENDING_SECTION];
        for i in 0..=MAX_ENDPOINTS {
            push_count(&mut many, format!("10.0.{}.{}:80", i / 256, i % 256).as_bytes(), 1);
        }
        assert!(log.serve(Some("00000000000000aa"), None, &many, 0).unwrap_err().contains("at most"));
        // Nothing of the refused sections counts for the others.
        let (answer, _) = log.serve(Some("00000000000000bb"), Some("1"), &section(&[]), 0).expect("served");
        assert_eq!(pending(&answer), Some(vec![]));
    }

    #[test]
    fn pending_sections_are_bounded_in_size_and_in_reporters() {
        let mut log = RecordLog::default();
        // The records and the section are bounded apart: a full report of records still carries its section.
        let mut body = Vec::new();
        while body.len() < MAX_REPORT_BYTES - 100 {
            encode(&mut body, 128, "10.0.0.1:80", &[1; 8]);
        }
        assert!(body.len() <= MAX_REPORT_BYTES);
        body.extend(section(&[("10.0.0.1:80", 9)]));
        for i in 0..100 {
            push_count(&mut body, format!("10.0.1.{i}:80").as_bytes(), 1);
        }
        assert!(body.len() > MAX_REPORT_BYTES, "records and section together over the records' bound");
        log.serve(Some("0000000000000001"), None, &body, 0).expect("records under the bound, section apart");
        let mut big = vec![PENDING_SECTION];
        big.resize(MAX_PENDING_BYTES + 2, 0);
        assert!(log.serve(Some("0000000000000001"), None, &big, 0).unwrap_err().contains("at most"));
        // A refused section takes the reporter's earlier one with it.
        let (answer, _) = log.serve(Some("0000000000000002"), Some("999999"), &section(&[]), 0).expect("served");
        assert_eq!(pending(&answer), Some(vec![]), "gateway 1's section went with its refused report");
        // At most MAX_REPORTERS sections: the one that arrived longest ago goes first.
        let mut log = RecordLog::default();
        for r in 1..=MAX_REPORTERS as u64 + 1 {
            let reporter = format!("{r:016x}");
            log.serve(Some(&reporter), None, &section(&[("10.0.0.1:80", 1)]), r).expect("served");
        }
        assert_eq!(log.pending.len(), MAX_REPORTERS);
        assert!(!log.pending.contains_key(&1), "the oldest section was dropped");
        let (answer, _) = log.serve(Some(&format!("{:016x}", 1000)), Some("0"), &section(&[]), 500).expect("served");
        assert_eq!(pending(&answer), Some(vec![("10.0.0.1:80".into(), MAX_REPORTERS as u32 - 1)]));
    }

    #[test]
    fn an_answer_is_bounded_and_its_cursor_says_where_to_go_on() {
        let mut log = RecordLog::new(10_000);
        let chain: Vec<u64> = (0..1000).collect();
        let mut recs = Vec::new();
        for _ in 0..300 {
            encode(&mut recs, 128, "10.0.0.1:80", &chain);
        }
        log.append(1, &recs).expect("well-formed");
        // 300 records of ≈ 8 KB: each answer stays under the bound, and following the cursor gets every record once.
        let (mut cursor, mut got, mut answers) = (0, 0, 0);
        while cursor < log.cursor() {
            let (bytes, next) = log.since(cursor, 2);
            assert!(
                bytes.len() <= MAX_REPORT_BYTES && next > cursor,
                "{} bytes, cursor {cursor} -> {next}",
                bytes.len()
            );
            got += chains(&bytes).len();
            assert_eq!(got as u64, next, "the cursor counts exactly the records delivered");
            (cursor, answers) = (next, answers + 1);
        }
        assert_eq!(got, 300, "nothing lost between answers");
        assert!(answers >= 3, "{answers} answers for 2.4 MB");
    }

    #[test]
    fn malformed_input_stops_with_an_error_after_the_good_records() {
        let mut out = Vec::new();
        encode(&mut out, 128, "a:1", &[7]);
        let good = out.len();
        encode(&mut out, 128, "b:2", &[8, 9]);
        // Every truncation of the second record is reported, the first still decoded.
        for cut in good + 1..out.len() {
            let recs: Vec<_> = decode(&out[..cut]).collect();
            assert_eq!(recs.len(), 2, "cut at {cut}");
            assert!(recs[0].is_ok() && recs[1].is_err(), "cut at {cut}: {recs:?}");
        }
        assert_eq!(decode(&[9, 0, 0]).next(), Some(Err("unknown record version")));
        let mut bad_utf8 = Vec::new();
        encode(&mut bad_utf8, 128, "ab", &[]);
        bad_utf8[6] = 0xff;
        assert_eq!(decode(&bad_utf8).next(), Some(Err("address is not UTF-8")));
        assert_eq!(decode(&[]).count(), 0);
    }
}
