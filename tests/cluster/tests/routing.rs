//! Reconciler tests against the in-memory API client: creation, strategy switch, restart without
//! duplicates, deletion removing exactly what was created, conflicts, bad input, annotations.

use std::sync::Arc;

use gateway_api::apis::standard::httproutes::HttpRoute;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::ResourceExt;
use serde_json::json;

use warmpath_cluster_tests::fixtures::{self, *};
use warmpath_controller::conditions;
use warmpath_controller::crd::routing_policy::InferenceRoutingPolicy;
use warmpath_controller::gateway::{route_annotations, routing_policy};
use warmpath_controller::reconcile::{Context, ControllerConfig};
use warmpath_controller::render::XdsNameScheme;
use warmpath_envoy_config::type_url;

const NS: &str = "llm";
const GW_NS: &str = "gateways";

fn base(controller: &str) -> Vec<serde_json::Value> {
    vec![
        gateway_class("eg", controller),
        gateway(GW_NS, "inference-gw", "eg"),
        service(NS, "vllm", 8000),
        endpoint_slice(NS, "vllm", 8000, &["10.0.0.1", "10.0.0.2"]),
    ]
}

async fn setup(controller: &str, route_annotations: serde_json::Value) -> (kube::Client, Context) {
    let client = fixtures::client(base(controller)).await;
    let _: HttpRoute =
        create(&client, NS, http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, route_annotations)).await;
    let ctx = fixtures::context(client.clone());
    (client, ctx)
}

async fn get_policy(client: &kube::Client, name: &str) -> Arc<InferenceRoutingPolicy> {
    Arc::new(Api::<InferenceRoutingPolicy>::namespaced(client.clone(), NS).get(name).await.unwrap())
}

/// Runs the reconciler until it settles (the first pass only adds the finalizer).
async fn reconcile_policy(client: &kube::Client, ctx: &Context, name: &str) {
    for _ in 0..2 {
        let p = get_policy(client, name).await;
        routing_policy::reconcile(p, Arc::new(ctx.clone())).await.unwrap();
    }
}

fn condition<'a>(
    p: &'a InferenceRoutingPolicy,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let st = p.status.as_ref().expect("status written");
    conditions::find(&st.ancestors[0].conditions, type_).expect("condition present")
}

/// The wasm filter's `PluginConfig` (Envoy v3 JSON) inside an Istio `EnvoyFilter` `HTTP_FILTER` patch.
fn wasm_plugin_config(o: &DynamicObject) -> serde_json::Value {
    let patches = o.data["spec"]["configPatches"].as_array().expect("an EnvoyFilter");
    let filter = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER" && p["patch"]["operation"] == "INSERT_BEFORE")
        .map(|p| &p["patch"]["value"])
        .expect("a wasm HTTP filter patch");
    assert_eq!(filter["typed_config"]["@type"], type_url::WASM);
    filter["typed_config"]["config"].clone()
}

/// The filter's plugin configuration (the JSON `warmpath_core::RawConfig` reads), from an Envoy
/// Gateway `EnvoyExtensionPolicy` (`wasm[0].config`) or an Istio `EnvoyFilter`.
fn plugin(o: &DynamicObject) -> serde_json::Value {
    if let Some(wasm) = o.data["spec"]["wasm"].as_array() {
        return wasm[0]["config"].clone();
    }
    serde_json::from_str(wasm_plugin_config(o)["configuration"]["value"].as_str().unwrap()).unwrap()
}

fn plugin_strategy(o: &DynamicObject) -> String {
    plugin(o)["strategy"].as_str().unwrap().to_string()
}

const EPP_POLICY: &str = "warmpath-feed-policy-llm-chat-routing";

