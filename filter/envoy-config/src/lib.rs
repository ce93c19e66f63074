//! warmpath-envoy-config: the Envoy v3 configuration fragments every warmpath deployment needs, as
//! `serde_json::Value`s, defined once. The controller's renderer (Envoy Gateway patches, Istio `EnvoyFilter`s) and
//! the bootstraps of `envoy/` and the test harness are built from these functions, so a fragment cannot drift
//! between them.
//!
//! - [`strip_client_destination_headers`]: a native HTTP filter removing client-sent destination headers; it goes
//!   before the wasm filter, so no failure of the wasm VM (crash, load or fetch failure with `FAIL_OPEN`) lets a
//!   client choose the upstream;
//! - [`wasm_http_filter`]: the wasm filter running the module;
//! - [`override_host_lb_policy`]: the cluster load-balancing policy that honours the filter's pick;
//! - [`cluster`]: a STATIC or STRICT_DNS cluster of fixed addresses (model servers, the feed);
//! - [`retry_policy`] (route) and [`outlier_detection`] (model-server cluster): what Envoy does when an endpoint
//!   dies under the filter's feet, before the filter has learnt it;
//! - [`ROUTE_BODY_BUFFER_LIMIT_BYTES`] (route): room for the bodies the filter holds where the listener's buffer
//!   limit is smaller (Envoy Gateway's [`ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES`]).

#![forbid(unsafe_code)]

use serde_json::{json, Value};
use warmpath_core::headers::{CLIENT_DESTINATION_HEADERS, DESTINATION_HEADER};

/// The `@type` URLs of the Envoy v3 messages warmpath writes or looks for (fragments here, the bootstraps, Envoy
/// Gateway patch types, Istio `EnvoyFilter`s and the tests that read rendered objects back).
pub mod type_url {
    /// `envoy.config.listener.v3.Listener` (also an Envoy Gateway patch type).
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    /// `envoy.config.route.v3.RouteConfiguration` (also an Envoy Gateway patch type).
    pub const ROUTE_CONFIGURATION: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    /// `envoy.config.cluster.v3.Cluster` (also an Envoy Gateway patch type).
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    /// A route's per-filter config that only enables a filter disabled on the listener.
    pub const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
    /// The HTTP connection manager network filter.
    pub const HTTP_CONNECTION_MANAGER: &str =
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
    /// The router HTTP filter.
    pub const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
    /// The wasm HTTP filter.
    pub const WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
    /// The native header mutation HTTP filter.
    pub const HEADER_MUTATION: &str =
        "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";
    /// The TLS inspector listener filter.
    pub const TLS_INSPECTOR: &str =
        "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector";
    /// The `override_host` load-balancing policy.
    pub const OVERRIDE_HOST: &str =
        "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost";
    /// The least-request load-balancing policy.
    pub const LEAST_REQUEST: &str =
        "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest";
    /// The `previous_hosts` retry host predicate.
    pub const PREVIOUS_HOSTS: &str =
        "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate";
    /// `google.protobuf.StringValue` (the wasm filter's plugin configuration).
    pub const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";
}

/// Envoy HTTP filter name of [`strip_client_destination_headers`] (Envoy does not require unique filter names,
/// but a fixed name lets a configuration check find it).
pub const STRIP_FILTER_NAME: &str = "warmpath.strip_client_destination";

/// The native `envoy.filters.http.header_mutation` filter that removes every client-sent value of
/// `x-gateway-destination-endpoint` and `x-envoy-original-dst-host`.
///
/// Placement: before the wasm filter in the HTTP filter chain. Not as a route-level header modifier: Envoy applies
/// those after the HTTP filters, so it would also remove the filter's own pick.
pub fn strip_client_destination_headers() -> Value {
    let removals: Vec<Value> = CLIENT_DESTINATION_HEADERS.iter().map(|h| json!({ "remove": h })).collect();
    json!({
        "name": STRIP_FILTER_NAME,
        "typed_config": {
            "@type": type_url::HEADER_MUTATION,
            "mutations": { "request_mutations": removals },
        },
    })
}

