//! The `warmpath-envoy run` launcher (what `scripts/envoy.sh run` execs): signals stop its Envoy, and a bad plugin
//! config is refused before Envoy starts.
//!
//! Needs `.venv/bin/envoy` and the release filter module, like the other end-to-end tests.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use warmpath_harness::process::{alive, wait_exit, KillOnDrop};
use warmpath_harness::{filter_wasm, free_port, start_on_picked_ports};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_warmpath-envoy");

/// Pids whose command line mentions `needle` (the launcher's unique bootstrap path).
fn pids_with_arg(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|arg| arg == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

fn launch(out: &Path, plugin_config: &str, admin_port: u16, upstream_port: u16) -> KillOnDrop {
    let wasm = filter_wasm().expect("filter module");
    KillOnDrop::spawn_for_stderr(
        Command::new(LAUNCHER)
            .arg("run")
            .args(["--upstream", &format!("127.0.0.1:{upstream_port}")])
            .args(["--listener-port", &free_port().unwrap().to_string()])
            .args(["--admin-port", &admin_port.to_string()])
            .arg("--wasm")
            .arg(wasm)
            .args(["--plugin-config", plugin_config])
            .args(["--concurrency", "1"])
            .arg("--out")
            .arg(out),
    )
    .expect("spawning warmpath-envoy")
}

#[tokio::test]
async fn sigterm_to_the_launcher_stops_envoy() {
    // A bound but never-accepting socket stands in for the model server: only the admin port is exercised.
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    // A picked port taken before Envoy binds it costs another start with new ports, as in the harness.
    let (mut guard, _out) = start_on_picked_ports(|| {
        let out = tempfile::tempdir()?;
        let admin_port = free_port()?;
        let mut guard = launch(out.path(), "{}", admin_port, upstream.local_addr()?.port());
        let bootstrap = out.path().join("envoy.yaml").to_string_lossy().into_owned();
        let http = http.clone();
        Ok(async move {
            let start = Instant::now();
            loop {
                if guard.envoy.is_none() {
                    guard.envoy = pids_with_arg(&bootstrap).into_iter().find(|p| *p != guard.child.id());
                }
                let ready = http.get(format!("http://127.0.0.1:{admin_port}/ready")).send().await;
                if guard.envoy.is_some() && ready.is_ok_and(|r| r.status().is_success()) {
                    return Ok((guard, out));
                }
                if guard.child.try_wait()?.is_some() {
                    anyhow::bail!("launcher exited before Envoy was ready:\n{}", guard.stderr());
                }
                anyhow::ensure!(start.elapsed() < Duration::from_secs(30), "Envoy not ready after 30 s");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    })
    .await
    .expect("Envoy started by the launcher");
    let envoy = guard.envoy.unwrap();

    let sent = Command::new("kill").args(["-TERM", &guard.child.id().to_string()]).status().unwrap();
    assert!(sent.success(), "kill -TERM failed");
    let status =
        wait_exit(&mut guard.child, Duration::from_secs(10)).expect("launcher still running 10 s after SIGTERM");
    let start = Instant::now();
    while alive(envoy) && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(envoy), "Envoy (pid {envoy}) still running 10 s after the launcher got SIGTERM");
    assert_eq!(status.code(), Some(143), "exit status after SIGTERM: {status:?}");
}

#[test]
fn bad_plugin_config_is_refused_before_envoy_starts() {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut guard =
        launch(out.path(), r#"{"prefix_length": 10}"#, free_port().unwrap(), upstream.local_addr().unwrap().port());
    let status = wait_exit(&mut guard.child, Duration::from_secs(20));
    let bootstrap = out.path().join("envoy.yaml").to_string_lossy().into_owned();
    guard.envoy = pids_with_arg(&bootstrap).into_iter().find(|p| *p != guard.child.id());
    let status = status.expect("launcher still running 20 s after being given a bad prefix_length");
    let stderr = guard.stderr();
    assert!(!status.success(), "launcher succeeded with a bad prefix_length; stderr:\n{stderr}");
    assert!(stderr.contains("`prefix_length` = 10 is out of range"), "stderr:\n{stderr}");
    assert_eq!(stderr.lines().filter(|l| !l.trim().is_empty()).count(), 1, "one-line error expected:\n{stderr}");
    assert!(guard.envoy.is_none(), "Envoy was started for a config the filter rejects");
    assert!(!out.path().join("envoy.yaml").exists(), "bootstrap written for a rejected config");
}

/// `warmpath-envoy render` run from a directory outside the repository: the defaults are the workspace's plugin
/// config and filter module (absolute paths, so the bootstrap works wherever Envoy runs), and a relative
/// `--plugin-config` is read from the working directory.
#[test]
fn defaults_are_the_workspace_s_files_from_any_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let render = |extra: &[&str]| {
        let out = Command::new(LAUNCHER)
            .current_dir(cwd.path())
            .args(["render", "--upstream", "127.0.0.1:8001"])
            .args(extra)
            .output()
            .expect("running warmpath-envoy render");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "render failed from {}:\n{stderr}", cwd.path().display());
        String::from_utf8(out.stdout).unwrap()
    };
    let yaml = render(&[]);
    let wasm = filter_wasm().expect("filter module");
    assert!(yaml.contains(&*wasm.to_string_lossy()), "the bootstrap does not load {}:\n{yaml}", wasm.display());
    assert!(yaml.contains("PREFIX_AWARE"), "the workspace's plugin config (PREFIX_AWARE) is not in:\n{yaml}");
    std::fs::write(cwd.path().join("mine.json"), r#"{"strategy": "RANDOM"}"#).unwrap();
    let yaml = render(&["--plugin-config", "mine.json"]);
    assert!(yaml.contains("RANDOM") && !yaml.contains("PREFIX_AWARE"), "mine.json was not read:\n{yaml}");
}
