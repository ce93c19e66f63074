//! `warmpath-controller render -f FILE...`: the routing reconcilers' plans (what each policy and
//! annotated HTTPRoute resolves to, the objects they would apply and the policies' status) computed
//! from the given manifests alone — like `helm template`, for review and golden tests. No API
//! client: the plans read the manifests through [`Source::Manifests`], and nothing leaves the
//! process.
//!
//! Determinism: objects without `metadata.uid` get one derived from their kind/namespace/name, and
//! objects without `creationTimestamp` get document order (1 s apart from the epoch), so the
//! output (owner references, labels, conflict resolution) is stable.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::DynamicObject;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::reconcile::route_annotations::{self, RoutePlan};
use crate::reconcile::routing_policy::{self, PolicyPlan};
use crate::reconcile::source::{Manifests, Source};
use crate::reconcile::ControllerConfig;
use crate::routing::ANNOTATION_STRATEGY;

/// Result of an offline render.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Objects the controller would create, sorted by (kind, namespace, name), server fields removed.
    pub objects: Vec<DynamicObject>,
    /// One line per policy condition: `InferenceRoutingPolicy ns/name ancestor: Type=Status (Reason): message`.
    pub status: Vec<String>,
}

/// Splits multi-document YAML into JSON values (empty documents skipped).
///
/// Errors: a document is not valid YAML.
pub fn parse_manifests(text: &str) -> Result<Vec<Value>, String> {
    use serde::Deserialize;
    let mut out = vec![];
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| format!("YAML: {e}"))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn fake_uid(kind: &str, ns: &str, name: &str) -> String {
    let h = hex::encode(Sha256::digest(format!("{kind}/{ns}/{name}").as_bytes()));
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn normalise(mut objects: Vec<Value>) -> Vec<Value> {
    for (i, o) in objects.iter_mut().enumerate() {
        let kind = o["kind"].as_str().unwrap_or_default().to_string();
        let cluster_scoped = kind == "GatewayClass";
        let meta = &mut o["metadata"];
        if !meta.is_object() {
            *meta = serde_json::json!({});
        }
        if !cluster_scoped && meta.get("namespace").is_none() {
            meta["namespace"] = "default".into();
        }
        let ns = meta["namespace"].as_str().unwrap_or_default().to_string();
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        if meta.get("uid").is_none() {
            meta["uid"] = fake_uid(&kind, &ns, &name).into();
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = format!("1970-01-01T00:{:02}:{:02}Z", (i / 60) % 60, i % 60).into();
        }
    }
    objects
}

/// Renders what the controller would create for `manifests`: the routing plan of every policy
/// (oldest first wins a contested route, as on a cluster) and of every annotated HTTPRoute that no
/// policy overrides. A pure function of its input.
///
/// Errors: a manifest of a kind routing reads that does not match its schema, or a policy or route
/// without a name.
pub async fn render(manifests: Vec<Value>, config: ControllerConfig) -> Result<Rendered, String> {
    let m = Manifests::from_values(normalise(manifests))?;
    let src = Source::Manifests(&m);
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let err = |e: crate::Error| e.to_string();
    let mut out = Rendered::default();
    let mut policies = m.policies.clone();
    policies.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
    for p in policies.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let plan = routing_policy::plan(p, src, &config, &now).await.map_err(err)?;
        for a in plan.ancestors().iter().take(16) {
            for c in &a.conditions {
                out.status.push(format!(
                    "InferenceRoutingPolicy {}/{} {} {}: {}={} ({}){}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                    a.ancestor_ref.kind,
                    a.ancestor_ref.name,
                    c.type_,
                    c.status,
                    c.reason,
                    if c.message.is_empty() { String::new() } else { format!(": {}", c.message) }
                ));
            }
        }
        if let PolicyPlan::Program { objects, .. } = plan {
            out.objects.extend(objects);
        }
    }
    for r in m.routes.iter().filter(|r| r.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_STRATEGY))) {
        if let RoutePlan::Program { outcome, .. } = route_annotations::plan(r, src, &config, &now).await.map_err(err)? {
            out.objects.extend(outcome.objects);
        }
    }
    out.objects.sort_by_key(crate::reconcile::program::key_of);
    Ok(out)
}
