//! Pure rendering: routing intent + resolved references → the provider objects the controller
//! applies. No API calls here, so `warmpath-controller render -f` and the reconciler share it.
//!
//! The filter must run with the wasm option `allow_on_headers_stop_iteration: true`: without it
//! Envoy 1.40 turns the filter's pause in the request-headers callback into a pause of the whole
//! stream, so the body never arrives and `PREFIX_AWARE` requests hang (verified on Envoy 1.40).
//! Neither Envoy Gateway's `EnvoyExtensionPolicy` nor Istio's `WasmPlugin` can set it, so each
//! provider needs a patch-capable kind for it. Every instance is scoped to its own route — two warmpath policies
//! on one Gateway listener must not pick for each other's requests:
//!
//! Envoy Gateway (API group `gateway.envoyproxy.io/v1alpha1`):
//! - `EnvoyExtensionPolicy` targeting the HTTPRoute: `wasm[0]` with `code: {type: HTTP, http:
//!   {url, sha256}}` (the module served by the controller), `config` = the plugin configuration,
//!   `failOpen`. Envoy Gateway adds the filter to the listener disabled and enables it on this
//!   route's xDS routes only (`typed_per_filter_config`), so each policy's filter sees only its
//!   own route's requests. Envoy Gateway names the filter
//!   `envoy.filters.http.wasm/envoyextensionpolicy/<ns>/<policy>/wasm/0`.
//! - `BackendTrafficPolicy` targeting the HTTPRoute: `loadBalancer.endpointOverride.extractFrom:
//!   [{header: x-gateway-destination-endpoint}]` — Envoy Gateway's typed front for Envoy's
//!   `override_host` load-balancing policy.
//! - `EnvoyPatchPolicy` targeting each Gateway: adds the STRICT_DNS cluster the filter polls the
//!   feed through (`dispatch_http_call` needs a cluster; no typed API adds one), and, in each xDS
//!   listener the route is served on, sets `allow_on_headers_stop_iteration: true` on that filter
//!   (a JSONPath operation, RFC 9535, so it reaches the filter in every filter chain: plain HTTP's
//!   `default_filter_chain` and HTTPS's per-SNI `filter_chains`); and in each route configuration
//!   holding the route (an HTTPS listener's own, the one plain HTTP listeners on a port share) it sets
//!   `request_body_buffer_limit` on the routes the filter is enabled on, since Envoy Gateway's 32 KiB
//!   listener buffer would answer 413 to every longer prompt the filter holds
//!   (`warmpath_envoy_config::ROUTE_BODY_BUFFER_LIMIT_BYTES`; Envoy 1.37 or later). Needs
//!   `extensionApis.enableEnvoyPatchPolicy: true` in the Envoy Gateway configuration.
//!
//! Istio (`networking.istio.io/v1alpha3`):
//! - `EnvoyFilter` targeting each Gateway: an `HTTP_FILTER` patch inserting the whole wasm filter
//!   (listener-wide: Istio names routes after rule positions, which a patch cannot follow) before
//!   `envoy.filters.http.router`, scoped to the route by the plugin configuration's
//!   `upstream_clusters` (the backend Service's outbound cluster: the filter leaves every other
//!   request alone); and a `CLUSTER` MERGE patch of that cluster setting `load_balancing_policy`
//!   to `override_host` with a least-request fallback (Istio's DestinationRule has no
//!   override-host option). The feed and the module are reached through the controller Service's
//!   own outbound cluster, which Istio already pushes.
//!
//! Every filter instance has its own plugin name ([`wasm_plugin_name`]): the filter shares its
//! router (prefix index, settings) between instances of the same plugin name in a VM.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{json, Value};
use warmpath_envoy_config as envoy_config;
// The `EnvoyPatchPolicy` resource types of the xDS objects patched.
use warmpath_envoy_config::type_url::{CLUSTER, LISTENER, ROUTE_CONFIGURATION};

use crate::foreign;
use crate::routing::{FeedTarget, RoutingIntent, DESTINATION_HEADER, FEED_KIND_HTTPROUTE, FEED_KIND_POLICY};

/// Label on every rendered object: the controller manages it.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label on every rendered object: uid of the policy or HTTPRoute it was rendered for. Clean-up
/// deletes by this label, so it removes exactly what was created for that owner.
pub const LABEL_OWNER_UID: &str = "warmpath.dev/owner-uid";
/// Annotation naming the owner as `Kind/namespace/name` (for humans).
pub const ANNOTATION_OWNER: &str = "warmpath.dev/owner";

