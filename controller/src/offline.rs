//! `warmpath-controller render -f FILE...`: runs the real routing reconcilers against an
//! in-memory API server (`kube-fake-client`) loaded with the given manifests, and returns every
//! object they would create plus the policies' resulting status — like `helm template`, for review
//! and golden tests. Nothing leaves the process.
//!
//! Determinism: objects without `metadata.uid` get one derived from their kind/namespace/name, and
//! objects without `creationTimestamp` get document order (1 s apart from the epoch), so the
//! output (owner references, labels, conflict resolution) is stable.

use std::sync::Arc;

use gateway_api::apis::standard::{gatewayclasses::GatewayClass, gateways::Gateway, httproutes::HttpRoute};
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::Client;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::crd::routing_policy::InferenceRoutingPolicy;
use crate::foreign::{self, handles::*};
use crate::reconcile::{route_annotations, routing_policy, Context, ControllerConfig};
use crate::routing::ANNOTATION_STRATEGY;

/// Result of an offline render.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Objects the controller would create, sorted by (kind, namespace, name), server fields removed.
    pub objects: Vec<DynamicObject>,
    /// What the controller would report: one line per policy condition
    /// (`InferenceRoutingPolicy ns/name <ancestor kind> <name>: Type=Status (Reason): message`), and one per event
    /// published for an annotated route (`HTTPRoute ns/name: <type> <reason>: <note>`, e.g. `NotProgrammed` with
    /// each parent's reason).
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

/// An in-memory API client knowing the kinds routing reads and writes.
///
/// Errors: an object cannot be loaded (unknown kind, missing name).
pub async fn client(objects: Vec<Value>) -> Result<Client, String> {
    kube_fake_client::ClientBuilder::new()
        .with_resource::<InferenceRoutingPolicy>()
        .with_status_subresource::<InferenceRoutingPolicy>()
        .with_resource::<HttpRoute>()
        .with_resource::<Gateway>()
        .with_resource::<GatewayClass>()
        .with_resource::<EnvoyExtensionPolicy>()
        .with_resource::<BackendTrafficPolicy>()
        .with_resource::<EnvoyPatchPolicy>()
        .with_resource::<EnvoyFilter>()
        .with_resource::<InferencePool>()
        .with_runtime_objects(objects)
        .build()
        .await
        .map_err(|e| format!("loading manifests: {e}"))
}

/// Renders what the controller would create for `manifests`.
///
/// Errors: manifests that cannot be loaded, or an API error inside the in-memory server.
pub async fn render(manifests: Vec<Value>, config: ControllerConfig) -> Result<Rendered, String> {
    // No gateway runs offline: nothing to read its status back from.
    let config = ControllerConfig { live_status: false, ..config };
    let client = client(normalise(manifests)).await?;
    let ctx = Arc::new(Context::new(client.clone(), config));
    let err = |e: crate::Error| e.to_string();
    let policies = Api::<InferenceRoutingPolicy>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| e.to_string())?;
    for p in &policies.items {
        let api = Api::<InferenceRoutingPolicy>::namespaced(client.clone(), &p.metadata.namespace.clone().unwrap_or_default());
        // Twice: the first pass adds the finalizer, as on a cluster.
        for _ in 0..2 {
            let cur = api.get(p.metadata.name.as_deref().unwrap_or_default()).await.map_err(|e| e.to_string())?;
            routing_policy::reconcile(Arc::new(cur), ctx.clone()).await.map_err(err)?;
        }
    }
    let routes = Api::<HttpRoute>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| e.to_string())?;
    for r in routes.items.iter().filter(|r| r.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_STRATEGY))) {
        let api = Api::<HttpRoute>::namespaced(client.clone(), &r.metadata.namespace.clone().unwrap_or_default());
        for _ in 0..2 {
            let cur = api.get(r.metadata.name.as_deref().unwrap_or_default()).await.map_err(|e| e.to_string())?;
            route_annotations::reconcile(Arc::new(cur), ctx.clone()).await.map_err(err)?;
        }
    }

    let mut out = Rendered::default();
    for ar in foreign::owned_kinds() {
        let list = Api::<DynamicObject>::all_with(client.clone(), &ar)
            .list(&ListParams::default().labels(&format!("{}={}", crate::render::LABEL_MANAGED_BY, crate::FIELD_MANAGER)))
            .await
            .map_err(|e| e.to_string())?;
        for mut o in list.items {
            o.types = Some(kube::core::TypeMeta { api_version: ar.api_version.clone(), kind: ar.kind.clone() });
            o.metadata.resource_version = None;
            o.metadata.uid = None;
            o.metadata.generation = None;
            o.metadata.creation_timestamp = None;
            o.metadata.managed_fields = None;
            out.objects.push(o);
        }
    }
    out.objects.sort_by_key(crate::reconcile::program::key_of);
    let mut policies = Api::<InferenceRoutingPolicy>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
    // The in-memory server lists in hash order; sort for stable output.
    policies.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
    for p in policies {
        for a in p.status.iter().flat_map(|s| s.ancestors.iter()) {
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
    }
    // Annotated routes: their status is only written on a live cluster, so report the events the
    // reconciler published for them (Programmed / NotProgrammed with each ancestor's reason, …).
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| e.to_string())?;
    let mut lines: Vec<String> = events
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some("HTTPRoute")))
        .map(|e| {
            let r = e.regarding.as_ref();
            format!(
                "HTTPRoute {}/{}: {} {}: {}",
                r.and_then(|r| r.namespace.as_deref()).unwrap_or_default(),
                r.and_then(|r| r.name.as_deref()).unwrap_or_default(),
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.note.as_deref().unwrap_or_default()
            )
        })
        .collect();
    lines.sort();
    lines.dedup();
    out.status.extend(lines);
    Ok(out)
}
