//! The endpoint/load feed poller: one poller per Envoy, elected among the VMs through a lease in shared
//! data, fetches the controller's versioned snapshot (`GET feed.path` on Envoy cluster `feed.cluster`) every
//! `feed.interval_ms` and publishes it in shared data; every VM applies a newer published snapshot to its router on
//! its own tick.
//!
//! When the feed is unreachable or answers garbage, the last good snapshot stays in force and the failure is
//! counted (`warmpath.feed.failures.<cause>`). Endpoint-set changes and the servers' reported loads go to the plugin's own router together
//! (`Router::set_feed_endpoints`), which keeps the prefix index and the in-flight counters of endpoints that stay.
//!
//! On every tick (with a feed 50 ms, or `feed.interval_ms` when shorter, so a slow load feed does not slow the
//! exchange) the poller runs the gateway leg of the index exchange (`warmpath_core::exchange`): it reports
//! the index records this Envoy's VMs produced since the last report (`POST <path>/index`, kept by the VM while it
//! holds the lease, `Exchange::collect`) and applies the records the other gateways reported, forwarding them to
//! this Envoy's other VMs. A feed server without that route (404), or any failure, costs only the records of that
//! round (counted in `warmpath.feed.failures.index`); routing goes on with this Envoy's own index.
//!
//! While the feed's last answer said it takes them (`PENDING_HEADER`), the report ends with this Envoy's pending prefill
//! work per endpoint, and the answer with the sum of the other gateways' (`warmpath_core::exchange`, "Pending work
//! between gateways"). The poller stores that sum in shared data with the time it arrived ([`remote_pending_key`]);
//! every VM adds it to its own pending work when it routes, until a newer answer replaces it or it is
//! [`remote_pending_max_age`] old (then the feed has stopped answering, and the work it said has been served).
//!
//! Likewise, while the feed's last answer said it takes them (`FITS_HEADER`), a report at most every
//! `FITS_REPORT_MS` carries this Envoy's prefill-speed fits, and its answer the sum of the other gateways'
//! (`warmpath_core::exchange`, "Prefill speeds between gateways"). The poller stores that sum with its arrival time
//! ([`remote_fits_key`]); every VM routes with it beside its own fits until it is `FITS_TTL_MS` old.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use log::{info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use warmpath_core::exchange::{push_fits, split_report, FITS_REPORT_MS, INDEX_PATH_SUFFIX, PENDING_SECTION};
use warmpath_core::feed::{server_loads_stale_after_ms, FeedSnapshot};
use warmpath_core::headers::{CURSOR_HEADER, FITS_HEADER, PENDING_HEADER, REPORTER_HEADER};
use warmpath_core::{FeedSettings, Router, ServerLoad};

use crate::exchange::Exchange;
use crate::metrics::Metrics;
use crate::shared;

/// Counters of the gateway leg of the index exchange (see `metrics`).
mod metric {
    /// Index records this Envoy reported to the feed.
    pub const REPORTED: &str = "warmpath.index_exchange.reported";
    /// Index records of other gateways received from the feed and applied.
    pub const RECEIVED: &str = "warmpath.index_exchange.received";
}

/// The `:status` of the answer at hand; `None` for a failed call (connection refused, timeout), which arrives with
/// no headers at all.
fn status() -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok().flatten()
}

/// Shared-data key prefix of the latest good snapshot (its JSON bytes, as served); the feed's cluster and path
/// complete the key, so plugins polling different feeds in one Envoy keep apart.
const SNAPSHOT_KEY: &str = "warmpath.feed.snapshot.";
/// Shared-data key prefix of the poller lease (see `shared::take_lease`), completed like `SNAPSHOT_KEY`.
const LEASE_KEY: &str = "warmpath.feed.lease.";
/// A lease lasts this many poll intervals, so a vanished owner (VM torn down) is replaced after a few ticks.
const LEASE_INTERVALS: u64 = 3;
/// Shared-data key prefix of the other gateways' pending prefill work (see [`remote_pending_key`]).
const REMOTE_PENDING_KEY: &str = "warmpath.feed.pending.";
/// Ticks after its arrival that the other gateways' pending work counts at least (the poller renews it every tick
/// while the feed answers in time).
const REMOTE_PENDING_TICKS: u32 = 3;

