//! `InferenceRoutingPolicy` (`warmpath.dev/v1alpha1`, namespaced): turns prefix-aware routing on for
//! HTTPRoutes, in the Gateway API policy-attachment style (GEP-713 direct policy attachment).
//!
//! Ranges follow the filter's plugin configuration (`warmpath-core` settings), so that anything the
//! API server accepts the filter accepts too. Numbers are `i64` on purpose: an out-of-range value
//! that slipped past the schema (an old CRD, a hand-edited object) still deserializes and is
//! reported in status instead of breaking the controller's watch.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use warmpath_core::config::{
    BLOCK_SIZE_RANGE, CONCURRENCY_THRESHOLD_RANGE, MAX_HEADER_NAME_BYTES, PREFIX_LENGTH_RANGE,
};

/// Group of Gateway API resources (`gateway.networking.k8s.io`).
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";
/// Group of the Gateway API Inference Extension's `InferencePool` (v1).
pub const INFERENCE_POOL_GROUP: &str = "inference.networking.k8s.io";

/// The accepted `strategy` values (the CRD's enum), in one spelling.
pub const STRATEGIES: [&str; 3] = ["RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE"];

/// Desired routing for the targeted HTTPRoutes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "warmpath.dev",
    version = "v1alpha1",
    kind = "InferenceRoutingPolicy",
    namespaced,
    status = "InferenceRoutingPolicyStatus",
    shortname = "irp",
    category = "warmpath",
    printcolumn = r#"{"name":"Strategy","type":"string","jsonPath":".spec.strategy"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetRefs[*].name"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.ancestors[0].conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[kube(cel)]
#[kube(derive = "Default")]
#[x_kube(
    validation = Rule::new("!has(self.prefixLength) || self.strategy == 'PREFIX_AWARE'").message("prefixLength applies only to strategy PREFIX_AWARE"),
    validation = Rule::new("!has(self.blockSize) || self.strategy == 'PREFIX_AWARE'").message("blockSize applies only to strategy PREFIX_AWARE"),
    validation = Rule::new("!has(self.prefixLength) || !has(self.blockSize) || self.blockSize <= self.prefixLength").message("blockSize must not exceed prefixLength")
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceRoutingPolicySpec {
    /// HTTPRoutes (same namespace) whose traffic this policy routes. 1–16 entries, unique names.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(validation = Rule::new("self.all(x, self.exists_one(y, y.name == x.name))").message("targetRefs must name each HTTPRoute once"))]
    pub target_refs: Vec<PolicyTargetRef>,

    /// `RANDOM`, `LEAST_OUTSTANDING_REQUESTS` or `PREFIX_AWARE` (default), spelled exactly so (also
    /// in the `warmpath.dev/routing-strategy` annotation). A string in Rust so an unknown value is
    /// reported in status (reason `Invalid`) rather than failing the watch.
    #[serde(default = "default_strategy")]
    #[schemars(extend("enum" = STRATEGIES))]
    pub strategy: String,

    /// Characters of extracted prompt text (bytes for raw bodies) hashed for the prefix key;
    /// 1024–65536. Unset: the filter's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = PREFIX_LENGTH_RANGE.0, max = PREFIX_LENGTH_RANGE.1))]
    pub prefix_length: Option<i64>,

    /// UTF-8 bytes of extracted text per hashed block (the unit of longest-prefix matching);
    /// 16–8192 and at most `prefixLength`. Unset: the filter's default (128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = BLOCK_SIZE_RANGE.0, max = BLOCK_SIZE_RANGE.1))]
    pub block_size: Option<i64>,

    /// In-flight requests (this gateway's, or the server's waiting + running if larger) at which an endpoint is
    /// no longer chosen while another is below it; 1–1024. Unset: the filter's default (64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = CONCURRENCY_THRESHOLD_RANGE.0, max = CONCURRENCY_THRESHOLD_RANGE.1))]
    pub concurrency_threshold: Option<i64>,

    /// Request header holding the tenant id that namespaces prefix keys (HTTP header name,
    /// lower case, at most 128 characters). Unset: the filter's default `x-warmpath-prefix-id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_HEADER_NAME_BYTES), regex(pattern = r"^[a-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub tenant_header: Option<String>,

    /// What the gateway does when the filter cannot run: `FailOpen` (default; route with the
    /// fallback policy) or `FailClosed` (reject the request).
    #[serde(default)]
    pub failure_mode: FailureMode,

    /// The endpoints routed: a Service port or an InferencePool. Unset: the first backendRef of
    /// the targeted route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendRef>,

    /// How the controller reads each model server's load for the feed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadSource>,

    /// Adds the `x-warmpath-decision` response header: the strategy that ran and, for a request that
    /// could not be keyed, its own fail-open cause; never the pick or anything about other requests
    /// (the pick is in Envoy's access log, `%UPSTREAM_HOST%`). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub debug_header: bool,
}

