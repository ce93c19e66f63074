//! Cache-warming reconcilers (InferenceEndpoint, ModelCache, ImageCache) against the in-memory API
//! client `kube-fake-client`. Each test drives reconciles the way the controller's watch loop would
//! (re-reading the object before each pass) and plays the node agent by writing exactly what the
//! agent writes on its Node (the contract in `crd::model_cache`). No API server, scheduler, kubelet or
//! garbage collector runs here: Deployment/DaemonSet status is written by the test where the real
//! controllers would.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use kube_fake_client::ClientBuilder;
use serde_json::json;
use warmpath_controller::crd::image_cache::{image_ready_label, ImageCache, PREPULL_POD_LABEL};
use warmpath_controller::crd::inference_endpoint::{
    phase as ie_phase, InferenceEndpoint, InferenceEndpointSpec, ModelCacheConfig, MODEL_CACHE_ANNOTATION,
};
use warmpath_controller::crd::model_cache::{
    cache_ready_label, phase as mc_phase, report_key, ModelCache, ModelSource, NodeCacheReport, S3Source,
    NODE_CACHE_STATES,
};
use warmpath_controller::crd::routing_policy::InferenceRoutingPolicy;
use warmpath_controller::reconcile::{Context, ControllerConfig};
use warmpath_controller::warming::{image_cache, inference_endpoint, model_cache};

const NS: &str = "ml";

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn client(nodes: Vec<Node>) -> Client {
    ClientBuilder::new()
        .with_resource::<InferenceEndpoint>()
        .with_resource::<ModelCache>()
        .with_resource::<ImageCache>()
        .with_resource::<InferenceRoutingPolicy>()
        .with_status_subresource::<InferenceEndpoint>()
        .with_status_subresource::<ModelCache>()
        .with_status_subresource::<ImageCache>()
        .with_status_subresource::<Deployment>()
        .with_status_subresource::<DaemonSet>()
        .with_objects(nodes)
        .build()
        .await
        .unwrap()
}

fn ctx(client: &Client) -> Arc<Context> {
    Arc::new(Context::new(client.clone(), ControllerConfig::default()))
}

fn s3(prefix: &str) -> ModelSource {
    ModelSource {
        s3: Some(S3Source { bucket: "models".into(), prefix: prefix.into(), region: None, endpoint: None }),
        ..Default::default()
    }
}

fn endpoint(name: &str, prefix: &str, image: &str) -> InferenceEndpoint {
    let mut cfg = ModelCacheConfig::default();
    cfg.weights_cache.enabled = true;
    cfg.image_cache.enabled = true;
    let mut ie = InferenceEndpoint::new(
        name,
        InferenceEndpointSpec {
            model: s3(prefix),
            sha256: BTreeMap::new(),
            image: image.into(),
            image_pull_secrets: vec![],
            args: vec!["--model".into(), "$(WARMPATH_MODEL_DIR)".into()],
            replicas: 2,
            resources: None,
            port: 8000,
            node_selector: BTreeMap::from([("pool".to_string(), "gpu".to_string())]),
            routing: Some(serde_json::from_value(json!({"httpRoutes": ["chat"], "strategy": "PREFIX_AWARE"})).unwrap()),
            model_cache_config: cfg,
            ..Default::default()
        },
    );
    ie.metadata.namespace = Some(NS.into());
    ie
}

/// Reconciles `name` `passes` times, re-reading it each time like a watch event would deliver it.
async fn reconcile_ie(ctx: &Arc<Context>, name: &str, passes: usize) {
    let api: Api<InferenceEndpoint> = Api::namespaced(ctx.client.clone(), NS);
    for _ in 0..passes {
        let ie = api.get(name).await.unwrap();
        inference_endpoint::reconcile(Arc::new(ie), ctx.clone()).await.unwrap();
    }
}

async fn reconcile_mc(ctx: &Arc<Context>, name: &str) -> ModelCache {
    let api: Api<ModelCache> = Api::namespaced(ctx.client.clone(), NS);
    for _ in 0..2 {
        let mc = api.get(name).await.unwrap();
        model_cache::reconcile(Arc::new(mc), ctx.clone()).await.unwrap();
    }
    api.get(name).await.unwrap()
}

async fn reconcile_ic(ctx: &Arc<Context>, name: &str) -> Option<ImageCache> {
    let api: Api<ImageCache> = Api::namespaced(ctx.client.clone(), NS);
    for _ in 0..2 {
        let ic = api.get_opt(name).await.unwrap()?;
        image_cache::reconcile(Arc::new(ic), ctx.clone()).await.unwrap();
    }
    api.get_opt(name).await.unwrap()
}

/// What the agent on `node` writes when `cache` reaches `state` there.
async fn agent_reports(client: &Client, node: &str, cache: &str, state: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.unwrap();
    let mut reports: BTreeMap<String, NodeCacheReport> =
        n.annotations().get(NODE_CACHE_STATES).map(|a| serde_json::from_str(a).unwrap()).unwrap_or_default();
    let mut r = NodeCacheReport { state: state.into(), bytes_total: 100, ..Default::default() };
    if state == mc_phase::FAILED {
        r.reason = Some("ChecksumMismatch".into());
        r.message = Some("sha256 mismatch for w.bin".into());
    }
    reports.insert(report_key(NS, cache), r);
    let label = if state == mc_phase::READY { json!("true") } else { serde_json::Value::Null };
    let patch = json!({"metadata": {
        "labels": { cache_ready_label(NS, cache): label },
        "annotations": { NODE_CACHE_STATES: serde_json::to_string(&reports).unwrap() }
    }});
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
}

