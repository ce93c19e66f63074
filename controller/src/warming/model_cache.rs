//! ModelCache reconciler: reads the node agents' reports from the target Nodes into status, and keeps
//! the cleanup finalizer until no node holds the cache any more.
//!
//! It also pins what the cache serves: the first version a node verified is recorded in
//! `status.pinned` and never changed for that source and those checksums; agents and pod starts fetch only it.
//!
//! The controller never downloads or writes node labels for weights: the agent on each node does
//! (contract in [`crate::crd::model_cache`]). Nodes are watched, so node addition (a new target, state
//! `Pending`) and node loss (a NotReady or deleted node stops counting) update the status.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::conditions;
use crate::crd::model_cache::{
    cache_ready_label, parse_reports, phase, report_key, ModelCache, ModelCacheStatus, NodeCacheStatus, PinnedVersion,
    FINALIZER, NODE_CACHE_STATES,
};
use crate::reconcile::{finalizers, Context};
use crate::{Error, Result, FIELD_MANAGER};

/// Name used in metrics and logs.
pub const CONTROLLER: &str = "model-cache";
pub use warmpath_api::nodes::{is_target, node_lost, INSTANCE_TYPE_LABEL};

/// Status from the target nodes' labels and reports (pure; `now` stamps changed conditions).
pub fn compute_status(mc: &ModelCache, nodes: &[Node], now: &Time) -> ModelCacheStatus {
    let ns = mc.namespace().unwrap_or_default();
    let name = mc.name_any();
    let mut st = mc.status.clone().unwrap_or_default();
    let generation = mc.meta().generation;
    if mc.spec.source.volume.is_some() {
        st.phase = Some(phase::READY.into());
        (st.target, st.ready, st.failed, st.nodes) = (0, 0, 0, vec![]);
        let c = conditions::new(
            conditions::READY,
            true,
            "VolumeSource",
            "weights come from a volume; nothing to pre-download",
            generation,
            now,
        );
        conditions::upsert(&mut st.conditions, c);
        st.observed_generation = generation;
        return st;
    }
    let label = cache_ready_label(&ns, &name);
    let key = report_key(&ns, &name);
    let mut per_node: Vec<NodeCacheStatus> = nodes
        .iter()
        .filter(|n| is_target(&mc.spec, n))
        .map(|n| {
            let report = parse_reports(n.annotations().get(NODE_CACHE_STATES)).remove(&key);
            let labelled = n.labels().get(&label).is_some_and(|v| v == "true");
            let mut s = NodeCacheStatus { node: n.name_any(), state: phase::PENDING.into(), ..Default::default() };
            let stale = report.as_ref().is_some_and(|r| r.generation.is_some_and(|g| Some(g) != generation));
            if let Some(r) = report {
                s.state = r.state;
                s.reason = r.reason;
                s.message = r.message;
                s.version = r.version;
                s.bytes_done = Some(r.bytes_done as i64);
                s.bytes_total = Some(r.bytes_total as i64);
                s.needed_bytes = r.needed_bytes.map(|b| b as i64);
                s.available_bytes = r.available_bytes.map(|b| b as i64);
            }
            // The label is what pods' affinity uses; a node counts as ready only with it.
            if s.state == phase::READY && !labelled {
                s.state = phase::PENDING.into();
            } else if labelled && s.state == phase::PENDING {
                s.state = phase::READY.into();
            }
            if s.state == phase::READY && stale {
                // A copy made for an earlier spec: the agent has not synced this generation yet.
                s.state = phase::PENDING.into();
            }
            s
        })
        .collect();
    per_node.sort_by(|a, b| a.node.cmp(&b.node));
    st.pinned = pin(st.pinned.take(), mc.spec.content_hash(), &per_node);
    if let Some(p) = &st.pinned {
        // A node that verified another version (the source changed between two nodes' downloads before
        // the pin was recorded) does not serve this cache: its agent now refuses or replaces it.
        for n in per_node
            .iter_mut()
            .filter(|n| n.state == phase::READY && n.version.as_ref().is_some_and(|v| *v != p.version))
        {
            n.state = phase::FAILED.into();
            n.reason = Some("SourceChanged".into());
            n.message = Some(format!(
                "holds version {}, but this cache is pinned to version {} (first verified on node {}); the source \
                 changed between the two downloads",
                n.version.as_deref().unwrap_or("?"),
                p.version,
                p.node
            ));
        }
    }
    let count = |state: &str| per_node.iter().filter(|n| n.state == state).count() as i32;
    st.target = per_node.len() as i32;
    st.ready = count(phase::READY);
    st.failed = count(phase::FAILED);
    let downloading = count(phase::DOWNLOADING);
    let (ph, ok, reason, msg) = if st.failed > 0 {
        let first = per_node.iter().find(|n| n.state == phase::FAILED).expect("counted");
        let reason = first.reason.clone().unwrap_or_else(|| "Failed".into());
        let msg = format!("node {}: {}", first.node, first.message.clone().unwrap_or_default());
        (phase::FAILED, false, reason, msg)
    } else if st.target > 0 && st.ready == st.target {
        (
            phase::READY,
            true,
            "AllNodesReady".to_string(),
            format!("{} of {} target nodes hold the weights", st.ready, st.target),
        )
    } else if downloading > 0 {
        (phase::DOWNLOADING, false, "Downloading".into(), format!("{} of {} target nodes ready", st.ready, st.target))
    } else if st.target == 0 {
        (phase::PENDING, false, "NoTargetNodes".into(), "no node matches nodeSelector/instanceTypes".into())
    } else {
        (phase::PENDING, false, "Pending".into(), format!("{} of {} target nodes ready", st.ready, st.target))
    };
    st.phase = Some(ph.into());
    st.nodes = per_node;
    conditions::upsert(&mut st.conditions, conditions::new(conditions::READY, ok, &reason, msg, generation, now));
    st.observed_generation = generation;
    st
}

