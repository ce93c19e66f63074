//! End-to-end tests: a real Envoy (`--concurrency 2`) with the release wasm filter in front of local upstreams.
//! Every assertion is on what the upstreams recorded, what clients got back, or Envoy's `/stats`.
//!
//! Needs `.venv/bin/envoy` (scripts/setup.sh) and the filter built with
//! `cargo build -p warmpath-filter --target wasm32-wasip1 --release` (scripts/test.d/20-filter-e2e.sh does both).

mod common;

mod config;
mod debug_header;
mod failopen;
mod failover;
mod feed;
mod gateways;
mod gauges;
mod honoured;
mod inflight;
mod module_failure;
mod reconfigure;
mod retry_on;
mod routing;
mod shared_listener;
mod spoofing;
mod workers;
