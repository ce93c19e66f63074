//! The endpoint/load feed poller: one poller per Envoy, elected among the VMs through a lease in shared
//! data, fetches the controller's versioned snapshot (`GET feed.path` on Envoy cluster `feed.cluster`) on the tick
//! and publishes it in shared data; every VM applies a newer published snapshot to its router on its own tick.
//!
//! When the feed is unreachable or answers garbage, the last good snapshot stays in force and the failure is
//! counted (`warmpath.feed.failures.<cause>`). Endpoint-set changes and the servers' reported loads go to the plugin's own router together
//! (`Router::set_feed_endpoints`), which keeps the prefix index and the in-flight counters of endpoints that stay.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use log::{info, warn};
use proxy_wasm::hostcalls;
use warmpath_core::feed::FeedSnapshot;
use warmpath_core::{FeedSettings, Router, ServerLoad};

use crate::metrics::Metrics;
use crate::shared;

/// Shared-data key prefix of the latest good snapshot (its JSON bytes, as served); the feed's cluster and path
/// complete the key, so plugins polling different feeds in one Envoy keep apart.
const SNAPSHOT_KEY: &str = "warmpath.feed.snapshot.";
/// Shared-data key prefix of the poller lease (see `shared::take_lease`), completed like `SNAPSHOT_KEY`.
const LEASE_KEY: &str = "warmpath.feed.lease.";
/// A lease lasts this many poll intervals, so a vanished owner (VM torn down) is replaced after a few ticks.
const LEASE_INTERVALS: u64 = 3;

/// Poller state of one root context.
pub struct FeedPoller {
    settings: FeedSettings,
    snapshot_key: String,
    lease_key: String,
    owner: u64,
    pending: Option<u32>,
    applied_cas: Option<u32>,
    applied_version: Option<u64>,
    /// True once a failed dispatch (e.g. no such cluster) was logged.
    dispatch_warned: bool,
}

impl FeedPoller {
    /// A poller for `settings`; `context_id` salts its lease owner id.
    pub fn new(settings: FeedSettings, context_id: u32) -> Self {
        let owner = crate::root::random_u64(u64::from(context_id)) | 1;
        let feed = format!("{}{}", settings.cluster, settings.path);
        FeedPoller {
            snapshot_key: format!("{SNAPSHOT_KEY}{feed}"),
            lease_key: format!("{LEASE_KEY}{feed}"),
            settings,
            owner,
            pending: None,
            applied_cas: None,
            applied_version: None,
            dispatch_warned: false,
        }
    }

    /// Applies a newer published snapshot, then polls if this VM holds (or takes) the lease.
    pub fn on_tick(&mut self, now_ms: u64, router: &Rc<RefCell<Router>>, metrics: &Metrics) {
        self.apply_published(router, metrics);
        let ttl = self.settings.interval_ms.saturating_mul(LEASE_INTERVALS);
        if self.pending.is_some() || !shared::take_lease(&self.lease_key, self.owner, now_ms, ttl) {
            return;
        }
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

    /// Handles the feed's answer: publish and apply a valid, newer snapshot; count anything else.
    pub fn on_response(&mut self, token: u32, body_size: usize, router: &Rc<RefCell<Router>>, metrics: &Metrics) {
        if self.pending != Some(token) {
            return;
        }
        self.pending = None;
        // A failed call (connection refused, timeout) arrives here with no headers at all.
        let status = hostcalls::get_map_value_bytes(proxy_wasm::types::MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten();
        match status.as_deref() {
            Some(b"200") => {}
            None => return metrics.count("warmpath.feed.failures.unreachable", 1),
            Some(_) => return metrics.count("warmpath.feed.failures.status", 1),
        }
        let body = hostcalls::get_buffer(proxy_wasm::types::BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let snapshot = match FeedSnapshot::from_json(&body) {
            Ok(s) => s,
            Err(e) => {
                warn!("feed snapshot rejected: {e}");
                return metrics.count("warmpath.feed.failures.invalid", 1);
            }
        };
        if self.applied_version == Some(snapshot.version) {
            return; // Nothing new.
        }
        // Any other version is news (a restarted controller starts counting again, so "lower" is not "older").
        let _ = hostcalls::set_shared_data(&self.snapshot_key, Some(&body), None);
        self.apply_published(router, metrics);
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
