//! The Envoy Gateway delivery path, live: what the controller renders for two routed HTTPRoutes
//! on one Gateway (`testdata/render/envoy-gateway-two-routes.yaml`: `chat` with a PREFIX_AWARE
//! policy, `code` annotated least-outstanding-requests), applied the way Envoy Gateway applies it,
//! carries real traffic through a real Envoy 1.40 (`.venv/bin/envoy`, `--concurrency 2`):
//!
//! - the release filter module (`<target>/wasm32-wasip1/release/warmpath_filter.wasm`) is served
//!   by the controller's own HTTP server (`feed::server::router`) and fetched by Envoy remotely,
//!   checked against the sha256 the `EnvoyExtensionPolicy`s carry;
//! - the same server serves each owner's feed (the endpoints of its route's pool of local upstream
//!   HTTP servers), which each filter polls through the cluster its `EnvoyPatchPolicy` adds;
//! - the listener is shaped like Envoy Gateway's (both filters disabled, each enabled on its own
//!   route), the route clusters use `override_host` (what the `BackendTrafficPolicy`'s
//!   `endpointOverride` becomes), and the rendered `EnvoyPatchPolicy`s are applied to it.
//!
//! A control runs the same gateway without the patch's listener operation
//! (`allow_on_headers_stop_iteration`) and shows PREFIX_AWARE requests hanging.
//!
//! Envoy, the release module and the recording upstreams come from `warmpath-harness` (so
//! `WARMPATH_ENVOY` and `WARMPATH_FILTER_WASM` apply here too). Everything listens on 127.0.0.1;
//! Envoy is killed and the servers stop when a test ends, passing or not. Needs `scripts/setup.sh`
//! (Envoy) and the release module (`cargo build -p warmpath-filter --target wasm32-wasip1 --release`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::envoy_gateway::{apply_patch_policy, enable_on_route, envoy_gateway_filter, hcm};
use common::static_cluster;
use serde_json::{json, Value};
use warmpath_controller::feed::server::{router, WasmBlob};
use warmpath_controller::feed::store::FeedStore;
use warmpath_controller::feed::FeedEndpoint;
use warmpath_controller::render::{override_host_lb_policy, WasmModule};
use warmpath_controller::routing::DESTINATION_HEADER;
use warmpath_core::headers::ORIGINAL_DST_HEADER;
use warmpath_envoy_config::type_url;
use warmpath_envoy_config::STRIP_FILTER_NAME;
use warmpath_harness::{filter_wasm, free_port, EnvoyProcess, Upstream};

/// Envoy worker threads: with more than one, each worker has its own filter VM (and prefix index).
const CONCURRENCY: u32 = 2;
/// Upstream servers per route pool.
const POOL_SIZE: usize = 3;
/// Bound on every request that is expected to complete.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The plain-HTTP Gateway listener's xDS listener, the one this gateway serves traffic on.
const HTTP_LISTENER: &str = "gateways/inference-gateway/http";

/// Serves `app` on 127.0.0.1 (a free port) on the test's runtime, which stops it when the test ends.
async fn serve(app: axum::Router) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    addr
}

/// The filter's metrics (`wasmcustom.warmpath.*`), without the `wasmcustom.` prefix.
async fn filter_stats(envoy: &EnvoyProcess) -> BTreeMap<String, u64> {
    let s = envoy.stats().await.expect("envoy /stats");
    s.with_prefix("wasmcustom.warmpath.").map(|(k, v)| (k.trim_start_matches("wasmcustom.").to_string(), v)).collect()
}

/// Connections accepted by each worker on the listener.
async fn worker_connections(envoy: &EnvoyProcess) -> Vec<u64> {
    let s = envoy.stats().await.expect("envoy /stats");
    let prefix = format!("listener.127.0.0.1_{}.worker_", envoy.config().listener_port);
    s.with_prefix(&prefix).filter(|(k, _)| k.ends_with(".downstream_cx_total")).map(|(_, v)| v).collect()
}

/// The gateway under test: Envoy, the controller's server, and the two pools.
struct Gateway {
    envoy: EnvoyProcess,
    http: reqwest::Client,
    /// Upstream addresses per route (`chat`, `code`).
    pools: BTreeMap<String, Vec<SocketAddr>>,
    /// The recording upstreams of both pools, by address.
    upstreams: BTreeMap<SocketAddr, Upstream>,
}

