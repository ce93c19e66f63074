//! The agent's download engine against a real S3-compatible server (moto) and a real HTTP server with
//! Range support: full download, interrupted-and-resumed download, checksum mismatch keeping the previous
//! version, disk-space refusal, two models downloading concurrently.

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use common::{payload, sha256_hex, Moto, RangeServer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warmpath_agent::{
    cache_dir::CacheDir, disk::FixedFreeSpace, fetch::progress_path, sync::sync_cache, AgentError, CacheRequest,
    SourceSpec, SyncOptions,
};

const KIB: usize = 1024;

fn s3(moto: &Moto, bucket: &str, prefix: &str) -> SourceSpec {
    SourceSpec::S3 { bucket: bucket.into(), prefix: prefix.into(), region: None, endpoint: Some(moto.endpoint.clone()) }
}

fn opts(root: &Path, chunk: u64, concurrency: usize) -> SyncOptions {
    let mut o = SyncOptions::new(root);
    o.fetch.chunk_size = chunk;
    o.fetch.concurrency = concurrency;
    o.fetch.permits = Arc::new(Semaphore::new(concurrency));
    o.reserve_bytes = 0;
    o
}

fn read_current(root: &Path, key: &str, rel: &str) -> Vec<u8> {
    std::fs::read(root.join(key).join("current").join(rel)).unwrap()
}

#[tokio::test]
async fn s3_full_download_is_verified_and_idempotent() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    let weights = payload(3 * 1024 * KIB + 123, 1); // not a multiple of the range size
    let config = br#"{"architectures":["LlamaForCausalLM"]}"#.to_vec();
    moto.put("models", "llama/model.safetensors", weights.clone()).await;
    moto.put("models", "llama/config.json", config.clone()).await;
    moto.put("models", "other/ignored.bin", payload(10, 2)).await;

    let root = tempfile::tempdir().unwrap();
    let req = CacheRequest {
        key: "default.llama".into(),
        source: s3(&moto, "models", "llama/"),
        sha256: BTreeMap::from([("model.safetensors".to_string(), sha256_hex(&weights))]),
        pin: None,
    };
    let o = opts(root.path(), 256 * KIB as u64, 4);
    let r = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();
    assert_eq!(r.files, 2, "only objects under the prefix");
    assert_eq!(r.bytes_total, (weights.len() + config.len()) as u64);
    assert_eq!(r.bytes_fetched, r.bytes_total);
    assert_eq!(read_current(root.path(), "default.llama", "model.safetensors"), weights);
    assert_eq!(read_current(root.path(), "default.llama", "config.json"), config);
    let marker = CacheDir::new(root.path(), "default.llama").unwrap().current().unwrap();
    assert_eq!(marker.version, r.version);
    assert!(!root.path().join("default.llama/staging").join(&r.version).exists(), "staging moved, not copied");

    let again = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();
    assert!(again.already_current);
    assert_eq!((again.bytes_fetched, again.version), (0, r.version));
}

#[tokio::test]
async fn s3_interrupted_download_resumes_from_verified_chunks() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    let weights = payload(2 * 1024 * KIB, 3);
    moto.put("models", "m/w.bin", weights.clone()).await;
    let root = tempfile::tempdir().unwrap();
    let req = CacheRequest {
        key: "ns.m".into(),
        source: s3(&moto, "models", "m/"),
        sha256: BTreeMap::from([("w.bin".to_string(), sha256_hex(&weights))]),
        pin: None,
    };
    let chunk = 64 * KIB as u64;
    let o = opts(root.path(), chunk, 1);

    // First run: cancelled after 5 chunks have landed (like the agent being stopped mid-download).
    let cancel = CancellationToken::new();
    let (c, seen) = (cancel.clone(), Arc::new(AtomicUsize::new(0)));
    let s = seen.clone();
    let cb: warmpath_agent::fetch::ChunkCallback = Arc::new(move |_, _| {
        if s.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
            c.cancel();
        }
    });
    let err = sync_cache(&req, &o, &cancel, Some(cb)).await.unwrap_err();
    assert!(matches!(err, AgentError::Cancelled), "{err}");
    let cache = CacheDir::new(root.path(), "ns.m").unwrap();
    assert!(cache.current().is_none(), "nothing current after an interrupted first download");
    assert!(!cache.current_link().exists());
    let staging = std::fs::read_dir(root.path().join("ns.m/staging")).unwrap().next().unwrap().unwrap().path();
    let part = staging.join("w.bin.part");
    assert!(part.exists() && progress_path(&part).exists(), "partial file and progress record kept");
    assert!(!staging.join("w.bin").exists(), "a partial file never has the final name");

    // Second run resumes: fetches only what is missing.
    let r = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();
    assert!(r.bytes_resumed >= 5 * chunk, "resumed {} bytes", r.bytes_resumed);
    assert_eq!(r.bytes_resumed + r.bytes_fetched, weights.len() as u64);
    assert_eq!(read_current(root.path(), "ns.m", "w.bin"), weights);
    assert!(!part.exists());
}

