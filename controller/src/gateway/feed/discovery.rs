//! A backend's ready endpoints: from the Service's EndpointSlices (`discovery.k8s.io/v1`), or from
//! the pods an InferencePool (`inference.networking.k8s.io/v1`) selects.

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::Client;

use super::scrape::Target;
use crate::crd::routing_policy::LoadSource;
use crate::render::ResolvedBackend;

/// Label EndpointSlices carry naming their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

fn join(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Ready endpoints of a Service port, from its EndpointSlices. The Service port is matched to the
/// slice port by name (how the EndpointSlice controller names them); endpoints whose `ready`
/// condition is false are skipped (unset counts as ready, per the EndpointSlice API).
pub fn service_targets(service: &Service, port: u16, slices: &[EndpointSlice], load: &LoadSource) -> Result<Vec<Target>, String> {
    let svc_port = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.port == port as i32))
        .ok_or_else(|| format!("Service has no port {port}"))?;
    let port_name = svc_port.name.clone().unwrap_or_default();
    let mut out = vec![];
    for slice in slices {
        let Some(target_port) = slice
            .ports
            .as_ref()
            .and_then(|ps| ps.iter().find(|p| p.name.clone().unwrap_or_default() == port_name))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            if let Some(ip) = ep.addresses.first() {
                let metrics_port = load.metrics_port.map(|p| p as i32).unwrap_or(target_port);
                out.push(Target { address: join(ip, target_port), metrics_address: join(ip, metrics_port) });
            }
        }
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out.dedup();
    Ok(out)
}

/// Ready pods of an InferencePool (v1 fields `selector.matchLabels`, `targetPorts[0].number`).
pub fn pool_targets(pool: &DynamicObject, pods: &[Pod], load: &LoadSource) -> Result<Vec<Target>, String> {
    let port = pool.data["spec"]["targetPorts"][0]["number"]
        .as_i64()
        .ok_or("InferencePool has no spec.targetPorts[0].number")? as i32;
    let mut out = vec![];
    for pod in pods {
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if let (true, Some(ip)) = (ready, status.and_then(|s| s.pod_ip.as_ref())) {
            let metrics_port = load.metrics_port.map(|p| p as i32).unwrap_or(port);
            out.push(Target { address: join(ip, port), metrics_address: join(ip, metrics_port) });
        }
    }
    out.sort_by(|a, b| a.address.cmp(&b.address));
    out.dedup();
    Ok(out)
}

/// Label selector string (`k=v,k2=v2`) from an InferencePool's `spec.selector.matchLabels`.
pub fn pool_selector(pool: &DynamicObject) -> Result<String, String> {
    let labels = pool.data["spec"]["selector"]["matchLabels"]
        .as_object()
        .ok_or("InferencePool has no spec.selector.matchLabels")?;
    let mut parts: Vec<String> = labels.iter().filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}"))).collect();
    parts.sort();
    if parts.is_empty() {
        return Err("InferencePool selector is empty".into());
    }
    Ok(parts.join(","))
}

/// Reads the backend's ready endpoints from the API server.
///
/// Errors: the Service / InferencePool is missing or malformed (message for status/logs).
pub async fn targets(client: &Client, backend: &ResolvedBackend, load: &LoadSource) -> Result<Vec<Target>, String> {
    match backend {
        ResolvedBackend::Service { namespace, name, port } => {
            let svc = Api::<Service>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("Service {namespace}/{name} not found"))?;
            let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
                .await
                .map_err(|e| e.to_string())?;
            service_targets(&svc, *port, &slices.items, load)
        }
        ResolvedBackend::InferencePool { namespace, name } => {
            let pool = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &crate::foreign::inference_pool())
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("InferencePool {namespace}/{name} not found"))?;
            let selector = pool_selector(&pool)?;
            let pods = Api::<Pod>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            pool_targets(&pool, &pods.items, load)
        }
    }
}
