//! Reconciler of `InferenceRoutingPolicy`: validate, resolve each targeted HTTPRoute, render,
//! server-side apply, sweep what is no longer wanted, register the feed, write status and events.
//! A finalizer (see [`super::finalizers`]) removes everything the policy created, including objects in Gateway namespaces
//! that owner references cannot cover.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::program::{self, ancestor, route_ref};
use super::source::Source;
use crate::conditions::reason;
use crate::crd::routing_policy::{InferenceRoutingPolicy, InferenceRoutingPolicyStatus, PolicyAncestorStatus};
use crate::reconcile::{finalizers, Context, ControllerConfig, FeedSource};
use crate::render::Owner;
use crate::routing::{feed_key, feed_path, RoutingIntent, FEED_KIND_POLICY};
use crate::{Error, Result};

/// Finalizer on every policy the controller has programmed.
pub const FINALIZER: &str = "warmpath.dev/routing-cleanup";
/// Name of this reconciler in metrics.
pub const CONTROLLER: &str = "routing-policy";

/// Entry point for the kube-runtime `Controller`.
pub async fn reconcile(policy: Arc<InferenceRoutingPolicy>, ctx: Arc<Context>) -> Result<Action> {
    let ns = policy.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<InferenceRoutingPolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let res =
        finalizers::guard(&api, &*policy, FINALIZER, async |p| cleanup(p, &ctx).await, async |p| apply(p, &ctx).await)
            .await;
    match &res {
        Ok(_) => ctx.metrics.reconcile_ok(CONTROLLER),
        Err(e) => ctx.metrics.reconcile_error(CONTROLLER, e),
    }
    res
}

/// Error policy: log, and retry with a delay (the error was counted in `reconcile`).
pub fn error_policy(policy: Arc<InferenceRoutingPolicy>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(policy = %policy.name_any(), error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

fn owner_of(p: &InferenceRoutingPolicy) -> Result<Owner> {
    Ok(Owner {
        api_version: InferenceRoutingPolicy::api_version(&()).into_owned(),
        kind: InferenceRoutingPolicy::kind(&()).into_owned(),
        name: p.name_any(),
        namespace: p.namespace().ok_or(Error::MissingField("metadata.namespace"))?,
        uid: p.uid().ok_or(Error::MissingField("metadata.uid"))?,
    })
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The policy that decides routing for `route` among `policies`: the oldest by creation time,
/// ties broken by name (GEP-713 conflict resolution).
pub fn winner<'a>(policies: &'a [InferenceRoutingPolicy], route: &str) -> Option<&'a InferenceRoutingPolicy> {
    policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.target_refs.iter().any(|t| t.kind == "HTTPRoute" && t.name == route))
        .min_by(|a, b| {
            let ka = (a.metadata.creation_timestamp.as_ref().map(|t| t.0), a.name_any());
            let kb = (b.metadata.creation_timestamp.as_ref().map(|t| t.0), b.name_any());
            ka.cmp(&kb)
        })
}

/// What one policy asks for, decided from the objects `src` holds (no writes).
#[derive(Debug)]
pub enum PolicyPlan {
    /// The spec is invalid: report it and touch nothing else (objects from the last good spec stay).
    Invalid {
        /// One entry per targeted route, naming the problem.
        ancestors: Vec<PolicyAncestorStatus>,
    },
    /// Program these objects (everything else the policy owns is swept).
    Program {
        /// Objects to apply, merged per key.
        objects: Vec<DynamicObject>,
        /// Status entries.
        ancestors: Vec<PolicyAncestorStatus>,
        /// What the policy's feed scrapes, when a backend resolved.
        feed: Option<FeedSource>,
        /// The feed's path on the controller's HTTP server.
        feed_path: String,
    },
}

impl PolicyPlan {
    /// The status entries, either way.
    pub fn ancestors(&self) -> &[PolicyAncestorStatus] {
        match self {
            PolicyPlan::Invalid { ancestors } | PolicyPlan::Program { ancestors, .. } => ancestors,
        }
    }
}

