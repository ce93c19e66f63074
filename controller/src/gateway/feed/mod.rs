//! The endpoint/load feed: per policy (or annotated route), the backend's ready endpoints and
//! each model server's load, as a versioned [`FeedSnapshot`] served over HTTP for the filter.
//!
//! - [`metrics`]: Prometheus text → load (vLLM, SGLang, llama.cpp names).
//! - [`store`]: the snapshots, versioned per feed.
//! - [`scrape`]: concurrent, bounded scrapes of a set of endpoints.
//! - [`discovery`]: a backend's ready endpoints from EndpointSlices or InferencePool pods.
//! - [`server`]: the axum HTTP server (feed, wasm module, health, metrics).
//! - [`refresh`]: the loop that keeps every registered feed fresh.

pub mod discovery;
/// The model-server metrics parser (shared with the benchmark).
pub use warmpath_server_metrics as metrics;
pub mod refresh;
pub mod scrape;
pub mod server;
pub mod store;

pub use warmpath_core::feed::{FeedEndpoint, FeedLoad, FeedSnapshot};
