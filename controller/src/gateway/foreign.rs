//! Kinds the controller writes but does not own the schema of (Envoy Gateway, Istio, Gateway API
//! Inference Extension). The controller handles them as `DynamicObject`s with the API resources
//! below; their specs are built in `render` from the projects' published API types (see
//! docs/controller.md for sources and for how they are checked).

use kube::core::{ApiResource, GroupVersionKind};

/// Envoy Gateway `EnvoyExtensionPolicy` (the wasm filter, attached to the HTTPRoute: Envoy Gateway
/// enables it on that route's xDS routes only).
pub fn envoy_extension_policy() -> ApiResource {
    ar("gateway.envoyproxy.io", "v1alpha1", "EnvoyExtensionPolicy", "envoyextensionpolicies")
}
/// Envoy Gateway `BackendTrafficPolicy` (load balancer with `endpointOverride`).
pub fn backend_traffic_policy() -> ApiResource {
    ar("gateway.envoyproxy.io", "v1alpha1", "BackendTrafficPolicy", "backendtrafficpolicies")
}
/// Envoy Gateway `EnvoyPatchPolicy` (adds the feed cluster to the Gateway's xDS and sets
/// `allow_on_headers_stop_iteration` on the wasm filter Envoy Gateway rendered).
pub fn envoy_patch_policy() -> ApiResource {
    ar("gateway.envoyproxy.io", "v1alpha1", "EnvoyPatchPolicy", "envoypatchpolicies")
}
/// Istio `EnvoyFilter` (the wasm HTTP filter and the cluster patch for the `override_host` load
/// balancer).
pub fn envoy_filter() -> ApiResource {
    ar("networking.istio.io", "v1alpha3", "EnvoyFilter", "envoyfilters")
}
/// Gateway API Inference Extension `InferencePool` (read only).
pub fn inference_pool() -> ApiResource {
    ar("inference.networking.k8s.io", "v1", "InferencePool", "inferencepools")
}

/// Every kind the routing reconciler may create, for clean-up sweeps. Istio's `WasmPlugin` is not
/// among them: it cannot set the wasm option `allow_on_headers_stop_iteration`, so on Istio the
/// filter goes through an `EnvoyFilter`.
pub fn owned_kinds() -> Vec<ApiResource> {
    vec![envoy_extension_policy(), backend_traffic_policy(), envoy_patch_policy(), envoy_filter()]
}

/// The kinds the routing reconciler may create for a fixed provider (`None`: auto, all kinds).
/// With a fixed provider the chart grants RBAC on that provider's kinds only, so sweeps must not
/// list the others.
pub fn owned_kinds_for(provider: Option<crate::render::Provider>) -> Vec<ApiResource> {
    use crate::render::Provider;
    match provider {
        None => owned_kinds(),
        Some(Provider::EnvoyGateway) => vec![envoy_extension_policy(), backend_traffic_policy(), envoy_patch_policy()],
        Some(Provider::Istio) => vec![envoy_filter()],
    }
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Typed handles so the in-memory test client (which routes by group/version/plural) knows the
/// foreign kinds. Their spec is opaque JSON: no schema is invented here.
pub mod handles {
    #![allow(missing_docs)]
    use kube::CustomResource;
    use serde::{Deserialize, Serialize};

    macro_rules! handle {
        ($spec:ident, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
            #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default)]
            #[kube(group = $group, version = $version, kind = $kind, plural = $plural, namespaced, schema = "disabled")]
            pub struct $spec {
                #[serde(flatten)]
                pub fields: serde_json::Map<String, serde_json::Value>,
            }
        };
    }
    handle!(
        EnvoyExtensionPolicySpec,
        "gateway.envoyproxy.io",
        "v1alpha1",
        "EnvoyExtensionPolicy",
        "envoyextensionpolicies"
    );
    handle!(
        BackendTrafficPolicySpec,
        "gateway.envoyproxy.io",
        "v1alpha1",
        "BackendTrafficPolicy",
        "backendtrafficpolicies"
    );
    handle!(EnvoyPatchPolicySpec, "gateway.envoyproxy.io", "v1alpha1", "EnvoyPatchPolicy", "envoypatchpolicies");
    handle!(EnvoyFilterSpec, "networking.istio.io", "v1alpha3", "EnvoyFilter", "envoyfilters");
    handle!(InferencePoolSpec, "inference.networking.k8s.io", "v1", "InferencePool", "inferencepools");
}
