//! The Envoy configuration fragments the controller renders are checked by a real Envoy
//! (`envoy --mode validate`, Envoy 1.40 from `.venv`, installed by scripts/setup.sh):
//! - the Istio `EnvoyFilter` MERGE value, merged into a cluster shaped like Istio's outbound
//!   cluster (which already sets `lb_policy: LEAST_REQUEST`);
//! - the cluster the Envoy Gateway `EnvoyPatchPolicy` adds for the feed;
//! - Envoy Gateway: the `EnvoyPatchPolicy` operations applied the way Envoy Gateway applies them
//!   (RFC 9535 JSONPath → RFC 6901 pointers, `path` appended, RFC 6902 `add`) to xDS listeners
//!   shaped like Envoy Gateway's output for the rendered `EnvoyExtensionPolicy`s (its xDS
//!   translator's test data: filter disabled in the listener, enabled per route), on plain HTTP
//!   and HTTPS (per-SNI filter chains); then loaded by Envoy;
//! - Istio: the wasm HTTP filter (full `PluginConfig`, `allow_on_headers_stop_iteration: true`)
//!   that the `EnvoyFilter` `HTTP_FILTER` patch inserts ahead of the router, placed in a listener's
//!   HTTP connection manager with the cluster it fetches the module through.
//!
//! Fails (never skips) when Envoy is not installed: CI installs it, so a missing binary is a broken setup.
//! Envoy is found like every live test finds it (`warmpath-harness`: `$WARMPATH_ENVOY`, else `.venv/bin/envoy`).

use std::process::Command;

mod common;

use common::envoy_gateway::{apply_patch_policy, enable_on_route, envoy_gateway_filter, hcm, EG_WASM_CACHE_URI};
use serde_json::{json, Value};
use warmpath_controller::render::WasmModule;
use warmpath_envoy_config::{type_url, STRIP_FILTER_NAME};

fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}

async fn rendered(case: &str) -> Vec<Value> {
    common::render_case(case, WasmModule { url: "http://x/wasm/m.wasm".into(), sha256: "0".repeat(64) }).await
}

fn validate(clusters: Vec<Value>) {
    validate_resources(json!({"clusters": clusters}));
}

/// Runs `envoy --mode validate` on a bootstrap with these `static_resources`: (exit status success,
/// output). Panics when Envoy is not installed.
fn envoy_validate(static_resources: Value) -> (bool, String) {
    let envoy = warmpath_harness::envoy_binary().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.json");
    std::fs::write(&cfg, json!({"static_resources": static_resources}).to_string()).unwrap();
    let out = Command::new(envoy).args(["--mode", "validate", "-c"]).arg(&cfg).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn validate_resources(static_resources: Value) {
    let (ok, log) = envoy_validate(static_resources);
    assert!(ok && log.contains("OK"), "Envoy rejected the rendered configuration:\n{log}");
}

/// A STATIC stand-in, on 127.0.0.1:8080, for a cluster the gateway already has (`name` is a JSON string).
fn stand_in_cluster(name: &Value) -> Value {
    common::static_cluster(name.as_str().expect("cluster name"), &["127.0.0.1:8080".parse().unwrap()], None)
}

#[tokio::test]
async fn istio_cluster_patch_is_valid_envoy_config() {
    let objs = rendered("istio-annotated.yaml").await;
    let ef = objs.iter().find(|o| o["kind"] == "EnvoyFilter").expect("EnvoyFilter rendered");
    let patches = ef["spec"]["configPatches"].as_array().unwrap();
    let patch = &patches.iter().find(|p| p["applyTo"] == "CLUSTER").expect("CLUSTER patch")["patch"]["value"];
    // Shape of an Istio outbound cluster before the patch (EDS replaced by a static endpoint).
    let mut cluster = json!({
        "name": "outbound|30000||sglang-qwen.llm.svc.cluster.local",
        "type": "STATIC",
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": "x", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 30000}}}}]}]},
    });
    merge(&mut cluster, patch);
    assert!(cluster["load_balancing_policy"].is_object());
    validate(vec![cluster]);
}

#[tokio::test]
async fn envoy_gateway_feed_cluster_is_valid_envoy_config() {
    let objs = rendered("envoy-gateway.yaml").await;
    let epp = objs.iter().find(|o| o["kind"] == "EnvoyPatchPolicy").expect("EnvoyPatchPolicy rendered");
    let mut cluster = epp["spec"]["jsonPatches"][0]["operation"]["value"].clone();
    // STRICT_DNS would resolve the cluster-local name at start; validate mode does not resolve.
    assert_eq!(cluster["type"], "STRICT_DNS");
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] =
        "localhost".into();
    validate(vec![cluster]);
}

/// A listener whose HTTP connection manager runs `wasm_filter` ahead of the router.
fn listener_with(wasm_filter: &Value) -> Value {
    json!({
        "name": "gateways/inference-gateway/http",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "default_filter_chain": {"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": type_url::HTTP_CONNECTION_MANAGER,
                "stat_prefix": "http",
                "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": []}]},
                "http_filters": [wasm_filter, {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": type_url::ROUTER}}],
            }
        }]}
    })
}

