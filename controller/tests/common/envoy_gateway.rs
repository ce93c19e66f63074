//! Envoy Gateway's side of the delivery path, reproduced for tests: the xDS it builds from a
//! rendered `EnvoyExtensionPolicy` (modelled on its xDS translator's test data
//! `wasm.listeners.yaml`), and how it applies a rendered `EnvoyPatchPolicy` (RFC 9535 JSONPath →
//! RFC 6901 pointers, operation `path` appended, RFC 6902 patch).

use serde_json::{json, Value};
use warmpath_envoy_config::type_url;

/// Where Envoy Gateway's wasm cache serves the first module of a policy (it fetches `code.http.url`
/// itself and hands Envoy this URL on its `wasm_cluster`).
#[allow(dead_code)] // envoy_live fetches from the controller's own server instead.
pub const EG_WASM_CACHE_URI: &str = "https://envoy-gateway:18002/0.wasm";

/// The wasm HTTP filter Envoy Gateway renders for the first `wasm` entry of an
/// `EnvoyExtensionPolicy`: disabled in the listener (enabled per route, see [`enable_on_route`]),
/// `StringValue` configuration, module fetched from `module_uri` over cluster `wasm_cluster` and
/// checked against the policy's sha256. No `allow_on_headers_stop_iteration`: Envoy Gateway does
/// not set it; the rendered `EnvoyPatchPolicy` does.
pub fn envoy_gateway_filter(eep: &Value, module_uri: &str) -> Value {
    let (ns, name) = (eep["metadata"]["namespace"].as_str().unwrap(), eep["metadata"]["name"].as_str().unwrap());
    let wasm = &eep["spec"]["wasm"][0];
    json!({
        "name": warmpath_controller::render::envoy_gateway_wasm_filter_name(ns, name),
        "disabled": true,
        "typed_config": {
            "@type": type_url::WASM,
            "config": {
                "name": wasm["name"],
                "root_id": wasm["rootID"],
                "fail_open": wasm["failOpen"],
                "configuration": {"@type": type_url::STRING_VALUE, "value": wasm["config"].to_string()},
                "vm_config": {
                    "vm_id": format!("envoyextensionpolicy/{ns}/{name}/wasm/0"),
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"remote": {
                        "http_uri": {"uri": module_uri, "cluster": "wasm_cluster", "timeout": "10s"},
                        "sha256": wasm["code"]["http"]["sha256"],
                    }},
                },
            }
        }
    })
}

/// The `typed_per_filter_config` entry with which Envoy Gateway enables the (listener-disabled)
/// filter named `filter` on the routes of the policy's HTTPRoute.
pub fn enable_on_route(filter: &str) -> Value {
    json!({filter: {"@type": type_url::FILTER_CONFIG, "config": {}}})
}

/// An HTTP connection manager running `filters` then the router, with one virtual host (`*`)
/// holding `routes`, in a route configuration named `route_config` (Envoy Gateway serves it over
/// RDS under the listener's name; here it is inline).
pub fn hcm(route_config: &str, filters: &[Value], routes: Vec<Value>) -> Value {
    let mut http_filters = filters.to_vec();
    http_filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": type_url::ROUTER}}));
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": type_url::HTTP_CONNECTION_MANAGER,
            "stat_prefix": "http",
            "route_config": {"name": route_config, "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": routes}]},
            "http_filters": http_filters,
        }
    })
}

/// Applies an `EnvoyPatchPolicy`'s operations to `listeners`/`clusters` as Envoy Gateway does:
/// a `Cluster` add at path `""` adds the resource; a `Listener` operation targets the listener by
/// name, a `RouteConfiguration` operation every (inline) route configuration of that name, and with
/// `jsonPath` each applies at every match (pointer + `path`), failing when nothing matches.
/// Returns the number of listener and route-configuration patches applied.
///
/// Errors: a named listener or route configuration is missing, the JSONPath is invalid or matches
/// nothing, or the RFC 6902 patch fails.
pub fn apply_patch_policy(epp: &Value, listeners: &mut [Value], clusters: &mut Vec<Value>) -> Result<usize, String> {
    let mut applied = 0;
    for p in epp["spec"]["jsonPatches"].as_array().unwrap() {
        let op = &p["operation"];
        match p["type"].as_str().unwrap() {
            type_url::CLUSTER => {
                assert_eq!((op["op"].as_str(), op["path"].as_str()), (Some("add"), Some("")));
                clusters.push(op["value"].clone());
            }
            type_url::LISTENER => {
                let l = listeners
                    .iter_mut()
                    .find(|l| l["name"] == p["name"])
                    .ok_or(format!("no listener {}", p["name"]))?;
                applied += apply_operation(op, l, &p["name"])?;
            }
            type_url::ROUTE_CONFIGURATION => {
                let q = serde_json_path::JsonPath::parse("$..route_config").unwrap();
                let mut found = 0;
                for l in listeners.iter_mut() {
                    let pointers: Vec<String> =
                        q.query_located(l).locations().map(|loc| loc.to_json_pointer()).collect();
                    for ptr in pointers {
                        let rc = l.pointer_mut(&ptr).unwrap();
                        if rc["name"] == p["name"] {
                            applied += apply_operation(op, rc, &p["name"])?;
                            found += 1;
                        }
                    }
                }
                if found == 0 {
                    return Err(format!("no route configuration {}", p["name"]));
                }
            }
            other => panic!("unexpected patch type {other}"),
        }
    }
    Ok(applied)
}

/// One patch operation on `resource`: at every match of its `jsonPath` (pointer + `path`), or at
/// `path` without one. Returns the number of places patched.
fn apply_operation(op: &Value, resource: &mut Value, name: &Value) -> Result<usize, String> {
    let pointers: Vec<String> = match op["jsonPath"].as_str() {
        Some(path) => {
            let q = serde_json_path::JsonPath::parse(path).map_err(|e| format!("JSONPath {path}: {e}"))?;
            q.query_located(resource).locations().map(|loc| loc.to_json_pointer()).collect()
        }
        None => vec![String::new()],
    };
    if pointers.is_empty() {
        return Err(format!("JSONPath {} matches nothing in {name}", op["jsonPath"]));
    }
    for ptr in &pointers {
        let one = json!([{"op": op["op"], "path": format!("{ptr}{}", op["path"].as_str().unwrap_or("")), "value": op["value"]}]);
        let patch: json_patch::Patch = serde_json::from_value(one).unwrap();
        json_patch::patch(resource, &patch).map_err(|e| e.to_string())?;
    }
    Ok(pointers.len())
}
