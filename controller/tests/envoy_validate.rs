//! The Envoy configuration fragments the controller renders are checked by a real Envoy
//! (`envoy --mode validate`, Envoy 1.40 from `.venv`, installed by scripts/setup.sh):
//! - the Istio `EnvoyFilter` MERGE value, merged into a cluster shaped like Istio's outbound
//!   cluster (which already sets `lb_policy: LEAST_REQUEST`);
//! - the cluster the Envoy Gateway `EnvoyPatchPolicy` adds for the feed.
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
    let Some(envoy) = envoy() else {
        eprintln!("SKIP: .venv/bin/envoy not installed (run scripts/setup.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.json");
    std::fs::write(&cfg, json!({"static_resources": {"clusters": clusters}}).to_string()).unwrap();
    let out = Command::new(envoy).args(["--mode", "validate", "-c"]).arg(&cfg).output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && log.contains("OK"), "Envoy rejected the rendered configuration:\n{log}");
}

#[tokio::test]
async fn istio_cluster_patch_is_valid_envoy_config() {
    let objs = rendered("istio-annotated.yaml").await;
    let ef = objs.iter().find(|o| o["kind"] == "EnvoyFilter").expect("EnvoyFilter rendered");
    let patch = &ef["spec"]["configPatches"][0]["patch"]["value"];
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