/// Shared-data key prefix of whether the feed's last answer to the index exchange said it takes pending sections
/// (`PENDING_HEADER`; one byte, 1 or 0), completed like `SNAPSHOT_KEY`: it outlives a change of the poller VM.
const TAKES_PENDING_KEY: &str = "warmpath.feed.takes_pending.";
/// Shared-data key prefix of the other gateways' prefill-speed fits (see [`remote_fits_key`]).
const REMOTE_FITS_KEY: &str = "warmpath.feed.fits.";
/// Shared-data key prefix of whether the feed's last answer said it takes fits sections (`FITS_HEADER`), like
/// `TAKES_PENDING_KEY`.
const TAKES_FITS_KEY: &str = "warmpath.feed.takes_fits.";

/// What completes the shared-data keys of one feed: its cluster and path, the cluster's length first. A cluster
/// name may hold any character (Envoy Gateway's hold `/`), so without the length cluster `a/b` with path `/c` and
/// cluster `a` with path `/b/c` would share their keys.
fn feed_id(feed: &FeedSettings) -> String {
    format!("{}:{}{}", feed.cluster.len(), feed.cluster, feed.path)
}

/// The shared-data key under which the poller of `feed` stores the other gateways' pending prefill work
/// (`shared::store_remote`, read by `shared::Remote::read`), completed like `SNAPSHOT_KEY`.
pub fn remote_pending_key(feed: &FeedSettings) -> String {
    format!("{REMOTE_PENDING_KEY}{}", feed_id(feed))
}

/// The shared-data key under which the poller of `feed` stores the sum of the other gateways' prefill-speed fits
/// (`shared::store_remote`, read by `shared::Remote::read`), completed like `SNAPSHOT_KEY`.
pub fn remote_fits_key(feed: &FeedSettings) -> String {
    format!("{REMOTE_FITS_KEY}{}", feed_id(feed))
}

/// Whether the feed's last answer said it takes the sections whose flag is stored under `key` (`TAKES_PENDING_KEY`,
/// `TAKES_FITS_KEY`; false before any answer).
fn feed_takes(key: &str) -> bool {
    matches!(hostcalls::get_shared_data(key), Ok((Some(b), _)) if b == [1])
}

/// How long the index exchange waits for the feed's answer (a new report goes out only after it).
fn report_timeout(feed: &FeedSettings) -> Duration {
    Duration::from_millis(feed.interval_ms.clamp(100, 1000))
}

/// How long, in ms, the other gateways' pending work counts after it arrived: [`REMOTE_PENDING_TICKS`] ticks, and
/// at least one answer's timeout and a tick (a slow answer must not blank it between two answers).
pub fn remote_pending_max_age(feed: &FeedSettings, tick: Duration) -> u64 {
    (tick * REMOTE_PENDING_TICKS).max(report_timeout(feed) + tick).as_millis() as u64
}

/// Shared-data key prefix of this Envoy's reporter id and cursor in the gateway leg of the index exchange
/// (`[reporter: u64 LE][cursor: u64 LE]`), completed like `SNAPSHOT_KEY`: they outlive a change of the poller VM.
const INDEX_STATE_KEY: &str = "warmpath.feed.index.";

/// Poller state of one root context.
pub struct FeedPoller {
    settings: FeedSettings,
    snapshot_key: String,
    /// Shared-data key of when a poll last answered with a valid snapshot (ms, u64 LE; the poller writes it, every
    /// VM reads it on its tick).
    confirmed_key: String,
    /// The confirmation this VM last acted on (ms).
    confirmed_seen: Option<u64>,
    lease_key: String,
    owner: u64,
    pending: Option<u32>,
    applied_cas: Option<u32>,
    applied_version: Option<u64>,
    /// True once a failed dispatch (e.g. no such cluster) was logged.
    dispatch_warned: bool,
    index_path: String,
    index_state_key: String,
    remote_pending_key: String,
    takes_pending_key: String,
    remote_fits_key: String,
    takes_fits_key: String,
    /// Shared-data key of this Envoy's own fits (`shared::prefill_fit_key`), which the reports carry.
    prefill_fit_key: String,
    /// When this VM last sent a report with the fits (ms; `None` before the first).
    fits_reported_at: Option<u64>,
    /// Token of the index exchange call in flight.
    index_pending: Option<u32>,
    /// True when this VM held the lease at its last tick.
    polling: bool,
    /// Ticks per snapshot poll (`feed.interval_ms` over the tick period, rounded up).
    ticks_per_poll: u64,
    /// Ticks this VM held the lease, counted to poll the snapshot every `ticks_per_poll`.
    ticks: u64,
    /// The tick count at or after which the next snapshot poll is due.
    next_poll: u64,
}

