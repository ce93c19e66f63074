//! A backend's ready endpoints: from the Service's EndpointSlices (`discovery.k8s.io/v1`), or from
//! the pods an InferencePool (`inference.networking.k8s.io/v1`) selects.

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
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

/// Whether an EndpointSlice endpoint should get new requests: `ready` and `serving` not false and
/// `terminating` not true (unset conditions count as ready/serving and not terminating, per the
/// EndpointSlice API). A terminating endpoint that still serves is being drained: it leaves the feed,
/// so the filter sends it nothing new, while the gateway's cluster (its own EDS) keeps it until it
/// goes, so its in-flight requests finish.
pub fn takes_new_requests(conditions: Option<&EndpointConditions>) -> bool {
    let c = conditions.cloned().unwrap_or_default();
    c.ready != Some(false) && c.serving != Some(false) && c.terminating != Some(true)
}

/// Endpoints of a Service port that take new requests ([`takes_new_requests`]), from its
/// EndpointSlices. The Service port is matched to the slice port by name (how the EndpointSlice
/// controller names them).
pub fn service_targets(
    service: &Service,
    port: u16,
    slices: &[EndpointSlice],
    load: &LoadSource,
) -> Result<Vec<Target>, String> {
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
            if !takes_new_requests(ep.conditions.as_ref()) {
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

/// Ready pods of an InferencePool that are not being deleted (v1 fields `selector.matchLabels`, `targetPorts[0].number`).
pub fn pool_targets(pool: &DynamicObject, pods: &[Pod], load: &LoadSource) -> Result<Vec<Target>, String> {
    let port = pool.data["spec"]["targetPorts"][0]["number"]
        .as_i64()
        .ok_or("InferencePool has no spec.targetPorts[0].number")? as i32;
    let mut out = vec![];
    for pod in pods {
        let status = pod.status.as_ref();
        // A pod being deleted is draining: no new requests, even while it still reports Ready.
        let ready = pod.metadata.deletion_timestamp.is_none()
            && status
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
            let pool =
                Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &crate::foreign::inference_pool())
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort};

    use super::*;

    fn conditions(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> EndpointConditions {
        EndpointConditions { ready, serving, terminating }
    }

    #[test]
    fn terminating_or_not_serving_endpoints_take_no_new_requests() {
        assert!(takes_new_requests(None), "no conditions: ready");
        assert!(takes_new_requests(Some(&conditions(Some(true), Some(true), Some(false)))));
        assert!(takes_new_requests(Some(&conditions(None, None, None))));
        assert!(!takes_new_requests(Some(&conditions(Some(false), Some(true), Some(true)))), "draining");
        assert!(!takes_new_requests(Some(&conditions(None, Some(true), Some(true)))), "terminating, ready unset");
        assert!(!takes_new_requests(Some(&conditions(None, Some(false), None))), "not serving");
        assert!(!takes_new_requests(Some(&conditions(Some(false), None, None))));
    }

    #[test]
    fn the_feed_keeps_only_endpoints_that_take_new_requests() {
        let service = Service {
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort { name: Some("http".into()), port: 80, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ep = |ip: &str, c: EndpointConditions| Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(c),
            ..Default::default()
        };
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(vec![
                ep("10.0.0.1", conditions(Some(true), Some(true), Some(false))),
                ep("10.0.0.2", conditions(Some(false), Some(true), Some(true))),
                ep("10.0.0.3", conditions(None, Some(true), Some(true))),
                ep("10.0.0.4", conditions(None, None, None)),
            ]),
            ports: Some(vec![EndpointPort { name: Some("http".into()), port: Some(8000), ..Default::default() }]),
            metadata: Default::default(),
        };
        let load = LoadSource::default();
        let got: Vec<String> =
            service_targets(&service, 80, &[slice], &load).unwrap().into_iter().map(|t| t.address).collect();
        assert_eq!(got, ["10.0.0.1:8000", "10.0.0.4:8000"]);
    }
}
