//! Cache warming: model weights on node-local disk before a replica needs them, and the serving
//! image pre-pulled on the nodes that will run it.
//!
//! - [`inference_endpoint`]: an `InferenceEndpoint` → its ModelCache, ImageCache, Deployment,
//!   Service and InferenceRoutingPolicy; the Deployment waits for the weights.
//! - [`model_cache`]: a `ModelCache`'s status from the node agents' reports on their Nodes.
//! - [`image_cache`]: an `ImageCache` → a pre-pull DaemonSet and per-node image status.
//!
//! Each reconciler uses [`crate::reconcile::finalizers::guard`].

use std::sync::Arc;

use crate::reconcile::Context;

pub mod image_cache;
pub mod inference_endpoint;
pub mod model_cache;

/// Runs the three cache-warming controllers together (for `warmpath-controller run`).
pub async fn run(ctx: Arc<Context>) {
    tokio::join!(inference_endpoint::run(ctx.clone()), model_cache::run(ctx.clone()), image_cache::run(ctx));
}
