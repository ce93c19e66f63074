//! Which Nodes a ModelCache targets: the predicate the controller (status, finalizer) and the node
//! agent (what to hold on its own node) must agree on.

use k8s_openapi::api::core::v1::Node;
use kube::{Resource, ResourceExt};

use crate::model_cache::ModelCacheSpec;

/// Node label holding the instance type (well-known label).
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// True when the node is a target of the cache: all selector labels match, the instance type is
/// allowed, and the node is not lost (its `Ready` condition is not False/Unknown) or being deleted.
pub fn is_target(spec: &ModelCacheSpec, node: &Node) -> bool {
    let labels = node.labels();
    let selected = spec.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v));
    let typed = spec.instance_types.is_empty()
        || labels.get(INSTANCE_TYPE_LABEL).is_some_and(|t| spec.instance_types.contains(t));
    selected && typed && node.meta().deletion_timestamp.is_none() && !node_lost(node)
}

/// A node whose `Ready` condition is `False` or `Unknown` (kubelet stopped reporting) counts as lost.
pub fn node_lost(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status != "True")
}
