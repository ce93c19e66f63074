//! Renders Envoy bootstraps for warmpath: one HTTP listener with the wasm filter in front of a cluster of model-server
//! endpoints whose load-balancing policy is `envoy.load_balancing_policies.override_host` (reads
//! `x-gateway-destination-endpoint`, falls back to least-request).
//!
//! The config is built as a `serde_json::Value` and printed as YAML, so there is one source of truth for the shape;
//! `envoy/*.yaml` are outputs of this module (see `bin/warmpath-envoy.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use warmpath_envoy_config as envoy_config;
use warmpath_envoy_config::type_url;

/// Prefix under which Envoy exports the filter's proxy-wasm metrics in `/stats` (`wasmcustom.` + the metric name
/// defined by the filter, which starts with `warmpath.`).
pub const FILTER_STAT_PREFIX: &str = "wasmcustom.warmpath.";

/// Name of the cluster holding the model-server endpoints.
pub const MODEL_CLUSTER: &str = "model_servers";

/// A cluster the filter's feed poller calls (`feed.cluster` in the plugin config) — a STATIC cluster of one address.
#[derive(Debug, Clone)]
pub struct FeedCluster {
    /// Cluster name, as written in the plugin config's `feed.cluster`.
    pub name: String,
    /// The feed server's address (loopback).
    pub address: SocketAddr,
}

/// A module fetched over HTTP (see [`EnvoyConfig::wasm_remote`]).
#[derive(Debug, Clone)]
pub struct RemoteModule {
    /// The server holding the module (loopback).
    pub address: SocketAddr,
    /// URL path of the module on it.
    pub path: String,
    /// Lower-case hex SHA-256 of the module.
    pub sha256: String,
}

/// Response header of a test rig ([`EnvoyConfig::rig_headers`]): the filter's decision record for the operator,
/// `<IP:port>;<reason>;matched=<n>`, copied by Envoy from the filter state the filter writes
/// ([`warmpath_core::headers::DECISION_PROPERTY`]).
pub const RIG_DECISION_HEADER: &str = "x-rig-decision";

/// Response header of a test rig ([`EnvoyConfig::rig_headers`]): the upstream host that answered, Envoy's
/// `%UPSTREAM_HOST%`.
pub const RIG_UPSTREAM_HEADER: &str = "x-rig-upstream-host";

/// Cluster the remote module is fetched through.
const WASM_MODULE_CLUSTER: &str = "wasm_module";

/// A further route of the listener, ahead of the catch-all route to [`MODEL_CLUSTER`]: requests whose path starts
/// with `path_prefix` go to the cluster `cluster` of `upstreams`, load-balanced like the model cluster
/// (`override_host` reading the destination header, least-request fallback).
#[derive(Debug, Clone)]
pub struct Pool {
    /// Envoy cluster name (what the filter sees as `xds.cluster_name`, and lists in `upstream_clusters`).
    pub cluster: String,
    /// Route match: path prefix, e.g. `/a/`.
    pub path_prefix: String,
    /// The cluster's endpoints (loopback IP:port).
    pub upstreams: Vec<SocketAddr>,
}

/// One warmpath filter instance of the listener's HTTP filter chain (all instances share the module and the VM).
#[derive(Debug, Clone)]
pub struct PluginInstance {
    /// Envoy `plugin_name` (also the HTTP filter's name). The filter keeps one router per plugin name in a VM, so
    /// instances with different configurations need different names.
    pub name: String,
    /// The plugin configuration JSON (see docs/filter.md).
    pub config: String,
}