#[tokio::test]
async fn envoy_gateway_create_switch_restart_delete() {
    let (client, ctx) = setup(EG_CONTROLLER, json!({})).await;
    // An unrelated, user-owned object of a kind we also write: must survive everything below.
    let foreign = json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": "users-own", "namespace": NS}, "spec": {"targetRefs": []}});
    let ar = warmpath_controller::foreign::backend_traffic_policy();
    Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ar)
        .create(&PostParams::default(), &serde_json::from_value(foreign).unwrap())
        .await
        .unwrap();
    let _: InferenceRoutingPolicy = create(
        &client,
        NS,
        policy(NS, "chat-routing", "chat", json!({"strategy": "PREFIX_AWARE", "prefixLength": 4096})),
    )
    .await;

    reconcile_policy(&client, &ctx, "chat-routing").await;
    let objs = owned_objects(&client).await;
    let want = vec![
        ("BackendTrafficPolicy".to_string(), NS.to_string(), "users-own".to_string()),
        ("BackendTrafficPolicy".to_string(), NS.to_string(), "warmpath-chat".to_string()),
        ("EnvoyExtensionPolicy".to_string(), NS.to_string(), "warmpath-chat".to_string()),
        ("EnvoyPatchPolicy".to_string(), GW_NS.to_string(), EPP_POLICY.to_string()),
    ];
    assert_eq!(objs, want);
    let eep = get_owned(&client, "EnvoyExtensionPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(plugin_strategy(&eep), "PREFIX_AWARE");
    assert_eq!(plugin(&eep)["prefix_length"], 4096);
    assert!(plugin(&eep).get("upstream_clusters").is_none(), "Envoy Gateway scopes the filter to the route itself");
    let wasm = &eep.data["spec"]["wasm"][0];
    assert_eq!(eep.data["spec"]["targetRefs"][0]["kind"], "HTTPRoute");
    assert_eq!(wasm["failOpen"], true);
    assert_eq!(wasm["name"], "warmpath/policy/llm/chat-routing", "plugin name unique per owner");
    assert_eq!(wasm["code"]["type"], "HTTP");
    assert_eq!(wasm["code"]["http"]["sha256"].as_str().unwrap().len(), 64);
    let epp = get_owned(&client, "EnvoyPatchPolicy", GW_NS, EPP_POLICY).await.unwrap();
    assert_eq!(epp.data["spec"]["jsonPatches"][0]["name"], plugin(&eep)["feed"]["cluster"], "feed cluster added");
    // First the native strip of client destination headers, at the head of every HTTP filter chain of the listener.
    let strip = &epp.data["spec"]["jsonPatches"][1];
    assert_eq!(
        (strip["name"].as_str(), strip["operation"]["jsonPath"].as_str(), strip["operation"]["path"].as_str()),
        (Some("gateways/inference-gw/http"), Some("$..http_filters"), Some("/0"))
    );
    assert_eq!(strip["operation"]["value"], warmpath_envoy_config::strip_client_destination_headers());
    let listener_patch = &epp.data["spec"]["jsonPatches"][2];
    assert_eq!(listener_patch["name"], "gateways/inference-gw/http");
    assert_eq!(
        listener_patch["operation"]["jsonPath"],
        "$..http_filters[?@.name == 'envoy.filters.http.wasm/envoyextensionpolicy/llm/warmpath-chat/wasm/0']"
    );
    assert_eq!(listener_patch["operation"]["path"], "/typed_config/config/allow_on_headers_stop_iteration");
    assert_eq!(listener_patch["operation"]["value"], true, "PREFIX_AWARE pauses in the headers callback");
    // Then, in that listener's route configuration, room for the bodies the filter holds on the routes it runs on.
    let route_patch = &epp.data["spec"]["jsonPatches"][3];
    assert_eq!(
        (route_patch["type"].as_str(), route_patch["name"].as_str()),
        (Some(type_url::ROUTE_CONFIGURATION), Some("gateways/inference-gw/http"))
    );
    assert_eq!(
        route_patch["operation"]["jsonPath"],
        "$..routes[?@.typed_per_filter_config['envoy.filters.http.wasm/envoyextensionpolicy/llm/warmpath-chat/wasm/0']]"
    );
    assert_eq!(
        (route_patch["operation"]["path"].as_str(), route_patch["operation"]["value"].as_u64()),
        (Some("/request_body_buffer_limit"), Some(warmpath_envoy_config::ROUTE_BODY_BUFFER_LIMIT_BYTES))
    );
    assert!(epp.metadata.owner_references.is_none(), "no cross-namespace owner reference");
    let btp = get_owned(&client, "BackendTrafficPolicy", NS, "warmpath-chat").await.unwrap();
    let owner_refs = btp.metadata.owner_references.clone().unwrap();
    assert_eq!((owner_refs[0].kind.as_str(), owner_refs[0].name.as_str()), ("InferenceRoutingPolicy", "chat-routing"));
    assert_eq!(
        btp.data["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"][0]["header"],
        "x-gateway-destination-endpoint"
    );

    // Programmed only once Envoy Gateway reports it (status read back), then True.
    let p = get_policy(&client, "chat-routing").await;
    assert_eq!(condition(&p, conditions::PROGRAMMED).reason, "AwaitingGatewayStatus");
    fixtures::eg_reports_programmed(&client, (GW_NS, "inference-gw")).await;
    reconcile_policy(&client, &ctx, "chat-routing").await;
    let p = get_policy(&client, "chat-routing").await;
    assert!(p.finalizers().contains(&routing_policy::FINALIZER.to_string()));
    assert_eq!(condition(&p, conditions::ACCEPTED).status, "True");
    assert_eq!(condition(&p, conditions::RESOLVED_REFS).status, "True");
    assert_eq!(condition(&p, conditions::PROGRAMMED).status, "True");
    let st = p.status.clone().unwrap();
    assert_eq!(st.ancestors[0].ancestor_ref.name, "inference-gw");
    assert_eq!(st.feed_path.as_deref(), Some("/v1/feed/policy/llm/chat-routing"));
    assert!(ctx.feed_sources.lock().unwrap().contains_key("policy/llm/chat-routing"));
    let first_transition = condition(&p, conditions::ACCEPTED).last_transition_time.clone();
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::all(client.clone()).list(&Default::default()).await.unwrap();
    assert!(
        events.items.iter().any(|e| e.reason.as_deref() == Some("Programmed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("chat-routing")),
        "a Programmed event on the policy: {:?}",
        events.items.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );

    // Strategy switch: same objects, new configuration, nothing else redeployed.
    Api::<InferenceRoutingPolicy>::namespaced(client.clone(), NS)
        .patch(
            "chat-routing",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"strategy": "LEAST_OUTSTANDING_REQUESTS", "prefixLength": null}})),
        )
        .await
        .unwrap();
    reconcile_policy(&client, &ctx, "chat-routing").await;
    assert_eq!(owned_objects(&client).await, want);
    let eep = get_owned(&client, "EnvoyExtensionPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(plugin_strategy(&eep), "LEAST_OUTSTANDING_REQUESTS");
    let p = get_policy(&client, "chat-routing").await;
    assert_eq!(
        condition(&p, conditions::ACCEPTED).last_transition_time,
        first_transition,
        "unchanged status keeps its transition time"
    );

    // Restart: a fresh controller (new context, same API state) creates no duplicates.
    let ctx2 = fixtures::context(client.clone());
    reconcile_policy(&client, &ctx2, "chat-routing").await;
    assert_eq!(owned_objects(&client).await, want);

    // Deletion: the finalizer removes exactly what was created (also across namespaces).
    let p = as_deleted((*get_policy(&client, "chat-routing").await).clone());
    routing_policy::reconcile(Arc::new(p), Arc::new(ctx2.clone())).await.unwrap();
    assert_eq!(
        owned_objects(&client).await,
        vec![("BackendTrafficPolicy".to_string(), NS.to_string(), "users-own".to_string())]
    );
    let p = get_policy(&client, "chat-routing").await;
    assert!(!p.finalizers().contains(&routing_policy::FINALIZER.to_string()), "finalizer released");
    assert!(!ctx2.feed_sources.lock().unwrap().contains_key("policy/llm/chat-routing"));
}

