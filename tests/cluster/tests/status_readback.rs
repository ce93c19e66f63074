//! Programmed mirrors Envoy Gateway's status on the written objects (status_readback), against the in-memory API client playing Envoy Gateway.
#![allow(unused_imports)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::ResourceExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use warmpath_controller::conditions::{self, reason, PROGRAMMED};
use warmpath_controller::crd::routing_policy::PolicyAncestorStatus;
use warmpath_controller::reconcile::Context;
use warmpath_controller::render::LABEL_OWNER_UID;
use warmpath_controller::{foreign, Result};

use gateway_api::apis::standard::httproutes::HttpRoute;
use kube::api::PostParams;
use serde_json::json;

use warmpath_cluster_tests::fixtures::{self, *};
use warmpath_controller::conditions::{ACCEPTED, RESOLVED_REFS};
use warmpath_controller::crd::routing_policy::InferenceRoutingPolicy;
use warmpath_controller::gateway::routing_policy;
use warmpath_controller::gateway::status_readback::*;

const NS: &str = "llm";
const GW_NS: &str = "gateways";
const GW: (&str, &str) = (GW_NS, "inference-gw");
const EPP: &str = "warmpath-feed-policy-llm-chat-routing";

async fn setup(route: serde_json::Value) -> (kube::Client, Context) {
    let client = fixtures::client(vec![
        gateway_class("eg", EG_CONTROLLER),
        gateway(GW_NS, "inference-gw", "eg"),
        service(NS, "vllm", 8000),
        service(NS, "vllm-canary", 8000),
        endpoint_slice(NS, "vllm", 8000, &["10.0.0.1"]),
    ])
    .await;
    let _: HttpRoute = create(&client, NS, route).await;
    let _: InferenceRoutingPolicy =
        create(&client, NS, policy(NS, "chat-routing", "chat", json!({"strategy": "PREFIX_AWARE"}))).await;
    let ctx = fixtures::context(client.clone());
    (client, ctx)
}

async fn reconcile(client: &kube::Client, ctx: &Context) -> InferenceRoutingPolicy {
    let api: Api<InferenceRoutingPolicy> = Api::namespaced(client.clone(), NS);
    for _ in 0..2 {
        routing_policy::reconcile(Arc::new(api.get("chat-routing").await.unwrap()), Arc::new(ctx.clone()))
            .await
            .unwrap();
    }
    api.get("chat-routing").await.unwrap()
}

fn cond(p: &InferenceRoutingPolicy, type_: &str) -> (String, String, String) {
    let c = conditions::find(&p.status.as_ref().unwrap().ancestors[0].conditions, type_).unwrap().clone();
    (c.status, c.reason, c.message)
}

fn route() -> serde_json::Value {
    http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, json!({}))
}

/// Programmed follows Envoy Gateway's own status: awaiting it, then True when every object is
/// accepted and the patch programmed, then False with Envoy Gateway's reason and message.
#[tokio::test]
async fn programmed_mirrors_envoy_gateway_status() {
    let (client, ctx) = setup(route()).await;
    let p = reconcile(&client, &ctx).await;
    let (s, r, m) = cond(&p, PROGRAMMED);
    assert_eq!((s.as_str(), r.as_str()), ("False", mirrored::AWAITING_GATEWAY), "{m}");
    assert!(m.contains("EnvoyPatchPolicy gateways/") && m.contains("EnvoyExtensionPolicy llm/warmpath-chat"), "{m}");

    fixtures::eg_reports_programmed(&client, GW).await;
    let (s, r, _) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
    assert_eq!((s.as_str(), r.as_str()), ("True", "Programmed"));

    // A patch does not apply (e.g. another xDS listener name, or an Envoy Gateway before v1.7): reason and message
    // mirrored, with both causes named.
    let failed = [
        ("Accepted", "True", "Accepted", "ok"),
        ("Programmed", "False", "ResourceNotFound", "unable to find xds resource gateways/inference-gw/http"),
    ];
    fixtures::eg_status(&client, "EnvoyPatchPolicy", GW_NS, EPP, GW, &failed).await;
    let (s, r, m) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
    assert_eq!((s.as_str(), r.as_str()), ("False", "ResourceNotFound"));
    assert!(
        m.contains("unable to find xds resource gateways/inference-gw/http")
            && m.contains("listener or route configuration name")
            && m.contains("v1.7"),
        "{m}"
    );

    // Recent Envoy Gateway releases report a disabled EnvoyPatchPolicy as Accepted=False/Disabled.
    fixtures::eg_status(
        &client,
        "EnvoyPatchPolicy",
        GW_NS,
        EPP,
        GW,
        &[("Accepted", "False", "Disabled", "EnvoyPatchPolicy is disabled")],
    )
    .await;
    let (s, r, m) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
    assert_eq!((s.as_str(), r.as_str()), ("False", "Disabled"));
    assert!(m.contains("enableEnvoyPatchPolicy"), "{m}");

    // Our BackendTrafficPolicy lost to an older one on the route.
    fixtures::eg_reports_programmed(&client, GW).await;
    let conflicted = [(
        "Accepted",
        "False",
        "Conflicted",
        "Unable to target HTTPRoute chat, another BackendTrafficPolicy has already attached to it",
    )];
    fixtures::eg_status(&client, "BackendTrafficPolicy", NS, "warmpath-chat", GW, &conflicted).await;
    let (s, r, m) = cond(&reconcile(&client, &ctx).await, PROGRAMMED);
    assert_eq!((s.as_str(), r.as_str()), ("False", "Conflicted"));
    assert!(m.contains("another BackendTrafficPolicy") && m.contains("merge the settings"), "{m}");
}