/// Everything a rendered Envoy bootstrap depends on. Build with [`EnvoyConfig::new`] and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    /// Listener port on 127.0.0.1 (0 only makes sense for `--mode validate`).
    pub listener_port: u16,
    /// Admin port on 127.0.0.1 (serves `/ready`, `/stats`).
    pub admin_port: u16,
    /// Model-server endpoints of the `model_servers` cluster (IP:port).
    pub upstreams: Vec<SocketAddr>,
    /// The filter module; `None` renders the same listener without the wasm filter (the benchmark baseline).
    pub wasm: Option<PathBuf>,
    /// The plugin configuration JSON handed to the filter's `on_configure` (see docs/filter.md).
    pub plugin_config: String,
    /// Optional feed cluster for the filter's endpoint/load poller.
    pub feed: Option<FeedCluster>,
    /// Listener `per_connection_buffer_limit_bytes` (bytes): bodies the filter buffers beyond this get a 413 from
    /// Envoy, so it must exceed the plugin's `max_body_bytes`. Default 4 MiB.
    pub buffer_limit_bytes: u32,
    /// Route `request_body_buffer_limit` (bytes) of every route: raises the stream's buffer limit above
    /// [`Self::buffer_limit_bytes`] (`warmpath_envoy_config::ROUTE_BODY_BUFFER_LIMIT_BYTES` is what the controller
    /// renders on Envoy Gateway). Default `None`: the listener's limit applies.
    pub route_body_buffer_limit_bytes: Option<u64>,
    /// Route timeout in seconds (0 = none). Default 60.
    pub route_timeout_s: u32,
    /// Remove client-sent destination headers in a native `header_mutation` filter placed first in the chain
    /// (default true), so that no failure of the wasm VM — crash, load failure, which `FAIL_OPEN` passes
    /// through — can let a client choose the destination. The filter strips them itself either way; the
    /// spoofing test turns this off to prove that.
    pub strip_in_envoy: bool,
    /// Further routes, each to its own cluster (default none: one catch-all route to [`MODEL_CLUSTER`]).
    pub pools: Vec<Pool>,
    /// Fetch the module over HTTP instead of reading [`Self::wasm`] from disk (what the controller renders): from
    /// this URL on a STATIC cluster `wasm_module` of the URL's address, checked against the SHA-256.
    pub wasm_remote: Option<RemoteModule>,
    /// The warmpath filter instances, in chain order. Empty (the default) means one instance named `warmpath`
    /// configured with `plugin_config`.
    pub plugins: Vec<PluginInstance>,
    /// Add [`RIG_DECISION_HEADER`] and [`RIG_UPSTREAM_HEADER`] to every response (default false): Envoy, not the
    /// filter, tells the client which backend answered and what the filter decided. For test rigs and benchmarks
    /// whose clients are the operator; never in a configuration that faces clients, since the decision record
    /// tells how much of a prompt other clients already sent.
    pub rig_headers: bool,
    /// The retry policy of every route (default `warmpath_envoy_config::retry_policy()`); a test replaces it to see
    /// the filter under another provider's route policy.
    pub route_retry_policy: Value,
    /// Write Envoy's own timing of every request to this file ([`crate::timing`]; default none).
    pub timing_log: Option<PathBuf>,
}

impl EnvoyConfig {
    /// A config for `upstreams` with the given plugin configuration JSON, ports 0 (set them with [`Self::ports`]).
    pub fn new(upstreams: Vec<SocketAddr>, plugin_config: impl Into<String>) -> Self {
        EnvoyConfig {
            listener_port: 0,
            admin_port: 0,
            upstreams,
            wasm: None,
            plugin_config: plugin_config.into(),
            feed: None,
            buffer_limit_bytes: 4 << 20,
            route_body_buffer_limit_bytes: None,
            route_timeout_s: 60,
            strip_in_envoy: true,
            pools: Vec::new(),
            wasm_remote: None,
            plugins: Vec::new(),
            rig_headers: false,
            route_retry_policy: envoy_config::retry_policy(),
            timing_log: None,
        }
    }

    /// Sets the listener and admin ports.
    pub fn ports(mut self, listener_port: u16, admin_port: u16) -> Self {
        self.listener_port = listener_port;
        self.admin_port = admin_port;
        self
    }