/// Where the wasm filter's module comes from.
#[derive(Debug, Clone, Copy)]
pub enum WasmCode<'a> {
    /// A file on the Envoy host (resolved against Envoy's working directory when relative).
    Local {
        /// The module's path.
        path: &'a str,
    },
    /// Fetched over HTTP through an Envoy cluster and checked against its SHA-256.
    Remote {
        /// The module's URL.
        uri: &'a str,
        /// The Envoy cluster the fetch goes through.
        cluster: &'a str,
        /// Lower-case hex SHA-256 of the module.
        sha256: &'a str,
    },
}

/// One wasm HTTP filter instance.
#[derive(Debug, Clone, Copy)]
pub struct WasmFilter<'a> {
    /// The HTTP filter's name in the chain.
    pub filter_name: &'a str,
    /// Envoy `plugin_name`: the filter keeps one router (prefix index, settings) per plugin name in a VM, so
    /// instances with different configurations need different names.
    pub plugin_name: &'a str,
    /// The module.
    pub code: WasmCode<'a>,
    /// The plugin configuration JSON text (see docs/filter.md).
    pub configuration: &'a str,
    /// `FAIL_OPEN` (requests pass without a pick when the VM is unavailable) or `FAIL_CLOSED`.
    pub fail_open: bool,
}

/// Timeout of a remote module fetch.
const REMOTE_FETCH_TIMEOUT: &str = "30s";

/// The wasm HTTP filter (`envoy.extensions.filters.http.wasm.v3.Wasm`): root id `warmpath`, V8, one VM
/// (`vm_id: warmpath`) shared by every instance, and `allow_on_headers_stop_iteration: true` — the filter pauses in
/// the request-headers callback until the body is buffered, and without this option Envoy 1.40 pauses the whole
/// stream instead, so `PREFIX_AWARE` requests hang.
pub fn wasm_http_filter(f: &WasmFilter<'_>) -> Value {
    let code = match f.code {
        WasmCode::Local { path } => json!({ "local": { "filename": path } }),
        WasmCode::Remote { uri, cluster, sha256 } => json!({ "remote": {
            "http_uri": { "uri": uri, "cluster": cluster, "timeout": REMOTE_FETCH_TIMEOUT },
            "sha256": sha256,
        } }),
    };
    json!({
        "name": f.filter_name,
        "typed_config": {
            "@type": type_url::WASM,
            "config": {
                "name": f.plugin_name,
                "root_id": "warmpath",
                "vm_config": { "vm_id": "warmpath", "runtime": "envoy.wasm.runtime.v8", "code": code },
                "configuration": { "@type": type_url::STRING_VALUE, "value": f.configuration },
                "failure_policy": if f.fail_open { "FAIL_OPEN" } else { "FAIL_CLOSED" },
                "allow_on_headers_stop_iteration": true,
            },
        },
    })
}

/// The Envoy router HTTP filter, last in every chain.
pub fn router_filter() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": type_url::ROUTER },
    })
}

/// The cluster `load_balancing_policy` that honours the filter's pick: `override_host` reading
/// `x-gateway-destination-endpoint`, with a least-request fallback for requests without a valid pick (no header,
/// or a host outside the cluster). Envoy uses the header host for the first attempt only; retries use the fallback.
pub fn override_host_lb_policy() -> Value {
    json!({ "policies": [{ "typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": type_url::OVERRIDE_HOST,
            "override_host_sources": [{ "header": DESTINATION_HEADER }],
            "fallback_policy": { "policies": [{ "typed_extension_config": {
                "name": "envoy.load_balancing_policies.least_request",
                "typed_config": {
                    "@type": type_url::LEAST_REQUEST,
                },
            } }] },
        },
    } }] })
}

