//! Snapshots per feed key (`namespace/name` of the policy or annotated HTTPRoute). The version of a
//! feed grows only when its content changes, so pollers can skip identical documents. Beside each snapshot, the
//! feed's log of index records for the gateway leg of the index exchange (`warmpath_core::exchange`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use warmpath_core::exchange::RecordLog;

use super::{FeedEndpoint, FeedSnapshot};

/// The first version of a feed created now: ms since the Unix epoch (1 on a clock before it). A feed changes far
/// less than once per ms, so a later feed of the same key starts above every version an earlier one reached.
fn first_version() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Shared, cloneable snapshot store.
#[derive(Clone)]
pub struct FeedStore {
    inner: Arc<RwLock<HashMap<String, FeedSnapshot>>>,
    /// The index exchange's record log of each feed (created by the first report).
    logs: Arc<Mutex<HashMap<String, RecordLog>>>,
    /// The clock the logs' pending sections are aged by (monotonic).
    started: Instant,
}

impl Default for FeedStore {
    fn default() -> Self {
        FeedStore { inner: Arc::default(), logs: Arc::default(), started: Instant::now() }
    }
}

impl FeedStore {
    /// Replaces the endpoints of `key`. Endpoints are sorted by address; the version grows by one when anything
    /// differs. A new feed starts at the wall-clock time in ms since the Unix epoch, not at 1: a filter applies
    /// any version other than the one it holds, so a restarted controller (or a new leader, or a policy deleted
    /// and created again) must not publish other endpoints under a version an Envoy already applied. Returns the
    /// resulting version.
    pub fn update(&self, key: &str, endpoints: Vec<FeedEndpoint>) -> u64 {
        self.update_at(key, endpoints, first_version())
    }

    /// [`FeedStore::update`], a new feed starting at version `first`.
    fn update_at(&self, key: &str, mut endpoints: Vec<FeedEndpoint>, first: u64) -> u64 {
        endpoints.sort_by(|a, b| a.address.cmp(&b.address));
        endpoints.dedup_by(|a, b| a.address == b.address);
        let mut map = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(key) {
            Some(snap) if snap.endpoints == endpoints => snap.version,
            Some(snap) => {
                snap.version = snap.version.saturating_add(1);
                snap.endpoints = endpoints;
                snap.version
            }
            None => {
                map.insert(key.to_string(), FeedSnapshot { version: first, endpoints });
                first
            }
        }
    }

    /// Current snapshot of `key`, if the feed exists.
    pub fn get(&self, key: &str) -> Option<FeedSnapshot> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    /// Removes a feed (its policy was deleted), with its record log. Returns whether it existed.
    pub fn remove(&self, key: &str) -> bool {
        self.logs.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        self.inner.write().unwrap_or_else(|p| p.into_inner()).remove(key).is_some()
    }

    /// One gateway's report to the index exchange of feed `key` ([`RecordLog::serve`]): `None` when the feed does
    /// not exist, else the other gateways' records since the cursor (and their pending work, when the report
    /// carried its own) and the next cursor, or why the report was refused.
    pub fn index_exchange(
        &self,
        key: &str,
        reporter: Option<&str>,
        cursor: Option<&str>,
        body: &[u8],
    ) -> Option<Result<(Vec<u8>, u64), String>> {
        if !self.inner.read().unwrap_or_else(|p| p.into_inner()).contains_key(key) {
            return None;
        }
        let mut logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        let now_ms = self.started.elapsed().as_millis() as u64;
        Some(logs.entry(key.to_string()).or_default().serve(reporter, cursor, body, now_ms))
    }

    /// Keys of every feed, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<_> = self.inner.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        k.sort();
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::FeedLoad;

    fn ep(a: &str, waiting: u32) -> FeedEndpoint {
        FeedEndpoint { address: a.into(), load: Some(FeedLoad { waiting, running: 0, kv_cache_usage: 0.0 }) }
    }

    #[test]
    fn version_grows_only_on_change() {
        let s = FeedStore::default();
        let v = s.update("ns/p", vec![ep("10.0.0.2:80", 0), ep("10.0.0.1:80", 0)]);
        assert_eq!(s.update("ns/p", vec![ep("10.0.0.1:80", 0), ep("10.0.0.2:80", 0)]), v, "order does not matter");
        assert_eq!(s.update("ns/p", vec![ep("10.0.0.1:80", 3), ep("10.0.0.2:80", 0)]), v + 1, "load change");
        assert_eq!(s.update("ns/p", vec![ep("10.0.0.1:80", 3)]), v + 2, "endpoint removed");
        assert_eq!(s.get("ns/p").unwrap().endpoints.len(), 1);
        assert!(s.remove("ns/p"));
        assert!(s.get("ns/p").is_none());
        assert!(!s.remove("ns/p"));
    }

    #[test]
    fn a_feed_starts_at_its_creation_time_and_counts_up_from_there() {
        // A restart, a new leader or a policy created again starts a feed later than the earlier one started, and
        // an earlier feed's versions stay below its start plus its changes (far fewer than one per ms).
        let s = FeedStore::default();
        assert_eq!(s.update_at("ns/p", vec![ep("10.0.0.1:80", 0)], 1_700_000_000_000), 1_700_000_000_000);
        assert_eq!(s.update_at("ns/p", vec![ep("10.0.0.1:80", 1)], 1_800_000_000_000), 1_700_000_000_001, "counts up");
        // The start is the wall clock in ms (2020-09-13 or later on any clock that is set).
        let before = first_version();
        assert!(before > 1_600_000_000_000, "{before}");
        assert!(s.update("ns/q", vec![ep("10.0.0.1:80", 0)]) >= before);
        // Never past the end.
        s.update_at("ns/r", vec![ep("10.0.0.1:80", 0)], u64::MAX);
        assert_eq!(s.update_at("ns/r", vec![ep("10.0.0.1:80", 1)], 1), u64::MAX);
    }

    #[test]
    fn index_exchange_needs_the_feed_and_goes_with_it() {
        let s = FeedStore::default();
        let mut rec = Vec::new();
        warmpath_core::exchange::encode(&mut rec, 128, "10.0.0.1:80", &[1, 2]);
        assert!(s.index_exchange("ns/p", Some("0000000000000001"), None, &rec).is_none(), "no such feed");
        s.update("ns/p", vec![ep("10.0.0.1:80", 0)]);
        assert_eq!(s.index_exchange("ns/p", Some("0000000000000001"), None, &rec), Some(Ok((Vec::new(), 1))));
        assert_eq!(s.index_exchange("ns/p", Some("0000000000000002"), None, &[]), Some(Ok((rec.clone(), 1))));
        assert!(s.index_exchange("ns/p", None, None, &[]).unwrap().is_err(), "a report names its gateway");
        // A feed deleted and created again starts with an empty log.
        s.remove("ns/p");
        s.update("ns/p", vec![ep("10.0.0.1:80", 0)]);
        assert_eq!(s.index_exchange("ns/p", Some("0000000000000002"), None, &[]), Some(Ok((Vec::new(), 0))));
    }
}
