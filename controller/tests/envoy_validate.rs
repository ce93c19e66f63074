//! The Envoy configuration fragments the controller renders are checked by a real Envoy
//! (`envoy --mode validate`, Envoy 1.40 from `.venv`, installed by scripts/setup.sh):
//! - the Istio `EnvoyFilter` MERGE value, merged into a cluster shaped like Istio's outbound
//!   cluster (which already sets `lb_policy: LEAST_REQUEST`);
//! - the cluster the Envoy Gateway `EnvoyPatchPolicy` adds for the feed;
//! - the wasm HTTP filter (full `PluginConfig`, `allow_on_headers_stop_iteration: true`) that the
//!   `EnvoyPatchPolicy` listener patch and the Istio `EnvoyFilter` `HTTP_FILTER` patch insert ahead
//!   of the router, placed in a listener's HTTP connection manager with the cluster it fetches the
//!   module through.
//!
//! Skips with a message when Envoy is not installed.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use warmpath_controller::reconcile::ControllerConfig;
use warmpath_controller::render::{ControllerEndpoint, WasmModule};

fn envoy() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy");
    p.exists().then_some(p)
}

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
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/render").join(case)).unwrap();
    let controller = ControllerEndpoint { service: "warmpath-controller".into(), namespace: "warmpath-system".into(), port: 8080 };
    let config = ControllerConfig {
        provider: None,
        wasm: WasmModule { url: "http://x/wasm/m.wasm".into(), sha256: "0".repeat(64) },
        controller,
    };
    let out = warmpath_controller::offline::render(warmpath_controller::offline::parse_manifests(&text).unwrap(), config).await.unwrap();
    out.objects.iter().map(|o| serde_json::to_value(o).unwrap()).collect()
}

fn validate(clusters: Vec<Value>) {
    validate_resources(json!({"clusters": clusters}));
}

fn validate_resources(static_resources: Value) {
    let Some(envoy) = envoy() else {
        eprintln!("SKIP: .venv/bin/envoy not installed (run scripts/setup.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.json");
    std::fs::write(&cfg, json!({"static_resources": static_resources}).to_string()).unwrap();
    let out = Command::new(envoy).args(["--mode", "validate", "-c"]).arg(&cfg).output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && log.contains("OK"), "Envoy rejected the rendered configuration:\n{log}");
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
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] = "localhost".into();
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
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "http",
                "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": []}]},
                "http_filters": [wasm_filter, {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            }
        }]}
    })
}

/// Checks the rendered wasm filter's `PluginConfig` and loads it, with the cluster its module URL is
/// fetched through, into a real Envoy.
fn validate_wasm_filter(filter: &Value, module_cluster: Value) {
    let config = &filter["typed_config"]["config"];
    assert_eq!(filter["typed_config"]["@type"], "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm");
    assert_eq!(config["allow_on_headers_stop_iteration"], true, "without it Envoy ignores the headers-callback pause (PREFIX_AWARE hangs)");
    assert_eq!(config["failure_policy"], "FAIL_OPEN");
    assert_eq!(config["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
    assert_eq!(config["vm_config"]["code"]["remote"]["http_uri"]["cluster"], module_cluster["name"]);
    let plugin: Value = serde_json::from_str(config["configuration"]["value"].as_str().unwrap()).unwrap();
    assert_eq!(plugin["strategy"], "PREFIX_AWARE");
    validate_resources(json!({"listeners": [listener_with(filter)], "clusters": [module_cluster]}));
}

#[tokio::test]
async fn envoy_gateway_wasm_filter_is_valid_envoy_config() {
    let objs = rendered("envoy-gateway.yaml").await;
    let epp = objs.iter().find(|o| o["kind"] == "EnvoyPatchPolicy").expect("EnvoyPatchPolicy rendered");
    let patches = epp["spec"]["jsonPatches"].as_array().unwrap();
    let listener = patches.iter().find(|p| p["type"] == "type.googleapis.com/envoy.config.listener.v3.Listener").expect("listener patch");
    assert_eq!(listener["operation"]["op"], "add");
    let mut cluster = patches[0]["operation"]["value"].clone();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] = "localhost".into();
    validate_wasm_filter(&listener["operation"]["value"], cluster);
}

#[tokio::test]
async fn istio_wasm_filter_is_valid_envoy_config() {
    let objs = rendered("istio-annotated.yaml").await;
    let ef = objs.iter().find(|o| o["kind"] == "EnvoyFilter").expect("EnvoyFilter rendered");
    let http = ef["spec"]["configPatches"].as_array().unwrap().iter().find(|p| p["applyTo"] == "HTTP_FILTER").expect("HTTP_FILTER patch");
    assert_eq!(http["patch"]["operation"], "INSERT_BEFORE");
    let filter = &http["patch"]["value"];
    // Istio pushes the controller Service's outbound cluster; a static stand-in with its name.
    let name = filter["typed_config"]["config"]["vm_config"]["code"]["remote"]["http_uri"]["cluster"].clone();
    let cluster = json!({"name": name, "type": "STATIC", "connect_timeout": "2s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}]}]}});
    validate_wasm_filter(filter, cluster);
}

/// The check has teeth: the same cluster with a typo in the policy's field is refused by Envoy.
#[test]
fn envoy_refuses_a_broken_override_host_policy() {
    let Some(envoy) = envoy() else {
        eprintln!("SKIP: .venv/bin/envoy not installed (run scripts/setup.sh)");
        return;
    };
    let mut policy = warmpath_controller::render::override_host_lb_policy();
    policy["policies"][0]["typed_extension_config"]["typed_config"]["override_host_sourcez"] = json!([]);
    let cluster = json!({"name": "c", "type": "STATIC", "connect_timeout": "1s", "load_balancing_policy": policy,
        "load_assignment": {"cluster_name": "c", "endpoints": []}});
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.json");
    std::fs::write(&cfg, json!({"static_resources": {"clusters": [cluster]}}).to_string()).unwrap();
    let out = Command::new(envoy).args(["--mode", "validate", "-c"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success(), "Envoy accepted an unknown field");
}

/// The wasm check has teeth too: a misspelled `PluginConfig` field is refused by Envoy.
#[tokio::test]
async fn envoy_refuses_a_broken_wasm_filter() {
    let Some(envoy) = envoy() else {
        eprintln!("SKIP: .venv/bin/envoy not installed (run scripts/setup.sh)");
        return;
    };
    let objs = rendered("envoy-gateway.yaml").await;
    let epp = objs.iter().find(|o| o["kind"] == "EnvoyPatchPolicy").unwrap();
    let mut filter = epp["spec"]["jsonPatches"][1]["operation"]["value"].clone();
    filter["typed_config"]["config"]["allow_on_headers_stop_iteratoin"] = json!(true);
    let mut cluster = epp["spec"]["jsonPatches"][0]["operation"]["value"].clone();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] = "localhost".into();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.json");
    std::fs::write(&cfg, json!({"static_resources": {"listeners": [listener_with(&filter)], "clusters": [cluster]}}).to_string()).unwrap();
    let out = Command::new(envoy).args(["--mode", "validate", "-c"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success(), "Envoy accepted an unknown PluginConfig field");
}