/// Upstream retries a route to model servers carries (`RetryPolicy`): a request that failed on its endpoint before
/// any response byte reached the client — connection refused or failed (`connect-failure`), reset before the
/// response (`reset`), or a 503 — is sent once more, to another host (`previous_hosts` predicate).
///
/// Why: the filter learns that an endpoint is down only from requests that already failed there, and Envoy's
/// `override_host` policy sends the first attempt to the picked host even when outlier detection ejected it. The
/// retry is chosen by the fallback policy (`override_host` uses the header host for the first attempt only), so it
/// lands elsewhere: the requests that reach a dead endpoint before the filter knows are served, not failed. Envoy
/// retries only while nothing of the response was sent downstream, so a streamed answer is never duplicated.
pub fn retry_policy() -> Value {
    json!({
        "retry_on": RETRY_ON,
        "retriable_status_codes": [503],
        "num_retries": RETRIES,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": { "@type": type_url::PREVIOUS_HOSTS },
        }],
        // Re-pick up to this many times when the predicate rejects a host (the fallback may pick the same one).
        "host_selection_retry_max_attempts": 5,
    })
}

/// Envoy `retry_on` conditions of [`retry_policy`] (defined in `warmpath_core::headers`: the filter also sends
/// them as `x-envoy-retry-on` on every request it places).
pub use warmpath_core::headers::RETRY_ON;
/// Retries per request in [`retry_policy`]: one other host is enough to get past one dead endpoint; more would
/// multiply load during a wider outage.
pub const RETRIES: u32 = 1;

/// Route `request_body_buffer_limit` (bytes) of every route the filter runs on: twice the filter's default
/// `max_body_bytes`, 2 MiB.
///
/// Why: to read the prompt, the filter holds a request's body, up to `max_body_bytes` (1 MiB by default) plus the
/// chunk Envoy read last, and Envoy answers 413 once a held body outgrows the stream's buffer limit. That limit is
/// the listener's `per_connection_buffer_limit_bytes`, raised by the route's `request_body_buffer_limit`, and
/// Envoy Gateway renders its listeners with [`ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES`]: without this, every
/// prompt the filter held above 32 KiB (up to `max_body_bytes`, and chunked ones) got a 413 there. Measured
/// through Envoy with a 32 KiB listener: 64 KiB and 512 KiB bodies got 413 without the route limit, and with it
/// 200 on Envoy 1.37.0 and 1.40 but still 413 on 1.36.4 (before 1.37 Envoy applied the route's limit only when
/// the router filter was reached, after the filter had held the body). It is set on the route, not the listener,
/// so every other route stays as it is, and it does not lower a larger listener limit (a 64 KiB route limit
/// under a 4 MiB listener still let a held 512 KiB body through). Envoy also keeps a copy of each request body for
/// retries up to this limit (the routes carry [`retry_policy`]), so a request on these routes can hold up to
/// 2 MiB where the listener alone allowed 32 KiB; the filter holds as much anyway. Sized for the default
/// `max_body_bytes` (the controller renders no other).
pub const ROUTE_BODY_BUFFER_LIMIT_BYTES: u64 = 2 * warmpath_core::config::DEFAULT_MAX_BODY_BYTES as u64;

/// The per-connection buffer limit Envoy Gateway gives every listener unless a ClientTrafficPolicy sets
/// `connection.bufferLimit`: 32 KiB (`tcpListenerPerConnectionBufferLimitBytes` in its xDS translator). Why
/// [`ROUTE_BODY_BUFFER_LIMIT_BYTES`] is rendered there; the tests reproduce Envoy Gateway's listeners with it.
pub const ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES: u32 = 32 << 10;

/// Outlier detection for a model-server cluster: a host that failed 3 times in a row (connect failures and resets
/// count as 5xx) is ejected from the fallback policy's choices for 10 s (doubling on repeat ejections), at most half
/// of the hosts at a time.
///
/// Why: retries and the fallback pick of requests without a valid pick then avoid the dead host; the filter's own
/// back-off keeps its picks away from it.
pub fn outlier_detection() -> Value {
    json!({
        "consecutive_5xx": 3,
        "consecutive_gateway_failure": 3,
        "interval": "1s",
        "base_ejection_time": "10s",
        "max_ejection_percent": 50,
    })
}

