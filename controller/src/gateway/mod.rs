//! Routing: which HTTPRoutes get the filter, with which settings, on which data plane.
//!
//! The flow, one module per step:
//! - [`routing`]: routing intent — an `InferenceRoutingPolicy` spec or HTTPRoute annotations parsed
//!   into one [`routing::RoutingIntent`] (validated against the filter's own ranges).
//! - [`source`]: where the objects intent refers to are read from (the API server, or manifests
//!   for offline rendering).
//! - [`program`]: resolve the route, its Gateways and backend; render; apply; sweep.
//! - [`render`] (with [`foreign`], the provider kinds): intent → Envoy Gateway / Istio objects.
//! - [`routing_policy`], [`route_annotations`]: the two reconcilers, each split into a read-only
//!   plan (also used by `render`) and the writes.
//! - [`status_readback`]: `Programmed` from the gateway's own status on the objects written;
//!   [`route_status`]: warmpath's entries in an HTTPRoute's `status.parents`;
//!   [`unknown_annotations`]: misspelled `warmpath.dev/*` keys, reported.
//! - [`feed`]: the endpoint/load feed — discovery, scrapes, the versioned store, its HTTP server
//!   and the refresh loop.

pub mod feed;
pub mod foreign;
pub mod program;
pub mod render;
pub mod route_annotations;
pub mod route_status;
pub mod routing;
pub mod routing_policy;
pub mod source;
pub mod status_readback;
pub mod unknown_annotations;
