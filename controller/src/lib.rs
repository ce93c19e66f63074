//! warmpath-controller: a kube-rs controller that turns routing intent (the `InferenceRoutingPolicy`
//! CRD or HTTPRoute annotations) into Envoy Gateway / Istio configuration, serves the endpoint/load
//! feed the filter polls, and manages cache warming (issue 6).
//!
//! Layout: `crd/` holds one file per custom resource (types + schema), `reconcile/` one reconciler
//! per resource, `conditions`/`error`/`metrics` are shared by all reconcilers, `fixtures` builds
//! objects and an in-memory API client for tests.

pub mod cleanup;
pub mod conditions;
pub mod crd;
pub mod error;
pub mod feed;
pub mod metrics;
pub mod offline;
pub mod foreign;
pub mod leader;
pub mod reconcile;
pub mod render;
pub mod routing;
pub mod run;
/// Scale-out timeline calculator for cache warming (issue 6).
pub mod timeline;

/// Test helpers: object builders and an in-memory API client (`kube-fake-client`) that knows every
/// type the controller reads or writes. Compiled for the crate's unit tests only.
#[cfg(test)]
pub mod fixtures;

pub use error::{Error, Result};

/// Field manager used for every server-side apply the controller makes. Fixed, so that a restarted
/// controller owns (and re-applies) exactly the fields its predecessor wrote: no duplicates.
pub const FIELD_MANAGER: &str = "warmpath-controller";

/// API group of every warmpath custom resource.
pub const API_GROUP: &str = "warmpath.dev";