/// Data-plane provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Envoy Gateway (`gateway.envoyproxy.io/gatewayclass-controller`).
    EnvoyGateway,
    /// Istio (`istio.io/gateway-controller`).
    Istio,
}

impl Provider {
    /// Provider from a GatewayClass `spec.controllerName`; `None` for other implementations.
    pub fn from_controller_name(name: &str) -> Option<Self> {
        match name {
            "gateway.envoyproxy.io/gatewayclass-controller" => Some(Self::EnvoyGateway),
            "istio.io/gateway-controller" => Some(Self::Istio),
            _ => None,
        }
    }
    /// Parses the setting `provider` (Helm value, `--provider`): `auto` (from each GatewayClass's controllerName) →
    /// `None`, `envoy-gateway`, `istio`.
    ///
    /// Errors: any other value, with a message naming the three.
    pub fn parse(s: &str) -> Result<Option<Self>, String> {
        match s {
            "auto" => Ok(None),
            // `envoygateway` was accepted before the setting was checked: kept so such a setup still starts.
            "envoy-gateway" | "envoygateway" => Ok(Some(Self::EnvoyGateway)),
            "istio" => Ok(Some(Self::Istio)),
            _ => Err(format!("unknown provider {s:?}: expected auto, envoy-gateway or istio")),
        }
    }
}

/// How Envoy Gateway names a Gateway's xDS listeners and route configurations, which the controller's
/// `EnvoyPatchPolicy` operations name: its `XDSNameSchemeV2` runtime flag (`EnvoyGateway.runtimeFlags.enabled`).
/// The flag is off by default through Envoy Gateway v1.9; its docs announce it on by default from v1.10. The
/// controller cannot read Envoy Gateway's own configuration, so this is a setting (`--envoy-gateway-xds-name-scheme`,
/// chart value `envoyGateway.xdsNameScheme`). The names follow Envoy Gateway's `xdsListenerName` and
/// `routeConfigName` (`internal/xds/translator/listener.go`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdsNameScheme {
    /// Flag off: the xDS listener of a port is named after the Gateway's first listener on it
    /// (`<gateway namespace>/<gateway>/<listener>`); so is the route configuration of the plain HTTP listeners on
    /// a port, and an HTTPS listener's route configuration is named after that listener.
    #[default]
    V1,
    /// Flag on: the xDS listener of a port is `tcp-<port>` and the route configuration of the plain HTTP listeners
    /// on it `http-<port>` (the Gateway listener's port); an HTTPS listener's route configuration keeps its V1 name.
    V2,
}

impl XdsNameScheme {
    /// Parses the setting: `v1` or `v2`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "v1" => Ok(Self::V1),
            "v2" => Ok(Self::V2),
            _ => Err(format!(
                "Envoy Gateway xDS name scheme {s:?}: expected v1 (Envoy Gateway's XDSNameSchemeV2 runtime flag off) \
                 or v2 (on)"
            )),
        }
    }

    /// The xDS listener of Gateway `namespace/name`'s `port`, whose first listener in spec order is
    /// `first_on_port` (Envoy Gateway merges a Gateway's listeners on one port into one xDS listener).
    pub fn listener(self, namespace: &str, name: &str, first_on_port: &str, port: i32) -> String {
        match self {
            Self::V1 => format!("{namespace}/{name}/{first_on_port}"),
            Self::V2 => format!("tcp-{port}"),
        }
    }

    /// The route configuration holding the routes of Gateway listener `listener` on `port`: an HTTPS listener has
    /// its own; plain HTTP listeners on a port share one, named (V1) after the first of them, `first_on_port`.
    pub fn route_config(
        self,
        namespace: &str,
        name: &str,
        listener: &str,
        first_on_port: &str,
        port: i32,
        https: bool,
    ) -> String {
        match (self, https) {
            (_, true) => format!("{namespace}/{name}/{listener}"),
            (Self::V1, false) => format!("{namespace}/{name}/{first_on_port}"),
            (Self::V2, false) => format!("http-{port}"),
        }
    }
}