/// Checks the rendered wasm filter's `PluginConfig` and loads it, with the cluster its module URL is
/// fetched through, into a real Envoy.
fn validate_wasm_filter(filter: &Value, module_cluster: Value) {
    let config = &filter["typed_config"]["config"];
    assert_eq!(filter["typed_config"]["@type"], type_url::WASM);
    assert_eq!(
        config["allow_on_headers_stop_iteration"], true,
        "without it Envoy ignores the headers-callback pause (PREFIX_AWARE hangs)"
    );
    assert_eq!(config["failure_policy"], "FAIL_OPEN");
    assert_eq!(config["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
    assert_eq!(config["vm_config"]["code"]["remote"]["http_uri"]["cluster"], module_cluster["name"]);
    let plugin: Value = serde_json::from_str(config["configuration"]["value"].as_str().unwrap()).unwrap();
    assert_eq!(plugin["strategy"], "PREFIX_AWARE");
    validate_resources(json!({"listeners": [listener_with(filter)], "clusters": [module_cluster]}));
}

/// Each route's `EnvoyExtensionPolicy` filter, in xDS listeners shaped like Envoy Gateway's (plain
/// HTTP `default_filter_chain` and HTTPS per-SNI `filter_chains`, both routes' filters disabled in
/// every chain and enabled on their own route), gets `allow_on_headers_stop_iteration: true` from
/// its own `EnvoyPatchPolicy` and from no other, as does its route's `request_body_buffer_limit`
/// (the listeners have Envoy Gateway's 32 KiB buffer limit); the patched listeners load in Envoy.
#[tokio::test]
async fn envoy_gateway_patches_apply_to_envoy_gateway_shaped_listeners() {
    let objs = rendered("envoy-gateway-two-routes.yaml").await;
    let eeps: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "EnvoyExtensionPolicy").collect();
    let epps: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "EnvoyPatchPolicy").collect();
    assert_eq!((eeps.len(), epps.len()), (2, 2), "one of each per routed HTTPRoute");
    let filters: Vec<Value> = eeps.iter().map(|e| envoy_gateway_filter(e, EG_WASM_CACHE_URI)).collect();
    let names: Vec<String> = filters.iter().map(|f| f["name"].as_str().unwrap().to_string()).collect();
    assert_ne!(names[0], names[1]);
    let routes: Vec<Value> = eeps
        .iter()
        .zip(&names)
        .map(|(e, f)| {
            let route = e["spec"]["targetRefs"][0]["name"].as_str().unwrap();
            json!({"name": format!("httproute/llm/{route}/rule/0/match/0/*"), "match": {"prefix": format!("/{route}")},
                "route": {"cluster": "backend"},
                "typed_per_filter_config": enable_on_route(f)})
        })
        .collect();
    const HTTP: &str = "gateways/inference-gateway/http";
    const HTTPS: &str = "gateways/inference-gateway/https-a";
    // Envoy Gateway's second HTTPS listener on the port: a filter chain and route configuration of its own in the
    // xDS listener named after the first.
    const HTTPS_B: &str = "gateways/inference-gateway/https-b";
    let mut listeners = vec![
        json!({"name": HTTP, "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "per_connection_buffer_limit_bytes": warmpath_envoy_config::ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES,
            "default_filter_chain": {"filters": [hcm(HTTP, &filters, routes.clone())]}}),
        json!({"name": HTTPS, "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "per_connection_buffer_limit_bytes": warmpath_envoy_config::ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES,
        "listener_filters": [{"name": "envoy.filters.listener.tls_inspector", "typed_config": {
            "@type": type_url::TLS_INSPECTOR}}],
        "filter_chains": [
            {"filter_chain_match": {"server_names": ["a.example.com"]}, "filters": [hcm(HTTPS, &filters, routes.clone())]},
            {"filter_chain_match": {"server_names": ["b.example.com"]}, "filters": [hcm(HTTPS_B, &filters, routes.clone())]},
        ]}),
    ];
    let flags = |listeners: &[Value], name: &str| -> Vec<Value> {
        let q = serde_json_path::JsonPath::parse(&format!("$..http_filters[?@.name == '{name}']")).unwrap();
        listeners
            .iter()
            .flat_map(|l| {
                q.query(l)
                    .all()
                    .into_iter()
                    .map(|f| f["typed_config"]["config"]["allow_on_headers_stop_iteration"].clone())
            })
            .collect()
    };
    let mut clusters = vec![];
    // One policy's patch reaches its own filter in all three chains, and leaves the other's alone.
    let applied = apply_patch_policy(epps[0], &mut listeners, &mut clusters).unwrap();
    assert_eq!(applied, 9, "plain HTTP + two SNI chains, each: the native strip first, the option on the filter, the body limit on its route");
    let q = serde_json_path::JsonPath::parse("$..http_filters").unwrap();
    for chain in listeners.iter().flat_map(|l| q.query(l).all()) {
        assert_eq!(chain[0]["name"], STRIP_FILTER_NAME, "the native header strip runs first in every chain: {chain}");
    }
    let own = epps[0]["spec"]["jsonPatches"][2]["operation"]["jsonPath"].as_str().unwrap().to_string();
    let (mine, other) = if own.contains(&names[0]) { (0, 1) } else { (1, 0) };
    assert_eq!(flags(&listeners, &names[mine]), vec![json!(true); 3]);
    assert_eq!(flags(&listeners, &names[other]), vec![Value::Null; 3]);
    // The body limit is on the policy's own route in every route configuration, not on the other's.
    let limits = |listeners: &[Value], name: &str| -> Vec<Value> {
        let q = serde_json_path::JsonPath::parse(&format!("$..routes[?@.typed_per_filter_config['{name}']]")).unwrap();
        listeners
            .iter()
            .flat_map(|l| q.query(l).all().into_iter().map(|r| r["request_body_buffer_limit"].clone()))
            .collect()
    };
    let limit = json!(warmpath_envoy_config::ROUTE_BODY_BUFFER_LIMIT_BYTES);
    assert_eq!(limits(&listeners, &names[mine]), vec![limit.clone(); 3]);
    assert_eq!(limits(&listeners, &names[other]), vec![Value::Null; 3]);
    apply_patch_policy(epps[1], &mut listeners, &mut clusters).unwrap();
    assert_eq!(flags(&listeners, &names[other]), vec![json!(true); 3]);
    assert_eq!(limits(&listeners, &names[other]), vec![limit; 3]);
    // The listener patches name the xDS listeners Envoy Gateway builds, one per port; the body-limit patches the
    // route configurations, one per HTTPS listener.
    let names = |ty: &str| -> Vec<&str> {
        let patches = epps[0]["spec"]["jsonPatches"].as_array().unwrap();
        patches.iter().filter(|p| p["type"] == ty).map(|p| p["name"].as_str().unwrap()).collect()
    };
    assert_eq!(names(type_url::LISTENER), [HTTP, HTTP, HTTPS, HTTPS]);
    assert_eq!(names(type_url::ROUTE_CONFIGURATION), [HTTP, HTTPS, HTTPS_B]);

    for c in clusters.iter_mut() {
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] =
            "localhost".into();
    }
    clusters.dedup_by(|a, b| a["name"] == b["name"]);
    for name in ["wasm_cluster", "backend"] {
        clusters.push(stand_in_cluster(&json!(name)));
    }
    validate_resources(json!({"listeners": listeners, "clusters": clusters}));
}