impl Default for InferenceRoutingPolicySpec {
    fn default() -> Self {
        Self {
            target_refs: vec![],
            strategy: default_strategy(),
            prefix_length: None,
            block_size: None,
            concurrency_threshold: None,
            tenant_header: None,
            failure_mode: FailureMode::FailOpen,
            backend: None,
            load: None,
            debug_header: false,
        }
    }
}

fn default_strategy() -> String {
    "PREFIX_AWARE".into()
}

/// A Gateway API `LocalPolicyTargetReference` restricted to HTTPRoutes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetRef {
    /// Always `gateway.networking.k8s.io`.
    #[schemars(extend("enum" = ["gateway.networking.k8s.io"]))]
    pub group: String,
    /// Always `HTTPRoute`.
    #[schemars(extend("enum" = ["HTTPRoute"]))]
    pub kind: String,
    /// Name of the HTTPRoute in the policy's namespace (a DNS subdomain, ≤ 253 characters).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Failure mode of the wasm filter in the data plane.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum FailureMode {
    /// Requests continue with the fallback load balancer when the filter cannot run.
    #[default]
    FailOpen,
    /// Requests fail when the filter cannot run.
    FailClosed,
}

/// The backend whose endpoints are routed: exactly one of `service` or `inferencePool`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.service) != has(self.inferencePool)").message("backend needs exactly one of service or inferencePool"))]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// A Service port in the policy's namespace; endpoints come from its EndpointSlices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceBackend>,
    /// A Gateway API Inference Extension `InferencePool` (`inference.networking.k8s.io/v1`) in
    /// the policy's namespace; endpoints are its selected pods on its target port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_pool: Option<InferencePoolBackend>,
}

/// A Service and port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBackend {
    /// Service name.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Service port number, 1–65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i64,
}

/// An InferencePool by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolBackend {
    /// InferencePool name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where and how often the controller scrapes model-server metrics (Prometheus text format).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadSource {
    /// HTTP path of the metrics endpoint; default `/metrics` (vLLM, SGLang and llama.cpp all use it).
    #[serde(default = "default_metrics_path")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^/"))]
    pub metrics_path: String,
    /// Port of the metrics endpoint, 1–65535; default: the serving port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: Option<i64>,
    /// Scrape interval in seconds, 1–300; default 5.
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1, max = 300))]
    pub interval_seconds: i64,
}

fn default_metrics_path() -> String {
    "/metrics".into()
}
fn default_interval() -> i64 {
    5
}

impl Default for LoadSource {
    fn default() -> Self {
        Self { metrics_path: default_metrics_path(), metrics_port: None, interval_seconds: default_interval() }
    }
}

/// Status in the Gateway API `PolicyStatus` shape: one entry per ancestor (the Gateways the
/// targeted routes attach to, or the route itself when it cannot be resolved).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceRoutingPolicyStatus {
    /// Per-ancestor conditions (`Accepted`, `ResolvedRefs`, `Programmed`). At most 16.
    #[serde(default)]
    pub ancestors: Vec<PolicyAncestorStatus>,
    /// URL path of this policy's endpoint/load feed on the controller's feed server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feed_path: Option<String>,
    /// `metadata.generation` the status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Gateway API `PolicyAncestorStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    /// The ancestor (a Gateway, or the HTTPRoute when its Gateways are unknown).
    pub ancestor_ref: AncestorRef,
    /// Controller that wrote this entry: `warmpath.dev/controller`.
    pub controller_name: String,
    /// Conditions, keyed by type.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A Gateway API `ParentReference` (subset).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AncestorRef {
    /// API group (`gateway.networking.k8s.io`).
    pub group: String,
    /// Kind (`Gateway` or `HTTPRoute`).
    pub kind: String,
    /// Namespace of the ancestor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the ancestor.
    pub name: String,
    /// Listener name, when the route attaches to one listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// Controller name written into `status.ancestors[].controllerName`.
pub const CONTROLLER_NAME: &str = "warmpath.dev/controller";
