//! `warmpath-controller cleanup`: what an uninstall must do before the controller goes away, run by
//! the chart's `pre-delete` hook Job. Without it, `helm uninstall` leaves warmpath's finalizers on
//! annotated HTTPRoutes and on InferenceRoutingPolicies (deleting them later hangs: no controller
//! removes the finalizer; GitOps pruning blocks), and leaves the rendered Envoy Gateway / Istio
//! objects in place, pointing the gateways at a controller Service that is gone.
//!
//! Order: stop the controller (scale its Deployment to 0), take its leader Lease (so no replica that
//! is still terminating can write again), then for every object carrying a warmpath finalizer delete
//! what it owns and remove the finalizer, and delete any rendered object left with a warmpath owner
//! label. The cache-warming kinds (InferenceEndpoint, ModelCache, ImageCache), when their CRDs are
//! installed, lose their finalizers too: with no controller (and no node agent) left to run their
//! clean-up, deleting them later would hang. The routes, policies and cache-warming objects
//! themselves stay: they belong to the user (and the CRDs, which Helm never deletes, stay with them).

use std::collections::BTreeSet;
use std::time::Duration;

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::crd::image_cache::{self, ImageCache};
use crate::crd::inference_endpoint::{self, InferenceEndpoint};
use crate::crd::model_cache::{self, ModelCache};
use crate::crd::routing_policy::InferenceRoutingPolicy;
use crate::gateway::{program, route_annotations, routing_policy};
use crate::leader::Elector;
use crate::reconcile::{finalizers, Context};
use crate::render::LABEL_OWNER_UID;
use crate::Result;

/// What [`remove_all`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// HTTPRoutes whose warmpath finalizer was removed.
    pub routes_released: usize,
    /// InferenceRoutingPolicies whose warmpath finalizer was removed.
    pub policies_released: usize,
    /// Rendered objects (EnvoyExtensionPolicy, BackendTrafficPolicy, EnvoyPatchPolicy, EnvoyFilter) deleted.
    pub objects_deleted: usize,
    /// InferenceEndpoints, ModelCaches and ImageCaches whose warmpath finalizer was removed.
    pub cache_objects_released: usize,
}

/// Removes every trace of warmpath routing from the cluster: deletes the objects rendered for each
/// finalized HTTPRoute and policy and releases its finalizer, then deletes rendered objects whose
/// owner is already gone (carrying the owner label). Idempotent; the controller must not run
/// (see [`stop_controller`]), or it would program the routes again.
pub async fn remove_all(ctx: &Context) -> Result<Report> {
    let mut report = Report::default();
    let none = BTreeSet::new();
    for route in Api::<HttpRoute>::all(ctx.client.clone()).list(&ListParams::default()).await?.items {
        if !finalizers::has(&route, route_annotations::FINALIZER) {
            continue;
        }
        if let Some(uid) = route.uid() {
            report.objects_deleted += program::sweep(ctx, &uid, &none).await?;
        }
        let ns = route.namespace().unwrap_or_default();
        let api: Api<HttpRoute> = Api::namespaced(ctx.client.clone(), &ns);
        finalizers::remove(&api, &route, route_annotations::FINALIZER).await?;
        crate::gateway::route_status::write(ctx, &ns, &route.name_any(), vec![]).await?;
        report.routes_released += 1;
    }
    for policy in Api::<InferenceRoutingPolicy>::all(ctx.client.clone()).list(&ListParams::default()).await?.items {
        if !finalizers::has(&policy, routing_policy::FINALIZER) {
            continue;
        }
        if let Some(uid) = policy.uid() {
            report.objects_deleted += program::sweep(ctx, &uid, &none).await?;
        }
        let api: Api<InferenceRoutingPolicy> =
            Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
        finalizers::remove(&api, &policy, routing_policy::FINALIZER).await?;
        report.policies_released += 1;
    }
    report.cache_objects_released += release_finalizers::<InferenceEndpoint>(ctx, inference_endpoint::FINALIZER)
        .await?
        + release_finalizers::<ModelCache>(ctx, model_cache::FINALIZER).await?
        + release_finalizers::<ImageCache>(ctx, image_cache::FINALIZER).await?;
    // Objects whose owner lost its finalizer some other way (edited by hand, an older release).
    let labelled = ListParams::default().labels(LABEL_OWNER_UID);
    for ar in crate::foreign::owned_kinds_for(ctx.config.provider) {
        let list = match Api::<DynamicObject>::all_with(ctx.client.clone(), &ar).list(&labelled).await {
            Ok(l) => l,
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        };
        for o in list.items {
            let api =
                Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &o.namespace().unwrap_or_default(), &ar);
            match api.delete(&o.name_any(), &DeleteParams::default()).await {
                Ok(_) => report.objects_deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(report)
}

/// Removes `finalizer` from every object of kind `K`; a kind whose CRD is not installed (404) has none.
/// Returns how many objects carried it.
async fn release_finalizers<K>(ctx: &Context, finalizer: &str) -> Result<usize>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let list = match Api::<K>::all(ctx.client.clone()).list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut released = 0;
    for o in list.iter().filter(|o| finalizers::has(*o, finalizer)) {
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &o.namespace().unwrap_or_default());
        finalizers::remove(&api, o, finalizer).await?;
        released += 1;
    }
    Ok(released)
}

/// Stops the controller before [`remove_all`]: scales Deployment `namespace/deployment` to zero
/// replicas (when given), then takes the controller's leader Lease with `elector`, waiting up to
/// `timeout` for the last leader to release it (on SIGTERM) or for it to expire. Holding the Lease
/// keeps any replica still terminating from leading again.
pub async fn stop_controller(
    client: &Client,
    namespace: &str,
    deployment: Option<&str>,
    elector: &Elector,
    timeout: Duration,
) -> anyhow::Result<()> {
    if let Some(name) = deployment {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        match api.patch_scale(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}}))).await {
            Ok(_) => tracing::info!(deployment = name, "controller scaled to 0"),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::info!(deployment = name, "controller Deployment already gone")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if elector.try_acquire_or_renew(Timestamp::now()).await? {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "Lease {}/{} still held by a running controller after {timeout:?}",
            namespace,
            elector.settings().name
        );
        tokio::time::sleep(elector.settings().retry_period).await;
    }
}
