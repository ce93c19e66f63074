//! ImageCache reconciler: a pre-pull DaemonSet per ImageCache, per-node pull state from its pods,
//! the `image-ready` node label, and reference counting (delete when no endpoint references it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Container, LocalObjectReference, Node, Pod, PodSpec, PodTemplateSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::conditions;
use crate::crd::image_cache::{
    image_ready_label, phase, ImageCache, ImageCacheStatus, NodeImageStatus, DEFAULT_PAUSE_IMAGE, FINALIZER,
    MANAGED_BY_ENDPOINTS, MANAGED_LABEL, PREPULL_POD_LABEL,
};
use crate::reconcile::{finalizers, Context};
use crate::{Error, Result, FIELD_MANAGER};

/// Name used in metrics and logs.
pub const CONTROLLER: &str = "image-cache";
/// Kubelet waiting reasons that mean the pull failed.
pub const PULL_FAILURES: [&str; 4] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"];

/// Name of the pre-pull DaemonSet of an ImageCache.
pub fn daemonset_name(cache: &str) -> String {
    format!("{cache}-prepull")
}

/// The pre-pull DaemonSet: init container = the cached image running a no-op (the kubelet pulls it,
/// `IfNotPresent`), main container = pause. Tolerates every taint so GPU nodes are covered.
pub fn prepull_daemonset(ic: &ImageCache) -> DaemonSet {
    let name = ic.name_any();
    let labels = BTreeMap::from([
        (PREPULL_POD_LABEL.to_string(), name.clone()),
        ("app.kubernetes.io/managed-by".to_string(), "warmpath".to_string()),
    ]);
    let tiny = ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("1m".into())),
            ("memory".to_string(), Quantity("8Mi".into())),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("50m".into())),
            ("memory".to_string(), Quantity("64Mi".into())),
        ])),
        ..Default::default()
    };
    let command = if ic.spec.command.is_empty() {
        vec!["/bin/sh".to_string(), "-c".into(), "exit 0".into()]
    } else {
        ic.spec.command.clone()
    };
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(daemonset_name(&name)),
            namespace: ic.namespace(),
            labels: Some(labels.clone()),
            owner_references: ic.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(PREPULL_POD_LABEL.to_string(), name.clone())])),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(PodSpec {
                    node_selector: (!ic.spec.node_selector.is_empty()).then(|| ic.spec.node_selector.clone()),
                    image_pull_secrets: (!ic.spec.image_pull_secrets.is_empty()).then(|| {
                        ic.spec.image_pull_secrets.iter().map(|s| LocalObjectReference { name: s.clone() }).collect()
                    }),
                    init_containers: Some(vec![Container {
                        name: "pull".into(),
                        image: Some(ic.spec.image.clone()),
                        image_pull_policy: Some("IfNotPresent".into()),
                        command: Some(command),
                        resources: Some(tiny.clone()),
                        ..Default::default()
                    }]),
                    containers: vec![Container {
                        name: "hold".into(),
                        image: Some(DEFAULT_PAUSE_IMAGE.into()),
                        resources: Some(tiny),
                        ..Default::default()
                    }],
                    tolerations: Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]),
                    termination_grace_period_seconds: Some(1),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Pull state of one pre-pull pod: `Cached` once the kubelet reports the init container's image id
/// (set when the image is present, whether or not the no-op succeeded), `Failed` on pull errors.
pub fn pod_pull_state(pod: &Pod) -> (String, Option<String>) {
    let init = pod.status.as_ref().and_then(|s| s.init_container_statuses.as_ref()).and_then(|v| v.first());
    match init {
        Some(cs) if !cs.image_id.is_empty() => (phase::CACHED.into(), None),
        Some(cs) => {
            let reason = cs.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.clone());
            match reason {
                Some(r) if PULL_FAILURES.contains(&r.as_str()) => (phase::FAILED.into(), Some(r)),
                r => (phase::PULLING.into(), r),
            }
        }
        None => (phase::PULLING.into(), None),
    }
}

/// Endpoints referencing the cache (owner references of kind InferenceEndpoint).
pub fn references(ic: &ImageCache) -> i32 {
    ic.owner_references().iter().filter(|r| r.kind == "InferenceEndpoint").count() as i32
}