#[tokio::test]
async fn istio_wasm_filter_is_valid_envoy_config() {
    let objs = rendered("istio-annotated.yaml").await;
    let ef = objs.iter().find(|o| o["kind"] == "EnvoyFilter").expect("EnvoyFilter rendered");
    let patches = ef["spec"]["configPatches"].as_array().unwrap();
    let strip = patches.iter().find(|p| p["patch"]["operation"] == "INSERT_FIRST").expect("the native strip, first");
    assert_eq!(strip["patch"]["value"], warmpath_envoy_config::strip_client_destination_headers());
    let http = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER" && p["patch"]["operation"] == "INSERT_BEFORE")
        .expect("wasm patch");
    let filter = &http["patch"]["value"];
    // Istio pushes the controller Service's outbound cluster; a static stand-in with its name.
    let name = filter["typed_config"]["config"]["vm_config"]["code"]["remote"]["http_uri"]["cluster"].clone();
    let cluster = stand_in_cluster(&name);
    validate_wasm_filter(filter, cluster);
}

/// The check has teeth: the same cluster with a typo in the policy's field is refused by Envoy.
#[test]
fn envoy_refuses_a_broken_override_host_policy() {
    let mut policy = warmpath_controller::render::override_host_lb_policy();
    policy["policies"][0]["typed_extension_config"]["typed_config"]["override_host_sourcez"] = json!([]);
    let cluster = json!({"name": "c", "type": "STATIC", "connect_timeout": "1s", "load_balancing_policy": policy,
        "load_assignment": {"cluster_name": "c", "endpoints": []}});
    let (ok, _) = envoy_validate(json!({"clusters": [cluster]}));
    assert!(!ok, "Envoy accepted an unknown field");
}

/// The wasm check has teeth too: a misspelled `PluginConfig` field is refused by Envoy.
#[tokio::test]
async fn envoy_refuses_a_broken_wasm_filter() {
    let objs = rendered("istio-annotated.yaml").await;
    let ef = objs.iter().find(|o| o["kind"] == "EnvoyFilter").expect("EnvoyFilter rendered");
    let http = ef["spec"]["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["patch"]["operation"] == "INSERT_BEFORE")
        .unwrap();
    let mut filter = http["patch"]["value"].clone();
    filter["typed_config"]["config"]["allow_on_headers_stop_iteratoin"] = json!(true);
    let name = filter["typed_config"]["config"]["vm_config"]["code"]["remote"]["http_uri"]["cluster"].clone();
    let cluster = stand_in_cluster(&name);
    let (ok, _) = envoy_validate(json!({"listeners": [listener_with(&filter)], "clusters": [cluster]}));
    assert!(!ok, "Envoy accepted an unknown PluginConfig field");
}
