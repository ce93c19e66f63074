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

/// Envoy's request header of extra retry conditions (`x-envoy-retry-on`), which Envoy's router adds to the route's
/// retry policy. The filter sets it to [`RETRY_ON`] on every request it places: a provider whose own route retry
/// policy lacks a condition (Istio's default retries connect failures and 503s, not resets) then still retries a
/// request reset by a dying endpoint on another host. The filter's value replaces any a client sent.
pub const ENVOY_RETRY_ON_HEADER: &str = "x-envoy-retry-on";

/// Envoy retry conditions of every model-server route warmpath configures or renders (Envoy `retry_on` syntax): a
/// failed connection, a reset before the response, or a retriable status code (503, given with the route's retry
/// policy).
pub const RETRY_ON: &str = "connect-failure,reset,retriable-status-codes";

/// Opt-in response header (`debug_header: true`, off in every shipped configuration): `<STRATEGY>` (the configured
/// strategy, e.g. `PREFIX_AWARE`), or `<STRATEGY>;fail_open=<cause>` when the request could not be keyed (the
/// `warmpath.fail_open.<cause>` label). Only what the client's own request and the operator's configuration decide:
/// never the backend, the matched prefix length, the decision reason or any load — those depend on what other
/// clients sent, and the operator reads them from [`DECISION_PROPERTY`] and the metrics.
pub const DEBUG_HEADER: &str = "x-warmpath-decision";

/// Envoy filter-state property the filter writes on every request it places, for operators (access logs, not
/// clients): `<IP:port>;<reason>;matched=<n>`, `n` the matched prefix length in characters (bytes for raw bodies).
/// Envoy stores it as `wasm.warmpath.decision`: an access log reads it with
/// `%FILTER_STATE(wasm.warmpath.decision:PLAIN)%`.
pub const DECISION_PROPERTY: &str = "warmpath.decision";

/// Request header of the gateway leg of the index exchange (`POST <feed path>/index`, [`crate::exchange`]): the
/// reporting gateway's id, 16 lower-case hex digits, kept for the Envoy's life, so the feed server never sends a
/// gateway its own records back.
pub const REPORTER_HEADER: &str = "x-warmpath-reporter";

/// Request and response header of the gateway leg of the index exchange: on the request the cursor of the last
/// record the gateway received (decimal, 0 at first), on the answer the cursor to send next time.
pub const CURSOR_HEADER: &str = "x-warmpath-cursor";

/// Response header of the gateway leg of the index exchange: a feed server that takes pending sections
/// ([`crate::exchange`], "Pending work between gateways") sets it (value `1`; its presence is what counts) on every
/// report it serves. A gateway sends its section while the feed's last answer carried it, so a feed server
/// without them never sees one.
pub const PENDING_HEADER: &str = "x-warmpath-pending";

/// Response header of the gateway leg of the index exchange: a feed server that takes fits sections
/// ([`crate::exchange`], "Prefill speeds between gateways") sets it (value `1`; its presence is what counts) on every
/// report it serves. A gateway sends its fits while the feed's last answer carried it, so a feed server without
/// them never sees any.
pub const FITS_HEADER: &str = "x-warmpath-fits";
