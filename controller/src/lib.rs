//! warmpath-controller: a kube-rs controller with two products.
//!
//! - [`gateway`]: routing. Routing intent (an `InferenceRoutingPolicy` or HTTPRoute annotations) →
//!   Envoy Gateway / Istio objects → server-side apply; and the endpoint/load feed the filter polls.
//! - [`warming`]: cache warming. `InferenceEndpoint`, `ModelCache` and `ImageCache` reconcilers
//!   (weights on node-local disk, image pre-pull) working with the node agent.
//!
//! Shared by both: [`reconcile`] (the context every reconciler gets, the finalizer helper),
//! [`error`], [`metrics`], [`offline`] (the `render` command: what both would create, offline),
//! [`run`] (the `run` command). The custom resources, conditions and the node contract are the
//! `warmpath-api` crate, which the node agent uses too.

/// The shared API (custom resources, conditions, node contract) lives in `warmpath-api`; these
/// aliases keep the controller's paths short (`crate::crd::model_cache`, `crate::conditions`).
pub use warmpath_api as crd;
pub use warmpath_api::conditions;
pub mod cleanup;
pub mod error;
pub mod gateway;
pub mod leader;
pub mod metrics;
pub mod offline;
pub mod reconcile;
pub mod run;
pub mod warming;

/// Short paths to the routing modules most code names (`crate::render`, `crate::routing`, ...).
pub use gateway::{feed, foreign, render, routing};

pub use error::{Error, Result};

/// Field manager used for every server-side apply the controller makes. Fixed, so that a restarted
/// controller owns (and re-applies) exactly the fields its predecessor wrote: no duplicates.
pub const FIELD_MANAGER: &str = "warmpath-controller";

pub use warmpath_api::API_GROUP;
