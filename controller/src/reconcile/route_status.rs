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

use super::Context;
use crate::conditions;
use crate::crd::routing_policy::{PolicyAncestorStatus, CONTROLLER_NAME, GATEWAY_API_GROUP};
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
pub fn entries(route: &HttpRoute, ancestors: &[PolicyAncestorStatus], unknown_keys: Option<&str>, generation: Option<i64>, now: &Time) -> Vec<Value> {
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
            conditions::upsert(&mut conds, conditions::new(ANNOTATIONS_RECOGNIZED, false, UNKNOWN_ANNOTATION, msg, generation, now));
        }
        out.push(json!({"parentRef": parent, "controllerName": CONTROLLER_NAME, "conditions": conds}));
    };
    for a in ancestors {
        if a.ancestor_ref.kind == "Gateway" {
            let r = &a.ancestor_ref;
            push(json!({"group": r.group, "kind": "Gateway", "namespace": r.namespace.clone().unwrap_or_else(|| route_ns.clone()), "name": r.name}), a.conditions.clone());
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
    let (old_ours, mut merged): (Vec<Value>, Vec<Value>) = parents.into_iter().partition(|p| p["controllerName"] == CONTROLLER_NAME);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    use super::*;
    use crate::conditions::PROGRAMMED;
    use crate::fixtures::{self, *};
    use crate::reconcile::route_annotations;

    const NS: &str = "llm";
    const GW_NS: &str = "gateways";

    async fn setup(annotations: Value) -> (kube::Client, Context, Api<HttpRoute>) {
        let client = fixtures::client(vec![gateway_class("eg", EG_CONTROLLER), gateway(GW_NS, "inference-gw", "eg"), service(NS, "vllm", 8000)]).await;
        let _: HttpRoute = create(&client, NS, http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, annotations)).await;
        let ctx = fixtures::context(client.clone());
        (client.clone(), ctx, Api::namespaced(client, NS))
    }

    async fn reconcile(ctx: &Context, api: &Api<HttpRoute>) -> HttpRoute {
        for _ in 0..2 {
            route_annotations::reconcile(Arc::new(api.get("chat").await.unwrap()), Arc::new(ctx.clone())).await.unwrap();
        }
        api.get("chat").await.unwrap()
    }

    fn ours(route: &HttpRoute) -> Vec<Value> {
        let v = serde_json::to_value(route).unwrap();
        v["status"]["parents"].as_array().cloned().unwrap_or_default().into_iter().filter(|p| p["controllerName"] == CONTROLLER_NAME).collect()
    }

    fn condition<'a>(entry: &'a Value, type_: &str) -> &'a Value {
        entry["conditions"].as_array().unwrap().iter().find(|c| c["type"] == type_).unwrap_or_else(|| panic!("no {type_} in {entry}"))
    }

    /// An annotated route gets warmpath's entry in status.parents (the gateway's own entry stays),
    /// it follows the read-back status, and goes when the annotation goes.
    #[tokio::test]
    async fn annotated_route_status_is_durable_and_leaves_the_gateways_entry_alone() {
        let (client, ctx, api) = setup(json!({"warmpath.dev/routing-strategy": "prefix-aware"})).await;
        let gateway_entry = json!({"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": GW_NS, "name": "inference-gw"},
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Route is accepted", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        api.patch_status("chat", &PatchParams::default(), &Patch::Merge(json!({"status": {"parents": [gateway_entry.clone()]}}))).await.unwrap();
        let route = reconcile(&ctx, &api).await;
        let entries = ours(&route);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0]["parentRef"]["name"], "inference-gw");
        assert_eq!(condition(&entries[0], PROGRAMMED)["reason"], "AwaitingGatewayStatus");
        let all = serde_json::to_value(&route).unwrap()["status"]["parents"].as_array().cloned().unwrap();
        assert!(all.contains(&gateway_entry), "the gateway's entry is kept: {all:?}");

        fixtures::eg_reports_programmed(&client, (GW_NS, "inference-gw")).await;
        let route = reconcile(&ctx, &api).await;
        assert_eq!(condition(&ours(&route)[0], PROGRAMMED)["status"], "True");
        let rv = route.metadata.resource_version.clone();
        // Nothing changed: no status write (the write would wake the route watch again).
        let route = reconcile(&ctx, &api).await;
        assert_eq!(route.metadata.resource_version, rv, "an unchanged status is not rewritten");

        api.patch("chat", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"warmpath.dev/routing-strategy": null}}}))).await.unwrap();
        let route = reconcile(&ctx, &api).await;
        assert!(ours(&route).is_empty(), "entries removed with the annotation");
        let all = serde_json::to_value(&route).unwrap()["status"]["parents"].as_array().cloned().unwrap();
        assert_eq!(all, vec![gateway_entry]);
    }

    /// A misspelled key: a Warning event and AnnotationsRecognized=False naming the key and the
    /// known key it resembles, also when it leaves routing off (misspelled strategy key).
    #[tokio::test]
    async fn unknown_annotation_keys_are_reported_with_the_nearest_known_key() {
        let (client, ctx, api) = setup(json!({"warmpath.dev/routing-stratgy": "prefix-aware", "warmpath.dev/prefix-lenght": "2048"})).await;
        let route = reconcile(&ctx, &api).await;
        let entries = ours(&route);
        assert_eq!(entries.len(), 1, "{entries:?}");
        let c = condition(&entries[0], ANNOTATIONS_RECOGNIZED);
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some(UNKNOWN_ANNOTATION)));
        let msg = c["message"].as_str().unwrap();
        assert!(msg.contains("warmpath.dev/routing-stratgy ignored (did you mean warmpath.dev/routing-strategy?)"), "{msg}");
        assert!(msg.contains("warmpath.dev/prefix-lenght ignored (did you mean warmpath.dev/prefix-length?)"), "{msg}");
        assert!(owned_objects(&client).await.is_empty(), "routing stays off: the strategy key is misspelled");
        let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone()).list(&Default::default()).await.unwrap();
        assert!(events.items.iter().any(|e| e.reason.as_deref() == Some("UnknownAnnotation") && e.note.as_deref().is_some_and(|n| n.contains("routing-stratgy"))));

        // Spelled right, plus one stray key: programmed, and the stray key still reported.
        api.patch("chat", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {
            "warmpath.dev/routing-stratgy": null, "warmpath.dev/prefix-lenght": null, "warmpath.dev/routing-strategy": "prefix-aware", "warmpath.dev/tenant": "x"}}}))).await.unwrap();
        let route = reconcile(&ctx, &api).await;
        let entry = &ours(&route)[0];
        assert_eq!(condition(entry, "Accepted")["status"], "True");
        assert!(condition(entry, ANNOTATIONS_RECOGNIZED)["message"].as_str().unwrap().contains("warmpath.dev/tenant ignored (known:"));
        assert!(!owned_objects(&client).await.is_empty());
    }
}
