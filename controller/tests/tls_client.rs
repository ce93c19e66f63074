//! `warmpath-controller run` builds a TLS client for the API server without panicking. rustls
//! panics on the first TLS client when more than one crypto provider is compiled in and the
//! process picked none; the binary must carry exactly one (ring, through kube's and reqwest's
//! rustls features — `cargo tree -e features -i rustls -p warmpath-controller`), which is why the
//! in-memory API client, whose jsonschema brings aws-lc-rs, lives in `tests/cluster` and not among
//! this crate's dev-dependencies. The API server here is an HTTPS URL on 127.0.0.1 where nothing
//! listens: the controller must fail with a connection error and exit non-zero, not panic.
//!
//! The same unreachable API server shows what `run` refuses before it connects to anything: a metrics listener on
//! the HTTP server's port (the chart rendered that when `metrics.port` equalled `http.port`), and a metrics address
//! that is neither `IP:port` nor `off`; `off` (the chart's `metrics.enabled: false`) is accepted.

use std::process::Command;
use std::time::Duration;

use warmpath_harness::process::{wait_exit, KillOnDrop};

/// Runs `run` with `args` against an API server at https://127.0.0.1:9 (nothing listens there), the listeners on
/// loopback port 0 unless `args` says otherwise; returns its exit status (`None`: still running after 20 s, then
/// killed) and its stderr.
fn run(args: &[&str]) -> (Option<std::process::ExitStatus>, String) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\n\
contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let mut guard = KillOnDrop::spawn_for_stderr(
        Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
            .arg("run")
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("WARMPATH_WASM_FILE", dir.path().join("absent.wasm"))
            .env("WARMPATH_HTTP_ADDR", "127.0.0.1:0")
            .env("WARMPATH_METRICS_ADDR", "127.0.0.1:0"),
    )
    .unwrap();
    let status = wait_exit(&mut guard.child, Duration::from_secs(20));
    if status.is_none() {
        let _ = guard.child.kill();
    }
    (status, guard.stderr())
}

#[test]
fn run_against_an_https_api_server_fails_cleanly_instead_of_panicking() {
    let (status, stderr) = run(&[]);
    assert!(!stderr.contains("panicked"), "the controller panicked:\n{stderr}");
    let status = status.expect("run neither connected nor gave up within 20 s");
    assert!(!status.success() && status.code() != Some(101), "expected a clean failure, got {status:?}:\n{stderr}");
}

#[test]
fn run_refuses_a_metrics_listener_it_cannot_serve_and_takes_off() {
    for (http, metrics) in [("127.0.0.1:8080", "0.0.0.0:8080"), ("127.0.0.1:8080", "127.0.0.1:8080")] {
        let (status, stderr) = run(&["--http-addr", http, "--metrics-addr", metrics]);
        assert!(status.is_some_and(|s| !s.success()), "{http} {metrics}: {stderr}");
        assert!(stderr.contains("cannot share port 8080"), "{http} {metrics}: {stderr}");
    }
    let (status, stderr) = run(&["--metrics-addr", "bogus"]);
    assert!(
        status.is_some_and(|s| !s.success()) && stderr.contains("\"bogus\" is neither an IP:port nor off"),
        "{stderr}"
    );
    // Accepted — off, both on port 0 (any free port, one each), one port on two addresses — as far as this test sees:
    // `run` then stops at the API server, where nothing listens, before it binds anything.
    for (http, metrics) in
        [("127.0.0.1:0", "off"), ("127.0.0.1:0", "127.0.0.1:0"), ("127.0.0.1:8080", "127.0.0.2:8080")]
    {
        let (status, stderr) = run(&["--http-addr", http, "--metrics-addr", metrics]);
        assert!(status.is_some_and(|s| !s.success()), "{metrics}: {stderr}");
        assert!(!stderr.contains("--metrics-addr") && !stderr.contains("panicked"), "{metrics}: {stderr}");
        assert!(stderr.contains("InferenceRoutingPolicies") || stderr.contains("127.0.0.1:9"), "{metrics}: {stderr}");
    }
}
