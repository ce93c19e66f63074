//! The node loop against the in-memory API client (`kube-fake-client`) for Nodes and ModelCaches and a
//! real S3-compatible server (moto) for the bytes: the agent syncs the caches that target its node,
//! labels and reports on its own Node exactly as the controller reads it, reports failures with their
//! reason, and removes a cache (files, label, report) once it is deleted or no longer targets the node.

#[path = "../../../controller/agent/tests/common/mod.rs"]
mod common;

use std::{collections::BTreeMap, sync::Arc};

use common::{payload, sha256_hex, Mode, Moto, SwitchServer};
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{Api, DeleteParams, PostParams},
    Client, ResourceExt,
};
use kube_fake_client::ClientBuilder;
use tokio::sync::Semaphore;
use warmpath_agent::{disk::FixedFreeSpace, node::NodeAgent, SyncOptions};
use warmpath_api::model_cache::{
    cache_ready_label, parse_reports, phase, report_key, HttpSource, ModelCache, ModelCacheSpec, ModelSource, S3Source,
    NODE_CACHE_STATES,
};
use warmpath_controller::warming::model_cache::compute_status;

const NS: &str = "ml";
const HOST_PATH: &str = "/opt/warmpath/models";

async fn client() -> Client {
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gpu-a", "labels": {"pool": "gpu"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap();
    ClientBuilder::new()
        .with_resource::<ModelCache>()
        .with_status_subresource::<ModelCache>()
        .with_object(node)
        .build()
        .await
        .unwrap()
}

fn cache(name: &str, moto: &Moto, prefix: &str, selector: &str, sha: BTreeMap<String, String>) -> ModelCache {
    let mut mc = ModelCache::new(
        name,
        ModelCacheSpec {
            source: ModelSource {
                s3: Some(S3Source {
                    bucket: "models".into(),
                    prefix: prefix.into(),
                    region: None,
                    endpoint: Some(moto.endpoint.clone()),
                }),
                ..Default::default()
            },
            node_selector: BTreeMap::from([("pool".to_string(), selector.to_string())]),
            sha256: sha,
            ..Default::default()
        },
    );
    mc.metadata.namespace = Some(NS.into());
    mc
}

fn agent(client: &Client, root: &std::path::Path, free: Option<u64>) -> NodeAgent {
    let mut o = SyncOptions::new(root);
    o.fetch.chunk_size = 64 * 1024;
    o.fetch.permits = Arc::new(Semaphore::new(4));
    o.reserve_bytes = 0;
    if let Some(f) = free {
        o.free_space = Arc::new(FixedFreeSpace(f));
    }
    NodeAgent::new(client.clone(), "gpu-a", HOST_PATH, o)
}

async fn node(client: &Client) -> Node {
    Api::<Node>::all(client.clone()).get("gpu-a").await.unwrap()
}

#[tokio::test]
async fn syncs_targeted_caches_reports_and_removes_them() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    let w = payload(300 * 1024, 11);
    moto.put("models", "llama/w.bin", w.clone()).await;
    let c = client().await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    caches
        .create(
            &PostParams::default(),
            &cache("llama", &moto, "llama/", "gpu", BTreeMap::from([("w.bin".into(), sha256_hex(&w))])),
        )
        .await
        .unwrap();
    caches.create(&PostParams::default(), &cache("elsewhere", &moto, "llama/", "cpu", BTreeMap::new())).await.unwrap();

    let root = tempfile::tempdir().unwrap();
    let a = agent(&c, root.path(), None);
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;

    let n = node(&c).await;
    assert_eq!(n.labels().get(&cache_ready_label(NS, "llama")).map(String::as_str), Some("true"));
    assert!(!n.labels().contains_key(&cache_ready_label(NS, "elsewhere")), "not a target of the cpu cache");
    let reports = parse_reports(n.annotations().get(NODE_CACHE_STATES));
    let r = &reports[&report_key(NS, "llama")];
    assert_eq!((r.state.as_str(), r.bytes_total), (phase::READY, w.len() as u64));
    assert_eq!(std::fs::read(root.path().join("ml.llama/current/w.bin")).unwrap(), w);
    assert!(!root.path().join("ml.elsewhere").exists());

    // Another pass with nothing changed does not refetch (same generation already synced).
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;

    // Retargeted away from this node (its label changes): removed; back again: synced again.
    let nodes: Api<Node> = Api::all(c.clone());
    let relabel = |pool: &'static str| serde_json::json!({"metadata": {"labels": {"pool": pool}}});
    nodes.patch("gpu-a", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(relabel("cpu"))).await.unwrap();
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    assert!(!node(&c).await.labels().contains_key(&cache_ready_label(NS, "llama")));
    assert!(!root.path().join("ml.llama").exists());
    assert!(root.path().join("ml.elsewhere/current/w.bin").exists(), "now a target of the cpu cache");
    nodes.patch("gpu-a", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(relabel("gpu"))).await.unwrap();
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    assert_eq!(std::fs::read(root.path().join("ml.llama/current/w.bin")).unwrap(), w);

    // Deleted: the agent removes files, then label and report (what the controller's finalizer waits for).
    caches.delete("llama", &DeleteParams::default()).await.unwrap();
    a.reconcile_once().await.unwrap();
    let n = node(&c).await;
    assert!(!n.labels().contains_key(&cache_ready_label(NS, "llama")));
    assert!(!parse_reports(n.annotations().get(NODE_CACHE_STATES)).contains_key(&report_key(NS, "llama")));
    assert!(!root.path().join("ml.llama").exists(), "files removed from the node");
}

