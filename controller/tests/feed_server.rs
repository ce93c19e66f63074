//! The standalone feed server (`warmpath-controller feed`) as the filter's end-to-end test uses
//! it: a real process on 127.0.0.1 scraping a local model-server metrics endpoint, or re-reading
//! a feed file. Every loop is bounded in count and time; the child is killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use warmpath_core::feed::FeedSnapshot;
use warmpath_harness::process::KillOnDrop;

/// Starts `warmpath-controller feed ARGS` and returns it with its feed URL.
fn start(args: &[&str]) -> (KillOnDrop, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .arg("feed")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let proc = KillOnDrop::new(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (proc, url)
}

async fn get_snapshot(url: &str) -> FeedSnapshot {
    let body = reqwest::get(url).await.unwrap().error_for_status().unwrap().bytes().await.unwrap();
    FeedSnapshot::from_json(&body).unwrap()
}

/// Polls (at most 50 × 100 ms) until `pred` holds.
async fn wait_for(url: &str, pred: impl Fn(&FeedSnapshot) -> bool) -> FeedSnapshot {
    for _ in 0..50 {
        let s = get_snapshot(url).await;
        if pred(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("feed never reached the expected state: {:?}", get_snapshot(url).await);
}

#[tokio::test]
async fn scrapes_a_local_vllm_metrics_endpoint() {
    let waiting = Arc::new(Mutex::new(3u32));
    let w = waiting.clone();
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let n = *w.lock().unwrap();
            async move {
                format!("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} {n}\nvllm:num_requests_running{{model_name=\"m\"}} 2\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.5\n")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    // A second endpoint with nothing listening: kept in the feed, without load.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();

    let endpoints = format!("{addr},{dead}");
    let (_proc, url) = start(&["--endpoints", &endpoints, "--interval-ms", "100", "--key", "policy/demo/chat"]);
    assert!(url.ends_with("/v1/feed/policy/demo/chat"), "{url}");
    let s = wait_for(&url, |s| s.endpoints.iter().any(|e| e.load.is_some())).await;
    assert_eq!(s.endpoints.len(), 2);
    let live = s.endpoints.iter().find(|e| e.address == addr.to_string()).unwrap();
    let load = live.load.unwrap();
    assert_eq!((load.waiting, load.running, load.kv_cache_usage), (3, 2, 0.5));
    assert!(s.endpoints.iter().find(|e| e.address == dead.to_string()).unwrap().load.is_none());

    *waiting.lock().unwrap() = 9;
    let s2 = wait_for(&url, |s| s.endpoints.iter().any(|e| e.load.is_some_and(|l| l.waiting == 9))).await;
    assert!(s2.version > s.version, "version grows when the load changes");

    // Unknown feed → 404.
    let other = url.replace("/chat", "/other");
    assert_eq!(reqwest::get(&other).await.unwrap().status(), 404);
    server.abort();
}

#[tokio::test]
async fn serves_a_feed_file_and_keeps_the_last_good_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("feed.json");
    std::fs::write(&file, r#"{"version":0,"endpoints":[{"address":"127.0.0.1:9001"},{"address":"127.0.0.1:9002","load":{"waiting":1,"running":1,"kv_cache_usage":0.1}}]}"#).unwrap();
    let (_proc, url) = start(&["--file", file.to_str().unwrap(), "--interval-ms", "100"]);
    let s = wait_for(&url, |s| s.endpoints.len() == 2).await;
    // Endpoint removed mid-run.
    std::fs::write(&file, r#"{"version":0,"endpoints":[{"address":"127.0.0.1:9002"}]}"#).unwrap();
    let s2 = wait_for(&url, |s| s.endpoints.len() == 1).await;
    assert!(s2.version > s.version);
    assert_eq!(s2.endpoints[0].address, "127.0.0.1:9002");
    // A broken file: the last good snapshot stays.
    std::fs::write(&file, "{ not json").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(get_snapshot(&url).await, s2);
}

/// A key the controller would never serve (another kind, a missing part, a namespace that is no DNS label) is
/// refused before the server starts, instead of printing a URL that answers 404.
#[test]
fn a_key_of_another_form_is_refused() {
    for key in ["bogus", "policy/onlyns", "route/ns/name", "policy/Bad_NS/name", "httproute/ns/", "policy/ns/a/b"] {
        let out = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
            .args(["feed", "--endpoints", "127.0.0.1:9", "--key", key])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "--key {key} started a server:\n{stderr}");
        assert!(
            stderr.contains("is not policy/<namespace>/<name> or httproute/<namespace>/<name>"),
            "--key {key}: {stderr}"
        );
    }
}