/// Decides what `policy` programs: validates its spec, settles conflicts with older policies on the
/// same routes, resolves and renders each targeted route. Reads only; API errors propagate.
pub async fn plan(
    policy: &InferenceRoutingPolicy,
    src: Source<'_>,
    config: &ControllerConfig,
    now: &Time,
) -> Result<PolicyPlan> {
    let owner = owner_of(policy)?;
    let generation = policy.metadata.generation;
    let key = feed_key(FEED_KIND_POLICY, &owner.namespace, &owner.name);
    let path = feed_path(&key);
    let mut ancestors: Vec<PolicyAncestorStatus> = vec![];
    let targets: BTreeSet<String> = policy.spec.target_refs.iter().map(|t| t.name.clone()).collect();

    let intent = match RoutingIntent::from_policy(&policy.spec) {
        Ok(i) => i,
        Err(msg) => {
            for t in &targets {
                ancestors.push(ancestor(
                    route_ref(&owner.namespace, t),
                    [
                        (false, reason::INVALID, msg.clone()),
                        (false, reason::INVALID, msg.clone()),
                        (false, reason::INVALID, "not changed: the spec is invalid".into()),
                    ],
                    generation,
                    now,
                ));
            }
            return Ok(PolicyPlan::Invalid { ancestors });
        }
    };

    let all = src.policies(&owner.namespace).await?;
    let mut objects = vec![];
    let mut feed: Option<FeedSource> = None;
    for route in &targets {
        let w = winner(&all, route);
        if let Some(w) = w.filter(|w| w.uid() != policy.uid()) {
            let msg = format!("HTTPRoute {route} is already routed by InferenceRoutingPolicy {} (older)", w.name_any());
            ancestors.push(ancestor(
                route_ref(&owner.namespace, route),
                [
                    (false, reason::CONFLICTED, msg.clone()),
                    (
                        false,
                        reason::CONFLICTED,
                        format!(
                            "references not resolved: InferenceRoutingPolicy {} decides routing for HTTPRoute {route}",
                            w.name_any()
                        ),
                    ),
                    (false, reason::CONFLICTED, msg),
                ],
                generation,
                now,
            ));
            continue;
        }
        let out =
            program::resolve_and_render(src, config, &owner, &intent, &owner.namespace, route, &path, generation, now)
                .await?;
        // One policy, one feed: every route it programs must route the same backend's endpoints.
        if let (Some(first), Some(this)) = (&feed, &out.feed) {
            if first.backend != this.backend {
                let msg = format!(
                    "HTTPRoute {route} routes backend {:?}, but this policy already routes {:?} (one backend per policy: set spec.backend, or use one policy per backend)",
                    this.backend, first.backend
                );
                ancestors.push(ancestor(
                    route_ref(&owner.namespace, route),
                    [
                        (true, reason::ACCEPTED, "policy accepted".into()),
                        (false, reason::BACKEND_MISMATCH, msg.clone()),
                        (false, reason::BACKEND_MISMATCH, msg),
                    ],
                    generation,
                    now,
                ));
                continue;
            }
        }
        ancestors.extend(out.ancestors);
        objects.extend(out.objects);
        if feed.is_none() {
            feed = out.feed;
        }
    }
    Ok(PolicyPlan::Program { objects: program::merge_same_key(objects), ancestors, feed, feed_path: path })
}