/// What the agent writes after removing `cache` from `node`.
async fn agent_removes(client: &Client, node: &str, cache: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.unwrap();
    let mut reports: BTreeMap<String, NodeCacheReport> =
        n.annotations().get(NODE_CACHE_STATES).map(|a| serde_json::from_str(a).unwrap()).unwrap_or_default();
    reports.remove(&report_key(NS, cache));
    let patch = json!({"metadata": {
        "labels": { cache_ready_label(NS, cache): null },
        "annotations": { NODE_CACHE_STATES: serde_json::to_string(&reports).unwrap() }
    }});
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
}

async fn ie_status(
    client: &Client,
    name: &str,
) -> warmpath_controller::crd::inference_endpoint::InferenceEndpointStatus {
    Api::<InferenceEndpoint>::namespaced(client.clone(), NS).get(name).await.unwrap().status.unwrap()
}

/// Marks the Deployment rolled out, as the Deployment controller would once new pods are available.
async fn deployment_rolled_out(client: &Client, name: &str) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = api.get(name).await.unwrap();
    // Left out by the controller under an autoscaler: the API server defaults it to 1.
    let replicas = d.spec.as_ref().unwrap().replicas.unwrap_or(1);
    let status = json!({"status": {"observedGeneration": d.metadata.generation, "replicas": replicas,
        "updatedReplicas": replicas, "availableReplicas": replicas, "readyReplicas": replicas}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

fn gpu_nodes() -> Vec<Node> {
    vec![node("gpu-a", &[("pool", "gpu")]), node("gpu-b", &[("pool", "gpu")]), node("cpu-a", &[("pool", "cpu")])]
}

async fn make_ready(c: &Client, ctx: &Arc<Context>, cache: &str) {
    for n in ["gpu-a", "gpu-b"] {
        agent_reports(c, n, cache, mc_phase::READY).await;
    }
    assert_eq!(reconcile_mc(ctx, cache).await.status.unwrap().phase.as_deref(), Some(mc_phase::READY));
}

#[tokio::test]
async fn weights_block_the_deployment_and_the_image_does_not() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 2).await;

    let st = ie_status(&c, "llama").await;
    assert_eq!(st.phase.as_deref(), Some(ie_phase::WAITING_FOR_WEIGHTS));
    let cache = st.model_cache.clone().unwrap();
    let mc = Api::<ModelCache>::namespaced(c.clone(), NS).get(&cache).await.unwrap();
    assert_eq!(mc.owner_references()[0].kind, "InferenceEndpoint");
    assert!(Api::<ImageCache>::namespaced(c.clone(), NS)
        .get_opt(st.image_cache.as_ref().unwrap())
        .await
        .unwrap()
        .is_some());
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    assert!(deployments.get_opt("llama").await.unwrap().is_none(), "no Deployment before the weights are ready");

    // One of two target nodes ready: still blocked. (cpu-a is not a target.)
    agent_reports(&c, "gpu-a", &cache, mc_phase::READY).await;
    agent_reports(&c, "gpu-b", &cache, mc_phase::DOWNLOADING).await;
    let mc = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!((mc.phase.as_deref(), mc.target, mc.ready), (Some(mc_phase::DOWNLOADING), 2, 1));
    reconcile_ie(&ctx, "llama", 1).await;
    assert!(deployments.get_opt("llama").await.unwrap().is_none());

    // All target nodes ready: the Deployment appears, although the image is not pulled anywhere yet.
    agent_reports(&c, "gpu-b", &cache, mc_phase::READY).await;
    assert_eq!(reconcile_mc(&ctx, &cache).await.status.unwrap().ready, 2);
    let ic = reconcile_ic(&ctx, st.image_cache.as_ref().unwrap()).await.unwrap();
    assert_ne!(ic.status.unwrap().phase.as_deref(), Some("Cached"));
    reconcile_ie(&ctx, "llama", 1).await;
    let d = deployments.get("llama").await.unwrap();
    assert_eq!(d.annotations().get(MODEL_CACHE_ANNOTATION), Some(&cache));
    assert_eq!(ie_status(&c, "llama").await.phase.as_deref(), Some(ie_phase::PROGRESSING));

    // Pods prefer (never require) cache-ready and image-ready nodes.
    let pod = d.spec.unwrap().template.spec.unwrap();
    let na = pod.affinity.unwrap().node_affinity.unwrap();
    assert!(na.required_during_scheduling_ignored_during_execution.is_none());
    let keys: Vec<String> = na
        .preferred_during_scheduling_ignored_during_execution
        .unwrap()
        .iter()
        .map(|t| t.preference.match_expressions.as_ref().unwrap()[0].key.clone())
        .collect();
    assert_eq!(keys, vec![cache_ready_label(NS, &cache), image_ready_label(NS, st.image_cache.as_ref().unwrap())]);
    // The weights are mounted from the node cache, with the cold-node fallback fetch in front.
    let hp = pod.volumes.unwrap()[0].host_path.clone().unwrap();
    assert_eq!(hp.path, format!("/opt/warmpath/models/{NS}.{cache}"));
    let init = &pod.init_containers.unwrap()[0];
    assert!(
        init.args.as_ref().unwrap().windows(2).any(|w| w[0] == "--source" && w[1] == "s3://models/llama/"),
        "{:?}",
        init.args
    );
    // Service and routing policy for the gateway.
    assert!(Api::<Service>::namespaced(c.clone(), NS).get_opt("llama").await.unwrap().is_some());
    let irp = Api::<InferenceRoutingPolicy>::namespaced(c.clone(), NS).get("llama").await.unwrap();
    assert_eq!(irp.spec.target_refs[0].name, "chat");
    assert_eq!(irp.spec.backend.unwrap().service.unwrap().name, "llama");

    deployment_rolled_out(&c, "llama").await;
    reconcile_ie(&ctx, "llama", 1).await;
    let st = ie_status(&c, "llama").await;
    assert_eq!((st.phase.as_deref(), st.ready_replicas), (Some(ie_phase::READY), 2));
}

