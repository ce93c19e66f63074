//! Reconciler of the HTTPRoute annotation shortcut (`warmpath.dev/routing-strategy` and friends).
//!
//! An annotated route with no policy targeting it is programmed exactly like a policy would be,
//! with the route as owner (owner references in its namespace, a finalizer on the route for the
//! objects in Gateway namespaces). Removing the annotation, or a policy starting to target the
//! route (policies take precedence), removes exactly those objects. Outcomes are reported as
//! Events on the HTTPRoute and, durably, in warmpath's own entries of its `status.parents`
//! ([`super::route_status`]); unknown `warmpath.dev/*` keys are reported in both.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::routing_policy::{publish, winner};
use super::source::Source;
use super::{program, route_status, unknown_annotations};
use crate::reconcile::{finalizers, Context, ControllerConfig};
use crate::render::Owner;
use crate::routing::{feed_key, feed_path, RoutingIntent, FEED_KIND_HTTPROUTE};
use crate::{Error, Result};

/// Finalizer on annotated HTTPRoutes the controller has programmed.
pub const FINALIZER: &str = "warmpath.dev/route-annotation-cleanup";
/// Name of this reconciler in metrics.
pub const CONTROLLER: &str = "route-annotations";

/// Entry point for the kube-runtime `Controller`.
pub async fn reconcile(route: Arc<HttpRoute>, ctx: Arc<Context>) -> Result<Action> {
    let res = reconcile_inner(route, &ctx).await;
    match &res {
        Ok(_) => ctx.metrics.reconcile_ok(CONTROLLER),
        Err(e) => ctx.metrics.reconcile_error(CONTROLLER, e),
    }
    res
}

