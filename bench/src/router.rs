//! Client-side routing for the baselines: the harness asks a [`Policy`] for an endpoint, tracks in-flight
//! requests per endpoint itself, and refreshes server load from the servers' `/metrics` in the background.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warmpath_core::decision::Reason;
use warmpath_core::endpoint::{Endpoint, EndpointLoad, ServerLoad};
use warmpath_core::extract_key;
use warmpath_core::policy::{PickInput, Policy};

use crate::loads::scrape;

/// A policy plus the load state it reads. Shared by the replay tasks.
pub struct ClientRouter {
    policy: Mutex<Box<dyn Policy>>,
    endpoints: Vec<Endpoint>,
    in_flight: Vec<AtomicU32>,
    server: Arc<Mutex<Vec<Option<ServerLoad>>>>,
    prefix_length: usize,
    /// Decisions whose reason was [`Reason::Overflow`].
    pub overflows: AtomicU64,
    seq: AtomicU64,
}

/// Releases the in-flight slot of a routed request when dropped.
pub struct InFlight<'a> {
    router: &'a ClientRouter,
    index: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.router.in_flight[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

impl ClientRouter {
    /// A router over `addresses` (`IP:port`) that keys requests on the first `prefix_length` characters of their
    /// text, as the filter does.
    pub fn new(policy: Box<dyn Policy>, addresses: &[String], prefix_length: usize) -> Arc<Self> {
        Arc::new(Self {
            policy: Mutex::new(policy),
            endpoints: addresses.iter().enumerate().map(|(i, a)| Endpoint::new(a.clone(), i as u32)).collect(),
            in_flight: addresses.iter().map(|_| AtomicU32::new(0)).collect(),
            server: Arc::new(Mutex::new(vec![None; addresses.len()])),
            prefix_length,
            overflows: AtomicU64::new(0),
            seq: AtomicU64::new(0),
        })
    }

    /// Starts a task that scrapes every server's `/metrics` each `every` (wall time) until the router is dropped.
    pub fn spawn_scraper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let addrs: Vec<String> = self.endpoints.iter().map(|e| e.address.clone()).collect();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let Some(me) = weak.upgrade() else { return };
                for (i, a) in addrs.iter().enumerate() {
                    if let Ok(m) = scrape(&client, a).await {
                        me.server.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(m.server_load());
                    }
                }
                drop(me);
                tokio::time::sleep(every).await;
            }
        })
    }

    /// Picks an endpoint for a request (`path` + JSON `body`) and counts it in flight until the guard drops.
    /// Returns the endpoint's address and the guard.
    pub fn route(&self, path: &str, body: &[u8]) -> (String, InFlight<'_>) {
        let key = extract_key(path, body, None, self.prefix_length).ok();
        let loads: Vec<EndpointLoad> = {
            let server = self.server.lock().unwrap_or_else(|e| e.into_inner());
            self.in_flight
                .iter()
                .zip(server.iter())
                .map(|(f, s)| EndpointLoad { in_flight: f.load(Ordering::Relaxed), server: *s, ..Default::default() })
                .collect()
        };
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let random = xxhash_rust::xxh3::xxh3_64(&n.to_le_bytes());
        let input = PickInput { key: key.as_ref(), random, body_len: body.len(), ..Default::default() };
        let mut policy = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        let d = policy.pick(&input, &self.endpoints, &loads).expect("endpoints are never empty");
        drop(policy);
        if d.reason == Reason::Overflow {
            self.overflows.fetch_add(1, Ordering::Relaxed);
        }
        self.in_flight[d.endpoint].fetch_add(1, Ordering::Relaxed);
        (d.address, InFlight { router: self, index: d.endpoint })
    }
}
