//! warmpath-harness: runs a real Envoy with the warmpath wasm filter in front of local upstream HTTP servers.
//!
//! The pieces are independent so the end-to-end tests, the overhead benchmark and the demo can share them:
//! - [`EnvoyConfig`] renders a complete Envoy bootstrap (listener, wasm filter, `override_host` cluster) as YAML;
//! - [`EnvoyProcess`] starts `envoy --concurrency N` with that bootstrap on loopback ports, waits until the admin
//!   port reports ready, reads `/stats`, rewrites the listener (LDS file) for live reconfiguration, and kills Envoy
//!   on drop;
//! - [`Upstream`] is a local model-server stand-in that records every request it got and can hold requests;
//! - [`FeedServer`] serves an endpoint/load snapshot for the filter's feed poller;
//! - [`timing`] reads Envoy's own timing of each request (how long the proxy held it);
//! - [`cpu`] reads the CPU time of a process tree and how busy the machine was, for the benchmarks;
//! - [`process`] tells whether a process still runs, waits for one's exit with a deadline, and kills what a test
//!   started when it ends.
//!
//! Everything binds to 127.0.0.1 only.

mod config;
pub mod cpu;
mod envoy;
mod feed;
mod paths;
pub mod process;
mod stats;
pub mod timing;
mod upstream;

pub use config::{
    example_configs, to_yaml, EnvoyConfig, FeedCluster, PluginInstance, Pool, RemoteModule, EXAMPLE_PLUGIN_CONFIG,
    FILTER_STAT_PREFIX, MODEL_CLUSTER, RIG_DECISION_HEADER, RIG_UPSTREAM_HEADER,
};
pub use envoy::{validate_file, EnvoyProcess};
pub use feed::FeedServer;
pub use paths::{
    envoy_binary, filter_wasm, free_port, port_was_taken, start_on_picked_ports, workspace_root, TakenFirst,
    ADDRESS_IN_USE, PORT_ATTEMPTS,
};
pub use stats::Stats;
pub use upstream::{Recorded, Upstream};

pub use warmpath_core::headers::{DEBUG_HEADER, DECISION_PROPERTY, DESTINATION_HEADER, ORIGINAL_DST_HEADER};
