//! Reconcilers, one module per custom resource, sharing one [`Context`].

use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use crate::metrics::Metrics;

pub mod image_cache;
pub mod inference_endpoint;
pub mod model_cache;

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
}

impl Context {
    /// Builds a context with fresh metrics and the controller's event reporter name.
    pub fn new(client: Client, config: ControllerConfig) -> Self {
        let reporter = Reporter { controller: crate::FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics: Arc::new(Metrics::default()),
            config: Arc::new(config),
        }
    }
}

/// Controller-wide settings (command-line flags, filled from Helm values).
#[derive(Clone, Debug, Default)]
pub struct ControllerConfig {
    /// Namespace the controller runs in (where it serves the wasm module and the feed from).
    pub namespace: String,
}