#[tokio::test]
async fn istio_provider_is_detected_from_the_gateway_class() {
    let (client, ctx) = setup(ISTIO_CONTROLLER, json!({})).await;
    let _: InferenceRoutingPolicy =
        create(&client, NS, policy(NS, "chat-routing", "chat", json!({"failureMode": "FailClosed"}))).await;
    reconcile_policy(&client, &ctx, "chat-routing").await;
    let objs = owned_objects(&client).await;
    assert_eq!(
        objs,
        vec![("EnvoyFilter".to_string(), GW_NS.to_string(), "warmpath-policy-llm-chat-routing".to_string())]
    );
    let ef = get_owned(&client, "EnvoyFilter", GW_NS, "warmpath-policy-llm-chat-routing").await.unwrap();
    assert_eq!(ef.data["spec"]["targetRefs"][0]["kind"], "Gateway");
    let wasm = wasm_plugin_config(&ef);
    assert_eq!(wasm["failure_policy"], "FAIL_CLOSED");
    assert_eq!(wasm["allow_on_headers_stop_iteration"], true);
    assert_eq!(wasm["name"], "warmpath/policy/llm/chat-routing", "plugin name unique per owner");
    assert_eq!(
        plugin(&ef)["upstream_clusters"],
        json!(["outbound|8000||vllm.llm.svc.cluster.local"]),
        "acts only on its backend's requests"
    );
    let feed_cluster = "outbound|8080||warmpath-controller.warmpath-system.svc.cluster.local";
    assert_eq!(plugin(&ef)["feed"]["cluster"], feed_cluster);
    assert_eq!(wasm["vm_config"]["code"]["remote"]["http_uri"]["cluster"], feed_cluster);
    let patches = ef.data["spec"]["configPatches"].as_array().unwrap();
    // First in the gateway's chain, the native strip of client destination headers; the wasm filter before the router.
    let ops: Vec<&str> = patches
        .iter()
        .filter(|p| p["applyTo"] == "HTTP_FILTER")
        .filter_map(|p| p["patch"]["operation"].as_str())
        .collect();
    assert_eq!(ops, ["INSERT_FIRST", "INSERT_BEFORE"]);
    let http =
        patches.iter().find(|p| p["applyTo"] == "HTTP_FILTER" && p["patch"]["operation"] == "INSERT_BEFORE").unwrap();
    assert_eq!(http["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"], "envoy.filters.http.router");
    let cluster = patches.iter().find(|p| p["applyTo"] == "CLUSTER").unwrap();
    assert_eq!(cluster["match"]["cluster"]["service"], "vllm.llm.svc.cluster.local");
    let p = get_policy(&client, "chat-routing").await;
    assert_eq!(condition(&p, conditions::PROGRAMMED).status, "True");
}

