//! HTTP header names shared by the filter, the Envoy configurations and the controller: defined here once.

/// The request header carrying the filter's pick, `IP:port` (Gateway API Inference Extension endpoint-picker
/// protocol); Envoy's `envoy.load_balancing_policies.override_host` policy reads it. A client-sent value is removed
/// before the filter runs (a native Envoy filter) and again by the filter itself.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// Envoy's ORIGINAL_DST override header: never set by warmpath, always removed, so a client cannot name an address
/// (Envoy does not strip it by itself).
pub const ORIGINAL_DST_HEADER: &str = "x-envoy-original-dst-host";

/// Headers a client must never get through to the load balancer: removed by a native Envoy filter placed before the
/// wasm filter in every shipped or rendered configuration, and by the filter itself.
pub const CLIENT_DESTINATION_HEADERS: [&str; 2] = [DESTINATION_HEADER, ORIGINAL_DST_HEADER];

/// Opt-in response header (`debug_header: true`, off in every shipped configuration):
/// `<IP:port>;<reason>;matched=<n>`, `n` the matched prefix length in characters (bytes for raw bodies). For test
/// rigs only: it names the backend and tells a client how much of its prompt other clients already sent.
pub const DEBUG_HEADER: &str = "x-warmpath-decision";
