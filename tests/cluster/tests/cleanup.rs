//! The cleanup subcommand against the in-memory API client.
#![allow(unused_imports)]

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use warmpath_controller::crd::routing_policy::InferenceRoutingPolicy;
use warmpath_controller::gateway::{program, route_annotations, routing_policy};
use warmpath_controller::leader::Elector;
use warmpath_controller::reconcile::{finalizers, Context};
use warmpath_controller::render::LABEL_OWNER_UID;
use warmpath_controller::Result;

use kube::api::PostParams;

use warmpath_cluster_tests::fixtures::{self, *};
use warmpath_controller::cleanup::*;

const NS: &str = "llm";
const GW_NS: &str = "gateways";

/// A route programmed through annotations and another through a policy, plus a user-owned
/// object of a rendered kind: cleanup deletes exactly warmpath's objects and releases both
/// finalizers; the routes, the policy and the user's object stay.
#[tokio::test]
async fn cleanup_releases_finalizers_and_deletes_rendered_objects_only() {
    let client = fixtures::client(vec![
        gateway_class("eg", EG_CONTROLLER),
        gateway(GW_NS, "inference-gw", "eg"),
        service(NS, "vllm", 8000),
        endpoint_slice(NS, "vllm", 8000, &["10.0.0.1"]),
    ])
    .await;
    let ctx = fixtures::context(client.clone());
    let _: HttpRoute = create(
        &client,
        NS,
        http_route(
            NS,
            "annotated",
            GW_NS,
            "inference-gw",
            "vllm",
            8000,
            json!({"warmpath.dev/routing-strategy": "PREFIX_AWARE"}),
        ),
    )
    .await;
    let _: HttpRoute =
        create(&client, NS, http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, json!({}))).await;
    let _: InferenceRoutingPolicy =
        create(&client, NS, policy(NS, "chat-routing", "chat", json!({"strategy": "PREFIX_AWARE"}))).await;
    let users = json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": "users-own", "namespace": NS}, "spec": {"targetRefs": []}});
    Api::<DynamicObject>::namespaced_with(client.clone(), NS, &warmpath_controller::foreign::backend_traffic_policy())
        .create(&PostParams::default(), &serde_json::from_value(users).unwrap())
        .await
        .unwrap();
    let routes: Api<HttpRoute> = Api::namespaced(client.clone(), NS);
    let policies: Api<InferenceRoutingPolicy> = Api::namespaced(client.clone(), NS);
    for _ in 0..2 {
        route_annotations::reconcile(Arc::new(routes.get("annotated").await.unwrap()), Arc::new(ctx.clone()))
            .await
            .unwrap();
        routing_policy::reconcile(Arc::new(policies.get("chat-routing").await.unwrap()), Arc::new(ctx.clone()))
            .await
            .unwrap();
    }
    let before = owned_objects(&client).await;
    assert!(before.len() >= 5, "both owners programmed: {before:?}");
    assert!(finalizers::has(&routes.get("annotated").await.unwrap(), route_annotations::FINALIZER));
    assert!(finalizers::has(&policies.get("chat-routing").await.unwrap(), routing_policy::FINALIZER));

    let report = remove_all(&ctx).await.unwrap();
    assert_eq!((report.routes_released, report.policies_released), (1, 1));
    assert_eq!(report.objects_deleted, before.len() - 1, "every rendered object but the user's");
    assert_eq!(
        owned_objects(&client).await,
        vec![("BackendTrafficPolicy".to_string(), NS.to_string(), "users-own".to_string())]
    );
    assert!(routes.get("annotated").await.unwrap().finalizers().is_empty(), "route finalizer released");
    assert!(policies.get("chat-routing").await.unwrap().finalizers().is_empty(), "policy finalizer released");
    assert_eq!(remove_all(&ctx).await.unwrap(), Report::default(), "a second run finds nothing to do");
}

/// An object rendered for an owner whose finalizer is already gone is deleted by its label.
#[tokio::test]
async fn cleanup_deletes_labelled_orphans() {
    let client = fixtures::client(vec![]).await;
    let ctx = fixtures::context(client.clone());
    let orphan = json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyPatchPolicy",
        "metadata": {"name": "warmpath-feed-x", "namespace": GW_NS, "labels": {LABEL_OWNER_UID: "gone-uid"}}, "spec": {}});
    Api::<DynamicObject>::namespaced_with(client.clone(), GW_NS, &warmpath_controller::foreign::envoy_patch_policy())
        .create(&PostParams::default(), &serde_json::from_value(orphan).unwrap())
        .await
        .unwrap();
    let report = remove_all(&ctx).await.unwrap();
    assert_eq!(report.objects_deleted, 1);
    assert!(owned_objects(&client).await.is_empty());
}

/// The cache-warming kinds, when installed: cleanup removes warmpath's finalizer from every
/// InferenceEndpoint, ModelCache and ImageCache (one already being deleted then goes), leaves other
/// finalizers and the objects themselves alone.
#[tokio::test]
async fn cleanup_releases_the_cache_warming_finalizers() {
    use warmpath_controller::crd::image_cache::{self, ImageCache};
    use warmpath_controller::crd::inference_endpoint::{self, InferenceEndpoint};
    use warmpath_controller::crd::model_cache::{self, ModelCache};
    let meta = |name: &str, finalizers: &[&str], deleting: bool| {
        let mut m = json!({"name": name, "namespace": NS, "finalizers": finalizers});
        if deleting {
            m["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        m
    };
    let endpoint = json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "InferenceEndpoint", "metadata": meta("qwen", &[inference_endpoint::FINALIZER], false),
        "spec": {"model": {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct"}}, "image": "vllm/vllm-openai:v0.11.0", "port": 8000}});
    let cache = json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "ModelCache", "metadata": meta("qwen-weights", &[model_cache::FINALIZER, "example.com/keep"], true),
        "spec": {"source": {"huggingFace": {"repo": "Qwen/Qwen2.5-0.5B-Instruct"}}}});
    let image = json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "ImageCache", "metadata": meta("vllm", &[image_cache::FINALIZER], true), "spec": {"image": "vllm/vllm-openai:v0.11.0"}});
    let client = kube_fake_client::ClientBuilder::new()
        .with_resource::<InferenceRoutingPolicy>()
        .with_resource::<HttpRoute>()
        .with_resource::<InferenceEndpoint>()
        .with_resource::<ModelCache>()
        .with_resource::<ImageCache>()
        .with_runtime_objects(vec![endpoint, cache, image])
        .build()
        .await
        .expect("fake client");
    let ctx = fixtures::context(client.clone());
    let report = remove_all(&ctx).await.unwrap();
    assert_eq!(report.cache_objects_released, 3, "{report:?}");
    let ie = Api::<InferenceEndpoint>::namespaced(client.clone(), NS).get("qwen").await.unwrap();
    assert!(ie.finalizers().is_empty(), "the endpoint stays, released: {:?}", ie.finalizers());
    let mc = Api::<ModelCache>::namespaced(client.clone(), NS).get("qwen-weights").await.unwrap();
    assert_eq!(mc.finalizers(), ["example.com/keep"], "another controller's finalizer stays");
    assert!(
        Api::<ImageCache>::namespaced(client.clone(), NS).get_opt("vllm").await.unwrap().is_none(),
        "a deletion held only by warmpath completes"
    );
    assert_eq!(remove_all(&ctx).await.unwrap(), Report::default(), "a second run finds nothing to do");
}