#[tokio::test]
async fn failed_node_fails_the_cache_with_the_agent_reason() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    agent_reports(&c, "gpu-a", &cache, mc_phase::READY).await;
    agent_reports(&c, "gpu-b", &cache, mc_phase::FAILED).await;
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!((st.phase.as_deref(), st.failed, st.ready), (Some(mc_phase::FAILED), 1, 1));
    let failed = st.nodes.iter().find(|n| n.node == "gpu-b").unwrap();
    assert_eq!(failed.reason.as_deref(), Some("ChecksumMismatch"));
    assert_eq!(st.conditions[0].reason, "ChecksumMismatch");
    reconcile_ie(&ctx, "llama", 1).await;
    assert_eq!(ie_status(&c, "llama").await.phase.as_deref(), Some(ie_phase::FAILED));
    assert!(Api::<Deployment>::namespaced(c.clone(), NS).get_opt("llama").await.unwrap().is_none());
}

#[tokio::test]
async fn node_addition_and_loss_are_reconciled() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    make_ready(&c, &ctx, &cache).await;

    let nodes: Api<Node> = Api::all(c.clone());
    nodes.create(&PostParams::default(), &node("gpu-c", &[("pool", "gpu")])).await.unwrap();
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!((st.phase.as_deref(), st.target, st.ready), (Some(mc_phase::PENDING), 3, 2));
    assert_eq!(st.nodes.iter().find(|n| n.node == "gpu-c").unwrap().state, mc_phase::PENDING);

    // gpu-c's kubelet stops reporting: the node is lost and no longer a target.
    let lost = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
    nodes.patch_status("gpu-c", &PatchParams::default(), &Patch::Merge(lost)).await.unwrap();
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!((st.phase.as_deref(), st.target, st.ready), (Some(mc_phase::READY), 2, 2));
}

#[tokio::test]
async fn image_cache_is_shared_and_reference_counted() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let ies: Api<InferenceEndpoint> = Api::namespaced(c.clone(), NS);
    ies.create(&PostParams::default(), &endpoint("a", "a/", "vllm:1")).await.unwrap();
    ies.create(&PostParams::default(), &endpoint("b", "b/", "vllm:1")).await.unwrap();
    reconcile_ie(&ctx, "a", 2).await;
    reconcile_ie(&ctx, "b", 2).await;
    let ics: Api<ImageCache> = Api::namespaced(c.clone(), NS);
    let all = ics.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "one ImageCache per image, shared");
    let name = all[0].name_any();
    assert_eq!(reconcile_ic(&ctx, &name).await.unwrap().status.unwrap().references, 2);

    // The pre-pull DaemonSet runs the image as an init container; a pulled node gets the label.
    let ds = Api::<DaemonSet>::namespaced(c.clone(), NS).get(&image_cache::daemonset_name(&name)).await.unwrap();
    let pod_spec = ds.spec.unwrap().template.spec.unwrap();
    let pull = &pod_spec.init_containers.as_ref().unwrap()[0];
    assert_eq!((pull.image.as_deref(), pull.image_pull_policy.as_deref()), (Some("vllm:1"), Some("IfNotPresent")));
    assert_eq!(pod_spec.node_selector.unwrap().get("pool").map(String::as_str), Some("gpu"));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "pp-1", "namespace": NS, "labels": {PREPULL_POD_LABEL: name}},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": "hold", "image": "pause"}]},
        "status": {"initContainerStatuses": [{"name": "pull", "image": "vllm:1", "imageID": "sha256:abc", "ready": false, "restartCount": 0}]}
    })).unwrap();
    Api::<Pod>::namespaced(c.clone(), NS).create(&PostParams::default(), &pod).await.unwrap();
    let st = reconcile_ic(&ctx, &name).await.unwrap().status.unwrap();
    assert_eq!(st.cached, 1);
    let a = Api::<Node>::all(c.clone()).get("gpu-a").await.unwrap();
    assert_eq!(a.labels().get(&image_ready_label(NS, &name)).map(String::as_str), Some("true"));

    // Endpoint a goes away: the image stays for b.
    let mut a_ie = ies.get("a").await.unwrap();
    a_ie.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    inference_endpoint::reconcile(Arc::new(a_ie), ctx.clone()).await.unwrap();
    assert_eq!(reconcile_ic(&ctx, &name).await.unwrap().status.unwrap().references, 1);
    // Endpoint b goes away: no reference left, the ImageCache is deleted.
    let mut b_ie = ies.get("b").await.unwrap();
    b_ie.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    inference_endpoint::reconcile(Arc::new(b_ie), ctx.clone()).await.unwrap();
    assert!(ics.get_opt(&name).await.unwrap().is_none(), "unreferenced ImageCache removed");
}