/// The cluster domain is a setting, not `cluster.local`: every Service name the controller renders
/// (Istio's backend and feed clusters, the module URL's host, Envoy Gateway's feed cluster) uses it.
#[tokio::test]
async fn service_names_are_rendered_with_the_configured_cluster_domain() {
    use warmpath_controller::render::{ControllerEndpoint, WasmModule};
    let controller = ControllerEndpoint {
        cluster_domain: "corp.example".into(),
        ..ControllerEndpoint::new("warmpath-controller", "warmpath-system", 8080)
    };
    let config = warmpath_controller::reconcile::ControllerConfig {
        wasm: WasmModule {
            url: format!("http://{}:8080/wasm/warmpath_filter-0123456789abcdef.wasm", controller.host()),
            sha256: "0123456789abcdef".repeat(4),
        },
        controller,
        ..Default::default()
    };
    for (gateway_controller, kind, ns, name) in [
        (ISTIO_CONTROLLER, "EnvoyFilter", GW_NS, "warmpath-policy-llm-chat-routing"),
        (EG_CONTROLLER, "EnvoyPatchPolicy", GW_NS, "warmpath-feed-policy-llm-chat-routing"),
    ] {
        let (client, _) = setup(gateway_controller, json!({})).await;
        let ctx = Context::new(client.clone(), config.clone());
        let _: InferenceRoutingPolicy = create(&client, NS, policy(NS, "chat-routing", "chat", json!({}))).await;
        reconcile_policy(&client, &ctx, "chat-routing").await;
        let o = get_owned(&client, kind, ns, name).await.unwrap_or_else(|| panic!("{kind} {ns}/{name} rendered"));
        let text = o.data.to_string();
        assert!(!text.contains("cluster.local"), "{kind}: {text}");
        assert!(text.contains("warmpath-controller.warmpath-system.svc.corp.example"), "{kind}: {text}");
        if kind == "EnvoyFilter" {
            assert_eq!(plugin(&o)["upstream_clusters"], json!(["outbound|8000||vllm.llm.svc.corp.example"]));
            let cluster = o.data["spec"]["configPatches"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["applyTo"] == "CLUSTER")
                .unwrap()
                .clone();
            assert_eq!(cluster["match"]["cluster"]["service"], "vllm.llm.svc.corp.example");
        }
    }
}

/// Bad input → a condition with a reason; no panic; nothing created.
#[tokio::test]
async fn bad_input_is_reported_and_touches_nothing() {
    let cases = [
        (
            "unknown-strategy",
            json!({"strategy": "ROUND_ROBIN"}),
            "chat",
            conditions::ACCEPTED,
            "Invalid",
            "ROUND_ROBIN",
        ),
        ("prefix-too-short", json!({"prefixLength": 10}), "chat", conditions::ACCEPTED, "Invalid", "1024..=65536"),
        (
            "threshold-too-big",
            json!({"concurrencyThreshold": 5000}),
            "chat",
            conditions::ACCEPTED,
            "Invalid",
            "concurrencyThreshold",
        ),
        (
            "missing-backend",
            json!({"backend": {"service": {"name": "nope", "port": 8000}}}),
            "chat",
            conditions::RESOLVED_REFS,
            "BackendNotFound",
            "nope",
        ),
        ("missing-route", json!({}), "ghost", conditions::ACCEPTED, "TargetNotFound", "ghost"),
    ];
    for (name, extra, route, cond, reason, needle) in cases {
        let (client, ctx) = setup(EG_CONTROLLER, json!({})).await;
        // Raw JSON through the dynamic API: the in-memory server has no schema validation, so this
        // is what an object that slipped past the CRD schema looks like to the controller.
        let ar = kube::core::ApiResource::erase::<InferenceRoutingPolicy>(&());
        Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ar)
            .create(&PostParams::default(), &serde_json::from_value(policy(NS, name, route, extra)).unwrap())
            .await
            .unwrap();
        reconcile_policy(&client, &ctx, name).await;
        let p = get_policy(&client, name).await;
        let c = condition(&p, cond);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason), "{name}: {c:?}");
        assert!(c.message.contains(needle), "{name}: {}", c.message);
        assert_eq!(condition(&p, conditions::PROGRAMMED).status, "False", "{name}");
        assert!(owned_objects(&client).await.is_empty(), "{name}: nothing created");
    }
}