/// The object a rendering belongs to (an `InferenceRoutingPolicy` or an annotated HTTPRoute).
#[derive(Clone, Debug, PartialEq)]
pub struct Owner {
    /// `apiVersion` of the owner.
    pub api_version: String,
    /// `kind` of the owner.
    pub kind: String,
    /// Name of the owner.
    pub name: String,
    /// Namespace of the owner.
    pub namespace: String,
    /// `metadata.uid` of the owner.
    pub uid: String,
}

/// The wasm module as the gateways fetch it: an HTTP URL on the controller and its sha256 (hex).
#[derive(Clone, Debug, PartialEq)]
pub struct WasmModule {
    /// `http://…/wasm/warmpath_filter-<sha prefix>.wasm`.
    pub url: String,
    /// Lower-case hex SHA-256 of the module bytes (64 characters).
    pub sha256: String,
}

/// The cluster domain Kubernetes uses unless the cluster was set up with another (kubelet `--cluster-domain`).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// How the gateways reach the controller's HTTP server (wasm module and feed), and the cluster
/// domain every Service name is rendered with.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerEndpoint {
    /// Service name of the controller.
    pub service: String,
    /// Namespace of the controller.
    pub namespace: String,
    /// HTTP port (wasm + feed).
    pub port: u16,
    /// The cluster's DNS domain (`cluster.local` by default): Service FQDNs are
    /// `<service>.<namespace>.svc.<cluster domain>`.
    pub cluster_domain: String,
}

impl ControllerEndpoint {
    /// The controller's Service in the default cluster domain.
    pub fn new(service: impl Into<String>, namespace: impl Into<String>, port: u16) -> Self {
        Self {
            service: service.into(),
            namespace: namespace.into(),
            port,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
        }
    }

    /// Cluster-local DNS name of the controller's Service.
    pub fn host(&self) -> String {
        self.service_host(&self.namespace, &self.service)
    }

    /// Cluster-local DNS name of Service `namespace/service`: `<service>.<namespace>.svc.<cluster domain>`.
    pub fn service_host(&self, namespace: &str, service: &str) -> String {
        format!("{service}.{namespace}.svc.{}", self.cluster_domain)
    }
}

/// True for an RFC 1123 DNS label: 1–63 lower-case letters, digits and `-`, not starting or ending with `-` (what
/// Kubernetes requires of a namespace's name and of each label of a DNS name).
fn is_dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// Checks a namespace's name (an RFC 1123 DNS label).
///
/// Errors: a message naming the value and what is expected.
pub fn validate_namespace(namespace: &str) -> Result<(), String> {
    if is_dns_label(namespace) {
        Ok(())
    } else {
        Err(format!("namespace {namespace:?} is not a DNS label (1-63 lower-case letters, digits and '-')"))
    }
}

/// Checks a Service's name (an RFC 1035 DNS label: an RFC 1123 label that starts with a letter), which the
/// controller renders into its own URLs.
///
/// Errors: a message naming the value and what is expected.
pub fn validate_service_name(service: &str) -> Result<(), String> {
    if is_dns_label(service) && service.starts_with(|c: char| c.is_ascii_lowercase()) {
        Ok(())
    } else {
        Err(format!(
            "service name {service:?} is not a DNS label starting with a letter (1-63 lower-case letters, digits and '-')"
        ))
    }
}

/// Checks a feed key given by hand (the standalone feed server's `--key`): a kind of [`crate::routing::feed_key`], a namespace
/// that is a DNS label and a non-empty name, separated by `/`.
///
/// Errors: a message naming the key and the expected form.
pub fn validate_feed_key(key: &str) -> Result<(), String> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts[..] {
        [kind, namespace, name]
            if [FEED_KIND_POLICY, FEED_KIND_HTTPROUTE].contains(&kind)
                && validate_namespace(namespace).is_ok()
                && !name.is_empty() =>
        {
            Ok(())
        }
        _ => Err(format!(
            "feed key {key:?} is not {FEED_KIND_POLICY}/<namespace>/<name> or {FEED_KIND_HTTPROUTE}/<namespace>/<name>"
        )),
    }
}

/// Checks a cluster domain: a DNS name of lower-case labels (RFC 1123), without a leading or trailing dot.
///
/// Errors: a message naming the value and what is expected.
pub fn validate_cluster_domain(domain: &str) -> Result<(), String> {
    if domain.len() <= 253 && domain.split('.').all(is_dns_label) {
        Ok(())
    } else {
        Err(format!(
            "cluster domain {domain:?} is not a DNS name (lower-case labels separated by dots, e.g. cluster.local)"
        ))
    }
}