#[tokio::test]
async fn checksum_mismatch_fails_with_reason_and_keeps_previous_version() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    let v1 = payload(300 * KIB, 4);
    moto.put("models", "m/w.bin", v1.clone()).await;
    let root = tempfile::tempdir().unwrap();
    let o = opts(root.path(), 64 * KIB as u64, 2);
    let mut req = CacheRequest {
        key: "ns.m".into(),
        source: s3(&moto, "models", "m/"),
        sha256: BTreeMap::from([("w.bin".to_string(), sha256_hex(&v1))]),
        pin: None,
    };
    let first = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();

    // The object is replaced by bytes that do not match the expected checksum.
    let v2 = payload(310 * KIB, 5);
    moto.put("models", "m/w.bin", v2).await;
    req.sha256.insert("w.bin".into(), sha256_hex(b"what the publisher said"));
    let err = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap_err();
    assert_eq!(err.reason(), "ChecksumMismatch");
    assert!(err.to_string().contains("w.bin"), "{err}");

    let cache = CacheDir::new(root.path(), "ns.m").unwrap();
    assert_eq!(cache.current().unwrap().version, first.version, "previous version still current");
    assert_eq!(read_current(root.path(), "ns.m", "w.bin"), v1, "previous bytes still served");
    let leftovers: Vec<_> = walk(&root.path().join("ns.m/staging"));
    assert!(leftovers.iter().all(|p| !p.ends_with(".part")), "bad partial discarded: {leftovers:?}");
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

#[tokio::test]
async fn refuses_when_disk_is_too_small_before_downloading() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    moto.put("models", "big/w.bin", payload(1024 * KIB, 6)).await;
    let root = tempfile::tempdir().unwrap();
    let mut o = opts(root.path(), 64 * KIB as u64, 2);
    o.free_space = Arc::new(FixedFreeSpace(512 * KIB as u64));
    let req =
        CacheRequest { key: "ns.big".into(), source: s3(&moto, "models", "big/"), sha256: BTreeMap::new(), pin: None };
    let err = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap_err();
    assert_eq!(err.reason(), "InsufficientDisk");
    assert!(err.to_string().contains("need 1048576 bytes"), "{err}");
    let written: Vec<String> = walk(root.path())
        .into_iter()
        .filter(|p| !p.ends_with(".warmpath.lock") && !p.ends_with(".warmpath-cache"))
        .collect();
    assert!(written.is_empty(), "nothing but the lock file and the owner marker written: {written:?}");

    // The same refusal through the binary (what the fallback init container and operators run).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["fetch", "--key", "ns.big", "--reserve-bytes", "0", "--free-bytes-override", "1000"])
        .arg("--source")
        .arg(format!("s3://models/big/?endpoint={}", moto.endpoint))
        .arg("--root")
        .arg(root.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["phase"], "Failed");
    assert_eq!(v["reason"], "InsufficientDisk");
}

#[tokio::test]
async fn two_models_download_concurrently_sharing_the_agent_limit() {
    let moto = Moto::start();
    moto.create_bucket("models").await;
    let a = payload(700 * KIB, 7);
    let b = payload(900 * KIB, 8);
    moto.put("models", "a/w.bin", a.clone()).await;
    moto.put("models", "b/w.bin", b.clone()).await;
    let root = tempfile::tempdir().unwrap();
    let o = opts(root.path(), 64 * KIB as u64, 3);
    let ra = CacheRequest {
        key: "ns.a".into(),
        source: s3(&moto, "models", "a/"),
        sha256: BTreeMap::from([("w.bin".into(), sha256_hex(&a))]),
        pin: None,
    };
    let rb = CacheRequest {
        key: "ns.b".into(),
        source: s3(&moto, "models", "b/"),
        sha256: BTreeMap::from([("w.bin".into(), sha256_hex(&b))]),
        pin: None,
    };
    // Interleaving is observable: chunks of both files land before either finishes.
    let order = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let ord = order.clone();
    let cb: warmpath_agent::fetch::ChunkCallback = Arc::new(move |_, _| ord.lock().unwrap().push(String::new()));
    let cancel = CancellationToken::new();
    let (x, y) = tokio::join!(sync_cache(&ra, &o, &cancel, Some(cb.clone())), sync_cache(&rb, &o, &cancel, Some(cb)),);
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_ne!(x.version, y.version);
    assert_eq!(read_current(root.path(), "ns.a", "w.bin"), a);
    assert_eq!(read_current(root.path(), "ns.b", "w.bin"), b);
    assert_eq!(order.lock().unwrap().len(), 11 + 15, "one callback per 64 KiB chunk of both files");
    assert_eq!(o.fetch.permits.available_permits(), 3, "all shared permits returned");
}