#[tokio::test]
async fn image_cache_cleanup_removes_daemonset_and_node_labels() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let ics: Api<ImageCache> = Api::namespaced(c.clone(), NS);
    let mut ic: ImageCache =
        serde_json::from_value(json!({"apiVersion": "warmpath.dev/v1alpha1", "kind": "ImageCache",
        "metadata": {"name": "sglang", "namespace": NS}, "spec": {"image": "sglang:0.5"}}))
        .unwrap();
    ics.create(&PostParams::default(), &ic).await.unwrap();
    reconcile_ic(&ctx, "sglang").await.expect("user-created cache without references is kept");
    let label = image_ready_label(NS, "sglang");
    Api::<Node>::all(c.clone())
        .patch("gpu-a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {&label: "true"}}})))
        .await
        .unwrap();
    ic = ics.get("sglang").await.unwrap();
    assert!(ic.finalizers().contains(&"warmpath.dev/image-cache-cleanup".to_string()));
    ic.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    image_cache::reconcile(Arc::new(ic), ctx.clone()).await.unwrap();
    assert!(Api::<DaemonSet>::namespaced(c.clone(), NS).get_opt("sglang-prepull").await.unwrap().is_none());
    assert!(!Api::<Node>::all(c.clone()).get("gpu-a").await.unwrap().labels().contains_key(&label));
    assert!(ics.get("sglang").await.unwrap().finalizers().is_empty(), "finalizer released after cleanup");
}

#[tokio::test]
async fn source_change_rolls_out_before_the_old_cache_goes() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let ies: Api<InferenceEndpoint> = Api::namespaced(c.clone(), NS);
    ies.create(&PostParams::default(), &endpoint("llama", "llama-v1/", "vllm:1")).await.unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let old = ie_status(&c, "llama").await.model_cache.unwrap();
    make_ready(&c, &ctx, &old).await;
    reconcile_ie(&ctx, "llama", 1).await;
    deployment_rolled_out(&c, "llama").await;
    reconcile_ie(&ctx, "llama", 1).await;
    assert_eq!(ie_status(&c, "llama").await.phase.as_deref(), Some(ie_phase::READY));

    // New weights and a new image.
    let mut ie = ies.get("llama").await.unwrap();
    ie.spec.model = s3("llama-v2/");
    ie.spec.image = "vllm:2".into();
    ies.replace("llama", &PostParams::default(), &ie).await.unwrap();
    reconcile_ie(&ctx, "llama", 1).await;
    let st = ie_status(&c, "llama").await;
    let new = st.model_cache.clone().unwrap();
    assert_ne!(new, old);
    assert_eq!(st.serving_model_cache.as_deref(), Some(old.as_str()), "old cache keeps serving");
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    assert!(caches.get_opt(&old).await.unwrap().is_some());
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    assert_eq!(deployments.get("llama").await.unwrap().annotations().get(MODEL_CACHE_ANNOTATION), Some(&old));

    // New cache ready: the Deployment switches cache, but keeps the old image until the new one is
    // pulled on every target node; the old cache stays until the rollout completes.
    make_ready(&c, &ctx, &new).await;
    reconcile_ie(&ctx, "llama", 1).await;
    let d = deployments.get("llama").await.unwrap();
    assert_eq!(d.annotations().get(MODEL_CACHE_ANNOTATION), Some(&new));
    assert_eq!(server_image(&d), "vllm:1", "the new image is not pulled yet");
    assert_eq!(ie_status(&c, "llama").await.serving_image.as_deref(), Some("vllm:1"));
    image_pulled_everywhere(&c, "vllm:2").await;
    reconcile_ie(&ctx, "llama", 1).await;
    let d = deployments.get("llama").await.unwrap();
    assert_eq!(server_image(&d), "vllm:2");
    let strategy = d.spec.unwrap().strategy.unwrap().rolling_update.unwrap();
    assert_eq!(strategy.max_unavailable, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)));
    assert!(caches.get_opt(&old).await.unwrap().is_some(), "old cache kept during the rollout");
    let images = Api::<ImageCache>::namespaced(c.clone(), NS).list(&ListParams::default()).await.unwrap().items;
    assert_eq!(images.len(), 2, "old image still referenced during the rollout");

    deployment_rolled_out(&c, "llama").await;
    reconcile_ie(&ctx, "llama", 1).await;
    assert!(caches.get_opt(&old).await.unwrap().is_none(), "old cache deleted after the rollout");
    let images = Api::<ImageCache>::namespaced(c.clone(), NS).list(&ListParams::default()).await.unwrap().items;
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].spec.image, "vllm:2");
    assert_eq!(ie_status(&c, "llama").await.phase.as_deref(), Some(ie_phase::READY));
}