#[tokio::test]
async fn second_policy_on_the_same_route_is_conflicted() {
    let (client, ctx) = setup(EG_CONTROLLER, json!({})).await;
    let _: InferenceRoutingPolicy = create(&client, NS, policy(NS, "a-first", "chat", json!({}))).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let _: InferenceRoutingPolicy =
        create(&client, NS, policy(NS, "b-second", "chat", json!({"strategy": "RANDOM"}))).await;
    reconcile_policy(&client, &ctx, "a-first").await;
    reconcile_policy(&client, &ctx, "b-second").await;
    let b = get_policy(&client, "b-second").await;
    let c = condition(&b, conditions::ACCEPTED);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Conflicted"));
    assert!(c.message.contains("a-first"));
    let eep = get_owned(&client, "EnvoyExtensionPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(plugin_strategy(&eep), "PREFIX_AWARE", "the older policy's configuration stays");
    assert!(
        get_owned(&client, "EnvoyPatchPolicy", GW_NS, "warmpath-feed-policy-llm-b-second").await.is_none(),
        "nothing for the conflicted policy"
    );
}

async fn reconcile_route(client: &kube::Client, ctx: &Context) {
    for _ in 0..2 {
        let r = Arc::new(Api::<HttpRoute>::namespaced(client.clone(), NS).get("chat").await.unwrap());
        route_annotations::reconcile(r, Arc::new(ctx.clone())).await.unwrap();
    }
}

#[tokio::test]
async fn annotations_program_the_route_and_removal_cleans_up() {
    let ann = json!({"warmpath.dev/routing-strategy": "PREFIX_AWARE", "warmpath.dev/prefix-length": "2048", "warmpath.dev/concurrency-threshold": "12"});
    let (client, ctx) = setup(EG_CONTROLLER, ann).await;
    reconcile_route(&client, &ctx).await;
    let objs = owned_objects(&client).await;
    assert_eq!(objs.len(), 3, "{objs:?}");
    assert!(get_owned(&client, "EnvoyPatchPolicy", GW_NS, "warmpath-feed-httproute-llm-chat").await.is_some());
    let eep = get_owned(&client, "EnvoyExtensionPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(plugin(&eep)["prefix_length"], 2048);
    assert_eq!(plugin(&eep)["concurrency_threshold"], 12);
    assert_eq!(eep.data["spec"]["wasm"][0]["name"], "warmpath/httproute/llm/chat");
    let btp = get_owned(&client, "BackendTrafficPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(btp.metadata.owner_references.as_ref().unwrap()[0].kind, "HTTPRoute");
    let route = Api::<HttpRoute>::namespaced(client.clone(), NS).get("chat").await.unwrap();
    assert!(route.finalizers().contains(&route_annotations::FINALIZER.to_string()));

    // Precedence: a policy on the route takes over; annotation-owned objects go away.
    let _: InferenceRoutingPolicy =
        create(&client, NS, policy(NS, "explicit", "chat", json!({"strategy": "RANDOM"}))).await;
    reconcile_route(&client, &ctx).await;
    assert!(owned_objects(&client).await.is_empty());
    reconcile_policy(&client, &ctx, "explicit").await;
    assert!(get_owned(&client, "EnvoyPatchPolicy", GW_NS, "warmpath-feed-policy-llm-explicit").await.is_some());
    let eep = get_owned(&client, "EnvoyExtensionPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(plugin_strategy(&eep), "RANDOM");
    let btp = get_owned(&client, "BackendTrafficPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(btp.metadata.owner_references.as_ref().unwrap()[0].kind, "InferenceRoutingPolicy");

    // Policy gone: the annotations apply again.
    let p = as_deleted((*get_policy(&client, "explicit").await).clone());
    routing_policy::reconcile(Arc::new(p), Arc::new(ctx.clone())).await.unwrap();
    Api::<InferenceRoutingPolicy>::namespaced(client.clone(), NS)
        .delete("explicit", &Default::default())
        .await
        .unwrap();
    reconcile_route(&client, &ctx).await;
    assert!(get_owned(&client, "EnvoyPatchPolicy", GW_NS, "warmpath-feed-httproute-llm-chat").await.is_some());
    let eep = get_owned(&client, "EnvoyExtensionPolicy", NS, "warmpath-chat").await.unwrap();
    assert_eq!(plugin_strategy(&eep), "PREFIX_AWARE");

    // Annotation removed: exactly the annotation's objects go, and the finalizer is released.
    Api::<HttpRoute>::namespaced(client.clone(), NS)
        .patch(
            "chat",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"warmpath.dev/routing-strategy": null}}})),
        )
        .await
        .unwrap();
    reconcile_route(&client, &ctx).await;
    assert!(owned_objects(&client).await.is_empty());
    let route = Api::<HttpRoute>::namespaced(client.clone(), NS).get("chat").await.unwrap();
    assert!(!route.finalizers().contains(&route_annotations::FINALIZER.to_string()));
}

