//! warmpath-filter: the proxy-wasm HTTP filter that picks the model-server endpoint for each LLM request and hands
//! the pick to Envoy as `x-gateway-destination-endpoint: IP:port` (read by Envoy's
//! `envoy.load_balancing_policies.override_host` load-balancing policy).
//!
//! A thin shell around [`warmpath_core`]: host calls happen here, decisions there.
//! - `root`: plugin configuration (validated in `on_configure`; a bad config is refused with a clear log line),
//!   the per-VM router, the tick (in-flight gauges, feed polling);
//! - `http`: per request — strip client-sent destination headers, buffer the body up to `max_body_bytes`, extract
//!   the key, pick, set the header; fail open on anything unusable;
//! - `stream`: the per-stream state machine (hold, route, slot taken and released once), natively tested;
//! - `shared`: the only compare-and-swap code: in-flight counters per endpoint in proxy-wasm shared data;
//! - `metrics`: the proxy-wasm metrics Envoy exports;
//! - `feed`: the endpoint/load feed poller;
//! - `exchange`: one prefix index per Envoy: each VM's index records appended to a log in shared data, which the
//!   others read before their next pick.
//!
//! Build: `cargo build -p warmpath-filter --target wasm32-wasip1 --release` →
//! `target/wasm32-wasip1/release/warmpath_filter.wasm`. Configuration reference: `docs/filter.md`.

mod exchange;
mod feed;
mod health;
mod http;
mod metrics;
mod outcome;
mod root;
mod shared;
pub mod stream;

pub use warmpath_core::headers::{DEBUG_HEADER, DECISION_PROPERTY, DESTINATION_HEADER, ORIGINAL_DST_HEADER};

// The entry point lives in a private module: `_initialize` is exported by symbol name, not by Rust visibility.
mod entry {
    use proxy_wasm::traits::RootContext;
    use proxy_wasm::types::LogLevel;

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Info);
        proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
            Box::new(crate::root::FilterRoot::new(context_id))
        });
    }}
}
