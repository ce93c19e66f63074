//! Helpers shared by the controller's Envoy tests (`envoy_validate`, `envoy_live`): offline
//! rendering of a `testdata/render` case, static Envoy clusters, and the Envoy Gateway shaping in
//! [`envoy_gateway`].

pub mod envoy_gateway;

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::Value;
use warmpath_controller::reconcile::ControllerConfig;
use warmpath_controller::render::{ControllerEndpoint, WasmModule};

/// The controller Service every case is rendered for (the address the rendered feed clusters and
/// module URLs name).
pub fn controller_endpoint() -> ControllerEndpoint {
    ControllerEndpoint::new("warmpath-controller", "warmpath-system", 8080)
}

/// Renders `testdata/render/<case>` offline (the real reconcilers against the in-memory API, as
/// `warmpath-controller render -f` does) with module `wasm`; returns every object as JSON.
pub async fn render_case(case: &str, wasm: WasmModule) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/render").join(case);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config =
        ControllerConfig { wasm, controller: controller_endpoint(), live_status: false, ..ControllerConfig::default() };
    let manifests = warmpath_controller::offline::parse_manifests(&text).unwrap();
    let out = warmpath_controller::offline::render(manifests, config).await.unwrap();
    out.objects.iter().map(|o| serde_json::to_value(o).unwrap()).collect()
}

/// A STATIC cluster over `hosts`, with `lb` as its `load_balancing_policy` if given (the same fragment the
/// bootstraps use).
pub fn static_cluster(name: &str, hosts: &[SocketAddr], lb: Option<Value>) -> Value {
    let hosts: Vec<(String, u16)> = hosts.iter().map(|a| (a.ip().to_string(), a.port())).collect();
    warmpath_envoy_config::cluster(name, warmpath_envoy_config::Discovery::Static, &hosts, 2, lb)
}