#[tokio::test]
async fn invalid_annotation_changes_nothing() {
    let (client, ctx) = setup(EG_CONTROLLER, json!({"warmpath.dev/routing-strategy": "fastest"})).await;
    reconcile_route(&client, &ctx).await;
    assert!(owned_objects(&client).await.is_empty());
}

/// The Gateway of the xDS name tests: two plain HTTP ports, two HTTPS listeners on 443, and a TCP listener.
fn gateway_of_many_listeners() -> serde_json::Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "inference-gw", "namespace": GW_NS},
        "spec": {"gatewayClassName": "eg", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "http-alt", "port": 8080, "protocol": "HTTP"},
            {"name": "tls", "port": 443, "protocol": "HTTPS"},
            {"name": "tls-other-host", "port": 443, "protocol": "HTTPS", "hostname": "b.example.com"},
            {"name": "raw", "port": 9000, "protocol": "TCP"}]}})
}

/// Reconciles a policy on a route attached to [`gateway_of_many_listeners`] through a parentRef with `section` and
/// `port`, with `scheme`; returns the xDS listeners (each once: the header strip and the option on the filter
/// come in pairs) and route configurations the `EnvoyPatchPolicy` patches, or `None` when none was written (then
/// the policy must say why).
async fn patched_xds_names(
    scheme: XdsNameScheme,
    section: Option<&str>,
    port: Option<i32>,
) -> Option<(Vec<String>, Vec<String>)> {
    let mut objs = base(EG_CONTROLLER);
    objs[1] = gateway_of_many_listeners();
    let client = fixtures::client(objs).await;
    let mut route = http_route(NS, "chat", GW_NS, "inference-gw", "vllm", 8000, json!({}));
    if let Some(s) = section {
        route["spec"]["parentRefs"][0]["sectionName"] = json!(s);
    }
    if let Some(p) = port {
        route["spec"]["parentRefs"][0]["port"] = json!(p);
    }
    let _: HttpRoute = create(&client, NS, route).await;
    let config = (*fixtures::context(client.clone()).config).clone();
    let ctx = Context::new(client.clone(), ControllerConfig { xds_name_scheme: scheme, ..config });
    let _: InferenceRoutingPolicy = create(&client, NS, policy(NS, "chat-routing", "chat", json!({}))).await;
    reconcile_policy(&client, &ctx, "chat-routing").await;
    let Some(epp) = get_owned(&client, "EnvoyPatchPolicy", GW_NS, EPP_POLICY).await else {
        let p = get_policy(&client, "chat-routing").await;
        let c = condition(&p, conditions::ACCEPTED);
        assert_eq!(c.status, "False");
        assert!(c.message.contains("no HTTP or HTTPS listener"), "{}", c.message);
        assert!(owned_objects(&client).await.is_empty());
        return None;
    };
    let names = |ty: &str| -> Vec<String> {
        let patches = epp.data["spec"]["jsonPatches"].as_array().unwrap();
        patches.iter().filter(|p| p["type"] == ty).map(|p| p["name"].as_str().unwrap().to_string()).collect()
    };
    let listeners = names(type_url::LISTENER);
    // Per listener: the native header strip, then the option on the wasm filter.
    let once: Vec<String> = listeners.iter().step_by(2).cloned().collect();
    assert_eq!(listeners, once.iter().flat_map(|n| [n.clone(), n.clone()]).collect::<Vec<_>>());
    Some((once, names(type_url::ROUTE_CONFIGURATION)))
}