impl FeedPoller {
    /// A poller for `settings` called every `tick`; `context_id` salts its lease owner id; `prefill_fit_key` is
    /// where the plugin keeps this Envoy's prefill-speed fits.
    pub fn new(settings: FeedSettings, context_id: u32, tick: Duration, prefill_fit_key: String) -> Self {
        let tick_ms = (tick.as_millis() as u64).max(1);
        // Unique within this Envoy, so two VMs never both take the lease as theirs (`shared::unique_id`).
        let owner = shared::unique_id(crate::root::random_u64(u64::from(context_id)));
        let feed = feed_id(&settings);
        FeedPoller {
            snapshot_key: format!("{SNAPSHOT_KEY}{feed}"),
            confirmed_key: format!("{SNAPSHOT_KEY}{feed}.confirmed"),
            confirmed_seen: None,
            lease_key: format!("{LEASE_KEY}{feed}"),
            index_state_key: format!("{INDEX_STATE_KEY}{feed}"),
            index_path: format!("{}{INDEX_PATH_SUFFIX}", settings.path),
            remote_pending_key: remote_pending_key(&settings),
            takes_pending_key: format!("{TAKES_PENDING_KEY}{feed}"),
            remote_fits_key: remote_fits_key(&settings),
            takes_fits_key: format!("{TAKES_FITS_KEY}{feed}"),
            prefill_fit_key,
            fits_reported_at: None,
            index_pending: None,
            polling: false,
            ticks_per_poll: settings.interval_ms.div_ceil(tick_ms).max(1),
            ticks: 0,
            next_poll: 0,
            settings,
            owner,
            pending: None,
            applied_cas: None,
            applied_version: None,
            dispatch_warned: false,
        }
    }

    /// Stops polling for a configuration that a newer one superseded (see `root::FilterRoot`): forgets the calls
    /// in flight, whose answers are then ignored, and gives up the lease, so the newer configuration's poller of the
    /// same feed takes over on its next tick. Idempotent; [`FeedPoller::on_tick`] resumes polling.
    pub fn abandon(&mut self) {
        if self.pending.take().is_some() | self.index_pending.take().is_some() | self.polling {
            shared::release_lease(&self.lease_key, self.owner);
        }
        self.polling = false;
    }

    /// Applies a newer published snapshot, then polls if this VM holds (or takes) the lease, and reports this
    /// Envoy's index records to the feed.
    pub fn on_tick(&mut self, now_ms: u64, router: &Rc<RefCell<Router>>, exchange: &Exchange, metrics: &Metrics) {
        self.apply_published(router, metrics);
        self.check_confirmed(now_ms, router);
        let ttl = self.settings.interval_ms.saturating_mul(LEASE_INTERVALS);
        let polling = shared::take_lease(&self.lease_key, self.owner, now_ms, ttl);
        self.polling = polling;
        exchange.collect(polling);
        if !polling {
            return;
        }
        if self.index_pending.is_none() {
            self.report_index(now_ms, router, exchange, metrics);
        }
        self.ticks += 1;
        if self.ticks < self.next_poll || self.pending.is_some() {
            return;
        }
        self.next_poll = self.ticks + self.ticks_per_poll;
        let headers = vec![(":method", "GET"), (":path", self.settings.path.as_str()), (":authority", "warmpath-feed")];
        let timeout = Duration::from_millis(self.settings.interval_ms.max(100));
        match hostcalls::dispatch_http_call(&self.settings.cluster, headers, None, vec![], timeout) {
            Ok(token) => {
                metrics.count("warmpath.feed.polls", 1);
                self.pending = Some(token);
            }
            Err(status) => {
                metrics.count("warmpath.feed.failures.dispatch", 1);
                // The cluster's existence cannot be checked at configure time; say it once per poller.
                if !self.dispatch_warned {
                    self.dispatch_warned = true;
                    warn!(
                        "feed: cannot call cluster {:?} ({status:?}): does the Envoy cluster exist? Counted in \
                         warmpath.feed.failures.dispatch; logged once",
                        self.settings.cluster
                    );
                }
            }
        }
    }