/// A Gateway an HTTPRoute attaches to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GatewayRef {
    /// Namespace of the Gateway.
    pub namespace: String,
    /// Name of the Gateway.
    pub name: String,
    /// Envoy Gateway only: the names of the xDS listeners that serve the route, one per port the route attaches
    /// to (its `parentRefs[].sectionName`s and ports, or every `HTTP`/`HTTPS` listener), as
    /// [`XdsNameScheme::listener`] gives them. Empty on Istio.
    pub listeners: Vec<String>,
    /// Envoy Gateway only: the names of the route configurations that hold the route's xDS routes, one per
    /// attached `HTTPS` listener and one per port of attached plain `HTTP` listeners, as
    /// [`XdsNameScheme::route_config`] gives them. Empty on Istio.
    pub route_configs: Vec<String>,
}

/// The backend whose endpoints are routed, resolved to something a gateway cluster can match.
#[derive(Clone, Debug, PartialEq)]
pub enum ResolvedBackend {
    /// A Service port.
    Service {
        /// Namespace.
        namespace: String,
        /// Service name.
        name: String,
        /// Service port.
        port: u16,
    },
    /// An InferencePool.
    InferencePool {
        /// Namespace.
        namespace: String,
        /// Pool name.
        name: String,
    },
}

/// Everything one rendering needs.
#[derive(Clone, Debug)]
pub struct RenderInput<'a> {
    /// Owner of the rendered objects.
    pub owner: &'a Owner,
    /// Namespace of the targeted HTTPRoute.
    pub route_namespace: &'a str,
    /// Name of the targeted HTTPRoute.
    pub route_name: &'a str,
    /// Gateways the route attaches to (all of one provider).
    pub gateways: &'a [GatewayRef],
    /// Provider of those Gateways.
    pub provider: Provider,
    /// Validated routing intent.
    pub intent: &'a RoutingIntent,
    /// Backend whose endpoints are routed.
    pub backend: &'a ResolvedBackend,
    /// Wasm module source.
    pub wasm: &'a WasmModule,
    /// Controller's HTTP endpoint.
    pub controller: &'a ControllerEndpoint,
    /// Feed path of the owner on the controller.
    pub feed_path: &'a str,
}

pub use warmpath_envoy_config::override_host_lb_policy;

/// The Envoy cluster (v3 JSON) the filter polls the feed through on Envoy Gateway.
pub fn feed_cluster(name: &str, controller: &ControllerEndpoint) -> Value {
    let host = [(controller.host(), controller.port)];
    envoy_config::cluster(name, envoy_config::Discovery::StrictDns, &host, 2, None)
}

impl Owner {
    /// Short kind used in feed keys and object names: `policy` or `httproute`.
    pub fn short_kind(&self) -> &'static str {
        if self.kind == "HTTPRoute" {
            FEED_KIND_HTTPROUTE
        } else {
            FEED_KIND_POLICY
        }
    }
}

/// Feed cluster name for an owner on a provider (Envoy Gateway: one cluster per owner, named
/// after its feed key; Istio: the controller Service's outbound cluster).
pub fn feed_cluster_name(provider: Provider, owner: &Owner, controller: &ControllerEndpoint) -> String {
    match provider {
        Provider::EnvoyGateway => format!("warmpath-feed/{}/{}/{}", owner.short_kind(), owner.namespace, owner.name),
        Provider::Istio => format!("outbound|{}||{}", controller.port, controller.host()),
    }
}

/// Renders every object for one HTTPRoute, sorted by (kind, namespace, name).
///
/// Errors: the filter refuses the plugin configuration, or the combination is unsupported
/// (Istio with an InferencePool backend: Istio programs InferencePool clusters itself).
pub fn render(input: &RenderInput<'_>) -> Result<Vec<DynamicObject>, String> {
    let feed = FeedTarget {
        cluster: feed_cluster_name(input.provider, input.owner, input.controller),
        path: input.feed_path.to_string(),
        interval_ms: (input.intent.load.interval_seconds.clamp(1, 60) as u64) * 1000,
    };
    let mut out = match input.provider {
        Provider::EnvoyGateway => render_envoy_gateway(input, &input.intent.plugin_config(&feed, &[])?, &feed),
        Provider::Istio => render_istio(input, &feed)?,
    };
    out.sort_by(|a, b| {
        let key = |o: &DynamicObject| {
            (o.types.as_ref().map(|t| t.kind.clone()), o.metadata.namespace.clone(), o.metadata.name.clone())
        };
        key(a).cmp(&key(b))
    });
    Ok(out)
}