#[tokio::test]
async fn http_source_downloads_and_resumes_over_range_requests() {
    let served = tempfile::tempdir().unwrap();
    let body = payload(1024 * KIB + 7, 9);
    std::fs::write(served.path().join("model.gguf"), &body).unwrap();
    let server = RangeServer::start(served.path()).await;
    let root = tempfile::tempdir().unwrap();
    let o = opts(root.path(), 128 * KIB as u64, 2);
    let req = CacheRequest {
        key: "ns.gguf".into(),
        source: SourceSpec::Http { url: format!("{}/model.gguf", server.base) },
        sha256: BTreeMap::from([("model.gguf".into(), sha256_hex(&body))]),
        pin: None,
    };
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let cb: warmpath_agent::fetch::ChunkCallback = Arc::new(move |_, done| {
        if done >= 3 * 128 * KIB as u64 {
            c.cancel();
        }
    });
    assert!(matches!(sync_cache(&req, &o, &cancel, Some(cb)).await, Err(AgentError::Cancelled)));
    let r = sync_cache(&req, &o, &CancellationToken::new(), None).await.unwrap();
    assert!(r.bytes_resumed >= 3 * 128 * KIB as u64);
    assert_eq!(r.bytes_resumed + r.bytes_fetched, body.len() as u64);
    assert_eq!(read_current(root.path(), "ns.gguf", "model.gguf"), body);
}

#[tokio::test]
async fn missing_object_is_a_clear_failure() {
    let served = tempfile::tempdir().unwrap();
    let server = RangeServer::start(served.path()).await;
    let root = tempfile::tempdir().unwrap();
    let req = CacheRequest {
        key: "ns.x".into(),
        source: SourceSpec::Http { url: format!("{}/absent.bin", server.base) },
        sha256: BTreeMap::new(),
        pin: None,
    };
    let err = sync_cache(&req, &opts(root.path(), 1024, 1), &CancellationToken::new(), None).await.unwrap_err();
    assert_eq!(err.reason(), "SourceNotFound", "{err}");
}

/// A real crash: the `warmpath-agent fetch` process is SIGKILLed mid-download (the server answers each
/// range after 40 ms so the kill lands inside the transfer), then run again: it resumes from the
/// chunks its progress record holds and ends with the exact bytes.
#[tokio::test]
async fn killed_agent_process_resumes_where_it_stopped() {
    use axum::{extract::Request, middleware::Next};
    let served = tempfile::tempdir().unwrap();
    let body = payload(2 * 1024 * KIB, 31);
    std::fs::write(served.path().join("w.bin"), &body).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback_service(tower_http::services::ServeDir::new(served.path())).layer(
        axum::middleware::from_fn(|req: Request, next: Next| async move {
            tokio::time::sleep(std::time::Duration::from_millis(40)).await;
            next.run(req).await
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let root = tempfile::tempdir().unwrap();
    let args = |extra: &[&str]| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"));
        c.args(["fetch", "--key", "ns.w", "--reserve-bytes", "0", "--chunk-size", "65536", "--concurrency", "1"])
            .arg("--source")
            .arg(format!("{base}/w.bin"))
            .arg("--root")
            .arg(root.path())
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        c
    };
    let sum = format!("w.bin={}", sha256_hex(&body));
    let mut child = args(&["--sha256", &sum]).spawn().unwrap();
    // Wait (bounded) until at least 5 chunks are recorded, then kill -9.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let done_chunks = || -> usize {
        let Ok(staging) = std::fs::read_dir(root.path().join("ns.w/staging")) else { return 0 };
        staging
            .flatten()
            .filter_map(|d| std::fs::read(progress_path(&d.path().join("w.bin.part"))).ok())
            .filter_map(|b| serde_json::from_slice::<warmpath_agent::fetch::ProgressRecord>(&b).ok())
            .map(|r| r.done.len())
            .max()
            .unwrap_or(0)
    };
    while done_chunks() < 5 {
        assert!(std::time::Instant::now() < deadline, "no progress within 20 s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    child.start_kill().unwrap();
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "killed, not finished");
    let kept = done_chunks();
    assert!((5..32).contains(&kept), "{kept} of 32 chunks recorded at the kill");
    assert!(!root.path().join("ns.w/current").exists(), "nothing current after the crash");

    let out = args(&["--sha256", &sum]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let resumed = v["report"]["bytesResumed"].as_u64().unwrap();
    assert!(resumed >= kept as u64 * 65536, "resumed {resumed} bytes, {kept} chunks were recorded");
    assert_eq!(resumed + v["report"]["bytesFetched"].as_u64().unwrap(), body.len() as u64);
    assert_eq!(read_current(root.path(), "ns.w", "w.bin"), body);
    server.abort();
}