    /// Sends the records this Envoy produced since the last report, its fits when due, and its pending prefill
    /// work, with the cursor of what it received so far, and keeps the call's token; the records of that round are
    /// lost if the call cannot be sent.
    fn report_index(&mut self, now_ms: u64, router: &Rc<RefCell<Router>>, exchange: &Exchange, metrics: &Metrics) {
        // What the other VMs routed up to now goes into this report.
        let Ok(mut r) = router.try_borrow_mut() else { return };
        // Records name endpoints by address: before the first snapshot (a feed-driven endpoint list) the answer's
        // records could not be applied, and the cursor would move past them.
        if r.endpoints().is_empty() {
            return;
        }
        exchange.drain(&mut r, metrics);
        drop(r);
        let mut body = exchange.take_collected();
        let n = warmpath_core::exchange::decode(&body).count() as u64;
        let fits_due = self.fits_reported_at.is_none_or(|at| now_ms.saturating_sub(at) >= FITS_REPORT_MS);
        let with_fits = fits_due && feed_takes(&self.takes_fits_key);
        if with_fits {
            push_fits(&mut body, &shared::read_prefill_fits(&self.prefill_fit_key));
        }
        if feed_takes(&self.takes_pending_key) {
            body.push(PENDING_SECTION);
            body.extend_from_slice(&shared::Table::read().pending_counts());
        }
        let (reporter, cursor) = self.index_state();
        let reporter = format!("{reporter:016x}");
        let cursor = cursor.to_string();
        let headers = vec![
            (":method", "POST"),
            (":path", self.index_path.as_str()),
            (":authority", "warmpath-feed"),
            ("content-type", "application/octet-stream"),
            (REPORTER_HEADER, reporter.as_str()),
            (CURSOR_HEADER, cursor.as_str()),
        ];
        match hostcalls::dispatch_http_call(
            &self.settings.cluster,
            headers,
            Some(&body),
            vec![],
            report_timeout(&self.settings),
        ) {
            Ok(token) => {
                self.index_pending = Some(token);
                if with_fits {
                    self.fits_reported_at = Some(now_ms);
                }
                if n > 0 {
                    metrics.count(metric::REPORTED, n);
                }
            }
            Err(_) => metrics.count("warmpath.feed.failures.index", 1),
        }
    }

    /// This Envoy's reporter id and cursor, created (a random id, cursor 0) on first use.
    fn index_state(&self) -> (u64, u64) {
        if let Ok((Some(b), _)) = hostcalls::get_shared_data(&self.index_state_key) {
            if b.len() == 16 {
                let reporter = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                let cursor = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
                return (reporter, cursor);
            }
        }
        let reporter = crate::root::random_u64(self.owner) | 1;
        self.set_index_state(reporter, 0);
        (reporter, 0)
    }