/// An EnvoyPatchPolicy that never gets a status: pending at first, "looks disabled" after the bound.
#[tokio::test]
async fn patch_policy_without_status_looks_disabled_after_the_bound() {
    let (client, ctx) = setup(route()).await;
    reconcile(&client, &ctx).await;
    let epp = fixtures::get_owned(&client, "EnvoyPatchPolicy", GW_NS, EPP).await.unwrap();
    let created = epp.metadata.creation_timestamp.clone().unwrap().0;
    let live = vec![("EnvoyPatchPolicy".to_string(), epp)];
    let at = |s: i64| created + SignedDuration::from_secs(s);
    assert_eq!(verdict(&live, GW_NS, "inference-gw", at(10)).1, mirrored::AWAITING_GATEWAY);
    let (ok, why, msg) = verdict(&live, GW_NS, "inference-gw", at(EPP_STATUS_BOUND.as_secs() as i64 + 1));
    assert!(!ok);
    assert_eq!(why, mirrored::PATCH_POLICY_DISABLED);
    assert!(msg.contains("EnvoyPatchPolicy looks disabled; enable `extensionApis.enableEnvoyPatchPolicy`"), "{msg}");
}

/// Under `mergeGateways` Envoy Gateway refuses the patch policy under a GatewayClass ancestor named like the Gateway
/// (it takes the target as a GatewayClass): that refusal is reported, with mergeGateways named, not a missing status
/// that later reads as "disabled".
#[tokio::test]
async fn a_refusal_under_merge_gateways_is_reported() {
    let (client, ctx) = setup(route()).await;
    reconcile(&client, &ctx).await;
    let mut epp = fixtures::get_owned(&client, "EnvoyPatchPolicy", GW_NS, EPP).await.unwrap();
    let created = epp.metadata.creation_timestamp.clone().unwrap().0;
    epp.data["status"] = json!({"ancestors": [{
        "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "inference-gw"},
        "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
        "conditions": [{"type": "Accepted", "status": "False", "reason": "Invalid", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "message": "TargetRef.Group:gateway.networking.k8s.io TargetRef.Kind:Gateway TargetRef.Namespace:gateways TargetRef.Name:inference-gw not found or not accepted (MergeGateways=true)."}]}]});
    let live = vec![("EnvoyPatchPolicy".to_string(), epp)];
    let late = created + SignedDuration::from_secs(EPP_STATUS_BOUND.as_secs() as i64 + 1);
    let (ok, why, msg) = verdict(&live, GW_NS, "inference-gw", late);
    assert!(!ok);
    assert_eq!(why, "Invalid", "{msg}");
    assert!(msg.contains("MergeGateways=true") && msg.contains("mergeGateways"), "{msg}");
}

/// A status Envoy Gateway wrote for an older generation of the object does not count.
#[test]
fn status_of_an_older_generation_is_not_current() {
    let mut epp: DynamicObject = serde_json::from_value(json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
        "metadata": {"name": EPP, "namespace": GW_NS, "generation": 3},
        "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gw"}},
        "status": {"ancestors": [{"ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": GW_NS, "name": "inference-gw"},
            "controllerName": EG_CONTROLLER_NAME,
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": 2},
                           {"type": "Programmed", "status": "True", "reason": "Programmed", "observedGeneration": 2}]}]}}))
    .unwrap();
    let now = Timestamp::now();
    let v = |o: &DynamicObject| verdict(&[("EnvoyPatchPolicy".to_string(), o.clone())], GW_NS, "inference-gw", now);
    assert_eq!(v(&epp).1, mirrored::AWAITING_GATEWAY, "generation 3, status for 2");
    epp.metadata.generation = Some(2);
    assert_eq!(
        v(&epp),
        (
            true,
            "Programmed".to_string(),
            "Envoy Gateway accepted every object and programmed the EnvoyPatchPolicy".to_string()
        )
    );
}