#[tokio::test]
async fn model_cache_finalizer_waits_for_nodes_to_drop_the_cache() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    make_ready(&c, &ctx, &cache).await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    assert_eq!(caches.get(&cache).await.unwrap().finalizers(), ["warmpath.dev/model-cache-cleanup"]);
    // What the watch delivers after `kubectl delete`: the object with deletionTimestamp set.
    let deleting = || async {
        let mut mc = caches.get(&cache).await.unwrap();
        mc.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        Arc::new(mc)
    };

    let err = model_cache::reconcile(deleting().await, ctx.clone()).await.unwrap_err();
    assert!(err.to_string().contains("gpu-a") && err.to_string().contains("gpu-b"), "{err}");
    let now = caches.get(&cache).await.unwrap();
    assert_eq!(now.finalizers().len(), 1, "finalizer kept while nodes hold the cache");
    assert_eq!(now.status.unwrap().phase.as_deref(), Some(mc_phase::DELETING));

    agent_removes(&c, "gpu-a", &cache).await;
    assert!(model_cache::reconcile(deleting().await, ctx.clone()).await.is_err());
    agent_removes(&c, "gpu-b", &cache).await;
    model_cache::reconcile(deleting().await, ctx.clone()).await.unwrap();
    assert!(caches.get(&cache).await.unwrap().finalizers().is_empty(), "finalizer released once no node holds it");
}

#[tokio::test]
async fn restarted_controller_creates_no_duplicates() {
    let c = client(gpu_nodes()).await;
    let first = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&first, "llama", 2).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    make_ready(&c, &first, &cache).await;
    reconcile_ie(&first, "llama", 1).await;

    async fn counts(c: &Client) -> (usize, usize, usize, usize, usize, Vec<usize>) {
        let lp = ListParams::default();
        let ics = Api::<ImageCache>::namespaced(c.clone(), NS).list(&lp).await.unwrap().items;
        (
            Api::<ModelCache>::namespaced(c.clone(), NS).list(&lp).await.unwrap().items.len(),
            ics.len(),
            Api::<Deployment>::namespaced(c.clone(), NS).list(&lp).await.unwrap().items.len(),
            Api::<Service>::namespaced(c.clone(), NS).list(&lp).await.unwrap().items.len(),
            Api::<InferenceRoutingPolicy>::namespaced(c.clone(), NS).list(&lp).await.unwrap().items.len(),
            ics.iter().map(|i| i.owner_references().len()).collect(),
        )
    }
    let before = counts(&c).await;
    assert_eq!(before, (1, 1, 1, 1, 1, vec![1]));
    // A new controller process: fresh context and metrics, same API state.
    let second = ctx(&c);
    reconcile_ie(&second, "llama", 3).await;
    reconcile_mc(&second, &cache).await;
    let ie = Api::<InferenceEndpoint>::namespaced(c.clone(), NS).get("llama").await.unwrap();
    assert_eq!(ie.finalizers().len(), 1, "finalizer not added twice");
    assert_eq!(counts(&c).await, before);
    let d = Api::<Deployment>::namespaced(c.clone(), NS).get("llama").await.unwrap();
    assert_eq!(d.owner_references().len(), 1);
    assert_eq!(d.owner_references()[0].uid, ie.meta().uid.clone().unwrap());
}

fn server_image(d: &Deployment) -> String {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].image.clone().unwrap()
}

/// What the ImageCache reconciler writes once the kubelets of both target nodes have pulled `image`.
async fn image_pulled_everywhere(c: &Client, image: &str) {
    let api = Api::<ImageCache>::namespaced(c.clone(), NS);
    let name = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|i| i.spec.image == image)
        .unwrap()
        .name_any();
    let st = json!({"status": {"phase": "Cached", "target": 2, "cached": 2, "references": 1}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(st)).await.unwrap();
}

/// Creates `ie`, makes its weights ready on both GPU nodes and completes the first rollout.
async fn serving(c: &Client, ctx: &Arc<Context>, ie: InferenceEndpoint) -> String {
    let name = ie.name_any();
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS).create(&PostParams::default(), &ie).await.unwrap();
    reconcile_ie(ctx, &name, 2).await;
    let cache = ie_status(c, &name).await.model_cache.unwrap();
    make_ready(c, ctx, &cache).await;
    reconcile_ie(ctx, &name, 1).await;
    deployment_rolled_out(c, &name).await;
    reconcile_ie(ctx, &name, 1).await;
    assert_eq!(ie_status(c, &name).await.phase.as_deref(), Some(ie_phase::READY));
    cache
}

