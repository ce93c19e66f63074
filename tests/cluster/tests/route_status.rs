//! HTTPRoute status written by warmpath (route_status) against the in-memory API client.
#![allow(unused_imports)]

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use std::sync::Arc;
use warmpath_controller::conditions;
use warmpath_controller::crd::routing_policy::{PolicyAncestorStatus, CONTROLLER_NAME, GATEWAY_API_GROUP};
use warmpath_controller::reconcile::Context;
use warmpath_controller::Result;

use kube::api::{Patch, PatchParams};

use warmpath_cluster_tests::fixtures::{self, *};
use warmpath_controller::conditions::PROGRAMMED;
use warmpath_controller::gateway::route_annotations;
use warmpath_controller::gateway::route_status::*;

const NS: &str = "llm";
const GW_NS: &str = "gateways";

async fn setup(annotations: Value) -> (kube::Client, Context, Api<HttpRoute>) {
    let client = fixtures::client(vec![
        gateway_class("eg", EG_CONTROLLER),
        gateway(GW_NS, "inference-gw", "eg"),
        service(NS, "vllm", 8000),
    ])
    .await;
    let _: HttpRoute =
        create(&client, NS, http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, annotations)).await;
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
    v["status"]["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["controllerName"] == CONTROLLER_NAME)
        .collect()
}

fn condition<'a>(entry: &'a Value, type_: &str) -> &'a Value {
    entry["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {entry}"))
}

/// An annotated route gets warmpath's entry in status.parents (the gateway's own entry stays),
/// it follows the read-back status, and goes when the annotation goes.
#[tokio::test]
async fn annotated_route_status_is_durable_and_leaves_the_gateways_entry_alone() {
    let (client, ctx, api) = setup(json!({"warmpath.dev/routing-strategy": "PREFIX_AWARE"})).await;
    let gateway_entry = json!({"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": GW_NS, "name": "inference-gw"},
        "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Route is accepted", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    api.patch_status(
        "chat",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"parents": [gateway_entry.clone()]}})),
    )
    .await
    .unwrap();
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

    api.patch(
        "chat",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"warmpath.dev/routing-strategy": null}}})),
    )
    .await
    .unwrap();
    let route = reconcile(&ctx, &api).await;
    assert!(ours(&route).is_empty(), "entries removed with the annotation");
    let all = serde_json::to_value(&route).unwrap()["status"]["parents"].as_array().cloned().unwrap();
    assert_eq!(all, vec![gateway_entry]);
}

/// A misspelled key: a Warning event and AnnotationsRecognized=False naming the key and the
/// known key it resembles, also when it leaves routing off (misspelled strategy key).
#[tokio::test]
async fn unknown_annotation_keys_are_reported_with_the_nearest_known_key() {
    let (client, ctx, api) =
        setup(json!({"warmpath.dev/routing-stratgy": "prefix-aware", "warmpath.dev/prefix-lenght": "2048"})).await;
    let route = reconcile(&ctx, &api).await;
    let entries = ours(&route);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let c = condition(&entries[0], ANNOTATIONS_RECOGNIZED);
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some(UNKNOWN_ANNOTATION)));
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("warmpath.dev/routing-stratgy ignored (did you mean warmpath.dev/routing-strategy?)"),
        "{msg}"
    );
    assert!(msg.contains("warmpath.dev/prefix-lenght ignored (did you mean warmpath.dev/prefix-length?)"), "{msg}");
    assert!(owned_objects(&client).await.is_empty(), "routing stays off: the strategy key is misspelled");
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::all(client.clone()).list(&Default::default()).await.unwrap();
    assert!(events.items.iter().any(|e| e.reason.as_deref() == Some("UnknownAnnotation")
        && e.note.as_deref().is_some_and(|n| n.contains("routing-stratgy"))));

    // Spelled right, plus one stray key: programmed, and the stray key still reported.
    api.patch("chat", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {
        "warmpath.dev/routing-stratgy": null, "warmpath.dev/prefix-lenght": null, "warmpath.dev/routing-strategy": "PREFIX_AWARE", "warmpath.dev/tenant": "x"}}}))).await.unwrap();
    let route = reconcile(&ctx, &api).await;
    let entry = &ours(&route)[0];
    assert_eq!(condition(entry, "Accepted")["status"], "True");
    assert!(condition(entry, ANNOTATIONS_RECOGNIZED)["message"]
        .as_str()
        .unwrap()
        .contains("warmpath.dev/tenant ignored (known:"));
    assert!(!owned_objects(&client).await.is_empty());
}

/// One spelling: the annotation takes the CRD's `strategy` values exactly. Another spelling
/// (`prefix-aware`) writes nothing; the route's status and event name the accepted values and the
/// value meant. The CRD spelling then programs the route.
#[tokio::test]
async fn strategy_annotation_in_another_spelling_is_refused_naming_the_accepted_values() {
    let (client, ctx, api) = setup(json!({"warmpath.dev/routing-strategy": "prefix-aware"})).await;
    let route = reconcile(&ctx, &api).await;
    assert!(owned_objects(&client).await.is_empty(), "nothing written for a refused spelling");
    let entries = ours(&route);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let c = condition(&entries[0], "Accepted");
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("Invalid")));
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("warmpath.dev/routing-strategy: unknown strategy \"prefix-aware\": accepted values are RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE (did you mean PREFIX_AWARE?)"),
        "{msg}"
    );
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::all(client.clone()).list(&Default::default()).await.unwrap();
    assert!(events.items.iter().any(|e| e.reason.as_deref() == Some("InvalidAnnotation")
        && e.note.as_deref().is_some_and(|n| n.contains("accepted values are"))));

    api.patch(
        "chat",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"warmpath.dev/routing-strategy": "PREFIX_AWARE"}}})),
    )
    .await
    .unwrap();
    reconcile(&ctx, &api).await;
    assert!(!owned_objects(&client).await.is_empty(), "the CRD spelling programs the route");
}