    /// Puts the wasm filter (this module file) in the listener.
    pub fn with_wasm(mut self, wasm: impl Into<PathBuf>) -> Self {
        self.wasm = Some(wasm.into());
        self
    }

    /// Adds a route (path prefix → its own `override_host` cluster) ahead of the catch-all route.
    pub fn with_pool(
        mut self,
        cluster: impl Into<String>,
        path_prefix: impl Into<String>,
        upstreams: Vec<SocketAddr>,
    ) -> Self {
        self.pools.push(Pool { cluster: cluster.into(), path_prefix: path_prefix.into(), upstreams });
        self
    }

    /// Appends a warmpath filter instance named `name` with plugin configuration `config` to the chain (the first
    /// call replaces the default single instance configured by `plugin_config`). Needs [`Self::with_wasm`].
    pub fn with_plugin(mut self, name: impl Into<String>, config: impl Into<String>) -> Self {
        self.plugins.push(PluginInstance { name: name.into(), config: config.into() });
        self
    }

    /// Turns on [`Self::rig_headers`].
    pub fn with_rig_headers(mut self) -> Self {
        self.rig_headers = true;
        self
    }

    /// Logs Envoy's own timing of every request to `path` ([`crate::timing`]).
    pub fn with_timing_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.timing_log = Some(path.into());
        self
    }

    /// Adds a feed cluster for the filter's poller.
    pub fn with_feed(mut self, feed: FeedCluster) -> Self {
        self.feed = Some(feed);
        self
    }

    /// The plugin configuration a test writes for `endpoints` plus extra fields (a JSON object whose keys override).
    ///
    /// `endpoints` is always set from `upstreams`.
    pub fn plugin_json(upstreams: &[SocketAddr], extra: Value) -> String {
        let mut cfg = json!({
            "endpoints": upstreams.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        });
        if let (Some(base), Value::Object(extra)) = (cfg.as_object_mut(), extra) {
            for (k, v) in extra {
                base.insert(k, v);
            }
        }
        cfg.to_string()
    }

    /// The HTTP filter list of the listener: the native header strip (also without the wasm filter: the cluster's
    /// `override_host` policy would honour a client's header), the wasm filter (when configured), then the router.
    fn http_filters(&self) -> Value {
        let mut filters = Vec::new();
        if self.strip_in_envoy {
            filters.push(envoy_config::strip_client_destination_headers());
        }
        if let Some(wasm) = &self.wasm {
            let default = [PluginInstance { name: "warmpath".into(), config: self.plugin_config.clone() }];
            let instances = if self.plugins.is_empty() { &default[..] } else { &self.plugins[..] };
            for instance in instances {
                filters.push(self.wasm_filter(wasm, instance, instances.len() > 1));
            }
        }
        filters.push(envoy_config::router_filter());
        Value::Array(filters)
    }

    /// One wasm HTTP filter running `instance` of the module `wasm`, `FAIL_OPEN` (a crashed VM must not take
    /// traffic down: requests pass without a pick and Envoy's fallback policy routes them). With several instances
    /// each HTTP filter is named after its plugin (the wasm extension is found by its `typed_config` type, not by
    /// the filter name).
    fn wasm_filter(&self, wasm: &Path, instance: &PluginInstance, several: bool) -> Value {
        let path = path_str(wasm);
        let uri = self.wasm_remote.as_ref().map(|r| format!("http://{}{}", r.address, r.path));
        let code = match (&self.wasm_remote, &uri) {
            (Some(r), Some(uri)) => {
                envoy_config::WasmCode::Remote { uri, cluster: WASM_MODULE_CLUSTER, sha256: &r.sha256 }
            }
            _ => envoy_config::WasmCode::Local { path: &path },
        };
        envoy_config::wasm_http_filter(&envoy_config::WasmFilter {
            filter_name: if several { instance.name.as_str() } else { "envoy.filters.http.wasm" },
            plugin_name: &instance.name,
            code,
            configuration: &instance.config,
            fail_open: true,
        })
    }

    /// The route list: one prefix route per pool, then the catch-all route to [`MODEL_CLUSTER`], each with the
    /// retry policy that sends a request failed on a dead endpoint to another one (and the rig headers, when on).
    fn routes(&self) -> Value {
        let timeout = format!("{}s", self.route_timeout_s);
        let route = |prefix: &str, cluster: &str| {
            let mut r = json!({ "match": { "prefix": prefix }, "route": {
                "cluster": cluster, "timeout": timeout, "retry_policy": self.route_retry_policy } });
            if self.rig_headers {
                r["response_headers_to_add"] = rig_response_headers();
            }
            if let Some(limit) = self.route_body_buffer_limit_bytes {
                r["request_body_buffer_limit"] = limit.into();
            }
            r
        };
        let mut routes: Vec<Value> = self.pools.iter().map(|p| route(&p.path_prefix, &p.cluster)).collect();
        routes.push(route("/", MODEL_CLUSTER));
        Value::Array(routes)
    }

    /// The listener resource (used inline in a static bootstrap and as the LDS resource).
    pub fn listener(&self) -> Value {
        let mut listener = json!({
            "name": "warmpath_http",
            "address": { "socket_address": { "address": "127.0.0.1", "port_value": self.listener_port } },
            // Envoy binds with SO_REUSEPORT by default: two Envoys given the same port would both bind and split each
            // other's connections silently. Without it the second bind fails loudly (the harness then retries another
            // port). Workers then take connections as they wake instead of by the kernel's hash; the bench prints how
            // they spread.
            "enable_reuse_port": false,
            "per_connection_buffer_limit_bytes": self.buffer_limit_bytes,
            "filter_chains": [{
                "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": type_url::HTTP_CONNECTION_MANAGER,
                        "stat_prefix": "warmpath",
                        "codec_type": "AUTO",
                        "route_config": {
                            "name": "local",
                            "virtual_hosts": [{
                                "name": "models",
                                "domains": ["*"],
                                "routes": self.routes(),
                            }],
                        },
                        "http_filters": self.http_filters(),
                    },
                }],
            }],
        });
        if let Some(path) = &self.timing_log {
            listener["filter_chains"][0]["filters"][0]["typed_config"]["access_log"] = crate::timing::access_log(path);
        }
        listener
    }

    fn clusters(&self) -> Value {
        let mut clusters = vec![override_host_cluster(MODEL_CLUSTER, &self.upstreams)];
        clusters.extend(self.pools.iter().map(|p| override_host_cluster(&p.cluster, &p.upstreams)));
        if let Some(feed) = &self.feed {
            let host = [(feed.address.ip().to_string(), feed.address.port())];
            clusters.push(envoy_config::cluster(&feed.name, envoy_config::Discovery::Static, &host, 1, None));
        }
        if let Some(remote) = &self.wasm_remote {
            let host = [(remote.address.ip().to_string(), remote.address.port())];
            clusters.push(envoy_config::cluster(WASM_MODULE_CLUSTER, envoy_config::Discovery::Static, &host, 1, None));
        }
        Value::Array(clusters)
    }

    fn admin(&self) -> Value {
        json!({ "address": { "socket_address": { "address": "127.0.0.1", "port_value": self.admin_port } } })
    }

    /// A self-contained bootstrap with the listener inline.
    pub fn static_bootstrap(&self) -> Value {
        json!({
            "admin": self.admin(),
            "static_resources": { "listeners": [self.listener()], "clusters": self.clusters() },
        })
    }

    /// A bootstrap whose listener comes from the LDS file `lds_path` (watched in its directory), so a rewrite of that
    /// file (write + rename) reconfigures the listener — and the plugin — without restarting Envoy.
    pub fn lds_bootstrap(&self, lds_path: &Path) -> Value {
        let dir = lds_path.parent().map(path_str).unwrap_or_else(|| ".".into());
        json!({
            "node": { "id": "warmpath", "cluster": "warmpath" },
            "admin": self.admin(),
            "dynamic_resources": { "lds_config": {
                "resource_api_version": "V3",
                "path_config_source": { "path": path_str(lds_path), "watched_directory": { "path": dir } },
            } },
            "static_resources": { "clusters": self.clusters() },
        })
    }

    /// [`Self::static_bootstrap`] as YAML text.
    pub fn render_static_yaml(&self) -> String {
        to_yaml(&self.static_bootstrap())
    }

    /// The LDS discovery response holding [`Self::listener`].
    pub fn lds_document(&self) -> Value {
        let mut listener = self.listener();
        listener["@type"] = type_url::LISTENER.into();
        json!({ "version_info": "0", "resources": [listener] })
    }
}