#[tokio::test]
async fn failures_are_reported_with_their_reason() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    moto.put("models", "bad/w.bin", payload(200 * 1024, 12)).await;
    moto.put("models", "big/w.bin", payload(400 * 1024, 13)).await;
    let c = client().await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    caches
        .create(
            &PostParams::default(),
            &cache("bad", &moto, "bad/", "gpu", BTreeMap::from([("w.bin".into(), "00".repeat(32))])),
        )
        .await
        .unwrap();
    caches.create(&PostParams::default(), &cache("big", &moto, "big/", "gpu", BTreeMap::new())).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    // 300 KiB "free": the 200 KiB cache fits, the 400 KiB one is refused before downloading.
    let a = agent(&c, root.path(), Some(300 * 1024));
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    let n = node(&c).await;
    let reports = parse_reports(n.annotations().get(NODE_CACHE_STATES));
    let bad = &reports[&report_key(NS, "bad")];
    assert_eq!((bad.state.as_str(), bad.reason.as_deref()), (phase::FAILED, Some("ChecksumMismatch")));
    let big = &reports[&report_key(NS, "big")];
    assert_eq!((big.state.as_str(), big.reason.as_deref()), (phase::FAILED, Some("InsufficientDisk")));
    assert!(big.message.as_deref().unwrap().contains("need 409600 bytes"), "{:?}", big.message);
    assert_eq!((big.needed_bytes, big.available_bytes), (Some(409600), Some(300 * 1024)));
    assert!(!n.labels().keys().any(|l| l.starts_with("warmpath.dev/cache-ready-")), "no ready label on failure");

    // The ModelCache says which node it does not fit on, with the bytes needed and free.
    let mc = caches.get("big").await.unwrap();
    let st = compute_status(&mc, &[n], &now());
    let entry = &st.nodes[0];
    assert_eq!((entry.node.as_str(), entry.reason.as_deref()), ("gpu-a", Some("InsufficientDisk")));
    assert_eq!((entry.needed_bytes, entry.available_bytes), (Some(409600), Some(300 * 1024)));
    let ready = &st.conditions[0];
    assert!(
        ready.message.starts_with("node gpu-a: does not fit") && ready.message.contains("307200 bytes available"),
        "{}",
        ready.message
    );
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Writes the status the controller computes from the node into the ModelCache (what its reconciler
/// does), so the agent reads the pin.
async fn controller_pass(c: &Client, name: &str) -> ModelCache {
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    let mc = caches.get(name).await.unwrap();
    let st = compute_status(&mc, &[node(c).await], &now());
    let patch = serde_json::json!({"status": st});
    caches.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch)).await.unwrap()
}