fn route_target(input: &RenderInput<'_>) -> Value {
    json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": input.route_name}])
}

fn gateway_target(gw: &GatewayRef) -> Value {
    json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gw.name})
}

fn render_envoy_gateway(input: &RenderInput<'_>, config: &Value, feed: &FeedTarget) -> Vec<DynamicObject> {
    let name = format!("warmpath-{}", input.route_name);
    let mut out = vec![
        object(
            &foreign::backend_traffic_policy(),
            input.route_namespace,
            &name,
            input.owner,
            json!({
                "targetRefs": route_target(input),
                "loadBalancer": {
                    "type": "LeastRequest",
                    "endpointOverride": {"extractFrom": [{"header": DESTINATION_HEADER}]},
                },
                // What Envoy does when an endpoint dies before the filter has learnt it (see
                // `warmpath_envoy_config::retry_policy` and `outlier_detection` for why): one retry on another
                // host (Envoy Gateway adds the `previous_hosts` predicate to every retry policy it renders) and
                // passive health checking (Envoy outlier detection).
                "retry": {
                    "numRetries": envoy_config::RETRIES,
                    "retryOn": {"triggers": envoy_config::RETRY_ON.split(',').collect::<Vec<_>>(), "httpStatusCodes": [503]},
                },
                "healthCheck": {"passive": envoy_gateway_passive_health_check()},
            }),
        ),
        object(
            &foreign::envoy_extension_policy(),
            input.route_namespace,
            &name,
            input.owner,
            json!({
                "targetRefs": route_target(input),
                "wasm": [{
                    "name": wasm_plugin_name(input.owner),
                    "rootID": "warmpath",
                    "code": {"type": "HTTP", "http": {"url": input.wasm.url, "sha256": input.wasm.sha256}},
                    "config": config,
                    "failOpen": input.intent.fail_open,
                }],
            }),
        ),
    ];
    let filter = envoy_gateway_wasm_filter_name(input.route_namespace, &name);
    for gw in input.gateways {
        let epp = format!("warmpath-feed-{}-{}-{}", input.owner.short_kind(), input.owner.namespace, input.owner.name);
        let mut patches = vec![json!({
            "type": CLUSTER,
            "name": feed.cluster,
            "operation": {"op": "add", "path": "", "value": feed_cluster(&feed.cluster, input.controller)},
        })];
        for name in &gw.listeners {
            // First in every HTTP filter chain of the listener (`add` at index 0 of each `http_filters`): the
            // native strip of client-sent destination headers, so that a wasm VM that fails to fetch, load or run
            // (passed through under failOpen) cannot let a client choose the endpoint. Unnamed by owner: several
            // policies on one listener each insert one, which is harmless (removing twice).
            patches.push(json_path_add(
                LISTENER,
                name,
                "$..http_filters",
                "/0",
                envoy_config::strip_client_destination_headers(),
            ));
            patches.push(json_path_add(
                LISTENER,
                name,
                &format!("$..http_filters[?@.name == '{filter}']"),
                "/typed_config/config/allow_on_headers_stop_iteration",
                true.into(),
            ));
        }
        for route_config in &gw.route_configs {
            // On the routes the filter is enabled on (Envoy Gateway enables it per route in
            // `typed_per_filter_config`), room for the bodies it holds: Envoy Gateway's listeners buffer 32 KiB, so
            // without this every prompt above 32 KiB the filter holds would get a 413.
            patches.push(json_path_add(
                ROUTE_CONFIGURATION,
                route_config,
                &format!("$..routes[?@.typed_per_filter_config['{filter}']]"),
                "/request_body_buffer_limit",
                envoy_config::ROUTE_BODY_BUFFER_LIMIT_BYTES.into(),
            ));
        }
        out.push(object(
            &foreign::envoy_patch_policy(),
            &gw.namespace,
            &truncate(&epp),
            input.owner,
            json!({
                "type": "JSONPatch",
                "targetRef": gateway_target(gw),
                "jsonPatches": patches,
            }),
        ));
    }
    out
}