/// A STATIC cluster `name` of `upstreams` whose load-balancing policy is `override_host`: the filter's pick arrives
/// as the destination header; a header naming a host outside the cluster (or no header) falls back to least-request.
/// Outlier detection and a retry budget handle an endpoint that dies (see `warmpath_envoy_config`).
fn override_host_cluster(name: &str, upstreams: &[SocketAddr]) -> Value {
    let hosts: Vec<(String, u16)> = upstreams.iter().map(|a| (a.ip().to_string(), a.port())).collect();
    let mut c = envoy_config::cluster(
        name,
        envoy_config::Discovery::Static,
        &hosts,
        1,
        Some(envoy_config::override_host_lb_policy()),
    );
    c["outlier_detection"] = envoy_config::outlier_detection();
    c["circuit_breakers"] = envoy_config::circuit_breakers();
    c
}

/// Route `response_headers_to_add` of a test rig: Envoy's own record of the upstream host and the filter's decision
/// (from filter state; a request the filter did not place gets no decision header).
fn rig_response_headers() -> Value {
    let decision = format!("%FILTER_STATE(wasm.{}:PLAIN)%", warmpath_core::headers::DECISION_PROPERTY);
    json!([
        { "header": { "key": RIG_UPSTREAM_HEADER, "value": "%UPSTREAM_HOST%" } },
        { "header": { "key": RIG_DECISION_HEADER, "value": decision } },
    ])
}

