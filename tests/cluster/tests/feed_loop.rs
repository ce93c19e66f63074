//! The feed loop against the in-memory API client: a backend's ready endpoints (EndpointSlices, or an
//! InferencePool's pods) are scraped into a versioned snapshot.

use serde_json::json;
use warmpath_cluster_tests::fixtures;
use warmpath_controller::crd::routing_policy::LoadSource;
use warmpath_controller::feed::discovery;
use warmpath_controller::feed::refresh::refresh;
use warmpath_controller::reconcile::FeedSource;
use warmpath_controller::render::ResolvedBackend;

async fn metrics_server(body: &'static str) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new().route("/metrics", axum::routing::get(move || async move { body }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    (
        addr,
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        }),
    )
}

#[tokio::test]
async fn endpoint_slices_are_scraped_into_a_versioned_snapshot() {
    let (addr, srv) =
        metrics_server("sglang:num_queue_reqs 4\nsglang:num_running_reqs 6\nsglang:token_usage 0.7\n").await;
    let port = addr.port() as i64;
    let mut slice = fixtures::endpoint_slice("llm", "sglang", port, &["127.0.0.1"]);
    // A not-ready endpoint is left out of the feed.
    slice["endpoints"].as_array_mut().unwrap().push(json!({"addresses": ["10.9.9.9"], "conditions": {"ready": false}}));
    let client = fixtures::client(vec![fixtures::service("llm", "sglang", 30000), slice]).await;
    // The Service port is 30000, its target port (in the slice) is the metrics server's port.
    let ctx = fixtures::context(client);
    let key = "policy/llm/p";
    ctx.set_feed_source(
        key,
        FeedSource {
            backend: ResolvedBackend::Service { namespace: "llm".into(), name: "sglang".into(), port: 30000 },
            load: LoadSource::default(),
        },
    );
    let http = reqwest::Client::new();
    let first = refresh(&ctx, &http, key).await.unwrap();
    let snap = ctx.feeds.get(key).unwrap();
    assert_eq!(snap.endpoints.len(), 1);
    assert_eq!(snap.endpoints[0].address, format!("127.0.0.1:{port}"));
    let load = snap.endpoints[0].load.unwrap();
    assert_eq!((load.waiting, load.running), (4, 6));
    assert!((load.kv_cache_usage - 0.7).abs() < 1e-6);
    assert_eq!(refresh(&ctx, &http, key).await.unwrap(), first, "same content, same version");
    srv.abort();
    let _ = srv.await;
    // Server gone: the endpoint stays, its load is dropped, and the version moves.
    assert_eq!(refresh(&ctx, &http, key).await.unwrap(), first + 1);
    assert!(ctx.feeds.get(key).unwrap().endpoints[0].load.is_none());
    assert!(ctx.metrics.encode().contains("warmpath_feed_scrapes_total{result=\"error\"} 1"));
}

#[tokio::test]
async fn inference_pool_pods_are_discovered() {
    let pool = json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": "llm"},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}});
    let pod = |name: &str, ip: &str, ready: &str, app: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}})
    };
    let client = fixtures::client(vec![
        pool,
        pod("a", "10.0.0.1", "True", "vllm"),
        pod("b", "10.0.0.2", "False", "vllm"),
        pod("c", "10.0.0.3", "True", "other"),
    ])
    .await;
    let backend = ResolvedBackend::InferencePool { namespace: "llm".into(), name: "pool".into() };
    let t = discovery::targets(&client, &backend, &LoadSource { metrics_port: Some(9100), ..LoadSource::default() })
        .await
        .unwrap();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!((t[0].address.as_str(), t[0].metrics_address.as_str()), ("10.0.0.1:8000", "10.0.0.1:9100"));
    let missing = ResolvedBackend::InferencePool { namespace: "llm".into(), name: "nope".into() };
    assert!(discovery::targets(&client, &missing, &LoadSource::default()).await.unwrap_err().contains("not found"));
}