/// An `EnvoyPatchPolicy` operation adding `value` at `path` under every match of `json_path` (RFC 9535) in the
/// xDS resource of type `ty` named `name`.
fn json_path_add(ty: &str, name: &str, json_path: &str, path: &str, value: Value) -> Value {
    json!({"type": ty, "name": name, "operation": {"op": "add", "jsonPath": json_path, "path": path, "value": value}})
}

/// [`envoy_config::outlier_detection`] in Envoy Gateway's `BackendTrafficPolicy.healthCheck.passive` terms.
fn envoy_gateway_passive_health_check() -> Value {
    let od = envoy_config::outlier_detection();
    json!({
        "consecutive5XxErrors": od["consecutive_5xx"],
        "consecutiveGatewayErrors": od["consecutive_gateway_failure"],
        "interval": od["interval"],
        "baseEjectionTime": od["base_ejection_time"],
        "maxEjectionPercent": od["max_ejection_percent"],
    })
}

/// The xDS name Envoy Gateway gives the first wasm filter of an `EnvoyExtensionPolicy`
/// (`envoy.filters.http.wasm/envoyextensionpolicy/<namespace>/<name>/wasm/0`, Envoy Gateway's
/// xDS translator naming, v1.1 onwards). The patch that sets `allow_on_headers_stop_iteration`
/// selects the filter by this name.
pub fn envoy_gateway_wasm_filter_name(policy_namespace: &str, policy_name: &str) -> String {
    format!("envoy.filters.http.wasm/envoyextensionpolicy/{policy_namespace}/{policy_name}/wasm/0")
}

/// Name of the wasm HTTP filter rendered for an owner on Istio: unique per owner, so several
/// routes on one listener each get their own filter
/// (`envoy.filters.http.wasm/warmpath/<policy|httproute>/<ns>/<name>`).
pub fn wasm_filter_name(owner: &Owner) -> String {
    format!("envoy.filters.http.wasm/warmpath/{}/{}/{}", owner.short_kind(), owner.namespace, owner.name)
}

/// Envoy plugin name (wasm `PluginConfig.name`) of an owner's filter instance:
/// `warmpath/<policy|httproute>/<ns>/<name>`. Unique per owner because the filter shares its router
/// (prefix index, settings, endpoint set) between instances with the same plugin name in a VM.
pub fn wasm_plugin_name(owner: &Owner) -> String {
    format!("warmpath/{}/{}/{}", owner.short_kind(), owner.namespace, owner.name)
}

/// The Envoy HTTP filter (v3 JSON, `envoy.extensions.filters.http.wasm.v3.Wasm`) that runs the
/// module on an Istio gateway. Rendered whole, rather than through `WasmPlugin`, because that
/// cannot set `allow_on_headers_stop_iteration: true`, without which Envoy 1.40 does not honour the
/// filter's pause in the request-headers callback and `PREFIX_AWARE` requests hang. The module is
/// fetched over `feed_cluster` (the controller's HTTP server also serves the wasm module) and
/// checked against its sha256; V8 runtime; one VM (`vm_id: warmpath`) shared by the instances,
/// each with its own plugin name; `failure_policy` from the intent's `fail_open` (`FAIL_OPEN` by
/// default). Shared with the test that loads it into a real Envoy.
pub fn wasm_http_filter(name: &str, input: &RenderInput<'_>, config: &Value, feed_cluster: &str) -> Value {
    let plugin_name = wasm_plugin_name(input.owner);
    let configuration = config.to_string();
    envoy_config::wasm_http_filter(&envoy_config::WasmFilter {
        filter_name: name,
        plugin_name: &plugin_name,
        code: envoy_config::WasmCode::Remote {
            uri: &input.wasm.url,
            cluster: feed_cluster,
            sha256: &input.wasm.sha256,
        },
        configuration: &configuration,
        fail_open: input.intent.fail_open,
    })
}