/// The first verified version is pinned; when the object then changes under the same URL, the node
/// holding the pinned version keeps serving it (Ready, reason `SourceChanged`) and a node without it
/// refuses the changed source instead of fetching different bytes (Failed, no ready label).
#[tokio::test]
async fn a_pinned_cache_never_fetches_a_changed_object() {
    let served = tempfile::tempdir().unwrap();
    let file = served.path().join("w.bin");
    let (v1, v2) = (payload(128 * 1024, 17), payload(128 * 1024, 18));
    std::fs::write(&file, &v1).unwrap();
    let server = SwitchServer::start(served.path()).await;
    let c = client().await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    caches
        .create(&PostParams::default(), &http_cache("m", &format!("{}/w.bin", server.base), BTreeMap::new()))
        .await
        .unwrap();
    let warm = tempfile::tempdir().unwrap();
    let a = agent(&c, warm.path(), None);
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    let version = report_of(&c, "m").await.version.expect("a version");
    let pinned = controller_pass(&c, "m").await.status.unwrap().pinned.expect("pinned once a node verified it");
    assert_eq!((pinned.version.as_str(), pinned.node.as_str()), (version.as_str(), "gpu-a"));

    std::fs::write(&file, &v2).unwrap();
    // The agent sees the pin and re-checks the source: the changed object is not fetched.
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    let r = report_of(&c, "m").await;
    assert_eq!(
        (r.state.as_str(), r.reason.as_deref(), r.version.as_deref()),
        (phase::READY, Some("SourceChanged"), Some(version.as_str())),
        "{r:?}"
    );
    assert_eq!(std::fs::read(warm.path().join("ml.m/current/w.bin")).unwrap(), v1);
    assert_eq!(node(&c).await.labels().get(&cache_ready_label(NS, "m")).map(String::as_str), Some("true"));
    assert_eq!(controller_pass(&c, "m").await.status.unwrap().pinned.unwrap().version, version, "the pin never moves");

    // A node joining later (a fresh disk) refuses rather than serving v2 beside v1.
    let cold = tempfile::tempdir().unwrap();
    let b = agent(&c, cold.path(), None);
    b.reconcile_once().await.unwrap();
    b.wait_idle().await;
    let r = report_of(&c, "m").await;
    assert_eq!((r.state.as_str(), r.reason.as_deref()), (phase::FAILED, Some("SourceChanged")), "{r:?}");
    assert!(r.message.as_deref().unwrap().contains(&version), "{r:?}");
    assert!(
        !node(&c).await.labels().contains_key(&cache_ready_label(NS, "m")),
        "no ready label without the pinned version"
    );
    assert!(!cold.path().join("ml.m/current").exists());
}

fn http_cache(name: &str, url: &str, sha: BTreeMap<String, String>) -> ModelCache {
    let mut mc = ModelCache::new(
        name,
        ModelCacheSpec {
            source: ModelSource { http: Some(HttpSource { url: url.into() }), ..Default::default() },
            sha256: sha,
            ..Default::default()
        },
    );
    mc.metadata.namespace = Some(NS.into());
    mc
}

async fn report_of(c: &Client, name: &str) -> warmpath_api::model_cache::NodeCacheReport {
    parse_reports(node(c).await.annotations().get(NODE_CACHE_STATES)).remove(&report_key(NS, name)).expect("a report")
}

/// Files the agent did not create are never deleted and never make a pass fail; a root holding them
/// is refused with a clear reason until the operator allows it.
#[tokio::test]
async fn never_deletes_what_it_did_not_create() {
    let served = tempfile::tempdir().unwrap();
    let w = payload(200 * 1024, 14);
    std::fs::write(served.path().join("w.bin"), &w).unwrap();
    let server = SwitchServer::start(served.path()).await;
    let c = client().await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    let url = format!("{}/w.bin", server.base);
    caches
        .create(&PostParams::default(), &http_cache("llama", &url, BTreeMap::from([("w.bin".into(), sha256_hex(&w))])))
        .await
        .unwrap();

    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("team.checkpoints")).unwrap();
    std::fs::write(root.path().join("team.checkpoints/step-1000.pt"), b"someone's checkpoint").unwrap();
    std::fs::write(root.path().join("README.txt"), b"do not delete").unwrap();
    let survivors = || {
        assert_eq!(std::fs::read(root.path().join("team.checkpoints/step-1000.pt")).unwrap(), b"someone's checkpoint");
        assert_eq!(std::fs::read(root.path().join("README.txt")).unwrap(), b"do not delete");
    };

    // Not empty and not ours: refused, with the reason on the node, nothing touched or downloaded.
    let a = agent(&c, root.path(), None);
    let err = a.reconcile_once().await.unwrap_err();
    assert_eq!(err.reason(), "ForeignFiles", "{err}");
    let r = report_of(&c, "llama").await;
    assert_eq!((r.state.as_str(), r.reason.as_deref()), (phase::FAILED, Some("ForeignFiles")));
    assert!(r.message.unwrap().contains("README.txt"));
    assert_eq!(server.requests(), 0);
    survivors();

    // Allowed explicitly: syncs beside the foreign files, passes keep succeeding, removal spares them.
    let a = agent(&c, root.path(), None).with_allow_foreign_files(true);
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    assert_eq!(report_of(&c, "llama").await.state, phase::READY);
    std::fs::write(root.path().join("notes.later"), b"added after").unwrap();
    std::fs::write(root.path().join("ml.llama/mine.txt"), b"dropped into the cache").unwrap();
    a.reconcile_once().await.unwrap();
    survivors();
    caches.delete("llama", &DeleteParams::default()).await.unwrap();
    a.reconcile_once().await.unwrap();
    survivors();
    assert!(root.path().join("notes.later").exists());
    assert!(!root.path().join("ml.llama/current").exists(), "the cache itself is removed");
    assert!(root.path().join("ml.llama/mine.txt").exists(), "a foreign file inside the cache directory survives");

    // A later agent (restart) needs no flag: the root carries the agent's marker now.
    agent(&c, root.path(), None).reconcile_once().await.unwrap();
    survivors();
}