    fn set_index_state(&self, reporter: u64, cursor: u64) {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&reporter.to_le_bytes());
        v[8..].copy_from_slice(&cursor.to_le_bytes());
        let _ = hostcalls::set_shared_data(&self.index_state_key, Some(&v), None);
    }

    /// Handles the answer of the index exchange: apply and forward the other gateways' records, store their pending
    /// work, keep the cursor.
    fn on_index_response(
        &mut self,
        body_size: usize,
        router: &Rc<RefCell<Router>>,
        exchange: &Exchange,
        metrics: &Metrics,
    ) {
        self.index_pending = None;
        // An answer says whether to send the next report's section (a feed server replaced by one without sections
        // answers without the header, and the next report leaves the section out); no answer (a timeout) says
        // nothing.
        let status = status();
        if status.is_some() {
            for (header, key) in [(PENDING_HEADER, &self.takes_pending_key), (FITS_HEADER, &self.takes_fits_key)] {
                let takes = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, header).ok().flatten();
                let _ = hostcalls::set_shared_data(key, Some(&[u8::from(takes.is_some())]), None);
            }
        }
        if status.as_deref() != Some(b"200") {
            return metrics.count("warmpath.feed.failures.index", 1);
        }
        let cursor = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, CURSOR_HEADER)
            .ok()
            .flatten()
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u64>().ok());
        let Some(cursor) = cursor else { return metrics.count("warmpath.feed.failures.index", 1) };
        let body =
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default();
        let sections = split_report(&body);
        if let Some(pending) = sections.pending {
            shared::store_remote(&self.remote_pending_key, pending, crate::root::now_ms());
        }
        if let Some(fits) = sections.fits {
            shared::store_remote(&self.remote_fits_key, fits, crate::root::now_ms());
        }
        let records = sections.records;
        if !records.is_empty() {
            let Ok(mut r) = router.try_borrow_mut() else { return };
            match r.learn(records) {
                Ok(n) => metrics.count(metric::RECEIVED, n as u64),
                Err(_) => return metrics.count("warmpath.feed.failures.index", 1),
            }
            drop(r);
            exchange.forward(records, metrics);
        }
        let (reporter, _) = self.index_state();
        self.set_index_state(reporter, cursor);
    }

    /// Handles the feed's answers: the snapshot (publish and apply a valid, newer one; count anything else) or the
    /// index exchange.
    pub fn on_response(
        &mut self,
        token: u32,
        body_size: usize,
        router: &Rc<RefCell<Router>>,
        exchange: &Exchange,
        metrics: &Metrics,
    ) {
        if self.index_pending == Some(token) {
            return self.on_index_response(body_size, router, exchange, metrics);
        }
        if self.pending != Some(token) {
            return;
        }
        self.pending = None;
        match status().as_deref() {
            Some(b"200") => {}
            None => return metrics.count("warmpath.feed.failures.unreachable", 1),
            Some(_) => return metrics.count("warmpath.feed.failures.status", 1),
        }
        let body =
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default();
        let snapshot = match FeedSnapshot::from_json(&body) {
            Ok(s) => s,
            Err(e) => {
                warn!("feed snapshot rejected: {e}");
                return metrics.count("warmpath.feed.failures.invalid", 1);
            }
        };
        // The servers' loads in force are current as of this answer, changed or not.
        let _ = hostcalls::set_shared_data(&self.confirmed_key, Some(&crate::root::now_ms().to_le_bytes()), None);
        if self.applied_version == Some(snapshot.version) {
            return; // Nothing new.
        }
        // Any other version is news: the version identifies the content, it is not compared.
        let _ = hostcalls::set_shared_data(&self.snapshot_key, Some(&body), None);
        self.apply_published(router, metrics);
    }

    /// Tells the router whether the server loads in force are current: a newer confirmation counts this Envoy's
    /// change on each endpoint from now (`Router::server_loads_confirmed`); none for `server_loads_stale_after_ms`
    /// turns them off (`Router::server_loads_stale`). Nothing before the first confirmation.
    fn check_confirmed(&mut self, now_ms: u64, router: &Rc<RefCell<Router>>) {
        let Ok((Some(bytes), _)) = hostcalls::get_shared_data(&self.confirmed_key) else { return };
        let Some(confirmed) = bytes.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes) else { return };
        let Ok(mut router) = router.try_borrow_mut() else { return };
        if self.confirmed_seen != Some(confirmed) {
            self.confirmed_seen = Some(confirmed);
            router.server_loads_confirmed();
        }
        if now_ms.saturating_sub(confirmed) > server_loads_stale_after_ms(self.settings.interval_ms) {
            router.server_loads_stale();
        }
    }

    /// Applies the published snapshot if it changed since this VM last applied it.
    fn apply_published(&mut self, router: &Rc<RefCell<Router>>, metrics: &Metrics) {
        let Ok((Some(bytes), cas)) = hostcalls::get_shared_data(&self.snapshot_key) else { return };
        if cas.is_some() && cas == self.applied_cas {
            return;
        }
        self.applied_cas = cas;
        let Ok(snapshot) = FeedSnapshot::from_json(&bytes) else { return };
        if self.applied_version == Some(snapshot.version) {
            return;
        }
        let Ok(mut router) = router.try_borrow_mut() else { return };
        // The server loads go to this plugin's router with its endpoints (never VM-wide: another plugin in this VM
        // has its own feed and its own loads).
        let endpoints: Vec<(String, Option<ServerLoad>)> =
            snapshot.endpoints.iter().map(|e| (e.address.clone(), e.load.map(ServerLoad::from))).collect();
        if let Err(e) = router.set_feed_endpoints(endpoints) {
            warn!("feed snapshot version {} not applied: {e}", snapshot.version);
            return metrics.count("warmpath.feed.failures.invalid", 1);
        }
        info!("feed snapshot version {} applied: {} endpoints", snapshot.version, snapshot.endpoints.len());
        self.applied_version = Some(snapshot.version);
        metrics.count("warmpath.feed.applied", 1);
        metrics.gauge("warmpath.feed.version", snapshot.version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(cluster: &str, path: &str) -> FeedSettings {
        FeedSettings { cluster: cluster.into(), path: path.into(), interval_ms: 1000 }
    }

    #[test]
    fn two_feeds_never_share_their_keys() {
        // Cluster names may contain `/`, so a plain concatenation would give these two the same keys.
        assert_ne!(feed_id(&feed("a/b", "/c")), feed_id(&feed("a", "/b/c")));
        assert_ne!(remote_pending_key(&feed("a/b", "/c")), remote_pending_key(&feed("a", "/b/c")));
        assert_eq!(feed_id(&feed("feed", "/v1/endpoints")), feed_id(&feed("feed", "/v1/endpoints")));
    }
}