/// Envoy Gateway: the option patch goes to the xDS listener of each port the route attaches to,
/// named after the Gateway's first listener on that port (Envoy Gateway merges listeners by port;
/// HTTPS included), the body-limit patch to the route configuration of each attached listener (an
/// HTTPS listener's own, plain HTTP ones share the first on the port's); parentRefs select by
/// `sectionName` and/or `port`; a route on no HTTP(S) listener gets a clear condition and nothing written.
#[tokio::test]
async fn envoy_gateway_patches_the_xds_listener_of_each_attached_port() {
    let all = vec!["gateways/inference-gw/http", "gateways/inference-gw/http-alt", "gateways/inference-gw/tls"];
    let (tls, tls_other) = ("gateways/inference-gw/tls", "gateways/inference-gw/tls-other-host");
    // (parentRef selection, xDS listeners patched, route configurations patched: an HTTPS listener has its own)
    for ((section, port), want, want_routes) in [
        ((None, None), all.clone(), [all.as_slice(), &[tls_other]].concat()),
        ((Some("http-alt"), None), vec!["gateways/inference-gw/http-alt"], vec!["gateways/inference-gw/http-alt"]),
        ((Some("tls-other-host"), None), vec![tls], vec![tls_other]),
        ((None, Some(8080)), vec!["gateways/inference-gw/http-alt"], vec!["gateways/inference-gw/http-alt"]),
        ((None, Some(443)), vec![tls], vec![tls, tls_other]),
        ((Some("http"), Some(443)), vec![], vec![]),
        ((Some("raw"), None), vec![], vec![]),
    ] {
        let got = patched_xds_names(XdsNameScheme::V1, section, port).await;
        let want = (!want.is_empty()).then(|| (strings(&want), strings(&want_routes)));
        assert_eq!(got, want, "{section:?} {port:?}");
    }
}

