//! `warmpath-controller run` builds a TLS client for the API server without panicking. rustls
//! panics on the first TLS client when more than one crypto provider is compiled in and the
//! process picked none; the binary must carry exactly one (ring, through kube's and reqwest's
//! rustls features — `cargo tree -e features -i rustls -p warmpath-controller`), which is why the
//! in-memory API client, whose jsonschema brings aws-lc-rs, lives in `tests/cluster` and not among
//! this crate's dev-dependencies. The API server here is an HTTPS URL on 127.0.0.1 where nothing
//! listens: the controller must fail with a connection error and exit non-zero, not panic.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn run_against_an_https_api_server_fails_cleanly_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: nothing listens, so the connection is refused at once.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\n\
contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_warmpath-controller"))
        .arg("run")
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("WARMPATH_WASM_FILE", dir.path().join("absent.wasm"))
        .env("WARMPATH_HTTP_ADDR", "127.0.0.1:0")
        .env("WARMPATH_METRICS_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!stderr.contains("panicked"), "the controller panicked:\n{stderr}");
    let status = status.expect("run neither connected nor gave up within 20 s");
    assert!(!status.success() && status.code() != Some(101), "expected a clean failure, got {status:?}:\n{stderr}");
}