/// Circuit breakers for a model-server cluster: a retry budget instead of Envoy's default of 3 concurrent retries
/// per cluster. When an endpoint dies, every request in flight on it and every request picked for it before the
/// filter learns (or when its back-off expires) retries at the same moment; with the default most of them overflow
/// and fail (measured: 4 of 7 at the kill of one of 3 endpoints). Retries may use up to half of the active
/// requests, and at least 32 at once.
pub fn circuit_breakers() -> Value {
    json!({ "thresholds": [{
        "priority": "DEFAULT",
        "retry_budget": { "budget_percent": { "value": 50.0 }, "min_retry_concurrency": 32 },
    }] })
}

/// How a [`cluster`] finds its hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// Fixed IP addresses.
    Static,
    /// Host names resolved by DNS (the controller's Service name).
    StrictDns,
}

/// A cluster `name` of `hosts` (`(IP or DNS name, port)`), connect timeout `connect_timeout_s` seconds, with the
/// given load-balancing policy (`None`: Envoy's default round robin).
pub fn cluster(
    name: &str,
    discovery: Discovery,
    hosts: &[(String, u16)],
    connect_timeout_s: u32,
    lb_policy: Option<Value>,
) -> Value {
    let endpoints: Vec<Value> = hosts
        .iter()
        .map(|(address, port)| json!({ "endpoint": { "address": { "socket_address": { "address": address, "port_value": port } } } }))
        .collect();
    let mut c = json!({
        "name": name,
        "type": match discovery { Discovery::Static => "STATIC", Discovery::StrictDns => "STRICT_DNS" },
        "connect_timeout": format!("{connect_timeout_s}s"),
        "load_assignment": { "cluster_name": name, "endpoints": [{ "lb_endpoints": endpoints }] },
    });
    if let Some(policy) = lb_policy {
        c["load_balancing_policy"] = policy;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_filter_removes_both_client_headers() {
        let f = strip_client_destination_headers();
        let removed: Vec<&str> = f["typed_config"]["mutations"]["request_mutations"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|m| m["remove"].as_str())
            .collect();
        assert_eq!(removed, vec!["x-gateway-destination-endpoint", "x-envoy-original-dst-host"]);
    }

    #[test]
    fn wasm_filter_code_sources() {
        let mut f = WasmFilter {
            filter_name: "f",
            plugin_name: "p",
            code: WasmCode::Local { path: "m.wasm" },
            configuration: "{}",
            fail_open: true,
        };
        let v = wasm_http_filter(&f);
        assert_eq!(v["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"], "m.wasm");
        assert_eq!(v["typed_config"]["config"]["failure_policy"], "FAIL_OPEN");
        assert_eq!(v["typed_config"]["config"]["allow_on_headers_stop_iteration"], true);
        f.code = WasmCode::Remote { uri: "http://x/m.wasm", cluster: "c", sha256: "ab" };
        f.fail_open = false;
        let v = wasm_http_filter(&f);
        assert_eq!(v["typed_config"]["config"]["vm_config"]["code"]["remote"]["http_uri"]["cluster"], "c");
        assert_eq!(v["typed_config"]["config"]["failure_policy"], "FAIL_CLOSED");
    }

    #[test]
    fn retries_go_to_another_host() {
        let r = retry_policy();
        assert_eq!(r["retry_on"], RETRY_ON);
        assert_eq!(r["retry_host_predicate"][0]["name"], "envoy.retry_host_predicates.previous_hosts");
        assert_eq!(outlier_detection()["max_ejection_percent"], 50);
        assert_eq!(circuit_breakers()["thresholds"][0]["retry_budget"]["min_retry_concurrency"], 32);
    }

    #[test]
    fn clusters_carry_their_policy() {
        let c = cluster("m", Discovery::Static, &[("127.0.0.1".into(), 1)], 1, Some(override_host_lb_policy()));
        assert_eq!(c["type"], "STATIC");
        assert_eq!(
            c["load_balancing_policy"]["policies"][0]["typed_extension_config"]["name"],
            "envoy.load_balancing_policies.override_host"
        );
        let c = cluster("f", Discovery::StrictDns, &[("svc.ns".into(), 80)], 2, None);
        assert_eq!((c["type"].as_str(), c.get("load_balancing_policy")), (Some("STRICT_DNS"), None));
    }
}