async fn apply(policy: &InferenceRoutingPolicy, ctx: &Context) -> Result<Action> {
    let owner = owner_of(policy)?;
    let key = feed_key(FEED_KIND_POLICY, &owner.namespace, &owner.name);
    let (generation, now) = (policy.metadata.generation, now());
    let (objects, mut ancestors, feed, path) = match plan(policy, Source::Api(&ctx.client), &ctx.config, &now).await? {
        PolicyPlan::Invalid { ancestors } => {
            write_status(policy, ctx, ancestors, None).await?;
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        PolicyPlan::Program { objects, ancestors, feed, feed_path } => (objects, ancestors, feed, feed_path),
    };
    program::apply_all(ctx, &objects).await?;
    let keep: BTreeSet<_> = objects.iter().map(program::key_of).collect();
    let removed = program::sweep(ctx, &owner.uid, &keep).await?;
    match feed {
        Some(f) => ctx.set_feed_source(&key, f),
        None => ctx.remove_feed(&key),
    }
    if removed > 0 {
        publish(ctx, policy, EventType::Normal, "Pruned", format!("deleted {removed} object(s) no longer wanted"))
            .await;
    }
    // Programmed only once the gateway says so (Envoy Gateway's status on what we wrote).
    let recheck = super::status_readback::mirror(ctx, &objects, &mut ancestors, generation, &now).await?;
    write_status(policy, ctx, ancestors, Some(path)).await?;
    Ok(Action::requeue(recheck.unwrap_or(Duration::from_secs(300))))
}

async fn cleanup(policy: &InferenceRoutingPolicy, ctx: &Context) -> Result<Action> {
    let owner = owner_of(policy)?;
    let removed = program::sweep(ctx, &owner.uid, &BTreeSet::new()).await?;
    ctx.remove_feed(&feed_key(FEED_KIND_POLICY, &owner.namespace, &owner.name));
    publish(ctx, policy, EventType::Normal, "CleanedUp", format!("deleted {removed} object(s)")).await;
    Ok(Action::await_change())
}

/// One line per ancestor and condition, for change detection and event messages.
fn summary(ancestors: &[PolicyAncestorStatus]) -> Vec<String> {
    ancestors
        .iter()
        .flat_map(|a| {
            a.conditions.iter().map(move |c| {
                format!("{}/{}: {}={} ({})", a.ancestor_ref.kind, a.ancestor_ref.name, c.type_, c.status, c.reason)
            })
        })
        .collect()
}

async fn write_status(
    policy: &InferenceRoutingPolicy,
    ctx: &Context,
    mut ancestors: Vec<PolicyAncestorStatus>,
    feed: Option<String>,
) -> Result<()> {
    // Keep lastTransitionTime of unchanged conditions (API conventions; makes re-reconciles no-ops).
    let old = policy.status.clone().unwrap_or_default();
    for a in &mut ancestors {
        if let Some(prev) = old.ancestors.iter().find(|p| p.ancestor_ref == a.ancestor_ref) {
            let mut merged = prev.conditions.clone();
            for c in a.conditions.drain(..) {
                crate::conditions::upsert(&mut merged, c);
            }
            merged.retain(|c| {
                [crate::conditions::ACCEPTED, crate::conditions::RESOLVED_REFS, crate::conditions::PROGRAMMED]
                    .contains(&c.type_.as_str())
            });
            a.conditions = merged;
        }
    }
    ancestors.truncate(16);
    let before = summary(&old.ancestors);
    let after = summary(&ancestors);
    let status =
        InferenceRoutingPolicyStatus { ancestors, feed_path: feed, observed_generation: policy.metadata.generation };
    let api: Api<InferenceRoutingPolicy> = Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": InferenceRoutingPolicy::api_version(&()),
        "kind": InferenceRoutingPolicy::kind(&()),
        "status": status,
    });
    api.patch_status(&policy.name_any(), &PatchParams::apply(crate::FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    if before != after {
        let failing: Vec<&String> = after.iter().filter(|l| l.contains("=False")).collect();
        let (type_, reason, note) = if failing.is_empty() {
            (EventType::Normal, "Programmed", format!("programmed: {}", after.len() / 3))
        } else {
            (EventType::Warning, "NotProgrammed", failing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; "))
        };
        publish(ctx, policy, type_, reason, note).await;
    }
    Ok(())
}

/// Publishes an event; failures are logged only (events are best effort).
pub async fn publish<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1024).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        tracing::debug!(error = %e, "event not published");
    }
}