#[tokio::test]
async fn pods_get_readiness_tolerations_and_source_credentials() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let mut ie = endpoint("llama", "llama/", "vllm:1");
    ie.spec.service_account_name = Some("model-reader".into());
    ie.spec.env = vec![serde_json::from_value(json!({"name": "AWS_REGION", "value": "eu-west-1"})).unwrap()];
    ie.spec.env_from = vec![serde_json::from_value(json!({"secretRef": {"name": "s3-creds"}})).unwrap()];
    ie.spec.tolerations =
        vec![serde_json::from_value(json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}))
            .unwrap()];
    serving(&c, &ctx, ie).await;
    let d = Api::<Deployment>::namespaced(c.clone(), NS).get("llama").await.unwrap();
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("model-reader"));
    assert_eq!(pod.tolerations.unwrap()[0].key.as_deref(), Some("nvidia.com/gpu"));
    let server = &pod.containers[0];
    let probe = server.readiness_probe.as_ref().expect("a readiness probe by default");
    let get = probe.http_get.as_ref().unwrap();
    assert_eq!(
        (get.path.as_deref(), &get.port),
        (Some("/health"), &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into()))
    );
    let init = &pod.init_containers.unwrap()[0];
    for (what, ctr) in [("server", server), ("fallback fetch", init)] {
        assert!(ctr.env.as_ref().unwrap().iter().any(|e| e.name == "AWS_REGION"), "{what}: env");
        assert_eq!(ctr.env_from.as_ref().unwrap()[0].secret_ref.as_ref().unwrap().name, "s3-creds", "{what}: envFrom");
    }

    // A configured probe replaces the default.
    let ies: Api<InferenceEndpoint> = Api::namespaced(c.clone(), NS);
    let mut ie = ies.get("llama").await.unwrap();
    ie.spec.readiness_probe = Some(
        serde_json::from_value(json!({"httpGet": {"path": "/v1/models", "port": 8000}, "periodSeconds": 10})).unwrap(),
    );
    ies.replace("llama", &PostParams::default(), &ie).await.unwrap();
    reconcile_ie(&ctx, "llama", 1).await;
    let d = Api::<Deployment>::namespaced(c.clone(), NS).get("llama").await.unwrap();
    let probe = d.spec.unwrap().template.spec.unwrap().containers[0].readiness_probe.clone().unwrap();
    assert_eq!((probe.http_get.unwrap().path.as_deref(), probe.period_seconds), (Some("/v1/models"), Some(10)));
}

#[tokio::test]
async fn an_autoscaler_owns_replicas_when_configured() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let mut ie = endpoint("llama", "llama/", "vllm:1");
    ie.spec.autoscaling = Some(serde_json::from_value(json!({"enabled": true})).unwrap());
    serving(&c, &ctx, ie).await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    assert_eq!(
        deployments.get("llama").await.unwrap().spec.unwrap().replicas,
        None,
        "replicas not applied by the controller"
    );
    // The HPA scales out (through the scale subresource in a cluster; a patch by another manager here).
    let hpa = PatchParams { field_manager: Some("horizontal-pod-autoscaler".into()), ..Default::default() };
    deployments.patch("llama", &hpa, &Patch::Merge(json!({"spec": {"replicas": 5}}))).await.unwrap();
    // An endpoint change re-applies the Deployment: the autoscaler's replicas stay.
    let ies: Api<InferenceEndpoint> = Api::namespaced(c.clone(), NS);
    let mut e = ies.get("llama").await.unwrap();
    e.spec.args.push("--enable-prefix-caching".into());
    ies.replace("llama", &PostParams::default(), &e).await.unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let d = deployments.get("llama").await.unwrap();
    assert!(d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
        .args
        .as_ref()
        .unwrap()
        .contains(&"--enable-prefix-caching".to_string()));
    assert_eq!(d.spec.unwrap().replicas, Some(5), "the autoscaler's replicas are kept");
}

#[tokio::test]
async fn scale_from_zero_creates_the_deployment_and_warms_nodes_as_they_join() {
    // No GPU node yet: a cluster autoscaler adds one only for a pending pod.
    let c = client(vec![node("cpu-a", &[("pool", "cpu")])]).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 1).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!((st.phase.as_deref(), st.target), (Some(mc_phase::PENDING), 0));
    reconcile_ie(&ctx, "llama", 1).await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    let d = deployments.get_opt("llama").await.unwrap().expect("Deployment created with no target node");
    assert_eq!(d.annotations().get(MODEL_CACHE_ANNOTATION), Some(&cache));
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert!(
        pod.affinity.unwrap().node_affinity.unwrap().required_during_scheduling_ignored_during_execution.is_none(),
        "preferred only"
    );
    assert_eq!(pod.init_containers.unwrap()[0].name, "weights", "cold-node fallback fetch in front");
    assert_eq!(ie_status(&c, "llama").await.phase.as_deref(), Some(ie_phase::PROGRESSING));

    // The autoscaler adds a GPU node: it becomes a target (its agent starts downloading), the
    // Deployment stays, and the endpoint serves once its pod is available, degraded until the node is warm.
    Api::<Node>::all(c.clone()).create(&PostParams::default(), &node("gpu-a", &[("pool", "gpu")])).await.unwrap();
    agent_reports(&c, "gpu-a", &cache, mc_phase::DOWNLOADING).await;
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!((st.phase.as_deref(), st.target), (Some(mc_phase::DOWNLOADING), 1));
    deployment_rolled_out(&c, "llama").await;
    reconcile_ie(&ctx, "llama", 1).await;
    assert!(deployments.get_opt("llama").await.unwrap().is_some());
    let st = ie_status(&c, "llama").await;
    assert_eq!((st.phase.as_deref(), st.degraded_nodes), (Some(ie_phase::READY), 1));
    agent_reports(&c, "gpu-a", &cache, mc_phase::READY).await;
    reconcile_mc(&ctx, &cache).await;
    reconcile_ie(&ctx, "llama", 1).await;
    assert_eq!(ie_status(&c, "llama").await.degraded_nodes, 0);
}

