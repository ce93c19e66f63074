//! The CRDs: the YAML committed in the Helm chart is exactly what `crdgen` generates from the Rust
//! types, it parses as a real `apiextensions.k8s.io/v1` CustomResourceDefinition, and the CEL
//! rules of `InferenceRoutingPolicy` accept and refuse what they should (evaluated client-side
//! with kube's CEL support — the same rules the API server runs).

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;
use warmpath_controller::crd::routing_policy::InferenceRoutingPolicy;

#[test]
fn committed_crds_are_in_sync_with_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/warmpath/crds");
    for crd in warmpath_controller::crd::all() {
        let name = crd.metadata.name.clone().unwrap();
        let path = dir.join(format!("{name}.yaml"));
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("{} missing: run `warmpath-controller crdgen`", path.display()));
        assert_eq!(
            committed,
            warmpath_controller::crd::to_yaml(&crd).unwrap(),
            "{name} is stale: run `cargo run -p warmpath-controller -- crdgen`"
        );
        let parsed: CustomResourceDefinition = serde_yaml::from_str(&committed).unwrap();
        assert_eq!(parsed.spec.group, "warmpath.dev");
    }
}

#[test]
fn routing_policy_crd_has_printer_columns_status_and_validation() {
    let crd: CustomResourceDefinition = serde_json::from_value(
        serde_json::to_value(<InferenceRoutingPolicy as kube::CustomResourceExt>::crd()).unwrap(),
    )
    .unwrap();
    let v = &crd.spec.versions[0];
    let cols: Vec<&str> = v.additional_printer_columns.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(cols, ["Strategy", "Target", "Accepted", "Age"]);
    assert!(v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
    let text = serde_json::to_string(&crd).unwrap();
    for needle in [
        "x-kubernetes-validations",
        "PREFIX_AWARE",
        "\"maximum\":65536.0",
        "\"minimum\":1024.0",
        "x-kubernetes-list-map-keys",
    ] {
        assert!(text.contains(needle), "CRD lacks {needle}");
    }
}

fn cel(spec: serde_json::Value) -> Result<(), String> {
    let obj: InferenceRoutingPolicy = serde_json::from_value(json!({
        "apiVersion": "warmpath.dev/v1alpha1", "kind": "InferenceRoutingPolicy",
        "metadata": {"name": "p", "namespace": "ns"}, "spec": spec,
    }))
    .unwrap();
    obj.validate_cel().map_err(|e| format!("{e:?}"))
}

fn target() -> serde_json::Value {
    json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"}])
}

#[test]
fn cel_rules() {
    assert_eq!(
        cel(json!({"targetRefs": target(), "strategy": "PREFIX_AWARE", "prefixLength": 4096, "blockSize": 256})),
        Ok(())
    );
    assert_eq!(cel(json!({"targetRefs": target(), "strategy": "RANDOM"})), Ok(()));
    let e = cel(json!({"targetRefs": target(), "strategy": "RANDOM", "prefixLength": 4096})).unwrap_err();
    assert!(e.contains("prefixLength applies only"), "{e}");
    let e = cel(json!({"targetRefs": target(), "strategy": "PREFIX_AWARE", "prefixLength": 1024, "blockSize": 2048}))
        .unwrap_err();
    assert!(e.contains("blockSize must not exceed"), "{e}");
    let twice = json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "a"}, {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "a"}]);
    let e = cel(json!({"targetRefs": twice, "strategy": "RANDOM"})).unwrap_err();
    assert!(e.contains("each HTTPRoute once"), "{e}");
    let e = cel(json!({"targetRefs": target(), "backend": {"service": {"name": "s", "port": 80}, "inferencePool": {"name": "p"}}})).unwrap_err();
    assert!(e.contains("exactly one of service or inferencePool"), "{e}");
    let e = cel(json!({"targetRefs": target(), "backend": {}})).unwrap_err();
    assert!(e.contains("exactly one"), "{e}");
}

/// The policy schema's ranges are the filter's own constants (`warmpath_core::config`), so the API
/// server cannot accept a value the filter refuses, or refuse one it accepts.
#[test]
fn policy_schema_ranges_are_the_filters() {
    use warmpath_core::config::{
        BLOCK_SIZE_RANGE, CONCURRENCY_THRESHOLD_RANGE, MAX_HEADER_NAME_BYTES, PREFIX_LENGTH_RANGE,
    };
    let crd = serde_json::to_value(
        <warmpath_controller::crd::routing_policy::InferenceRoutingPolicy as kube::CustomResourceExt>::crd(),
    )
    .unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let range = |f: &str| (spec[f]["minimum"].as_f64().unwrap() as u64, spec[f]["maximum"].as_f64().unwrap() as u64);
    assert_eq!(range("prefixLength"), PREFIX_LENGTH_RANGE);
    assert_eq!(range("blockSize"), BLOCK_SIZE_RANGE);
    assert_eq!(range("concurrencyThreshold"), CONCURRENCY_THRESHOLD_RANGE);
    assert_eq!(spec["tenantHeader"]["maxLength"].as_u64(), Some(MAX_HEADER_NAME_BYTES as u64));
}
