//! Config-level checks: every rendered bootstrap passes `envoy --mode validate`, the committed `envoy/*.yaml`
//! match the renderer, and a bad plugin config stops Envoy with a clear message.

use std::time::Duration;

use serde_json::json;
use warmpath_harness::{workspace_root, EnvoyConfig, EnvoyProcess, FeedCluster, Upstream};

use crate::common::{Rig, CONCURRENCY};

fn addrs() -> Vec<std::net::SocketAddr> {
    (8001..=8003).map(|p| format!("127.0.0.1:{p}").parse().expect("addr")).collect()
}

#[test]
fn rendered_configs_pass_envoy_validation() {
    let wasm = warmpath_harness::filter_wasm().expect("filter module");
    let plugin = EnvoyConfig::plugin_json(&addrs(), json!({}));
    let base = EnvoyConfig::new(addrs(), plugin).ports(10000, 9901);
    let feed = FeedCluster { name: "warmpath_feed".into(), address: "127.0.0.1:8090".parse().expect("addr") };
    // Two routes to two clusters with one filter instance each (several policies on one listener).
    let pools = base
        .clone()
        .with_wasm(&wasm)
        .with_pool("pool-a", "/a/", addrs()[..1].to_vec())
        .with_pool("pool-b", "/b/", addrs()[1..].to_vec())
        .with_plugin("warmpath-a", EnvoyConfig::plugin_json(&addrs()[..1], json!({"upstream_clusters": ["pool-a"]})))
        .with_plugin("warmpath-b", EnvoyConfig::plugin_json(&addrs()[1..], json!({"upstream_clusters": ["pool-b"]})));
    let rig = base.clone().with_wasm(&wasm).with_rig_headers();
    for cfg in [base.clone(), base.clone().with_wasm(&wasm), base.with_wasm(&wasm).with_feed(feed), pools, rig] {
        EnvoyProcess::validate(&cfg).expect("valid bootstrap");
    }
}

#[test]
fn committed_envoy_configs_are_current_and_valid() {
    let root = workspace_root();
    let wasm = warmpath_harness::filter_wasm().expect("filter module");
    for (file, cfg) in warmpath_harness::example_configs() {
        let committed = std::fs::read_to_string(root.join(file)).expect("committed config");
        assert_eq!(committed, cfg.render_static_yaml(), "{file} is stale: run `scripts/envoy.sh examples`");
        // The committed file names the module relative to the workspace root; validate with the built module.
        let cfg = if cfg.wasm.is_some() { cfg.with_wasm(&wasm) } else { cfg };
        EnvoyProcess::validate(&cfg).expect("valid");
    }
}

/// The debug header is for test rigs: every plugin configuration the project ships has it off, and no shipped
/// bootstrap adds the rig headers.
#[test]
fn shipped_configs_leave_the_debug_header_and_the_rig_headers_off() {
    // The example configurations leave `endpoints` to the launcher, so read the field itself.
    let debug = |json: &str| {
        let v: serde_json::Value = serde_json::from_str(json).expect("plugin config is JSON");
        v.get("debug_header").and_then(serde_json::Value::as_bool).unwrap_or(false)
    };
    assert!(!debug(warmpath_harness::EXAMPLE_PLUGIN_CONFIG), "envoy/plugin-config.json");
    for (file, cfg) in warmpath_harness::example_configs() {
        assert!(!debug(&cfg.plugin_config) && !cfg.rig_headers, "{file}");
        assert!(!cfg.render_static_yaml().contains("x-rig-"), "{file}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_plugin_config_is_rejected_with_a_clear_message() {
    let upstreams = Upstream::start_many(3).await.expect("upstreams");
    for (extra, needle) in [
        (json!({"strategy": "FASTEST"}), "FASTEST"),
        (json!({"concurrency_threshold": 5000}), "concurrency_threshold"),
        (json!({"endpoints": ["not-an-address"]}), "endpoints[0]"),
        (json!({"upstream_clusters": ["pool-a", ""]}), "upstream_clusters[1]"),
        // Endpoints Envoy could never honour.
        (json!({"endpoints": ["127.0.0.1:0"]}), "endpoints[0]"),
        (json!({"endpoints": ["127.0.0.1:18001", "[::ffff:127.0.0.1]:18001"]}), "endpoints[1]"),
    ] {
        let cfg = Rig::config(&upstreams, extra);
        let mut envoy = EnvoyProcess::spawn(cfg, CONCURRENCY, false).expect("spawn");
        let code = envoy.wait_exit(Duration::from_secs(30)).await.expect("envoy refuses to start");
        assert_ne!(code, 0);
        let log = envoy.log();
        assert!(log.contains("rejected plugin configuration") && log.contains(needle), "unclear log:\n{log}");
    }
}

/// A plugin configuration that is not a JSON object is refused with that reason, not with a serde message about
/// the first array element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_config_that_is_not_an_object_is_refused_as_such() {
    let upstreams = Upstream::start_many(1).await.expect("upstreams");
    let addr = upstreams[0].addr();
    let cfg = EnvoyConfig::new(vec![addr], format!(r#"["{addr}"]"#))
        .with_wasm(warmpath_harness::filter_wasm().expect("filter module"));
    let mut envoy = EnvoyProcess::spawn(cfg, CONCURRENCY, false).expect("spawn");
    let code = envoy.wait_exit(Duration::from_secs(30)).await.expect("envoy refuses to start");
    assert_ne!(code, 0);
    let log = envoy.log();
    assert!(
        log.contains("the plugin configuration must be a JSON object"),
        "unclear log:
{log}"
    );
    assert!(!log.contains("unknown variant"), "{log}");
}
