//! `InferenceEndpoint` (`warmpath.dev/v1alpha1`, namespaced): what users write to serve a model. The
//! controller creates and owns everything else: the ModelCache (weights on node-local disk), a shared
//! ImageCache (image pre-pull), the Deployment and Service of the model server, and an
//! InferenceRoutingPolicy for the routes that send traffic to it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Probe, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::model_cache::{ModelSource, SHA256_PATTERN};

/// Finalizer that releases the endpoint's image-cache reference and caches.
pub const FINALIZER: &str = "warmpath.dev/inference-endpoint-cleanup";
/// Deployment annotation naming the ModelCache its pods mount.
pub const MODEL_CACHE_ANNOTATION: &str = "warmpath.dev/model-cache";
/// Label on objects created for an endpoint, naming it.
pub const ENDPOINT_LABEL: &str = "warmpath.dev/inference-endpoint";
/// Mount path of the weights in the model-server container; the files are in `current/` below it.
pub const MODEL_MOUNT: &str = "/models";

/// Phases.
pub mod phase {
    /// Weights are being put on the target nodes; no Deployment yet (or the old one keeps serving).
    pub const WAITING_FOR_WEIGHTS: &str = "WaitingForWeights";
    /// Deployment created or rolling out.
    pub const PROGRESSING: &str = "Progressing";
    /// All replicas available on the current cache.
    pub const READY: &str = "Ready";
    /// The weights cache failed on some node (reason in the ModelCache).
    pub const FAILED: &str = "Failed";
}

/// A model served by a Deployment, with cache warming and routing.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "warmpath.dev",
    version = "v1alpha1",
    kind = "InferenceEndpoint",
    derive = "Default",
    namespaced,
    status = "InferenceEndpointStatus",
    shortname = "ie",
    category = "warmpath",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Cache","type":"string","jsonPath":".status.modelCache"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[kube(validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63").message("the name must be a DNS label of 1-63 characters starting with a letter (lower-case letters, digits, '-'): it names the endpoint's Service and a label value"))]
#[serde(rename_all = "camelCase")]
pub struct InferenceEndpointSpec {
    /// Where the weights come from.
    pub model: ModelSource,
    /// Expected sha256 (64 hex chars) per weights file (see `ModelCache.spec.sha256`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("additionalProperties" = {"type": "string", "pattern": SHA256_PATTERN}))]
    pub sha256: BTreeMap<String, String>,
    /// Model-server image.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Pull secrets for the image (same namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Arguments of the model server. `$(WARMPATH_MODEL_DIR)` expands to the weights directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Replicas, 0–1000; default 1. Ignored while `autoscaling.enabled` (an autoscaler owns it).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Replicas set by an autoscaler (HPA, KEDA) instead of `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingConfig>,
    /// ServiceAccount of the pods (model server and the cold-node fallback fetch), e.g. one bound to an
    /// IAM role (IRSA, Pod Identity) that can read the S3 source. Default: the namespace's `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Environment of both the model server and the cold-node fallback fetch (e.g. `AWS_REGION`, or
    /// `AWS_ACCESS_KEY_ID` from a Secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Environment from ConfigMaps or Secrets, for both containers like `env`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    /// Tolerations of the pods (GPU nodes are usually tainted, e.g. `nvidia.com/gpu:NoSchedule`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Readiness probe of the model server. Default: `GET /health` on the serving port every 5 s
    /// (timeout 2 s, 3 failures to turn unready) — the health endpoint of vLLM, SGLang, TGI and
    /// llama.cpp's server, which fails until the weights are loaded. A rollout then waits for
    /// loaded servers (`maxUnavailable: 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// Container resources (GPUs, memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Serving port, 1–65535; default 8000.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Nodes the endpoint runs on (and that the caches target). Empty: every node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Routing through the gateway (rendered as an InferenceRoutingPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<EndpointRouting>,
    /// Which caches to use.
    #[serde(default)]
    pub model_cache_config: ModelCacheConfig,
}

fn default_replicas() -> i32 {
    1
}

/// `autoscaling`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingConfig {
    /// True when an HPA or KEDA ScaledObject scales the endpoint's Deployment (same name as the
    /// endpoint): the controller never writes `replicas`, so it does not fight the autoscaler.
    /// Default false.
    #[serde(default)]
    pub enabled: bool,
}
fn default_port() -> i32 {
    8000
}

/// Routing of the endpoint's traffic.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointRouting {
    /// HTTPRoutes (same namespace) that send traffic to this endpoint's Service.
    #[schemars(length(min = 1, max = 16))]
    pub http_routes: Vec<String>,
    /// `RANDOM`, `LEAST_OUTSTANDING_REQUESTS` or `PREFIX_AWARE` (default).
    #[serde(default = "default_strategy")]
    #[schemars(extend("enum" = ["RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE"]))]
    pub strategy: String,
    /// See `InferenceRoutingPolicy.spec.prefixLength`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<i64>,
    /// See `InferenceRoutingPolicy.spec.concurrencyThreshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_threshold: Option<i64>,
}

fn default_strategy() -> String {
    "PREFIX_AWARE".into()
}

/// `modelCacheConfig`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheConfig {
    /// Weights on node-local disk.
    #[serde(default)]
    pub weights_cache: WeightsCacheConfig,
    /// Image pre-pull.
    #[serde(default)]
    pub image_cache: ImageCacheConfig,
}

/// `modelCacheConfig.weightsCache`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightsCacheConfig {
    /// Default false: pods download from the source at start.
    #[serde(default)]
    pub enabled: bool,
    /// Host directory of the caches; default `/opt/warmpath/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/"))]
    pub host_path: Option<String>,
}

/// `modelCacheConfig.imageCache`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheConfig {
    /// Default false.
    #[serde(default)]
    pub enabled: bool,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceEndpointStatus {
    /// `WaitingForWeights`, `Progressing`, `Ready` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// ModelCache the endpoint wants (new pods mount it once it is ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_cache: Option<String>,
    /// ModelCache the running Deployment still mounts during a source change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_model_cache: Option<String>,
    /// ImageCache of the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_cache: Option<String>,
    /// Available replicas of the Deployment.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Target nodes of the serving ModelCache that do not hold it now (downloading, failed, or joined
    /// since): pods placed there fetch from the source at start. 0 when every target node is warm.
    #[serde(default)]
    pub degraded_nodes: i32,
    /// Image the running Deployment serves while a new image is being pulled onto the target nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_image: Option<String>,
    /// Conditions (`Ready`), keyed by type.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
