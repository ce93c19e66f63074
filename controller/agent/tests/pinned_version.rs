//! An object that changes under the same URL does not reach nodes unevenly: once a cache is pinned to
//! the version its first node verified (`CacheRequest::pin`, from `ModelCache.status.pinned`), a node
//! holding it keeps it, a cold node refuses the changed source with `SourceChanged` instead of
//! fetching other bytes, an object that changes mid-download is refused through `If-Match`, and a pod
//! start (`warmpath-agent fetch --pin`) does the same. Against a local Range server with strong ETags, and against
//! a plain one without ETags, where the modification time does the ETag's work.

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{payload, RangeServer, SwitchServer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warmpath_agent::{sync_cache, CacheRequest, SourceSpec, SyncOptions};

const KEY: &str = "ml.m";

fn opts(root: &Path) -> SyncOptions {
    let mut o = SyncOptions::new(root);
    o.fetch.chunk_size = 64 * 1024;
    o.fetch.concurrency = 1;
    o.fetch.permits = Arc::new(Semaphore::new(1));
    o.reserve_bytes = 0;
    o
}

fn request(url: &str, pin: Option<&str>) -> CacheRequest {
    CacheRequest {
        key: KEY.into(),
        source: SourceSpec::Http { url: url.into() },
        sha256: BTreeMap::new(),
        pin: pin.map(str::to_string),
    }
}

/// Nothing of the cache is visible or left taking space: no `current`, no staging directory.
fn holds_nothing(root: &Path) -> bool {
    let base = root.join(KEY);
    let staging = std::fs::read_dir(base.join("staging")).map(|d| d.count()).unwrap_or(0);
    !base.join("current").exists() && staging == 0
}

/// `warmpath-agent fetch` (the pod's fallback init container) with `extra` arguments.
async fn pod_start(root: &Path, url: &str, extra: &[&str]) -> (bool, serde_json::Value) {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"));
    c.args(["fetch", "--key", KEY, "--reserve-bytes", "0", "--chunk-size", "65536", "--source", url])
        .arg("--root")
        .arg(root)
        .args(extra)
        .kill_on_drop(true);
    let out =
        tokio::time::timeout(Duration::from_secs(20), c.output()).await.expect("fetch finishes within 20 s").unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("stdout: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.success(), v)
}

/// A chunk callback that rewrites `file` with `bytes` once, after the first chunk landed, and whether it did.
fn rewrite_after_first_chunk(file: &Path, bytes: &[u8]) -> (warmpath_agent::fetch::ChunkCallback, Arc<Mutex<bool>>) {
    let swapped = Arc::new(Mutex::new(false));
    let (f, s, b) = (file.to_path_buf(), swapped.clone(), bytes.to_vec());
    let on_chunk: warmpath_agent::fetch::ChunkCallback = Arc::new(move |_: &str, _: u64| {
        let mut done = s.lock().unwrap();
        if !*done {
            std::fs::write(&f, &b).unwrap();
            *done = true;
        }
    });
    (on_chunk, swapped)
}

#[tokio::test]
async fn a_changed_object_under_the_pin_is_refused_not_mixed() {
    let served = tempfile::tempdir().unwrap();
    let file = served.path().join("w.bin");
    // Same size, other bytes: only the ETag tells the two publications apart (no sha256 in the spec).
    let (v1, v2) = (payload(256 * 1024, 51), payload(256 * 1024, 52));
    std::fs::write(&file, &v1).unwrap();
    let server = SwitchServer::start(served.path()).await;
    let url = format!("{}/w.bin", server.base);
    let cancel = CancellationToken::new();

    // The first node verifies v1; its version is what the controller pins.
    let warm = tempfile::tempdir().unwrap();
    let first = sync_cache(&request(&url, None), &opts(warm.path()), &cancel, None).await.unwrap();
    let pin = first.version.clone();

    // The object changes under the same URL.
    std::fs::write(&file, &v2).unwrap();

    // Unpinned (the old behaviour), a cold node would now serve other bytes than the first node.
    let unpinned = tempfile::tempdir().unwrap();
    let r = sync_cache(&request(&url, None), &opts(unpinned.path()), &cancel, None).await.unwrap();
    assert_ne!(r.version, pin);
    assert_eq!(std::fs::read(unpinned.path().join("ml.m/current/w.bin")).unwrap(), v2);

    // Pinned: a cold node refuses, with both versions named, and fetches nothing.
    let cold = tempfile::tempdir().unwrap();
    let before = server.requests();
    let err = sync_cache(&request(&url, Some(&pin)), &opts(cold.path()), &cancel, None).await.unwrap_err();
    assert_eq!(err.reason(), "SourceChanged", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&pin) && msg.contains(&r.version) && msg.contains("new ModelCache"), "{msg}");
    assert_eq!(server.requests() - before, 1, "only the HEAD of the listing, no byte fetched");
    assert!(holds_nothing(cold.path()));

    // The node holding the pinned version keeps it (the agent's update check), and says what the source holds.
    let kept = sync_cache(&request(&url, Some(&pin)), &opts(warm.path()), &cancel, None).await.unwrap();
    assert!(kept.already_current, "{kept:?}");
    assert_eq!((kept.version.as_str(), kept.source_version.as_deref()), (pin.as_str(), Some(r.version.as_str())));
    assert_eq!(std::fs::read(warm.path().join("ml.m/current/w.bin")).unwrap(), v1);

    // A pod start with the pin: on the warm node served at once without the source; on the cold node refused.
    let before = server.requests();
    let (ok, v) = pod_start(warm.path(), &url, &["--pin", &pin]).await;
    assert!(ok && v["report"]["version"] == pin.as_str(), "{v}");
    assert_eq!(server.requests(), before, "warm pod start contacted the source");
    let (ok, v) = pod_start(cold.path(), &url, &["--pin", &pin]).await;
    assert!(!ok, "{v}");
    assert_eq!(v["reason"], "SourceChanged", "{v}");
    assert!(holds_nothing(cold.path()));
    // The unpinned node's copy is not the pinned version: a pod start there refuses too.
    let (ok, v) = pod_start(unpinned.path(), &url, &["--pin", &pin]).await;
    assert!(!ok && v["reason"] == "SourceChanged", "{v}");

    // The pinned publication back at the source: the cold node fetches exactly it.
    std::fs::write(&file, &v1).unwrap();
    let r = sync_cache(&request(&url, Some(&pin)), &opts(cold.path()), &cancel, None).await.unwrap();
    assert_eq!(r.version, pin);
    assert_eq!(std::fs::read(cold.path().join("ml.m/current/w.bin")).unwrap(), v1);
}

#[tokio::test]
async fn an_object_changing_mid_download_is_refused_by_if_match() {
    let served = tempfile::tempdir().unwrap();
    let file = served.path().join("w.bin");
    let (v1, v2) = (payload(512 * 1024, 53), payload(512 * 1024, 54));
    std::fs::write(&file, &v1).unwrap();
    let server = SwitchServer::start(served.path()).await;
    let url = format!("{}/w.bin", server.base);

    // The pinned version as the first node saw it.
    let first = tempfile::tempdir().unwrap();
    let pin =
        sync_cache(&request(&url, None), &opts(first.path()), &CancellationToken::new(), None).await.unwrap().version;

    // A cold node starts fetching the pinned version; after its first chunk the object is replaced.
    let cold = tempfile::tempdir().unwrap();
    let (on_chunk, swapped) = rewrite_after_first_chunk(&file, &v2);
    let err = sync_cache(&request(&url, Some(&pin)), &opts(cold.path()), &CancellationToken::new(), Some(on_chunk))
        .await
        .unwrap_err();
    assert!(*swapped.lock().unwrap());
    assert_eq!(err.reason(), "SourceChanged", "{err}");
    assert!(!cold.path().join("ml.m/current").exists(), "no mixed copy became current");
    assert!(holds_nothing(cold.path()), "the bytes of the old object are not kept for a resume that cannot come");
    // The next attempt sees the new listing and refuses before fetching anything.
    let err =
        sync_cache(&request(&url, Some(&pin)), &opts(cold.path()), &CancellationToken::new(), None).await.unwrap_err();
    assert!(matches!(err, warmpath_agent::AgentError::SourceChanged { .. }), "{err}");
    assert!(holds_nothing(cold.path()), "the partial download of the pinned version gives its space back");
}

/// A plain static file server (Range and `Last-Modified`, no ETag) serving `bytes` as `w.bin`, dated an hour back so
/// a rewrite now carries another `Last-Modified` (one-second resolution): the served directory, the file, the
/// server and the file's URL.
async fn plain_server(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, RangeServer, String) {
    let served = tempfile::tempdir().unwrap();
    let file = served.path().join("w.bin");
    std::fs::write(&file, bytes).unwrap();
    let then = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(then).unwrap();
    let server = RangeServer::start(served.path()).await;
    let url = format!("{}/w.bin", server.base);
    (served, file, server, url)
}

#[tokio::test]
async fn without_an_etag_the_modification_time_tells_a_rewritten_object_apart() {
    // Same size, other bytes, no sha256 in the spec, and a server that sends no ETag: only `Last-Modified` differs.
    let (v1, v2) = (payload(256 * 1024, 55), payload(256 * 1024, 56));
    let (_served, file, _server, url) = plain_server(&v1).await;
    let cancel = CancellationToken::new();
    let warm = tempfile::tempdir().unwrap();
    let first = sync_cache(&request(&url, None), &opts(warm.path()), &cancel, None).await.unwrap();

    std::fs::write(&file, &v2).unwrap();
    // The node holding the first publication sees a new version and fetches it, as a cold node would: nodes do not
    // end up serving different bytes under one version.
    let r = sync_cache(&request(&url, None), &opts(warm.path()), &cancel, None).await.unwrap();
    assert!(!r.already_current, "a rewritten object was taken for the version at hand: {r:?}");
    assert_ne!(r.version, first.version);
    assert_eq!(std::fs::read(warm.path().join("ml.m/current/w.bin")).unwrap(), v2);
    // Pinned to the first publication, a cold node refuses the rewritten one.
    let cold = tempfile::tempdir().unwrap();
    let err = sync_cache(&request(&url, Some(&first.version)), &opts(cold.path()), &cancel, None).await.unwrap_err();
    assert_eq!(err.reason(), "SourceChanged", "{err}");
    assert!(holds_nothing(cold.path()));
}

#[tokio::test]
async fn without_an_etag_an_object_changing_mid_download_is_refused_by_its_date() {
    let (v1, v2) = (payload(512 * 1024, 57), payload(512 * 1024, 58));
    let (_served, file, _server, url) = plain_server(&v1).await;

    // After the first chunk the object is rewritten: the next ranged read, sent with If-Unmodified-Since, fails
    // instead of appending the new object's bytes to the old one's.
    let cold = tempfile::tempdir().unwrap();
    let (on_chunk, swapped) = rewrite_after_first_chunk(&file, &v2);
    let err = sync_cache(&request(&url, None), &opts(cold.path()), &CancellationToken::new(), Some(on_chunk))
        .await
        .unwrap_err();
    assert!(*swapped.lock().unwrap());
    assert_eq!(err.reason(), "SourceChanged", "{err}");
    assert!(holds_nothing(cold.path()), "no mixed copy became current, and no part of it is kept");
    // The next attempt lists the rewritten object and fetches it whole.
    let r = sync_cache(&request(&url, None), &opts(cold.path()), &CancellationToken::new(), None).await.unwrap();
    assert_eq!(std::fs::read(cold.path().join("ml.m/current/w.bin")).unwrap(), v2);
    assert_eq!(r.bytes_resumed, 0);
}

#[tokio::test]
async fn a_pin_made_before_dates_were_compared_is_kept() {
    let v1 = payload(128 * 1024, 59);
    let (_served, _file, _server, url) = plain_server(&v1).await;
    // The version an agent that compared sizes only gave this listing, and the controller pinned.
    let undated = warmpath_agent::source::RemoteFile {
        location: "w.bin".into(),
        rel: "w.bin".into(),
        size: v1.len() as u64,
        e_tag: None,
        last_modified: None,
    };
    let pin = warmpath_agent::sync::fingerprint(&request(&url, None), None, &[undated]);
    let cancel = CancellationToken::new();
    let cold = tempfile::tempdir().unwrap();
    let r = sync_cache(&request(&url, Some(&pin)), &opts(cold.path()), &cancel, None).await.unwrap();
    assert_eq!(r.version, pin, "a new node fetches the pinned version instead of refusing it as changed");
    assert_eq!(std::fs::read(cold.path().join("ml.m/current/w.bin")).unwrap(), v1);
    let again = sync_cache(&request(&url, Some(&pin)), &opts(cold.path()), &cancel, None).await.unwrap();
    assert!(again.already_current && again.source_version.is_none(), "{again:?}");
}
