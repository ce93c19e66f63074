//! Where the routing pipeline reads the objects it resolves: the API server (the running
//! controller) or a fixed set of manifests (`warmpath-controller render -f`, a pure function of its
//! input objects — no API client, nothing leaves the process).

use gateway_api::apis::standard::{gatewayclasses::GatewayClass, gateways::Gateway, httproutes::HttpRoute};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::crd::inference_endpoint::InferenceEndpoint;
use crate::crd::routing_policy::InferenceRoutingPolicy;
use crate::foreign;
use crate::render::ResolvedBackend;
use crate::Result;

/// The objects routing reads, by where they come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// Read from the API server on demand.
    Api(&'a Client),
    /// A fixed set of objects (offline rendering).
    Manifests(&'a Manifests),
}

/// Objects given as manifests, by kind. Kinds routing and cache warming do not read are ignored.
#[derive(Debug, Default, Clone)]
pub struct Manifests {
    /// `InferenceRoutingPolicy` objects.
    pub policies: Vec<InferenceRoutingPolicy>,
    /// `HTTPRoute` objects.
    pub routes: Vec<HttpRoute>,
    /// `Gateway` objects.
    pub gateways: Vec<Gateway>,
    /// `GatewayClass` objects.
    pub classes: Vec<GatewayClass>,
    /// `(namespace, name)` of every `Service`.
    pub services: Vec<(String, String)>,
    /// `(namespace, name)` of every `InferencePool`.
    pub pools: Vec<(String, String)>,
    /// `InferenceEndpoint` objects (cache warming).
    pub endpoints: Vec<InferenceEndpoint>,
}

/// The kinds [`Manifests::from_values`] reads; any other object among the inputs is ignored.
pub fn reads_kind(kind: &str) -> bool {
    matches!(
        kind,
        "InferenceRoutingPolicy"
            | "HTTPRoute"
            | "Gateway"
            | "GatewayClass"
            | "Service"
            | "InferencePool"
            | "InferenceEndpoint"
    )
}

impl Manifests {
    /// Sorts JSON objects into kinds (`metadata.namespace` must already be set on namespaced ones).
    ///
    /// Errors: an object of a known kind that does not match its schema (named by kind and name).
    pub fn from_values(values: Vec<Value>) -> std::result::Result<Self, String> {
        fn typed<T: serde::de::DeserializeOwned>(v: Value) -> std::result::Result<T, String> {
            let what = format!(
                "{} {}",
                v["kind"].as_str().unwrap_or_default(),
                v["metadata"]["name"].as_str().unwrap_or_default()
            );
            serde_json::from_value(v).map_err(|e| format!("{what}: {e}"))
        }
        let id = |v: &Value| {
            (
                v["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                v["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            )
        };
        let mut m = Manifests::default();
        for v in values {
            match v["kind"].as_str().unwrap_or_default() {
                "InferenceRoutingPolicy" => m.policies.push(typed(v)?),
                "HTTPRoute" => m.routes.push(typed(v)?),
                "Gateway" => m.gateways.push(typed(v)?),
                "GatewayClass" => m.classes.push(typed(v)?),
                "Service" => m.services.push(id(&v)),
                "InferencePool" => m.pools.push(id(&v)),
                "InferenceEndpoint" => m.endpoints.push(typed(v)?),
                kind => debug_assert!(!reads_kind(kind), "{kind} is read but not sorted"),
            }
        }
        Ok(m)
    }
}

fn named<'a, K: ResourceExt>(items: &'a [K], ns: Option<&str>, name: &str) -> Option<&'a K> {
    items.iter().find(|o| o.name_any() == name && ns.is_none_or(|ns| o.namespace().as_deref() == Some(ns)))
}

impl Source<'_> {
    /// The HTTPRoute `ns/name`, if it exists.
    pub async fn route(&self, ns: &str, name: &str) -> Result<Option<HttpRoute>> {
        match self {
            Source::Api(c) => Ok(Api::<HttpRoute>::namespaced((*c).clone(), ns).get_opt(name).await?),
            Source::Manifests(m) => Ok(named(&m.routes, Some(ns), name).cloned()),
        }
    }

    /// The Gateway `ns/name`, if it exists.
    pub async fn gateway(&self, ns: &str, name: &str) -> Result<Option<Gateway>> {
        match self {
            Source::Api(c) => Ok(Api::<Gateway>::namespaced((*c).clone(), ns).get_opt(name).await?),
            Source::Manifests(m) => Ok(named(&m.gateways, Some(ns), name).cloned()),
        }
    }

    /// The (cluster-scoped) GatewayClass `name`, if it exists.
    pub async fn gateway_class(&self, name: &str) -> Result<Option<GatewayClass>> {
        match self {
            Source::Api(c) => {
                // A field-selected list rather than a get: same result on an API server, and the
                // in-memory test client (kube-fake-client 0.3) registers every typed resource as
                // namespaced, so a cluster-scoped get misses there.
                let lp = ListParams::default().fields(&format!("metadata.name={name}"));
                Ok(Api::<GatewayClass>::all((*c).clone()).list(&lp).await?.items.into_iter().next())
            }
            Source::Manifests(m) => Ok(named(&m.classes, None, name).cloned()),
        }
    }

    /// Whether the backend (Service or InferencePool) exists.
    pub async fn backend_exists(&self, backend: &ResolvedBackend) -> Result<bool> {
        match (self, backend) {
            (Source::Api(c), ResolvedBackend::Service { namespace, name, .. }) => {
                Ok(Api::<Service>::namespaced((*c).clone(), namespace).get_opt(name).await?.is_some())
            }
            (Source::Api(c), ResolvedBackend::InferencePool { namespace, name }) => {
                Ok(Api::<DynamicObject>::namespaced_with((*c).clone(), namespace, &foreign::inference_pool())
                    .get_opt(name)
                    .await?
                    .is_some())
            }
            (Source::Manifests(m), ResolvedBackend::Service { namespace, name, .. }) => {
                Ok(m.services.contains(&(namespace.clone(), name.clone())))
            }
            (Source::Manifests(m), ResolvedBackend::InferencePool { namespace, name }) => {
                Ok(m.pools.contains(&(namespace.clone(), name.clone())))
            }
        }
    }

    /// A user's own BackendTrafficPolicies / EnvoyExtensionPolicies targeting HTTPRoute `ns/route`
    /// (Envoy Gateway attaches one of each per route), as `Kind ns/name`. Manifests: none are
    /// looked for (offline rendering reads nothing back).
    pub async fn user_policies_on_route(
        &self,
        ns: &str,
        route: &str,
        route_labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<String>> {
        match self {
            Source::Api(c) => super::status_readback::user_policies_on_route(c, ns, route, route_labels).await,
            Source::Manifests(_) => Ok(vec![]),
        }
    }

    /// Every InferenceRoutingPolicy in namespace `ns`.
    pub async fn policies(&self, ns: &str) -> Result<Vec<InferenceRoutingPolicy>> {
        match self {
            Source::Api(c) => Ok(Api::<InferenceRoutingPolicy>::namespaced((*c).clone(), ns)
                .list(&ListParams::default())
                .await?
                .items),
            Source::Manifests(m) => {
                Ok(m.policies.iter().filter(|p| p.namespace().as_deref() == Some(ns)).cloned().collect())
            }
        }
    }
}
