//! A warm node starts a pod without the source: `warmpath-agent fetch` (the pod's fallback init
//! container) serves a verified current copy made for the same source and checksums without listing or
//! HEADing the source, whether the source throttles (429), is black-holed or is down — each start
//! bounded in time. `--refresh` (and the node agent) still ask the source.

mod common;

use std::time::Duration;

use common::{payload, sha256_hex, Mode, SwitchServer};

/// Runs `warmpath-agent fetch` for `url` into `root`; `None` when it did not finish within 20 s.
async fn fetch(root: &std::path::Path, url: &str, sum: &str, extra: &[&str]) -> Option<(bool, serde_json::Value)> {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"));
    c.args([
        "fetch",
        "--key",
        "ml.m",
        "--reserve-bytes",
        "0",
        "--chunk-size",
        "65536",
        "--source",
        url,
        "--sha256",
        sum,
    ])
    .arg("--root")
    .arg(root)
    .args(extra)
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(20), c.output()).await.ok()?.unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("stdout: {}", String::from_utf8_lossy(&out.stdout)));
    Some((out.status.success(), v))
}

#[tokio::test]
async fn warm_copy_serves_a_pod_start_without_the_source() {
    let served = tempfile::tempdir().unwrap();
    let body = payload(300 * 1024, 41);
    std::fs::write(served.path().join("w.bin"), &body).unwrap();
    let mut server = SwitchServer::start(served.path()).await;
    let url = format!("{}/w.bin", server.base);
    let sum = format!("w.bin={}", sha256_hex(&body));
    let root = tempfile::tempdir().unwrap();

    // Cold node: downloads from the source.
    let (ok, v) = fetch(root.path(), &url, &sum, &[]).await.expect("cold fetch finishes");
    assert!(ok, "{v}");
    assert_eq!(v["report"]["alreadyCurrent"], false);
    let version = v["report"]["version"].clone();

    for mode in [Mode::Throttle, Mode::BlackHole] {
        server.set(mode);
        let before = server.requests();
        let (ok, v) = fetch(root.path(), &url, &sum, &[])
            .await
            .unwrap_or_else(|| panic!("{mode:?}: pod start blocked on the source"));
        assert!(ok, "{mode:?}: {v}");
        assert_eq!(
            (&v["report"]["alreadyCurrent"], &v["report"]["version"]),
            (&serde_json::json!(true), &version),
            "{mode:?}"
        );
        assert_eq!(server.requests(), before, "{mode:?}: the source was contacted");
    }

    // `--refresh` asks the source (what the node agent does out of the pod's start path).
    server.set(Mode::Serve);
    let before = server.requests();
    let (ok, v) = fetch(root.path(), &url, &sum, &["--refresh"]).await.unwrap();
    assert!(ok && v["report"]["alreadyCurrent"] == true, "{v}");
    assert!(server.requests() > before, "--refresh contacts the source");

    // A different request (other checksum) is not served from the copy made for another one: it asks
    // the source, which here answers 404.
    server.set(Mode::Gone);
    let other = format!("w.bin={}", sha256_hex(b"another publication"));
    let (ok, v) = fetch(root.path(), &url, &other, &[]).await.expect("refused in time");
    assert!(!ok, "{v}");
    assert_eq!(v["reason"], "SourceNotFound");

    // Source down (port closed).
    server.stop().await;
    let (ok, v) = fetch(root.path(), &url, &sum, &[]).await.expect("source down: pod start blocked");
    assert!(ok, "{v}");
    assert_eq!(std::fs::read(root.path().join("ml.m/current/w.bin")).unwrap(), body);
}