/// A user's own BackendTrafficPolicy on the route: warmpath writes nothing for it and says why.
#[tokio::test]
async fn user_policy_on_the_route_is_reported_conflicted() {
    let (client, ctx) = setup(route()).await;
    let users = json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": "chat-timeouts", "namespace": NS},
        "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"}], "timeout": {"http": {"requestTimeout": "300s"}}}});
    Api::<DynamicObject>::namespaced_with(client.clone(), NS, &foreign::backend_traffic_policy())
        .create(&PostParams::default(), &serde_json::from_value(users).unwrap())
        .await
        .unwrap();
    let p = reconcile(&client, &ctx).await;
    let (s, r, m) = cond(&p, ACCEPTED);
    assert_eq!((s.as_str(), r.as_str()), ("False", "Conflicted"));
    assert!(m.contains("BackendTrafficPolicy llm/chat-timeouts") && m.contains("Merge"), "{m}");
    assert_eq!(cond(&p, RESOLVED_REFS).0, "True", "the references themselves resolved");
    let owned = owned_objects(&client).await;
    assert_eq!(
        owned,
        vec![("BackendTrafficPolicy".to_string(), NS.to_string(), "chat-timeouts".to_string())],
        "only the user's object"
    );
}

/// A user's EnvoyExtensionPolicy that selects the route by label (`targetSelectors`) conflicts
/// just as one naming it does; a selector the route's labels do not match (or of another kind)
/// does not.
#[tokio::test]
async fn user_policy_selecting_the_route_by_label_is_reported_conflicted() {
    let mut r = route();
    r["metadata"]["labels"] = json!({"team": "llm", "tier": "prod"});
    let (client, ctx) = setup(r).await;
    let user = |name: &str, selectors: Value| {
        json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyExtensionPolicy",
            "metadata": {"name": name, "namespace": NS}, "spec": {"targetSelectors": selectors}})
    };
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &foreign::envoy_extension_policy());
    for (name, selectors) in [
        ("other-team", json!([{"kind": "HTTPRoute", "matchLabels": {"team": "search"}}])),
        ("gateways-only", json!([{"kind": "Gateway", "matchLabels": {"team": "llm"}}])),
        (
            "not-prod",
            json!([{"kind": "HTTPRoute", "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["prod"]}]}]),
        ),
    ] {
        api.create(&PostParams::default(), &serde_json::from_value(user(name, selectors)).unwrap()).await.unwrap();
    }
    let p = reconcile(&client, &ctx).await;
    assert_eq!(cond(&p, ACCEPTED).0, "True", "no selector matches the route: {:?}", cond(&p, ACCEPTED));

    let selecting = json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "matchLabels": {"team": "llm"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod", "staging"]}]}]);
    api.create(&PostParams::default(), &serde_json::from_value(user("llm-auth", selecting)).unwrap()).await.unwrap();
    let p = reconcile(&client, &ctx).await;
    let (s, r, m) = cond(&p, ACCEPTED);
    assert_eq!((s.as_str(), r.as_str()), ("False", "Conflicted"), "{m}");
    assert!(
        m.contains("EnvoyExtensionPolicy llm/llm-auth") && !m.contains("other-team") && !m.contains("not-prod"),
        "{m}"
    );
}

/// A 90/10 canary (two backendRefs): refused with a condition naming both backends; nothing written.
#[tokio::test]
async fn several_backend_refs_are_refused() {
    let mut r = route();
    r["spec"]["rules"][0]["backendRefs"] =
        json!([{"name": "vllm", "port": 8000, "weight": 90}, {"name": "vllm-canary", "port": 8000, "weight": 10}]);
    let (client, ctx) = setup(r).await;
    let p = reconcile(&client, &ctx).await;
    let (s, reason, m) = cond(&p, RESOLVED_REFS);
    assert_eq!((s.as_str(), reason.as_str()), ("False", conditions::reason::MULTIPLE_BACKENDS));
    assert!(
        m.contains("Service llm/vllm:8000")
            && m.contains("Service llm/vllm-canary:8000")
            && m.contains("own HTTPRoute"),
        "{m}"
    );
    assert_eq!(cond(&p, PROGRAMMED).0, "False");
    assert!(owned_objects(&client).await.is_empty());
}