fn render_istio(input: &RenderInput<'_>, feed: &FeedTarget) -> Result<Vec<DynamicObject>, String> {
    let (svc_ns, svc, port) = match input.backend {
        ResolvedBackend::Service { namespace, name, port } => (namespace, name, *port),
        ResolvedBackend::InferencePool { .. } => {
            return Err("Istio programs InferencePool backends itself (its own endpoint picker); use a Service backend for warmpath on Istio".into())
        }
    };
    // The filter is listener-wide on Istio; it acts only on requests bound for this cluster.
    let config = input.intent.plugin_config(feed, &[istio_outbound_cluster(input.controller, svc_ns, svc, port)])?;
    let filter = wasm_http_filter(&wasm_filter_name(input.owner), input, &config, &feed.cluster);
    let mut out = vec![];
    for gw in input.gateways {
        // One per owner and Gateway: a policy's routes share its backend, hence one filter instance
        // (same name, same configuration) serves them all on that Gateway.
        let name =
            truncate(&format!("warmpath-{}-{}-{}", input.owner.short_kind(), input.owner.namespace, input.owner.name));
        out.push(object(&foreign::envoy_filter(), &gw.namespace, &name, input.owner, json!({
            "targetRefs": [gateway_target(gw)],
            "configPatches": [
                {
                    // First in the gateway's HTTP filter chain: the native strip of client-sent destination
                    // headers, so that a wasm VM that fails to fetch, load or run (passed through under
                    // FAIL_OPEN) cannot let a client choose the endpoint.
                    "applyTo": "HTTP_FILTER",
                    "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                        "name": "envoy.filters.network.http_connection_manager",
                    }}}},
                    "patch": {"operation": "INSERT_FIRST", "value": envoy_config::strip_client_destination_headers()},
                },
                {
                    "applyTo": "HTTP_FILTER",
                    "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                        "name": "envoy.filters.network.http_connection_manager",
                        "subFilter": {"name": "envoy.filters.http.router"},
                    }}}},
                    "patch": {"operation": "INSERT_BEFORE", "value": filter},
                },
                {
                    "applyTo": "CLUSTER",
                    "match": {"context": "GATEWAY", "cluster": {"service": input.controller.service_host(svc_ns, svc), "portNumber": port}},
                    // Istio's default route retry policy retries connect failures and 503s on another host
                    // (`previous_hosts`), not resets; the filter adds them to every request it places
                    // (`x-envoy-retry-on`, `warmpath_core::headers::RETRY_ON`). The cluster gets outlier
                    // detection and a retry budget.
                    "patch": {"operation": "MERGE", "value": {
                        "load_balancing_policy": override_host_lb_policy(),
                        "outlier_detection": envoy_config::outlier_detection(),
                        "circuit_breakers": envoy_config::circuit_breakers(),
                    }},
                },
            ],
        })));
    }
    Ok(out)
}

/// Istio's name for the outbound cluster of a Service port on a gateway:
/// `outbound|<port>||<service>.<namespace>.svc.<cluster domain>` (Istio's cluster naming,
/// `model.BuildSubsetKey`). The filter's `upstream_clusters` use it.
pub fn istio_outbound_cluster(controller: &ControllerEndpoint, namespace: &str, service: &str, port: u16) -> String {
    format!("outbound|{port}||{}", controller.service_host(namespace, service))
}

fn truncate(name: &str) -> String {
    name.chars().take(253).collect::<String>().trim_end_matches(['-', '.']).to_string()
}

/// Builds one object with our labels, the owner annotation, and an owner reference when the
/// object lives in the owner's namespace (Kubernetes forbids cross-namespace owners; those
/// objects are removed by the owner's finalizer instead).
fn object(ar: &ApiResource, namespace: &str, name: &str, owner: &Owner, spec: Value) -> DynamicObject {
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), crate::FIELD_MANAGER.to_string()),
        (LABEL_OWNER_UID.to_string(), owner.uid.clone()),
    ]);
    let annotations =
        BTreeMap::from([(ANNOTATION_OWNER.to_string(), format!("{}/{}/{}", owner.kind, owner.namespace, owner.name))]);
    let owner_references = (namespace == owner.namespace).then(|| {
        vec![OwnerReference {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    });
    let mut obj = DynamicObject::new(name, ar).within(namespace);
    obj.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references,
        ..ObjectMeta::default()
    };
    obj.data = json!({ "spec": spec });
    obj
}

/// YAML stream (`---`-separated) of rendered objects, as `render -f` prints it.
///
/// Errors: serialization failure (not expected).
pub fn to_yaml_stream(objects: &[DynamicObject]) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(o)?);
    }
    Ok(out)
}