#[tokio::test]
async fn a_serving_endpoint_stays_serving_when_a_node_joins_or_fails() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let cache = serving(&c, &ctx, endpoint("llama", "llama/", "vllm:1")).await;
    Api::<Node>::all(c.clone()).create(&PostParams::default(), &node("gpu-c", &[("pool", "gpu")])).await.unwrap();
    agent_reports(&c, "gpu-c", &cache, mc_phase::DOWNLOADING).await;
    reconcile_mc(&ctx, &cache).await;
    reconcile_ie(&ctx, "llama", 1).await;
    let st = ie_status(&c, "llama").await;
    assert_eq!(
        (st.phase.as_deref(), st.degraded_nodes),
        (Some(ie_phase::READY), 1),
        "a joining node does not stop serving"
    );
    assert_eq!(st.conditions[0].reason, "Degraded");
    agent_reports(&c, "gpu-c", &cache, mc_phase::FAILED).await;
    assert_eq!(reconcile_mc(&ctx, &cache).await.status.unwrap().phase.as_deref(), Some(mc_phase::FAILED));
    reconcile_ie(&ctx, "llama", 1).await;
    let st = ie_status(&c, "llama").await;
    assert_eq!(
        (st.phase.as_deref(), st.degraded_nodes),
        (Some(ie_phase::READY), 1),
        "one failed node does not fail the endpoint"
    );
    assert!(
        st.conditions[0].message.contains("1 target nodes do not hold the weights"),
        "{}",
        st.conditions[0].message
    );
}

#[tokio::test]
async fn an_image_change_waits_for_its_image_cache() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    serving(&c, &ctx, endpoint("llama", "llama/", "vllm:1")).await;
    let ies: Api<InferenceEndpoint> = Api::namespaced(c.clone(), NS);
    let mut ie = ies.get("llama").await.unwrap();
    ie.spec.image = "vllm:2".into();
    ies.replace("llama", &PostParams::default(), &ie).await.unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    assert_eq!(
        server_image(&deployments.get("llama").await.unwrap()),
        "vllm:1",
        "old image until the new one is pulled"
    );
    let st = ie_status(&c, "llama").await;
    assert_eq!(
        (st.phase.as_deref(), st.conditions[0].reason.as_str()),
        (Some(ie_phase::PROGRESSING), "WaitingForImage")
    );
    image_pulled_everywhere(&c, "vllm:2").await;
    reconcile_ie(&ctx, "llama", 1).await;
    assert_eq!(server_image(&deployments.get("llama").await.unwrap()), "vllm:2");
    deployment_rolled_out(&c, "llama").await;
    reconcile_ie(&ctx, "llama", 1).await;
    let images = Api::<ImageCache>::namespaced(c.clone(), NS).list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        images.iter().map(|i| i.spec.image.as_str()).collect::<Vec<_>>(),
        ["vllm:2"],
        "old image released after the rollout"
    );
}

/// The CRD schema carries the sha256 pattern on every map value (a JSON-schema validator refusing a
/// non-hex value against the committed CRD runs in `scripts/test.d/65-cache-controller.sh`).
#[test]
fn crd_schema_requires_hex_sha256_values() {
    for crd in [<ModelCache as kube::CustomResourceExt>::crd(), <InferenceEndpoint as kube::CustomResourceExt>::crd()] {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema).unwrap();
        let sha = &schema["properties"]["spec"]["properties"]["sha256"];
        assert_eq!(
            sha["additionalProperties"]["pattern"],
            warmpath_controller::crd::model_cache::SHA256_PATTERN,
            "{sha}"
        );
    }
}

#[tokio::test]
async fn endpoints_on_different_nodes_get_their_own_image_cache() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    let ies: Api<InferenceEndpoint> = Api::namespaced(c.clone(), NS);
    ies.create(&PostParams::default(), &endpoint("gpu", "a/", "vllm:1")).await.unwrap();
    let mut on_cpu = endpoint("cpu", "b/", "vllm:1");
    on_cpu.spec.node_selector = BTreeMap::from([("pool".to_string(), "cpu".to_string())]);
    ies.create(&PostParams::default(), &on_cpu).await.unwrap();
    let mut same = endpoint("gpu2", "c/", "vllm:1");
    same.spec.args.push("--other".into());
    ies.create(&PostParams::default(), &same).await.unwrap();
    for n in ["gpu", "cpu", "gpu2"] {
        reconcile_ie(&ctx, n, 2).await;
    }
    let (gpu, cpu, gpu2) = (
        ie_status(&c, "gpu").await.image_cache.unwrap(),
        ie_status(&c, "cpu").await.image_cache.unwrap(),
        ie_status(&c, "gpu2").await.image_cache.unwrap(),
    );
    assert_eq!(gpu, gpu2, "same image on the same nodes: shared");
    assert_ne!(gpu, cpu, "same image on other nodes: its own cache");
    for (ic, pool) in [(&gpu, "gpu"), (&cpu, "cpu")] {
        reconcile_ic(&ctx, ic).await;
        let ds = Api::<DaemonSet>::namespaced(c.clone(), NS).get(&image_cache::daemonset_name(ic)).await.unwrap();
        let sel = ds.spec.unwrap().template.spec.unwrap().node_selector.unwrap();
        assert_eq!(sel.get("pool").map(String::as_str), Some(pool), "{ic} pre-pulls on the {pool} nodes");
    }
}

