//! warmpath-sim: a simulated OpenAI-compatible model server for routing experiments.
//!
//! It serves `/v1/chat/completions` and `/v1/completions` (streaming SSE and non-streaming) and models the two
//! things a router can change: the prefix (KV) cache hit of each request and the time to first token that follows.
//!
//! - [`tokens`]: the deterministic text ↔ token mapping (4 bytes of UTF-8 per token) and the chat template.
//! - [`cache`]: a vLLM-style automatic prefix cache (chained token blocks, capacity in blocks, LRU of free blocks).
//! - [`latency`]: the latency profile (overhead, prefill per uncached token, inter-token latency, batch limit).
//! - [`metrics`]: `/metrics` with vLLM's metric names.
//! - [`server`]: the axum app and [`SimServer`], which runs one server on a loopback port.
//!
//! Ground truth: every response carries `usage.prompt_tokens_details.cached_tokens` (tokens served from the
//! simulated cache) and the `x-sim-endpoint` response header naming the server that answered.

pub mod api;
pub mod cache;
pub mod latency;
pub mod metrics;
pub mod server;
pub mod tokens;

pub use cache::{CacheStats, PrefixCache};
pub use latency::LatencyProfile;
pub use server::{ServerTruth, SimConfig, SimProbe, SimServer, ENDPOINT_HEADER};
