//! `ImageCache` (`warmpath.dev/v1alpha1`, namespaced): a container image kept pulled on the target
//! nodes, shared by every InferenceEndpoint in the namespace that uses the same image.
//!
//! Pre-pull without a container-runtime socket: the controller runs a DaemonSet per ImageCache whose
//! init container *is* the image (running a no-op command), so the kubelet pulls it with the node's
//! normal credentials and pull secrets; the main container is a tiny pause image that keeps the pod,
//! and so the image, referenced (the kubelet's image GC does not remove images used by a pod).
//!
//! Reference counting: every InferenceEndpoint using the image is an owner reference of the
//! ImageCache (non-controller). The controller removes an endpoint's reference when the endpoint stops
//! using the image, and deletes an ImageCache it created once no reference is left (Kubernetes garbage
//! collection does the same when the last owner is deleted).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Finalizer that removes the pre-pull DaemonSet and the node labels.
pub const FINALIZER: &str = "warmpath.dev/image-cache-cleanup";
/// Prefix of the node label set (by the controller) when the image is pulled on the node.
pub const IMAGE_READY_PREFIX: &str = "warmpath.dev/image-ready-";
/// Label on ImageCaches the controller created for endpoints (deleted when unreferenced).
pub const MANAGED_LABEL: &str = "warmpath.dev/managed-by";
/// Value of [`MANAGED_LABEL`].
pub const MANAGED_BY_ENDPOINTS: &str = "inference-endpoint";
/// Label on the pre-pull DaemonSet's pods naming their ImageCache.
pub const PREPULL_POD_LABEL: &str = "warmpath.dev/image-cache";
/// Default main container of pre-pull pods (keeps the pod alive at ~1 MiB of memory).
pub const DEFAULT_PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Phases.
pub mod phase {
    /// Pulls in progress on some target nodes.
    pub const PULLING: &str = "Pulling";
    /// Pulled on every target node.
    pub const CACHED: &str = "Cached";
    /// A pull failed (reason in `status.nodes`).
    pub const FAILED: &str = "Failed";
    /// Being removed.
    pub const DELETING: &str = "Deleting";
}

/// An image to keep pulled.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "warmpath.dev",
    version = "v1alpha1",
    kind = "ImageCache",
    derive = "Default",
    namespaced,
    status = "ImageCacheStatus",
    shortname = "ic",
    category = "warmpath",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Cached","type":"integer","jsonPath":".status.cached"}"#,
    printcolumn = r#"{"name":"Target","type":"integer","jsonPath":".status.target"}"#,
    printcolumn = r#"{"name":"Refs","type":"integer","jsonPath":".status.references"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheSpec {
    /// Image reference (`registry/repo:tag` or `@sha256:` digest).
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Pull secrets (same namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Target nodes: labels a node must have (empty: every schedulable node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// No-op command run with the image; default `["/bin/sh", "-c", "exit 0"]` (model-server images ship a shell).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageCacheStatus {
    /// `Pulling`, `Cached`, `Failed` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Nodes the pre-pull DaemonSet targets.
    #[serde(default)]
    pub target: i32,
    /// Nodes with the image pulled.
    #[serde(default)]
    pub cached: i32,
    /// InferenceEndpoints referencing this image.
    #[serde(default)]
    pub references: i32,
    /// Per-node pull state (sorted by node).
    #[serde(default)]
    pub nodes: Vec<NodeImageStatus>,
    /// Conditions (`Ready`), keyed by type.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One node's pull state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageStatus {
    /// Node name.
    pub node: String,
    /// `Pulling`, `Cached` or `Failed`.
    pub state: String,
    /// Kubelet reason when not cached (`ErrImagePull`, `ImagePullBackOff`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Name of the ImageCache the controller creates for `image`: `img-` + 16 hex chars of its sha256.
pub fn image_cache_name(image: &str) -> String {
    format!("img-{}", &hex::encode(Sha256::digest(image.as_bytes()))[..16])
}

/// Node label marking an ImageCache's image pulled on a node:
/// `warmpath.dev/image-ready-<namespace>.<name>` (shortened like the cache-ready label when long).
pub fn image_ready_label(namespace: &str, name: &str) -> String {
    let suffix = super::model_cache::label_suffix(&format!("{namespace}.{name}"), 63 - "image-ready-".len());
    format!("{IMAGE_READY_PREFIX}{suffix}")
}