/// What an upstream answered.
#[derive(Debug)]
struct Answer {
    upstream: SocketAddr,
    /// The destination header the upstream received (the filter's pick), if any.
    picked: Option<String>,
}

impl Gateway {
    /// Renders the case, starts the controller's server and the pools, builds the Envoy
    /// Gateway-shaped bootstrap, applies the rendered `EnvoyPatchPolicy`s (their listener
    /// operations only if `listener_patches`), and starts Envoy.
    async fn start(listener_patches: bool) -> Self {
        Self::start_with(listener_patches, true).await
    }

    /// [`Self::start`]; with `module_reachable` false, Envoy fetches the module from a loopback port nothing
    /// listens on, so the wasm filters fail to load and `failOpen` passes requests through them.
    async fn start_with(listener_patches: bool, module_reachable: bool) -> Self {
        let module = filter_wasm().expect("release filter module");
        let blob = WasmBlob::new(std::fs::read(&module).unwrap_or_else(|e| panic!("{}: {e}", module.display())));
        let store = FeedStore::default();
        let server = serve(router(store.clone(), Some(blob.clone()))).await;
        // The module as the controller renders it (run.rs): its URL on the controller Service.
        let controller = common::controller_endpoint();
        let wasm = WasmModule {
            url: format!("http://{}:{}{}", controller.host(), controller.port, blob.path()),
            sha256: blob.sha256.clone(),
        };
        let objs = common::render_case("envoy-gateway-two-routes.yaml", wasm.clone()).await;
        let eeps: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "EnvoyExtensionPolicy").collect();
        let epps: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "EnvoyPatchPolicy").collect();
        assert_eq!((eeps.len(), epps.len()), (2, 2), "one of each per routed HTTPRoute");

        // Envoy Gateway fetches `code.http.url` into its wasm cache and hands Envoy a URL there;
        // here Envoy fetches the module from the controller's server directly (same bytes, and
        // Envoy checks them against the rendered sha256).
        let module_host =
            if module_reachable { server } else { SocketAddr::from(([127, 0, 0, 1], free_port().unwrap())) };
        let module_uri = format!("http://{module_host}{}", blob.path());
        let (mut filters, mut routes, mut clusters) = (vec![], vec![], vec![]);
        let (mut pools, mut upstreams) = (BTreeMap::new(), BTreeMap::new());
        for eep in &eeps {
            let w = &eep["spec"]["wasm"][0];
            assert_eq!(w["code"]["http"], json!({"url": wasm.url, "sha256": blob.sha256}));
            let route = eep["spec"]["targetRefs"][0]["name"].as_str().unwrap().to_string();
            let started = Upstream::start_many(POOL_SIZE).await.expect("upstreams");
            let pool: Vec<SocketAddr> = started.iter().map(Upstream::addr).collect();
            upstreams.extend(started.into_iter().map(|u| (u.addr(), u)));
            // The owner's feed, under the key its plugin configuration polls (`feed.path`).
            let feed_path = w["config"]["feed"]["path"].as_str().unwrap();
            let key = feed_path.strip_prefix("/v1/feed/").unwrap_or_else(|| panic!("feed path {feed_path}"));
            assert_eq!(warmpath_controller::routing::feed_path(key), feed_path);
            store.update(key, pool.iter().map(|a| FeedEndpoint { address: a.to_string(), load: None }).collect());

            let filter = envoy_gateway_filter(eep, &module_uri);
            let cluster = format!("httproute/llm/{route}/rule/0");
            routes.push(json!({"name": format!("{cluster}/match/0/*"), "match": {"prefix": format!("/{route}")},
                "route": {"cluster": cluster, "timeout": "10s"},
                "typed_per_filter_config": enable_on_route(filter["name"].as_str().unwrap())}));
            clusters.push(static_cluster(&cluster, &pool, Some(override_host_lb_policy())));
            filters.push(filter);
            pools.insert(route, pool);
        }
        // Envoy sends the module fetch to this cluster (the URL's host only names it).
        clusters.push(static_cluster("wasm_cluster", &[module_host], None));

        // Ports are set when Envoy starts (`with_ports`).
        let mut listeners = vec![json!({"name": HTTP_LISTENER,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "per_connection_buffer_limit_bytes": warmpath_envoy_config::ENVOY_GATEWAY_LISTENER_BUFFER_LIMIT_BYTES,
            "default_filter_chain": {"filters": [hcm(HTTP_LISTENER, &filters, routes)]}})];
        for epp in &epps {
            // The case's HTTPS Gateway listeners need certificates; this gateway serves plain HTTP
            // only, so their operations are left out (envoy_validate applies them).
            let mut epp = (*epp).clone();
            let ops = epp["spec"]["jsonPatches"].as_array_mut().unwrap();
            let before: BTreeSet<String> =
                ops.iter().filter(|p| is_listener_op(p)).map(|p| p["name"].as_str().unwrap().to_string()).collect();
            let https = ["gateways/inference-gateway/https-a", "gateways/inference-gateway/https-b"];
            assert_eq!(before, BTreeSet::from([HTTP_LISTENER.to_string(), https[0].to_string(), https[1].to_string()]));
            ops.retain(|p| !is_listener_op(p) || (listener_patches && p["name"] == HTTP_LISTENER));
            let applied = apply_patch_policy(&epp, &mut listeners, &mut clusters).unwrap();
            // Per policy: the native header strip inserted first, the option set on its wasm filter, and the body
            // limit on its route.
            assert_eq!(
                applied,
                3 * usize::from(listener_patches),
                "three operations per policy in the listener and its routes"
            );
        }
        let flags: Vec<Value> = listeners[0]["default_filter_chain"]["filters"][0]["typed_config"]["http_filters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["name"] != "envoy.filters.http.router" && f["name"] != STRIP_FILTER_NAME)
            .map(|f| f["typed_config"]["config"]["allow_on_headers_stop_iteration"].clone())
            .collect();
        assert_eq!(flags, vec![if listener_patches { json!(true) } else { Value::Null }; 2]);
        let http_filters = &listeners[0]["default_filter_chain"]["filters"][0]["typed_config"]["http_filters"];
        if listener_patches {
            assert_eq!(http_filters[0]["name"], STRIP_FILTER_NAME, "the native strip runs first: {http_filters}");
        }

        // The feed clusters the patches add resolve the controller Service's cluster-local name
        // (STRICT_DNS); here the controller's server is on loopback, so point them there.
        let feed_clusters: Vec<&mut Value> =
            clusters.iter_mut().filter(|c| c["name"].as_str().unwrap().starts_with("warmpath-feed/")).collect();
        assert_eq!(feed_clusters.len(), 2, "one feed cluster per owner");
        for c in feed_clusters {
            assert_eq!(c["type"], "STRICT_DNS");
            let addr =
                &mut c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
            assert_eq!(
                (addr["address"].as_str(), addr["port_value"].as_u64()),
                (Some(controller.host().as_str()), Some(8080))
            );
            *addr = json!({"address": "127.0.0.1", "port_value": server.port()});
        }

        let bootstrap = json!({"static_resources": {"listeners": listeners, "clusters": clusters}});
        // A new connection per request, so requests spread over Envoy's workers (each with its own
        // filter VM and prefix index).
        let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).pool_max_idle_per_host(0).build().unwrap();
        // At most 30 s: the module is fetched from the controller's server and compiled first.
        let envoy = EnvoyProcess::start_bootstrap(
            |port, admin| with_ports(&bootstrap, port, admin),
            CONCURRENCY,
            Duration::from_secs(30),
        )
        .await
        .expect("envoy");
        Gateway { envoy, http, pools, upstreams }
    }

    /// POSTs `body` to `path` through Envoy with `headers`; `None` when no answer came within
    /// `timeout`.
    async fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)], timeout: Duration) -> Option<Answer> {
        let mut req = self.http.post(format!("{}{path}", self.envoy.url())).json(body).timeout(timeout);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.send().await {
            Ok(r) => {
                assert_eq!(r.status(), 200, "{path}: {:?}", r.text().await);
                let v: Value = r.json().await.unwrap();
                let upstream: SocketAddr = v["upstream"].as_str().unwrap().parse().unwrap();
                // Requests are sequential: the upstream's last recorded request is this one.
                let last =
                    self.upstreams[&upstream].requests().pop().expect("the answering upstream recorded the request");
                Some(Answer { upstream, picked: last.header(DESTINATION_HEADER).map(str::to_string) })
            }
            Err(e) if e.is_timeout() => None,
            Err(e) => panic!("{path}: {e}"),
        }
    }

    /// Polls the filter's metrics (at most `bound`) until `done` holds; returns the last reading.
    async fn stats_until(
        &self,
        bound: Duration,
        done: impl Fn(&BTreeMap<String, u64>) -> bool,
    ) -> BTreeMap<String, u64> {
        let deadline = Instant::now() + bound;
        loop {
            let s = filter_stats(&self.envoy).await;
            if done(&s) || Instant::now() >= deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `bootstrap` with its one listener on `port` and an admin listener on `admin`.
fn with_ports(bootstrap: &Value, port: u16, admin: u16) -> Value {
    let mut b = bootstrap.clone();
    assert_eq!(b["static_resources"]["listeners"].as_array().map(Vec::len), Some(1), "one listener");
    b["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = port.into();
    b["admin"] = json!({"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}});
    b
}

/// An operation on one xDS listener or on its route configuration (both named after the Gateway listener).
fn is_listener_op(p: &Value) -> bool {
    p["type"] == type_url::LISTENER || p["type"] == type_url::ROUTE_CONFIGURATION
}

/// A system prompt of about `len` characters, distinct per `seed`.
fn prompt(seed: &str, len: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("{seed}: rule {i} of the house style for answers about caches and prefixes. "));
        i += 1;
    }
    s
}

fn chat_body(system: &str, question: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_rendering_routes_real_traffic_in_envoy() {
    let gw = Gateway::start(true).await;
    let (chat, code) = (&gw.pools["chat"], &gw.pools["code"]);

    // Every filter VM (main thread + each worker, per policy) has applied its feed: each applies
    // on its own tick (the rendered interval is 5 s), so this takes up to two intervals.
    let vms = 2 * (u64::from(CONCURRENCY) + 1);
    let s =
        gw.stats_until(Duration::from_secs(15), |s| s.get("warmpath.feed.applied").copied().unwrap_or(0) >= vms).await;
    assert!(s.get("warmpath.feed.applied").copied().unwrap_or(0) >= vms, "feeds not applied in every VM: {s:?}");

    // (a) PREFIX_AWARE on /chat: the filter holds the headers until the body is in; with the
    // patched option this completes. Each prefix sticks to one chat upstream, the one it picked.
    let mut homes: BTreeMap<usize, BTreeSet<SocketAddr>> = BTreeMap::new();
    let (prefixes, repeats) = (6, 4);
    for round in 0..repeats {
        for p in 0..prefixes {
            let body = chat_body(&prompt(&format!("tenant {p}"), 3000), &format!("question {round}"));
            let a = gw.post("/chat/v1/chat/completions", &body, &[], REQUEST_TIMEOUT).await.unwrap_or_else(|| {
                panic!("PREFIX_AWARE /chat request {round}/{p} did not complete in {REQUEST_TIMEOUT:?}")
            });
            assert!(chat.contains(&a.upstream), "/chat answered by {} outside the chat pool {chat:?}", a.upstream);
            assert_eq!(a.picked, Some(a.upstream.to_string()), "the filter's pick is the upstream that answered");
            homes.entry(p).or_default().insert(a.upstream);
        }
    }
    for (p, h) in &homes {
        assert_eq!(h.len(), 1, "prefix {p} went to {h:?}");
    }
    // ... across workers: the requests came on new connections, spread over both workers.
    let workers = worker_connections(&gw.envoy).await;
    assert!(
        workers.len() == CONCURRENCY as usize && workers.iter().all(|n| *n > 0),
        "connections per worker: {workers:?}"
    );

    // (b) /code: the least-outstanding-requests filter picks among the code pool only.
    let code_requests = 12;
    let mut used = BTreeSet::new();
    for i in 0..code_requests {
        let body = json!({"model": "m", "prompt": format!("def f{i}():")});
        let a = gw.post("/code/v1/completions", &body, &[], REQUEST_TIMEOUT).await.expect("/code request completes");
        assert!(code.contains(&a.upstream), "/code answered by {} outside the code pool {code:?}", a.upstream);
        assert_eq!(a.picked, Some(a.upstream.to_string()));
        used.insert(a.upstream);
    }

    // (c) A client-sent destination header does not steer /chat: neither to a code upstream nor
    // to a chat upstream other than the prefix's own.
    let (p, home) = homes.iter().next().map(|(p, h)| (*p, *h.iter().next().unwrap())).unwrap();
    let other_chat = chat.iter().find(|a| **a != home).unwrap().to_string();
    let body = chat_body(&prompt(&format!("tenant {p}"), 3000), "spoofed");
    for spoof in [code[0].to_string(), other_chat] {
        let a = gw
            .post("/chat/v1/chat/completions", &body, &[(DESTINATION_HEADER, &spoof)], REQUEST_TIMEOUT)
            .await
            .expect("completes");
        assert_eq!(a.upstream, home, "client header {spoof} steered the request");
        assert_eq!(a.picked, Some(home.to_string()));
    }

    // Each filter decided exactly its own route's requests (flushed on each VM's tick).
    let chat_total = (prefixes * repeats + 2) as u64;
    let sum = |s: &BTreeMap<String, u64>, prefix: &str| {
        s.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum::<u64>()
    };
    let s = gw
        .stats_until(Duration::from_secs(12), |s| {
            sum(s, "warmpath.decisions.prefix_aware.") >= chat_total
                && sum(s, "warmpath.decisions.least_outstanding_requests.") >= code_requests
        })
        .await;
    assert_eq!(sum(&s, "warmpath.decisions.prefix_aware."), chat_total, "{s:?}");
    assert_eq!(sum(&s, "warmpath.decisions.least_outstanding_requests."), code_requests, "{s:?}");
    assert_eq!(sum(&s, "warmpath.fail_open."), 0, "{s:?}");
    // The prefix index did the sticking: at most one miss per prefix in each worker's VM.
    let misses = s["warmpath.decisions.prefix_aware.consistent_pick"];
    assert!(misses <= (prefixes * CONCURRENCY as usize) as u64, "{misses} prefix misses: {s:?}");
    // Envoy's native strip removed the client's headers before the filters ran: nothing left for the filter.
    assert_eq!(s.get("warmpath.spoofed_header_removed").copied().unwrap_or(0), 0, "{s:?}");

    // (d) A prompt far above the listener's 32 KiB buffer (Envoy Gateway's default) is held, placed and served:
    // the rendered route limit gives the filter room (without it Envoy answers 413).
    let body = chat_body(&prompt("long system prompt", 300 << 10), "question");
    let a =
        gw.post("/chat/v1/chat/completions", &body, &[], REQUEST_TIMEOUT).await.expect("a 300 KiB prompt completes");
    assert!(chat.contains(&a.upstream), "/chat answered by {} outside the chat pool {chat:?}", a.upstream);
    assert_eq!(a.picked, Some(a.upstream.to_string()), "the filter placed it");
}

/// Sends `n` requests to `path` carrying the destination headers naming `target`; returns the answers.
async fn spoofed(gw: &Gateway, path: &str, target: &str, n: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for i in 0..n {
        let body = chat_body(&prompt(&format!("spoof {i}"), 500), "q");
        let headers = [(DESTINATION_HEADER, target), (ORIGINAL_DST_HEADER, target)];
        answers.push(gw.post(path, &body, &headers, REQUEST_TIMEOUT).await.expect("served (fail open)"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_rendering_with_an_unfetchable_module_does_not_let_the_client_choose() {
    let gw = Gateway::start_with(true, false).await;
    let target = gw.pools["chat"][1].to_string();
    let answers = spoofed(&gw, "/chat/v1/chat/completions", &target, 10).await;
    // No filter ran (module not loaded), yet no upstream saw the client's header, and Envoy's fallback spread
    // the requests instead of sending them all where the client asked.
    assert!(answers.iter().all(|a| a.picked.is_none()), "a client header reached an upstream: {answers:?}");
    assert!(
        answers.iter().any(|a| a.upstream.to_string() != target),
        "every request went where the client asked: {answers:?}"
    );
    let s = filter_stats(&gw.envoy).await;
    assert_eq!(s.values().sum::<u64>(), 0, "the filter is not running: {s:?}");
}

/// The Istio rendering applied the way Istio applies its `EnvoyFilter` patches (`INSERT_FIRST` and
/// `INSERT_BEFORE` the router in the gateway's HTTP filter chain, `MERGE` into the backend Service's outbound
/// cluster), with the module fetched from a loopback port nothing listens on: the wasm filter fails to load and
/// `FAIL_OPEN` passes requests through, but the native strip the rendering puts first still removes the client's
/// destination headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_rendering_with_an_unfetchable_module_does_not_let_the_client_choose() {
    let controller = common::controller_endpoint();
    let wasm = WasmModule {
        url: format!("http://{}:{}/wasm/warmpath_filter-0.wasm", controller.host(), controller.port),
        sha256: "0".repeat(64),
    };
    let objs = common::render_case("istio-annotated.yaml", wasm).await;
    let envoy_filters: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "EnvoyFilter").collect();
    assert_eq!(envoy_filters.len(), 1, "{objs:?}");
    let patches = envoy_filters[0]["spec"]["configPatches"].as_array().unwrap();
    let started = Upstream::start_many(POOL_SIZE).await.expect("upstreams");
    let pool: Vec<SocketAddr> = started.iter().map(Upstream::addr).collect();

    let mut http_filters = vec![json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": type_url::ROUTER}})];
    let mut backend = None;
    let mut module_cluster = None;
    for p in patches {
        let value = &p["patch"]["value"];
        match (p["applyTo"].as_str().unwrap(), p["patch"]["operation"].as_str().unwrap()) {
            ("HTTP_FILTER", "INSERT_FIRST") => http_filters.insert(0, value.clone()),
            ("HTTP_FILTER", "INSERT_BEFORE") => {
                assert_eq!(
                    p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
                    "envoy.filters.http.router"
                );
                let at = http_filters.len() - 1;
                module_cluster = value["typed_config"]["config"]["vm_config"]["code"]["remote"]["http_uri"]["cluster"]
                    .as_str()
                    .map(str::to_string);
                http_filters.insert(at, value.clone());
            }
            ("CLUSTER", "MERGE") => {
                let m = &p["match"]["cluster"];
                let name = format!("outbound|{}||{}", m["portNumber"], m["service"].as_str().unwrap());
                let mut c = static_cluster(&name, &pool, None);
                c["load_balancing_policy"] = value["load_balancing_policy"].clone();
                backend = Some((name, c));
            }
            other => panic!("unexpected patch {other:?}"),
        }
    }
    assert_eq!(http_filters[0]["name"], STRIP_FILTER_NAME, "the native strip runs first");
    let (backend_name, backend_cluster) = backend.expect("a CLUSTER patch");
    // The module's cluster is the controller Service's outbound cluster: here a loopback port with no server.
    let module_cluster = module_cluster.expect("a remote module");
    let dead = SocketAddr::from(([127, 0, 0, 1], free_port().unwrap()));

    let routes = vec![json!({"match": {"prefix": "/"}, "route": {"cluster": backend_name, "timeout": "10s"}})];
    let listener = json!({"name": "istio-gateway",
    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
    "filter_chains": [{"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": type_url::HTTP_CONNECTION_MANAGER,
            "stat_prefix": "http",
            "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": routes}]},
            "http_filters": http_filters,
        }}]}]});
    let bootstrap = json!({
        "static_resources": {"listeners": [listener], "clusters": [backend_cluster, static_cluster(&module_cluster, &[dead], None)]},
    });
    let http = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).pool_max_idle_per_host(0).build().unwrap();
    // At most 30 s: Envoy gives up on the unreachable module first.
    let envoy = EnvoyProcess::start_bootstrap(
        |port, admin| with_ports(&bootstrap, port, admin),
        CONCURRENCY,
        Duration::from_secs(30),
    )
    .await
    .expect("envoy");
    let upstreams = started.into_iter().map(|u| (u.addr(), u)).collect();
    let gw = Gateway { envoy, http, pools: BTreeMap::from([("backend".to_string(), pool.clone())]), upstreams };
    let target = pool[1].to_string();
    let answers = spoofed(&gw, "/v1/chat/completions", &target, 10).await;
    assert!(answers.iter().all(|a| a.picked.is_none()), "a client header reached an upstream: {answers:?}");
    assert!(
        answers.iter().any(|a| a.upstream.to_string() != target),
        "every request went where the client asked: {answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_patch_option_prefix_aware_requests_hang() {
    let gw = Gateway::start(false).await;
    // The /chat route and its filter work: a request without a body is routed at header time.
    let got = gw.http.get(format!("{}/chat/v1/models", gw.envoy.url())).send().await.expect("GET /chat completes");
    assert_eq!(got.status(), 200);
    // Not a timing assertion: a request that completes at all shows the option is not needed.
    let body = chat_body(&prompt("control", 3000), "question");
    let hung = gw.post("/chat/v1/chat/completions", &body, &[], Duration::from_secs(3)).await;
    assert!(hung.is_none(), "PREFIX_AWARE request completed without allow_on_headers_stop_iteration: {hung:?}");
    // The gateway itself works: the /code filter does not pause, so its requests complete.
    let a = gw.post("/code/v1/completions", &json!({"model": "m", "prompt": "x"}), &[], REQUEST_TIMEOUT).await;
    assert!(a.is_some_and(|a| gw.pools["code"].contains(&a.upstream)), "/code failed in the control gateway");
}
