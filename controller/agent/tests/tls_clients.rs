//! The agent builds TLS clients without panicking. rustls panics on the first TLS client when more
//! than one crypto provider is compiled in and the process picked none; the binary must carry
//! exactly one (ring — `cargo tree -e features -i rustls -p warmpath-agent`; the in-memory API
//! client, whose jsonschema brings aws-lc-rs, lives in `tests/cluster` for that reason). Both TLS paths are driven at 127.0.0.1 port 9, where nothing
//! listens: the API server client of `run` (kube), and an `https://` model source of `fetch`
//! (object_store's reqwest, which picks its provider itself today — checked so it stays so). Each
//! must fail or keep retrying, never panic.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Waits up to `limit` for the child to exit, then kills it; returns (exit status if it exited, stdout,
/// stderr). Output is small (a few lines), so reading after exit cannot block on a full pipe.
fn finish(mut child: Child, limit: Duration) -> (Option<std::process::ExitStatus>, String, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let mut stdout = String::new();
    if let Some(out) = child.stdout.as_mut() {
        std::io::Read::read_to_string(out, &mut stdout).unwrap();
    }
    (status, stdout, stderr)
}

#[test]
fn run_builds_its_api_server_client_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\n\
contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["run", "--node", "n1", "--poll-seconds", "1", "--host-path"])
        .arg(dir.path())
        .env("KUBECONFIG", &kubeconfig)
        .env("WARMPATH_CACHE_ROOT", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The node loop retries a refused API server forever: give it time to try a few times.
    let (status, _, stderr) = finish(child, Duration::from_secs(3));
    assert!(!stderr.contains("panicked"), "the agent panicked:\n{stderr}");
    assert!(status.is_none_or(|s| s.code() != Some(101)), "{status:?}:\n{stderr}");
}

#[test]
fn fetch_from_an_https_source_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["fetch", "--key", "ml.m", "--source", "https://127.0.0.1:9/model.safetensors", "--root"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, _, stderr) = finish(child, Duration::from_secs(30));
    assert!(!stderr.contains("panicked"), "the agent panicked:\n{stderr}");
    let status = status.expect("fetch neither failed nor finished within 30 s");
    assert_eq!(status.code(), Some(1), "a refused source is a reported failure:\n{stderr}");
}

/// Effective uid of this process, from /proc (no unsafe FFI).
fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// A Hugging Face source with no home directory, as in a scratch image (no `HOME`, no /etc/passwd):
/// hf-hub's default cache directory would panic ("Cache directory cannot be found"); the agent names
/// its own, so the refused Hub endpoint is a reported `HubError`. When the test runs as root, the
/// child runs as a uid that has no passwd entry, which is what makes the home lookup fail.
#[test]
fn fetch_from_the_hub_without_a_home_directory_fails_cleanly() {
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    // The other uid may not traverse the build directory: run a copy from a world-readable temp dir
    // (/tmp), with a world-writable cache root.
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("warmpath-agent");
    std::fs::copy(env!("CARGO_BIN_EXE_warmpath-agent"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.args(["fetch", "--key", "ml.m", "--source", "hf://org/model?endpoint=http://127.0.0.1:9", "--root"])
        .arg(&root)
        .env_remove("HOME")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let homeless = euid() == Some(0);
    if homeless {
        cmd.uid(54_321).gid(54_321);
    } else {
        eprintln!("not root: the child keeps this uid, whose passwd entry still gives a home directory");
    }
    let (status, stdout, stderr) = finish(cmd.spawn().unwrap(), Duration::from_secs(30));
    assert!(!stderr.contains("panicked"), "the agent panicked (homeless: {homeless}):\n{stderr}");
    assert_eq!(status.expect("fetch neither failed nor finished within 30 s").code(), Some(1), "{stderr}");
    assert!(stdout.contains(r#""reason":"HubError""#), "{stdout}");
}
