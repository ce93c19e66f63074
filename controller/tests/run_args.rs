//! `warmpath-controller run` refuses listener settings it cannot serve before it connects to anything: the metrics
//! server on the HTTP server's port (the chart rendered that when `metrics.port` equalled `http.port`), and an
//! address that is neither `IP:port` nor `off`. `off` (the chart's `metrics.enabled: false`) is accepted.

use std::process::{Command, Stdio};

use warmpath_harness::process::{wait_exit, KillOnDrop};

/// Runs `run` with `args` against an API server on 127.0.0.1:9 (nothing listens), for at most 20 s; returns whether
/// it succeeded and its stderr.
fn run(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n\
contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .arg("run")
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = KillOnDrop::new(child);
    let status = wait_exit(&mut guard.child, std::time::Duration::from_secs(20)).expect("run ended within 20 s");
    let mut stderr = String::new();
    std::io::Read::read_to_string(guard.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (status.success(), stderr)
}

#[test]
fn run_refuses_a_metrics_listener_it_cannot_serve_and_takes_off() {
    for (http, metrics) in [("127.0.0.1:8080", "0.0.0.0:8080"), ("127.0.0.1:8080", "127.0.0.1:8080")] {
        let (ok, stderr) = run(&["--http-addr", http, "--metrics-addr", metrics]);
        assert!(!ok && stderr.contains("cannot share port 8080"), "{http} {metrics}: {stderr}");
    }
    let (ok, stderr) = run(&["--metrics-addr", "bogus"]);
    assert!(!ok && stderr.contains("\"bogus\" is neither an IP:port nor off"), "{stderr}");
    // Accepted — off, both on port 0 (any free port, one each), one port on two addresses — as far as this test sees:
    // `run` then stops at the API server, where nothing listens, before it binds anything.
    for (http, metrics) in
        [("127.0.0.1:0", "off"), ("127.0.0.1:0", "127.0.0.1:0"), ("127.0.0.1:8080", "127.0.0.2:8080")]
    {
        let (ok, stderr) = run(&["--http-addr", http, "--metrics-addr", metrics]);
        assert!(!ok && !stderr.contains("--metrics-addr") && !stderr.contains("panicked"), "{metrics}: {stderr}");
        assert!(stderr.contains("InferenceRoutingPolicies") || stderr.contains("127.0.0.1:9"), "{metrics}: {stderr}");
    }
}