/// What the agent on `node` writes once it verified `version` of `cache`.
async fn agent_verified(client: &Client, node: &str, cache: &str, version: &str) {
    agent_reports(client, node, cache, mc_phase::READY).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.unwrap();
    let mut reports: BTreeMap<String, NodeCacheReport> =
        serde_json::from_str(&n.annotations()[NODE_CACHE_STATES]).unwrap();
    reports.get_mut(&report_key(NS, cache)).unwrap().version = Some(version.into());
    let patch = json!({"metadata": {"annotations": { NODE_CACHE_STATES: serde_json::to_string(&reports).unwrap() }}});
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
}

fn fetch_args(d: &Deployment) -> Vec<String> {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0].args.clone().unwrap()
}

/// The first version a node verified is recorded as the cache's pin and never moves; a node that
/// verified other bytes (the object changed between two downloads) does not count as holding the
/// cache; the pods' fallback fetch gets the pin (`--pin`), so a pod on a cold node fetches exactly it.
#[tokio::test]
async fn the_first_verified_version_is_pinned_and_reaches_the_pods() {
    let c = client(gpu_nodes()).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 2).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    assert!(reconcile_mc(&ctx, &cache).await.status.unwrap().pinned.is_none(), "nothing verified yet");

    agent_verified(&c, "gpu-b", &cache, "1111111111111111").await;
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    let pin = st.pinned.clone().expect("pinned once one node verified a version");
    assert_eq!((pin.version.as_str(), pin.node.as_str()), ("1111111111111111", "gpu-b"));

    // gpu-a verified other bytes: not a holder of this cache, and the cache says why.
    agent_verified(&c, "gpu-a", &cache, "2222222222222222").await;
    let st = reconcile_mc(&ctx, &cache).await.status.unwrap();
    assert_eq!(st.pinned.as_ref().unwrap().version, "1111111111111111", "the pin never moves");
    assert_eq!((st.ready, st.phase.as_deref()), (1, Some(mc_phase::FAILED)));
    let a = st.nodes.iter().find(|n| n.node == "gpu-a").unwrap();
    assert_eq!(a.reason.as_deref(), Some("SourceChanged"));
    assert!(a.message.as_deref().unwrap().contains("pinned to version 1111111111111111"), "{a:?}");
    reconcile_ie(&ctx, "llama", 1).await;
    assert!(
        Api::<Deployment>::namespaced(c.clone(), NS).get_opt("llama").await.unwrap().is_none(),
        "not every node holds the pin"
    );

    // gpu-a's agent replaces its copy with the pinned version: Ready, and the pods fetch exactly the pin.
    agent_verified(&c, "gpu-a", &cache, "1111111111111111").await;
    assert_eq!(reconcile_mc(&ctx, &cache).await.status.unwrap().phase.as_deref(), Some(mc_phase::READY));
    reconcile_ie(&ctx, "llama", 1).await;
    let d = Api::<Deployment>::namespaced(c.clone(), NS).get("llama").await.unwrap();
    let args = fetch_args(&d);
    let at = args.iter().position(|a| a == "--pin").expect("--pin in the fallback fetch");
    assert_eq!(args[at + 1], "1111111111111111");
}

/// Scale from zero: the Deployment exists before any node verified a version; once one has, the pods'
/// fallback fetch is pinned too (new pods on cold nodes fetch what the first node holds).
#[tokio::test]
async fn scale_from_zero_pins_the_pods_once_the_first_node_verified() {
    let c = client(vec![node("cpu-a", &[("pool", "cpu")])]).await;
    let ctx = ctx(&c);
    Api::<InferenceEndpoint>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &endpoint("llama", "llama/", "vllm:1"))
        .await
        .unwrap();
    reconcile_ie(&ctx, "llama", 1).await;
    let cache = ie_status(&c, "llama").await.model_cache.unwrap();
    reconcile_mc(&ctx, &cache).await;
    reconcile_ie(&ctx, "llama", 1).await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    assert!(!fetch_args(&deployments.get("llama").await.unwrap()).contains(&"--pin".to_string()), "nothing to pin yet");
    Api::<Node>::all(c.clone()).create(&PostParams::default(), &node("gpu-a", &[("pool", "gpu")])).await.unwrap();
    agent_verified(&c, "gpu-a", &cache, "3333333333333333").await;
    reconcile_mc(&ctx, &cache).await;
    reconcile_ie(&ctx, "llama", 1).await;
    let args = fetch_args(&deployments.get("llama").await.unwrap());
    assert!(args.windows(2).any(|w| w[0] == "--pin" && w[1] == "3333333333333333"), "{args:?}");
}
