//! Test fixtures: object builders (as JSON, the way users write manifests) and an in-memory API
//! client (`kube-fake-client`) that knows every kind the controller reads or writes.
//! Used by the tests of this crate only.

use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::Client;
use serde_json::{json, Value};

use warmpath_controller::crd::routing_policy::InferenceRoutingPolicy;
use warmpath_controller::foreign::handles::*;
use warmpath_controller::reconcile::{Context, ControllerConfig};
use warmpath_controller::render::WasmModule;

/// Envoy Gateway's GatewayClass controller name.
pub const EG_CONTROLLER: &str = "gateway.envoyproxy.io/gatewayclass-controller";
/// Istio's GatewayClass controller name.
pub const ISTIO_CONTROLLER: &str = "istio.io/gateway-controller";

/// An in-memory API client loaded with `objects` (JSON manifests).
pub async fn client(objects: Vec<Value>) -> Client {
    use gateway_api::apis::standard::{gatewayclasses::GatewayClass, gateways::Gateway, httproutes::HttpRoute};
    kube_fake_client::ClientBuilder::new()
        .with_resource::<InferenceRoutingPolicy>()
        .with_status_subresource::<InferenceRoutingPolicy>()
        .with_resource::<HttpRoute>()
        .with_status_subresource::<HttpRoute>()
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
        .expect("fake client")
}

/// A context over `client` with a fixed wasm module and auto-detected provider.
pub fn context(client: Client) -> Context {
    Context::new(
        client,
        ControllerConfig {
            wasm: WasmModule {
                url: "http://warmpath-controller.warmpath-system.svc.cluster.local:8080/wasm/warmpath_filter-0123456789abcdef.wasm".into(),
                sha256: "0123456789abcdef".repeat(4),
            },
            ..ControllerConfig::default()
        },
    )
}

/// A GatewayClass.
pub fn gateway_class(name: &str, controller: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": name},
           "spec": {"controllerName": controller}})
}

/// A Gateway with one HTTP listener.
pub fn gateway(ns: &str, name: &str, class: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": ns},
           "spec": {"gatewayClassName": class, "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
}

/// An HTTPRoute attached to Gateway `gw_ns/gw` with one Service backendRef.
pub fn http_route(ns: &str, name: &str, gw_ns: &str, gw: &str, svc: &str, port: i64, annotations: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": name, "namespace": ns, "annotations": annotations},
           "spec": {"parentRefs": [{"name": gw, "namespace": gw_ns}],
                    "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                               "backendRefs": [{"name": svc, "port": port}]}]}})
}

/// A Service with one named port.
pub fn service(ns: &str, name: &str, port: i64) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": port, "targetPort": port}]}})
}

/// An EndpointSlice of Service `svc` with the given ready `IP`s on `port` (port name `http`).
pub fn endpoint_slice(ns: &str, svc: &str, port: i64, ips: &[&str]) -> Value {
    let eps: Vec<Value> = ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{svc}-abc"), "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}], "endpoints": eps})
}

/// An InferenceRoutingPolicy targeting HTTPRoute `route` with `extra` merged into the spec.
pub fn policy(ns: &str, name: &str, route: &str, extra: Value) -> Value {
    let mut spec = json!({"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "InferenceRoutingPolicy", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Creates an object from JSON through the API (so it gets uid, timestamps, generation).
pub async fn create<K>(client: &Client, ns: &str, obj: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(obj).expect("fixture matches type");
    Api::<K>::namespaced(client.clone(), ns).create(&PostParams::default(), &typed).await.expect("create")
}

/// Every object of the rendered kinds, as `(Kind, namespace, name)`, sorted.
pub async fn owned_objects(client: &Client) -> Vec<(String, String, String)> {
    let mut out = vec![];
    for ar in warmpath_controller::foreign::owned_kinds() {
        let list = Api::<DynamicObject>::all_with(client.clone(), &ar).list(&Default::default()).await.expect("list");
        for o in list.items {
            out.push((ar.kind.clone(), o.metadata.namespace.unwrap_or_default(), o.metadata.name.unwrap_or_default()));
        }
    }
    out.sort();
    out
}

/// Fetches one rendered object by kind.
pub async fn get_owned(client: &Client, kind: &str, ns: &str, name: &str) -> Option<DynamicObject> {
    let ar = warmpath_controller::foreign::owned_kinds().into_iter().find(|a| a.kind == kind)?;
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar).get_opt(name).await.expect("get")
}

/// The object as the watcher delivers it once a delete was requested while finalizers remain:
/// same object, `deletionTimestamp` set. (kube-fake-client 0.3 deletes at once whatever the
/// finalizers and drops `deletionTimestamp` on create, so the pending-deletion state is built here;
/// the test then checks the finalizer was released and deletes the object for real.)
pub fn as_deleted<K: kube::Resource>(mut obj: K) -> K {
    obj.meta_mut().deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    obj
}

/// Plays Envoy Gateway: writes its `status.ancestors` entry for Gateway `gw_ns/gw` on one object,
/// with conditions `(type, status, reason, message)`. Without `observedGeneration`: kube-fake-client
/// 0.3 bumps `metadata.generation` on every write (this status write, and each no-op re-apply),
/// where an API server bumps it on spec changes only, so no generation written here would stay current.
pub async fn eg_status(
    client: &Client,
    kind: &str,
    ns: &str,
    name: &str,
    (gw_ns, gw): (&str, &str),
    conds: &[(&str, &str, &str, &str)],
) {
    let ar = warmpath_controller::foreign::owned_kinds()
        .into_iter()
        .find(|a| a.kind == kind)
        .expect("an Envoy Gateway kind");
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar);
    let conditions: Vec<Value> = conds
        .iter()
        .map(|(t, s, r, m)| json!({"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": "2026-01-01T00:00:00Z"}))
        .collect();
    let status = json!({"status": {"ancestors": [{
        "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": gw_ns, "name": gw},
        "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
        "conditions": conditions}]}});
    api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status))
        .await
        .expect("status written");
}

/// Plays Envoy Gateway accepting every Envoy Gateway object the controller rendered, and
/// programming its EnvoyPatchPolicies, for Gateway `gw_ns/gw`.
pub async fn eg_reports_programmed(client: &Client, gw: (&str, &str)) {
    for (kind, ns, name) in owned_objects(client).await {
        let conds: &[(&str, &str, &str, &str)] = match kind.as_str() {
            "EnvoyPatchPolicy" => &[
                ("Accepted", "True", "Accepted", "Policy has been accepted."),
                ("Programmed", "True", "Programmed", "Patches have been successfully applied."),
            ],
            "EnvoyExtensionPolicy" | "BackendTrafficPolicy" => {
                &[("Accepted", "True", "Accepted", "Policy has been accepted.")]
            }
            _ => continue,
        };
        eg_status(client, &kind, &ns, &name, gw, conds).await;
    }
}