/// The same under Envoy Gateway's `XDSNameSchemeV2` names (the controller's `v2` setting): a port's xDS listener
/// is `tcp-<port>`, the plain HTTP listeners' route configuration `http-<port>`, an HTTPS listener's route
/// configuration keeps its own name (Envoy Gateway's `xds-name-scheme-v2` test fixtures).
#[tokio::test]
async fn envoy_gateway_v2_names_are_by_port() {
    let (tls, tls_other) = ("gateways/inference-gw/tls", "gateways/inference-gw/tls-other-host");
    for ((section, port), want, want_routes) in [
        ((None, None), vec!["tcp-80", "tcp-8080", "tcp-443"], vec!["http-80", "http-8080", tls, tls_other]),
        ((Some("http-alt"), None), vec!["tcp-8080"], vec!["http-8080"]),
        ((Some("tls-other-host"), None), vec!["tcp-443"], vec![tls_other]),
        ((None, Some(443)), vec!["tcp-443"], vec![tls, tls_other]),
        ((Some("raw"), None), vec![], vec![]),
    ] {
        let got = patched_xds_names(XdsNameScheme::V2, section, port).await;
        let want = (!want.is_empty()).then(|| (strings(&want), strings(&want_routes)));
        assert_eq!(got, want, "{section:?} {port:?}");
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A policy targeting two HTTPRoutes on one Gateway: both routes are programmed from one backend —
/// Envoy Gateway: one `EnvoyExtensionPolicy` per route and one `EnvoyPatchPolicy` for the Gateway
/// holding the feed cluster once and the option operation for both routes' filters; Istio: one
/// `EnvoyFilter` (one filter instance) for the policy. A third route on another backend is refused
/// with `BackendMismatch` and gets nothing.
#[tokio::test]
async fn one_policy_on_several_routes_of_one_gateway() {
    for controller in [EG_CONTROLLER, ISTIO_CONTROLLER] {
        let mut objs = base(controller);
        objs.push(service(NS, "other", 8000));
        let client = fixtures::client(objs).await;
        for (route, svc) in [("chat", "vllm"), ("chat-v2", "vllm"), ("embed", "other")] {
            let _: HttpRoute =
                create(&client, NS, http_route(NS, route, GW_NS, "inference-gw", svc, 8000, json!({}))).await;
        }
        let ctx = fixtures::context(client.clone());
        let mut p = policy(NS, "multi", "chat", json!({}));
        p["spec"]["targetRefs"] = json!([
            {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"},
            {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat-v2"},
            {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "embed"}]);
        let _: InferenceRoutingPolicy = create(&client, NS, p).await;
        reconcile_policy(&client, &ctx, "multi").await;
        let owned = owned_objects(&client).await;
        let st = get_policy(&client, "multi").await.status.clone().unwrap();
        let embed = st.ancestors.iter().find(|a| a.ancestor_ref.name == "embed").expect("embed reported");
        let c = conditions::find(&embed.conditions, conditions::RESOLVED_REFS).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "BackendMismatch"), "{controller}: {c:?}");
        assert!(c.message.contains("other") && c.message.contains("vllm"), "{}", c.message);
        if controller == EG_CONTROLLER {
            let s = |k: &str, ns: &str, n: &str| (k.to_string(), ns.to_string(), n.to_string());
            assert_eq!(
                owned,
                vec![
                    s("BackendTrafficPolicy", NS, "warmpath-chat"),
                    s("BackendTrafficPolicy", NS, "warmpath-chat-v2"),
                    s("EnvoyExtensionPolicy", NS, "warmpath-chat"),
                    s("EnvoyExtensionPolicy", NS, "warmpath-chat-v2"),
                    s("EnvoyPatchPolicy", GW_NS, "warmpath-feed-policy-llm-multi"),
                ]
            );
            let epp = get_owned(&client, "EnvoyPatchPolicy", GW_NS, "warmpath-feed-policy-llm-multi").await.unwrap();
            let patches = epp.data["spec"]["jsonPatches"].as_array().unwrap();
            let clusters = patches.iter().filter(|p| p["type"] == type_url::CLUSTER).count();
            let on = |ty: &'static str| {
                patches
                    .iter()
                    .filter(move |p| p["type"] == ty)
                    .filter_map(|p| p["operation"]["jsonPath"].as_str())
                    .filter(|p| p.contains("/wasm/0"))
            };
            let paths: Vec<&str> = on(type_url::LISTENER).collect();
            let routes: Vec<&str> = on(type_url::ROUTE_CONFIGURATION).collect();
            assert!(
                routes.len() == 2
                    && routes[0].contains("/llm/warmpath-chat/wasm/0")
                    && routes[1].contains("/llm/warmpath-chat-v2/wasm/0"),
                "the body limit on each route's routes: {routes:?}"
            );
            let strips = patches.iter().filter(|p| p["operation"]["path"] == "/0").count();
            assert_eq!(strips, 1, "the native strip is inserted once per listener, not once per route");
            assert_eq!(clusters, 1, "the feed cluster is added once");
            assert_eq!(paths.len(), 2, "{paths:?}");
            assert!(
                paths[0].contains("/llm/warmpath-chat/wasm/0") && paths[1].contains("/llm/warmpath-chat-v2/wasm/0"),
                "{paths:?}"
            );
        } else {
            let s = |k: &str, ns: &str, n: &str| (k.to_string(), ns.to_string(), n.to_string());
            assert_eq!(
                owned,
                vec![s("EnvoyFilter", GW_NS, "warmpath-policy-llm-multi")],
                "one filter instance for the policy"
            );
        }
    }
}

/// An explicit provider is still checked against the GatewayClass: an Istio gateway with the
/// controller set to envoy-gateway is refused with a condition saying why, and nothing is written;
/// a controllerName warmpath does not know is accepted when the provider is explicit.
#[tokio::test]
async fn explicit_provider_is_checked_against_the_gateway_class() {
    use warmpath_controller::render::Provider;
    let with_provider = |client: &kube::Client, p: Provider| {
        let mut cfg = (*fixtures::context(client.clone()).config).clone();
        cfg.provider = Some(p);
        Context::new(client.clone(), cfg)
    };
    let (client, _) = setup(ISTIO_CONTROLLER, json!({})).await;
    let ctx = with_provider(&client, Provider::EnvoyGateway);
    let _: InferenceRoutingPolicy = create(&client, NS, policy(NS, "chat-routing", "chat", json!({}))).await;
    reconcile_policy(&client, &ctx, "chat-routing").await;
    let p = get_policy(&client, "chat-routing").await;
    let c = condition(&p, conditions::ACCEPTED);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "UnsupportedProvider"), "{c:?}");
    assert!(
        c.message.contains("Istio") && c.message.contains("EnvoyGateway") && c.message.contains("provider"),
        "{}",
        c.message
    );
    assert_eq!(condition(&p, conditions::PROGRAMMED).status, "False");
    assert!(owned_objects(&client).await.is_empty(), "no Envoy Gateway objects for an Istio gateway");

    // Same provider as the class: programmed as before.
    let ctx = with_provider(&client, Provider::Istio);
    reconcile_policy(&client, &ctx, "chat-routing").await;
    assert_eq!(condition(&*get_policy(&client, "chat-routing").await, conditions::PROGRAMMED).status, "True");

    // A controllerName warmpath does not know: refused in auto mode, accepted with an explicit provider.
    let (client, auto) = setup("example.com/custom-envoy-gateway", json!({})).await;
    let _: InferenceRoutingPolicy = create(&client, NS, policy(NS, "chat-routing", "chat", json!({}))).await;
    reconcile_policy(&client, &auto, "chat-routing").await;
    assert_eq!(
        condition(&*get_policy(&client, "chat-routing").await, conditions::ACCEPTED).reason,
        "UnsupportedProvider"
    );
    reconcile_policy(&client, &with_provider(&client, Provider::EnvoyGateway), "chat-routing").await;
    assert_eq!(condition(&*get_policy(&client, "chat-routing").await, conditions::ACCEPTED).status, "True");
}
