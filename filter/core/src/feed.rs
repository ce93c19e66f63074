//! The endpoint/load feed document the controller serves and the filter polls. One type,
//! shared by both sides, so they cannot drift apart.
//!
//! JSON shape: `{"version": 7, "endpoints": [{"address": "10.0.0.5:8000",
//! "load": {"waiting": 2, "running": 5, "kv_cache_usage": 0.41}}]}`. `version` grows whenever the
//! endpoint set or a load changes; `load` is absent when the endpoint's metrics could not be read.

use serde::{Deserialize, Serialize};

use crate::config::{normalize_address, MAX_ENDPOINTS};
use crate::endpoint::ServerLoad;

/// Feed polls a snapshot's server loads stay in force without an answer: past them (and [`STALE_MIN_MS`]) the
/// loads are older than the feed can explain (the feed, or the controller behind it, stopped answering) and routing
/// goes on this gateway's own counts ([`crate::Router::server_loads_stale`]) until a poll confirms them again.
/// Three: one or two lost or late answers are not an outage.
pub const STALE_POLLS: u64 = 3;

/// The least time server loads stay in force without an answer, ms: a feed polled every few ms (the benchmark's
/// harness) is late by more than three polls whenever the machine is busy, and flapping between the reports and
/// this gateway's own counts would help nobody.
pub const STALE_MIN_MS: u64 = 1_000;

/// How long server loads stay in force without a feed answer when the feed is polled every `interval_ms`, ms:
/// [`STALE_POLLS`] polls, at least [`STALE_MIN_MS`].
pub fn server_loads_stale_after_ms(interval_ms: u64) -> u64 {
    interval_ms.saturating_mul(STALE_POLLS).max(STALE_MIN_MS)
}

/// One versioned snapshot of a backend's endpoints and their server-reported load.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FeedSnapshot {
    /// Version of the feed's content: it changes whenever the content does, and a feed created again (a restarted
    /// controller, a new leader) starts above its earlier versions; a filter applies any version other than the
    /// one it holds.
    pub version: u64,
    /// Ready endpoints, at most [`MAX_ENDPOINTS`].
    #[serde(default)]
    pub endpoints: Vec<FeedEndpoint>,
}

/// One endpoint of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedEndpoint {
    /// `IP:port` (IPv6 as `[addr]:port`), the form Envoy's override_host policy matches.
    pub address: String,
    /// Server load from the model server's metrics; `None` when the last scrape failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<FeedLoad>,
}

/// Server-reported load of one endpoint (vLLM / SGLang / llama.cpp metrics, see the controller).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct FeedLoad {
    /// Requests queued at the server (count).
    #[serde(default)]
    pub waiting: u32,
    /// Requests being processed by the server (count).
    #[serde(default)]
    pub running: u32,
    /// Fraction of the KV cache in use, 0.0..=1.0.
    #[serde(default)]
    pub kv_cache_usage: f32,
}

impl From<FeedLoad> for ServerLoad {
    fn from(l: FeedLoad) -> ServerLoad {
        ServerLoad { waiting: l.waiting, running: l.running, kv_cache_usage: l.kv_cache_usage }
    }
}

/// Why a feed document was refused (the filter then keeps its last good snapshot).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("feed document rejected: {0}")]
pub struct FeedError(pub String);

impl FeedSnapshot {
    /// Parses and checks a feed document: valid JSON of the shape above, every address a socket
    /// address (normalised), at most [`MAX_ENDPOINTS`] endpoints, `kv_cache_usage` within 0..=1.
    ///
    /// Errors: [`FeedError`] naming the first problem.
    pub fn from_json(bytes: &[u8]) -> Result<FeedSnapshot, FeedError> {
        let mut snap: FeedSnapshot = serde_json::from_slice(bytes).map_err(|e| FeedError(e.to_string()))?;
        if snap.endpoints.len() > MAX_ENDPOINTS {
            return Err(FeedError(format!("{} endpoints, at most {MAX_ENDPOINTS}", snap.endpoints.len())));
        }
        for e in &mut snap.endpoints {
            e.address = normalize_address(&e.address)
                .ok_or_else(|| FeedError(format!("address {:?} is not IP:port", e.address)))?;
            if let Some(l) = e.load {
                if !(0.0..=1.0).contains(&l.kv_cache_usage) {
                    return Err(FeedError(format!(
                        "kv_cache_usage {} of {} is outside 0..=1",
                        l.kv_cache_usage, e.address
                    )));
                }
            }
        }
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_trips_and_validates() {
        let snap = FeedSnapshot {
            version: 3,
            endpoints: vec![
                FeedEndpoint {
                    address: "10.0.0.1:8000".into(),
                    load: Some(FeedLoad { waiting: 1, running: 2, kv_cache_usage: 0.5 }),
                },
                FeedEndpoint { address: "[::1]:8000".into(), load: None },
            ],
        };
        let text = serde_json::to_string(&snap).unwrap();
        assert_eq!(FeedSnapshot::from_json(text.as_bytes()).unwrap(), snap);
        assert!(FeedSnapshot::from_json(br#"{"version":1,"endpoints":[{"address":"nope"}]}"#).is_err());
        assert!(FeedSnapshot::from_json(
            br#"{"version":1,"endpoints":[{"address":"10.0.0.1:1","load":{"kv_cache_usage":2.0}}]}"#
        )
        .is_err());
        assert!(FeedSnapshot::from_json(b"{").is_err());
    }
}