/// A checksum mismatch is retried with exponential back-off, not on every pass; a non-hex checksum is
/// refused before anything is fetched.
#[tokio::test]
async fn checksum_mismatch_backs_off_exponentially() {
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("w.bin"), payload(128 * 1024, 15)).unwrap();
    let server = SwitchServer::start(served.path()).await;
    let c = client().await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    let url = format!("{}/w.bin", server.base);
    caches
        .create(&PostParams::default(), &http_cache("bad", &url, BTreeMap::from([("w.bin".into(), "00".repeat(32))])))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let a = agent(&c, root.path(), None)
        .with_retry_backoff(std::time::Duration::from_secs(2), std::time::Duration::from_secs(60));
    let pass = || async {
        a.reconcile_once().await.unwrap();
        a.wait_idle().await;
        server.requests()
    };
    let first = pass().await;
    assert!(first > 0);
    let r = report_of(&c, "bad").await;
    assert_eq!(r.reason.as_deref(), Some("ChecksumMismatch"));
    assert!(r.message.unwrap().contains("next attempt in 2s"));
    assert_eq!(pass().await, first, "no new download within the back-off");
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let second = pass().await;
    assert!(second > first, "retried after the back-off");
    assert!(report_of(&c, "bad").await.message.unwrap().contains("next attempt in 4s"), "doubled");
    assert_eq!(pass().await, second);
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    assert_eq!(pass().await, second, "still waiting: the second wait is 4 s");

    // A checksum that is not 64 hex characters: refused before any request reaches the source.
    let mut bad = http_cache("nothex", &url, BTreeMap::from([("w.bin".into(), "not-a-checksum".into())]));
    bad.metadata.name = Some("nothex".into());
    caches.create(&PostParams::default(), &bad).await.unwrap();
    let before = server.requests();
    pass().await;
    let r = report_of(&c, "nothex").await;
    assert_eq!((r.state.as_str(), r.reason.as_deref()), (phase::FAILED, Some("InvalidSource")));
    assert_eq!(server.requests(), before, "nothing fetched for an invalid checksum");
}

/// The node agent checks the source out of the pods' start path; when that check fails while a verified
/// copy of the same request is current (the object was deleted upstream here), the node stays Ready.
#[tokio::test]
async fn source_gone_keeps_a_warm_node_ready() {
    let served = tempfile::tempdir().unwrap();
    let w = payload(100 * 1024, 16);
    std::fs::write(served.path().join("w.bin"), &w).unwrap();
    let server = SwitchServer::start(served.path()).await;
    let c = client().await;
    let caches: Api<ModelCache> = Api::namespaced(c.clone(), NS);
    let url = format!("{}/w.bin", server.base);
    caches
        .create(&PostParams::default(), &http_cache("m", &url, BTreeMap::from([("w.bin".into(), sha256_hex(&w))])))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let a = agent(&c, root.path(), None);
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    assert_eq!(report_of(&c, "m").await.state, phase::READY);
    // Agent restart during the outage: it re-checks the source, which now answers 404.
    server.set(Mode::Gone);
    let a = agent(&c, root.path(), None);
    a.reconcile_once().await.unwrap();
    a.wait_idle().await;
    let r = report_of(&c, "m").await;
    assert_eq!((r.state.as_str(), r.reason.as_deref()), (phase::READY, Some("SourceUnavailable")), "{r:?}");
    assert_eq!(node(&c).await.labels().get(&cache_ready_label(NS, "m")).map(String::as_str), Some("true"));
    assert_eq!(std::fs::read(root.path().join("ml.m/current/w.bin")).unwrap(), w);
}
