//! Durable status for HTTPRoutes routed through annotations: warmpath's own entries in the route's
//! `status.parents` (one per Gateway, `controllerName: warmpath.dev/controller`, the same Accepted /
//! ResolvedRefs / Programmed conditions a policy gets), so the outcome outlives Events (about an
//! hour). Entries of other controllers (the gateway's own) are kept as they are.
//!
//! `status.parents` is an atomic list in Gateway API's CRD (no list-map keys), so a server-side
//! apply would replace the gateway's entries too: the list is read, our entries swapped, and the
//! status replaced with the `resourceVersion` read (a concurrent writer gets 409; retried).

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

use crate::conditions;
use crate::crd::routing_policy::{PolicyAncestorStatus, CONTROLLER_NAME, GATEWAY_API_GROUP};
use crate::reconcile::Context;
use crate::Result;

/// Condition type on warmpath's route entries: False when the route carries `warmpath.dev/*`
/// annotation keys the controller does not read (message: each key and the known key it resembles).
pub const ANNOTATIONS_RECOGNIZED: &str = "warmpath.dev/AnnotationsRecognized";
/// Reason of `AnnotationsRecognized=False`.
pub const UNKNOWN_ANNOTATION: &str = "UnknownAnnotation";

/// Gateway API allows at most this many entries in `status.parents`.
const MAX_PARENTS: usize = 32;

/// warmpath's entries for `route`: one per Gateway ancestor in `ancestors`; an ancestor naming the
/// route itself (its Gateways unknown) is reported against each of the route's parentRefs. With
/// `unknown_keys`, every entry also carries `AnnotationsRecognized=False`.
pub fn entries(
    route: &HttpRoute,
    ancestors: &[PolicyAncestorStatus],
    unknown_keys: Option<&str>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Value> {
    let route_ns = route.metadata.namespace.clone().unwrap_or_default();
    let spec_parents: Vec<Value> = route
        .spec
        .parent_refs
        .iter()
        .flatten()
        .map(|p| json!({"group": p.group.clone().unwrap_or_else(|| GATEWAY_API_GROUP.into()), "kind": p.kind.clone().unwrap_or_else(|| "Gateway".into()),
                        "namespace": p.namespace.clone().unwrap_or_else(|| route_ns.clone()), "name": p.name}))
        .collect();
    let mut out = vec![];
    let mut push = |parent: Value, mut conds: Vec<Condition>| {
        if let Some(msg) = unknown_keys {
            conditions::upsert(
                &mut conds,
                conditions::new(ANNOTATIONS_RECOGNIZED, false, UNKNOWN_ANNOTATION, msg, generation, now),
            );
        }
        out.push(json!({"parentRef": parent, "controllerName": CONTROLLER_NAME, "conditions": conds}));
    };
    for a in ancestors {
        if a.ancestor_ref.kind == "Gateway" {
            let r = &a.ancestor_ref;
            push(
                json!({"group": r.group, "kind": "Gateway", "namespace": r.namespace.clone().unwrap_or_else(|| route_ns.clone()), "name": r.name}),
                a.conditions.clone(),
            );
        } else {
            for p in &spec_parents {
                push(p.clone(), a.conditions.clone());
            }
        }
    }
    if ancestors.is_empty() && unknown_keys.is_some() {
        // Nothing programmed (e.g. only misspelled keys): still say why, on each parent.
        for p in &spec_parents {
            push(p.clone(), vec![]);
        }
    }
    out
}

/// True when the route's status holds an entry of warmpath's (so routes warmpath never touched
/// cost no extra API call).
pub fn has_ours(route: &HttpRoute) -> bool {
    route.status.as_ref().is_some_and(|s| s.parents.iter().any(|p| p.controller_name == CONTROLLER_NAME))
}

/// Replaces warmpath's entries in the route's `status.parents` with `ours` (empty: removes them).
/// Keeps the `lastTransitionTime` of unchanged conditions, and writes nothing when nothing changed
/// (the status write itself wakes the route watch; an unchanged status ends that loop).
pub async fn write(ctx: &Context, ns: &str, name: &str, ours: Vec<Value>) -> Result<()> {
    if !ctx.config.live_status {
        return Ok(());
    }
    let api: Api<HttpRoute> = Api::namespaced(ctx.client.clone(), ns);
    let Some(route) = api.get_opt(name).await? else { return Ok(()) };
    let mut doc = serde_json::to_value(&route)?;
    let parents = doc["status"]["parents"].as_array().cloned().unwrap_or_default();
    let (old_ours, mut merged): (Vec<Value>, Vec<Value>) =
        parents.into_iter().partition(|p| p["controllerName"] == CONTROLLER_NAME);
    let mut ours = ours;
    for entry in &mut ours {
        let Some(prev) = old_ours.iter().find(|p| p["parentRef"] == entry["parentRef"]) else { continue };
        let mut kept: Vec<Condition> = serde_json::from_value(prev["conditions"].clone()).unwrap_or_default();
        let fresh: Vec<Condition> = serde_json::from_value(entry["conditions"].clone())?;
        let types: Vec<String> = fresh.iter().map(|c| c.type_.clone()).collect();
        kept.retain(|c| types.contains(&c.type_));
        for c in fresh {
            conditions::upsert(&mut kept, c);
        }
        entry["conditions"] = serde_json::to_value(kept)?;
    }
    if old_ours == ours {
        return Ok(());
    }
    merged.extend(ours);
    merged.truncate(MAX_PARENTS);
    doc["status"] = json!({"parents": merged});
    let updated: HttpRoute = serde_json::from_value(doc)?;
    api.replace_status(name, &PostParams::default(), &updated).await?;
    Ok(())
}