/// Error policy: log and retry with a delay.
pub fn error_policy(route: Arc<HttpRoute>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(route = %route.name_any(), error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

async fn reconcile_inner(route: Arc<HttpRoute>, ctx: &Context) -> Result<Action> {
    let ns = route.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<HttpRoute> = Api::namespaced(ctx.client.clone(), &ns);
    let annotated = RoutingIntent::from_annotations(route.annotations()).is_some();
    let ours = finalizers::has(&*route, FINALIZER);
    let deleting = route.metadata.deletion_timestamp.is_some();
    let unknown = unknown_annotations::message(route.annotations());
    if let Some(msg) = unknown.as_ref().filter(|_| !deleting) {
        publish(ctx, &*route, EventType::Warning, "UnknownAnnotation", msg.clone()).await;
    }
    if annotated && !deleting {
        let route = match finalizers::add(&api, &*route, FINALIZER).await? {
            Some(updated) => updated,
            None => (*route).clone(),
        };
        return apply(&route, ctx, unknown.as_deref()).await;
    }
    if ours {
        // Annotation removed or route deleted: delete what it created, then release the route.
        cleanup(&route, ctx).await?;
        finalizers::remove(&api, &*route, FINALIZER).await?;
    }
    if !deleting && (unknown.is_some() || route_status::has_ours(&route)) {
        // Only misspelled keys (routing stays off), or none left: say so, or clear our entries.
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        route_status::write(
            ctx,
            &ns,
            &route.name_any(),
            route_status::entries(&route, &[], unknown.as_deref(), route.metadata.generation, &now),
        )
        .await?;
    }
    Ok(Action::await_change())
}

fn owner_of(r: &HttpRoute) -> Result<Owner> {
    Ok(Owner {
        api_version: HttpRoute::api_version(&()).into_owned(),
        kind: HttpRoute::kind(&()).into_owned(),
        name: r.name_any(),
        namespace: r.namespace().ok_or(Error::MissingField("metadata.namespace"))?,
        uid: r.uid().ok_or(Error::MissingField("metadata.uid"))?,
    })
}

/// What an annotated route asks for, decided from the objects `src` holds (no writes).
#[derive(Debug)]
pub enum RoutePlan {
    /// Not annotated: nothing of ours should exist.
    NotAnnotated,
    /// A policy targets the route and takes precedence over its annotations.
    Overridden {
        /// Name of the winning InferenceRoutingPolicy.
        policy: String,
    },
    /// The annotations are invalid (message); nothing changes.
    Invalid(String),
    /// Program the outcome's objects (everything else the route owns is swept).
    Program {
        /// Strategy named by the annotations (for events).
        strategy: &'static str,
        /// Resolution and rendering result.
        outcome: program::TargetOutcome,
    },
}

/// Decides what an annotated `route` programs. Reads only; API errors propagate.
pub async fn plan(route: &HttpRoute, src: Source<'_>, config: &ControllerConfig, now: &Time) -> Result<RoutePlan> {
    let owner = owner_of(route)?;
    let key = feed_key(FEED_KIND_HTTPROUTE, &owner.namespace, &owner.name);
    // Precedence: a policy targeting this route wins over its annotations.
    let policies = src.policies(&owner.namespace).await?;
    if let Some(p) = winner(&policies, &owner.name) {
        return Ok(RoutePlan::Overridden { policy: p.name_any() });
    }
    let intent = match RoutingIntent::from_annotations(route.annotations()) {
        Some(Ok(i)) => i,
        Some(Err(msg)) => return Ok(RoutePlan::Invalid(msg)),
        None => return Ok(RoutePlan::NotAnnotated),
    };
    let outcome = program::resolve_and_render(
        src,
        config,
        &owner,
        &intent,
        &owner.namespace,
        &owner.name,
        &feed_path(&key),
        route.metadata.generation,
        now,
    )
    .await?;
    Ok(RoutePlan::Program { strategy: intent.strategy.as_str(), outcome })
}

async fn apply(route: &HttpRoute, ctx: &Context, unknown: Option<&str>) -> Result<Action> {
    let owner = owner_of(route)?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let key = feed_key(FEED_KIND_HTTPROUTE, &owner.namespace, &owner.name);
    let (strategy, out) = match plan(route, Source::Api(&ctx.client), &ctx.config, &now).await? {
        RoutePlan::Overridden { policy } => {
            let removed = program::sweep(ctx, &owner.uid, &BTreeSet::new()).await?;
            ctx.remove_feed(&key);
            route_status::write(
                ctx,
                &owner.namespace,
                &owner.name,
                route_status::entries(route, &[], unknown, route.metadata.generation, &now),
            )
            .await?;
            publish(ctx, route, EventType::Warning, "AnnotationsOverridden", overridden_note(&policy, removed)).await;
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        RoutePlan::Invalid(msg) => {
            publish(ctx, route, EventType::Warning, "InvalidAnnotation", invalid_note(&msg)).await;
            let invalid = (false, crate::conditions::reason::INVALID, msg.clone());
            let a = program::ancestor(
                program::route_ref(&owner.namespace, &owner.name),
                [
                    invalid.clone(),
                    invalid,
                    (false, crate::conditions::reason::INVALID, "not changed: the annotations are invalid".into()),
                ],
                route.metadata.generation,
                &now,
            );
            route_status::write(
                ctx,
                &owner.namespace,
                &owner.name,
                route_status::entries(route, &[a], unknown, route.metadata.generation, &now),
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        RoutePlan::NotAnnotated => return Ok(Action::await_change()),
        RoutePlan::Program { strategy, outcome } => (strategy, outcome),
    };
    program::apply_all(ctx, &out.objects).await?;
    let keep: BTreeSet<_> = out.objects.iter().map(program::key_of).collect();
    program::sweep(ctx, &owner.uid, &keep).await?;
    match out.feed {
        Some(f) => ctx.set_feed_source(&key, f),
        None => ctx.remove_feed(&key),
    }
    let mut ancestors = out.ancestors;
    let recheck =
        super::status_readback::mirror(ctx, &out.objects, &mut ancestors, route.metadata.generation, &now).await?;
    route_status::write(
        ctx,
        &owner.namespace,
        &owner.name,
        route_status::entries(route, &ancestors, unknown, route.metadata.generation, &now),
    )
    .await?;
    let (type_, reason, note) = outcome_event(strategy, &ancestors, out.objects.len());
    publish(ctx, route, type_, reason, note).await;
    Ok(Action::requeue(recheck.unwrap_or(Duration::from_secs(300))))
}

/// Event note when a policy overrides the route's annotations (`removed`: annotation-owned objects deleted).
pub fn overridden_note(policy: &str, removed: usize) -> String {
    format!("InferenceRoutingPolicy {policy} targets this route and takes precedence over its warmpath.dev annotations (removed {removed} annotation-owned object(s))")
}

/// Event note for invalid annotations.
pub fn invalid_note(msg: &str) -> String {
    format!("{msg}; nothing changed")
}

/// The event after programming: `Programmed`, or `NotProgrammed` naming each failing condition.
pub fn outcome_event(
    strategy: &str,
    ancestors: &[crate::crd::routing_policy::PolicyAncestorStatus],
    objects: usize,
) -> (EventType, &'static str, String) {
    let failing: Vec<String> = ancestors
        .iter()
        .flat_map(|a| {
            a.conditions
                .iter()
                .filter(|c| c.status == "False")
                .map(move |c| format!("{}/{}: {} ({})", a.ancestor_ref.kind, a.ancestor_ref.name, c.reason, c.message))
        })
        .collect();
    if failing.is_empty() {
        (EventType::Normal, "Programmed", format!("strategy {strategy} via annotations: {objects} object(s)"))
    } else {
        (EventType::Warning, "NotProgrammed", failing.join("; "))
    }
}

async fn cleanup(route: &HttpRoute, ctx: &Context) -> Result<Action> {
    let owner = owner_of(route)?;
    let removed = program::sweep(ctx, &owner.uid, &BTreeSet::new()).await?;
    ctx.remove_feed(&feed_key(FEED_KIND_HTTPROUTE, &owner.namespace, &owner.name));
    if removed > 0 {
        publish(ctx, route, EventType::Normal, "CleanedUp", format!("deleted {removed} object(s)")).await;
    }
    Ok(Action::await_change())
}