/// Status from the DaemonSet and its pods (pure).
pub fn compute_status(ic: &ImageCache, ds: Option<&DaemonSet>, pods: &[Pod], now: &Time) -> ImageCacheStatus {
    let mut st = ic.status.clone().unwrap_or_default();
    let mut nodes: Vec<NodeImageStatus> = pods
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let (state, reason) = pod_pull_state(p);
            Some(NodeImageStatus { node, state, reason })
        })
        .collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    nodes.dedup_by(|a, b| a.node == b.node);
    let desired = ds.and_then(|d| d.status.as_ref()).map(|s| s.desired_number_scheduled).unwrap_or(0);
    st.target = desired.max(nodes.len() as i32);
    st.cached = nodes.iter().filter(|n| n.state == phase::CACHED).count() as i32;
    st.references = references(ic);
    let failed = nodes.iter().find(|n| n.state == phase::FAILED);
    let (ph, ok, reason, msg) = match failed {
        Some(f) => {
            (phase::FAILED, false, f.reason.clone().unwrap_or_default(), format!("pull failed on node {}", f.node))
        }
        None if st.target > 0 && st.cached == st.target => {
            (phase::CACHED, true, "Cached".into(), format!("pulled on {} nodes", st.cached))
        }
        None => (phase::PULLING, false, "Pulling".into(), format!("pulled on {} of {} nodes", st.cached, st.target)),
    };
    st.phase = Some(ph.into());
    st.nodes = nodes;
    conditions::upsert(
        &mut st.conditions,
        conditions::new(conditions::READY, ok, &reason, msg, ic.meta().generation, now),
    );
    st
}

/// Reconciles one ImageCache (finalizer-wrapped).
pub async fn reconcile(ic: Arc<ImageCache>, ctx: Arc<Context>) -> Result<Action> {
    let ns = ic.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<ImageCache> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizers::guard(
        &api,
        &*ic,
        FINALIZER,
        async |o| cleanup(o, &ctx).await,
        async |o| apply(&api, o, &ctx).await,
    )
    .await;
    result.inspect(|_| ctx.metrics.reconcile_ok(CONTROLLER))
}

async fn apply(api: &Api<ImageCache>, ic: &ImageCache, ctx: &Context) -> Result<Action> {
    let ns = ic.namespace().unwrap_or_default();
    let name = ic.name_any();
    // Reference counting: an ImageCache made for endpoints goes when the last endpoint lets go.
    if ic.labels().get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_BY_ENDPOINTS) && references(ic) == 0 {
        tracing::info!(image_cache = %name, "no endpoint references the image any more; deleting");
        api.delete(&name, &DeleteParams::default()).await?;
        return Ok(Action::await_change());
    }
    let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ns);
    let ds = dss
        .patch(
            &daemonset_name(&name),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&prepull_daemonset(ic)),
        )
        .await?;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("{PREPULL_POD_LABEL}={name}")))
        .await?
        .items;
    let status = compute_status(ic, Some(&ds), &pods, &Time(k8s_openapi::jiff::Timestamp::now()));
    let cached: BTreeSet<String> =
        status.nodes.iter().filter(|n| n.state == phase::CACHED).map(|n| n.node.clone()).collect();
    sync_node_labels(ctx, &image_ready_label(&ns, &name), &cached).await?;
    if ic.status.as_ref() != Some(&status) {
        let patch = json!({ "apiVersion": "warmpath.dev/v1alpha1", "kind": "ImageCache", "status": status });
        api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    }
    Ok(Action::requeue(Duration::from_secs(if status.phase.as_deref() == Some(phase::CACHED) { 300 } else { 15 })))
}

/// Makes exactly the nodes in `want` carry `label=true`.
async fn sync_node_labels(ctx: &Context, label: &str, want: &BTreeSet<String>) -> Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let have: BTreeSet<String> =
        nodes.list(&ListParams::default().labels(label)).await?.items.iter().map(|n| n.name_any()).collect();
    for n in want.difference(&have) {
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {label: "true"}}})))
            .await?;
    }
    for n in have.difference(want) {
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {label: null}}}))).await?;
    }
    Ok(())
}

/// Removes the pre-pull DaemonSet (the kubelet's image GC then may reclaim the image) and the labels.
async fn cleanup(ic: &ImageCache, ctx: &Context) -> Result<Action> {
    let ns = ic.namespace().unwrap_or_default();
    let dss: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ns);
    match dss.delete(&daemonset_name(&ic.name_any()), &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    sync_node_labels(ctx, &image_ready_label(&ns, &ic.name_any()), &BTreeSet::new()).await?;
    Ok(Action::await_change())
}

/// Error policy: count, log, retry in 30 s.
pub fn error_policy(_ic: Arc<ImageCache>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(controller = CONTROLLER, error = %err, "reconcile failed");
    ctx.metrics.reconcile_error(CONTROLLER, err);
    Action::requeue(Duration::from_secs(30))
}

/// Runs the ImageCache controller (owns the pre-pull DaemonSets; pods' progress arrives through them).
pub async fn run(ctx: Arc<Context>) {
    let caches: Api<ImageCache> = Api::all(ctx.client.clone());
    let dss: Api<DaemonSet> = Api::all(ctx.client.clone());
    Controller::new(caches, watcher::Config::default())
        .owns(dss, watcher::Config::default().labels(PREPULL_POD_LABEL))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
