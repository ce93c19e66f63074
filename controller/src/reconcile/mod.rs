//! What every reconciler shares: one [`Context`] (client, events, metrics, settings, feeds) and the
//! [`finalizers`] helper. The reconcilers themselves live by product: [`crate::gateway`] (routing)
//! and [`crate::warming`] (cache warming).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use crate::crd::routing_policy::LoadSource;
use crate::feed::store::FeedStore;
use crate::metrics::Metrics;
use crate::render::{ControllerEndpoint, Provider, ResolvedBackend, WasmModule, XdsNameScheme};

pub mod finalizers;

/// Shared state handed to every reconciler.
#[derive(Clone)]
pub struct Context {
    /// Kubernetes client (a real one, or `kube-fake-client` in tests).
    pub client: Client,
    /// Publishes Kubernetes Events on the objects we reconcile.
    pub recorder: Recorder,
    /// Prometheus metrics (reconcile counts, errors, feed scrapes).
    pub metrics: Arc<Metrics>,
    /// Settings from the command line / Helm values.
    pub config: Arc<ControllerConfig>,
    /// Feed snapshots served over HTTP.
    pub feeds: FeedStore,
    /// What each feed scrapes, keyed like the store (`kind/namespace/name`).
    pub feed_sources: Arc<Mutex<HashMap<String, FeedSource>>>,
}

/// What one feed reads: a backend and how to read its servers' load.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedSource {
    /// Backend whose ready endpoints make up the feed.
    pub backend: ResolvedBackend,
    /// Metrics path/port/interval.
    pub load: LoadSource,
}

impl Context {
    /// Builds a context with fresh metrics, an empty feed store and the controller's event reporter.
    pub fn new(client: Client, config: ControllerConfig) -> Self {
        let reporter = Reporter { controller: crate::FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics: Arc::new(Metrics::default()),
            config: Arc::new(config),
            feeds: FeedStore::default(),
            feed_sources: Arc::default(),
        }
    }

    /// Registers (or replaces) what a feed scrapes.
    pub fn set_feed_source(&self, key: &str, source: FeedSource) {
        self.feed_sources.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), source);
    }

    /// Forgets a feed: no more scrapes, and its snapshot is no longer served.
    pub fn remove_feed(&self, key: &str) {
        self.feed_sources.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        self.feeds.remove(key);
    }
}

/// Controller-wide settings (command-line flags, filled from Helm values).
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Forced provider, or `None` to detect it from each Gateway's GatewayClass.
    pub provider: Option<Provider>,
    /// How gateways reach the controller's HTTP server.
    pub controller: ControllerEndpoint,
    /// Where gateways fetch the wasm module, and its sha256.
    pub wasm: WasmModule,
    /// How Envoy Gateway names the xDS resources the `EnvoyPatchPolicy` operations patch.
    pub xds_name_scheme: XdsNameScheme,
    /// Status that only a live cluster has: read the gateway's own status on the written objects
    /// back into `Programmed` ([`status_readback`]) and write annotated routes' status
    /// ([`route_status`]); off for the offline `render`, where no gateway runs.
    pub live_status: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            provider: None,
            controller: ControllerEndpoint::new("warmpath-controller", "warmpath-system", 8080),
            wasm: WasmModule { url: String::new(), sha256: String::new() },
            xds_name_scheme: XdsNameScheme::V1,
            live_status: true,
        }
    }
}