/// Renders any config value as YAML text.
pub fn to_yaml(v: &Value) -> String {
    serde_yaml::to_string(v).unwrap_or_else(|e| format!("# yaml rendering failed: {e}\n"))
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The example plugin configuration committed as `envoy/plugin-config.json`.
pub const EXAMPLE_PLUGIN_CONFIG: &str = include_str!("../../envoy/plugin-config.json");

/// The committed example bootstraps (`envoy/*.yaml`, relative to the workspace root) and the configs that render
/// them: three model servers on 127.0.0.1:8001-8003, listener 10000, admin 9901, the module at the default cargo
/// path (Envoy resolves it against its working directory, so run it from the workspace root).
pub fn example_configs() -> Vec<(&'static str, EnvoyConfig)> {
    let addrs: Vec<SocketAddr> = (8001..=8003).map(|p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
    let mut plugin: Value = serde_json::from_str(EXAMPLE_PLUGIN_CONFIG).unwrap_or_else(|_| json!({}));
    if let Some(obj) = plugin.as_object_mut() {
        obj.insert("endpoints".into(), addrs.iter().map(|a| a.to_string()).collect());
    }
    let plugin = serde_json::to_string_pretty(&plugin).unwrap_or_default();
    let base = EnvoyConfig::new(addrs, plugin).ports(10000, 9901);
    vec![
        ("envoy/envoy.yaml", base.clone().with_wasm("target/wasm32-wasip1/release/warmpath_filter.wasm")),
        ("envoy/envoy-no-filter.yaml", base),
    ]
}