/// The pin of this source and checksums: kept once recorded; otherwise the version held by the most
/// Ready nodes (ties: the first node by name), recorded as soon as one node verified it.
fn pin(old: Option<PinnedVersion>, content_hash: String, nodes: &[NodeCacheStatus]) -> Option<PinnedVersion> {
    if let Some(p) = old.filter(|p| p.content_hash == content_hash) {
        return Some(p);
    }
    let ready: Vec<(&str, &str)> = nodes
        .iter()
        .filter(|n| n.state == phase::READY)
        .filter_map(|n| Some((n.version.as_deref()?, n.node.as_str())))
        .collect();
    let count = |v: &str| ready.iter().filter(|(w, _)| *w == v).count();
    let (version, node) = ready.iter().copied().max_by(|a, b| count(a.0).cmp(&count(b.0)).then(b.1.cmp(a.1)))?;
    Some(PinnedVersion { version: version.into(), content_hash, node: node.into() })
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn patch_status(api: &Api<ModelCache>, name: &str, status: &ModelCacheStatus) -> Result<()> {
    let patch = json!({ "apiVersion": "warmpath.dev/v1alpha1", "kind": "ModelCache", "status": status });
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

/// Reconciles one ModelCache (finalizer-wrapped apply/cleanup).
pub async fn reconcile(mc: Arc<ModelCache>, ctx: Arc<Context>) -> Result<Action> {
    let ns = mc.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<ModelCache> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizers::guard(
        &api,
        &*mc,
        FINALIZER,
        async |o| cleanup(&api, o, &ctx).await,
        async |o| apply(&api, o, &ctx).await,
    )
    .await;
    result.inspect(|_| ctx.metrics.reconcile_ok(CONTROLLER))
}

async fn apply(api: &Api<ModelCache>, mc: &ModelCache, ctx: &Context) -> Result<Action> {
    let nodes = Api::<Node>::all(ctx.client.clone()).list(&ListParams::default()).await?.items;
    let status = compute_status(mc, &nodes, &now());
    if mc.status.as_ref() != Some(&status) {
        patch_status(api, &mc.name_any(), &status).await?;
    }
    // Agents report progress on their nodes; poll a little while anything is moving.
    Ok(match status.phase.as_deref() {
        Some(phase::READY) => Action::requeue(Duration::from_secs(300)),
        _ => Action::requeue(Duration::from_secs(10)),
    })
}

/// Cleanup waits until no node carries the cache's label or report: the agents remove the files,
/// then the label. Lost/deleted nodes do not hold it up.
async fn cleanup(api: &Api<ModelCache>, mc: &ModelCache, ctx: &Context) -> Result<Action> {
    let ns = mc.namespace().unwrap_or_default();
    let (label, key) = (cache_ready_label(&ns, &mc.name_any()), report_key(&ns, &mc.name_any()));
    let nodes = Api::<Node>::all(ctx.client.clone()).list(&ListParams::default()).await?.items;
    let holding: Vec<String> = nodes
        .iter()
        .filter(|n| !node_lost(n))
        .filter(|n| {
            n.labels().contains_key(&label) || parse_reports(n.annotations().get(NODE_CACHE_STATES)).contains_key(&key)
        })
        .map(|n| n.name_any())
        .collect();
    if holding.is_empty() {
        return Ok(Action::await_change());
    }
    let mut st = mc.status.clone().unwrap_or_default();
    if st.phase.as_deref() != Some(phase::DELETING) {
        st.phase = Some(phase::DELETING.into());
        patch_status(api, &mc.name_any(), &st).await?;
    }
    Err(Error::CleanupPending(format!("waiting for node agents on {} to remove the cache", holding.join(", "))))
}

/// Error policy: count, log, retry in 5 s (cleanup waits) or 30 s.
pub fn error_policy(_mc: Arc<ModelCache>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(controller = CONTROLLER, error = %err, "reconcile failed");
    ctx.metrics.reconcile_error(CONTROLLER, err);
    Action::requeue(Duration::from_secs(if matches!(err, Error::CleanupPending(_)) { 5 } else { 30 }))
}

/// Runs the ModelCache controller until the stream ends. Every Node event re-reconciles every
/// ModelCache (node add/loss, agent reports).
pub async fn run(ctx: Arc<Context>) {
    let caches: Api<ModelCache> = Api::all(ctx.client.clone());
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let controller = Controller::new(caches, watcher::Config::default());
    let store = controller.store();
    controller
        .watches(nodes, watcher::Config::default(), move |_node| {
            store.state().into_iter().map(|mc| ObjectRef::from_obj(&*mc)).collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(controller = CONTROLLER, error = %e, "reconcile failed");
            }
        })
        .await;
}
