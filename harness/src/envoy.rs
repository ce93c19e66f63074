//! A real Envoy process on loopback ports, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::config::{to_yaml, EnvoyConfig};
use crate::paths::{envoy_binary, free_port, start_on_picked_ports};
use crate::stats::Stats;

/// A running Envoy started with a rendered [`EnvoyConfig`]. Dropping it kills the process (SIGKILL) and removes its
/// working directory.
pub struct EnvoyProcess {
    child: Child,
    dir: tempfile::TempDir,
    config: EnvoyConfig,
    lds_path: Option<PathBuf>,
    lds_version: u32,
    log_path: PathBuf,
    http: reqwest::Client,
}

impl EnvoyProcess {
    /// Starts Envoy with a static bootstrap (listener inline) and `--concurrency concurrency`, picking free ports for
    /// any port left at 0, and waits until the admin port reports ready and the listener accepts connections.
    pub async fn start(config: EnvoyConfig, concurrency: u32) -> Result<Self> {
        Self::start_picking(config, concurrency, false, &mut free_port).await
    }

    /// Like [`Self::start`], but the listener comes from an LDS file so [`Self::update_listener`] can reconfigure the
    /// plugin at run time.
    pub async fn start_dynamic(config: EnvoyConfig, concurrency: u32) -> Result<Self> {
        Self::start_picking(config, concurrency, true, &mut free_port).await
    }

    /// Starts and waits for readiness, taking the ports left at 0 from `pick`. A port found free can be taken by
    /// another process before Envoy binds it; Envoy then exits with "Address already in use", and the start is
    /// tried again with new ports ([`start_on_picked_ports`]). Ports the caller chose are never replaced.
    async fn start_picking(
        config: EnvoyConfig,
        concurrency: u32,
        dynamic: bool,
        pick: &mut impl FnMut() -> Result<u16>,
    ) -> Result<Self> {
        let ready = |p: EnvoyProcess| async move { p.wait_ready(Duration::from_secs(30)).await.map(|()| p) };
        if config.listener_port != 0 && config.admin_port != 0 {
            return ready(Self::spawn_picking(config, concurrency, dynamic, pick)?).await;
        }
        start_on_picked_ports(|| Ok(ready(Self::spawn_picking(config.clone(), concurrency, dynamic, pick)?))).await
    }

    /// Starts Envoy without waiting for readiness (e.g. to watch it reject a config).
    pub fn spawn(config: EnvoyConfig, concurrency: u32, dynamic: bool) -> Result<Self> {
        Self::spawn_picking(config, concurrency, dynamic, &mut free_port)
    }

    fn spawn_picking(
        mut config: EnvoyConfig,
        concurrency: u32,
        dynamic: bool,
        pick: &mut impl FnMut() -> Result<u16>,
    ) -> Result<Self> {
        if config.listener_port == 0 {
            config.listener_port = pick()?;
        }
        if config.admin_port == 0 {
            config.admin_port = pick()?;
        }
        Self::spawn_in(config, concurrency, |dir, config| {
            let bootstrap_path = dir.join("envoy.yaml");
            if !dynamic {
                std::fs::write(&bootstrap_path, to_yaml(&config.static_bootstrap()))?;
                return Ok((bootstrap_path, None));
            }
            let lds_dir = dir.join("lds");
            std::fs::create_dir_all(&lds_dir)?;
            let lds = lds_dir.join("listeners.yaml");
            std::fs::write(&lds, to_yaml(&config.lds_document()))?;
            std::fs::write(&bootstrap_path, to_yaml(&config.lds_bootstrap(&lds)))?;
            Ok((bootstrap_path, Some(lds)))
        })
    }

    /// Launches Envoy for `config` in a new temporary directory, where `write` puts the bootstrap (and the LDS file
    /// of a dynamic listener) and returns their paths.
    fn spawn_in(
        config: EnvoyConfig,
        concurrency: u32,
        write: impl FnOnce(&Path, &EnvoyConfig) -> Result<(PathBuf, Option<PathBuf>)>,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("warmpath-envoy-").tempdir()?;
        let (bootstrap_path, lds_path) = write(dir.path(), &config)?;
        let log_path = dir.path().join("envoy.log");
        let child = launch(&bootstrap_path, &log_path, concurrency)?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        Ok(EnvoyProcess { child, dir, config, lds_path, lds_version: 0, log_path, http })
    }

    /// Starts Envoy with a bootstrap built elsewhere (for example from a controller's rendered objects):
    /// `render(listener_port, admin_port)` returns it for two ports the harness picked, and the start waits up to
    /// `timeout` until Envoy is ready (a remotely fetched module is fetched and compiled first). Like
    /// [`Self::start`], a port taken before Envoy binds it costs another start with new ports. [`Self::config`] then
    /// carries only the two ports.
    pub async fn start_bootstrap(
        render: impl Fn(u16, u16) -> Value,
        concurrency: u32,
        timeout: Duration,
    ) -> Result<Self> {
        start_on_picked_ports(|| {
            let (listener_port, admin_port) = (free_port()?, free_port()?);
            let config = EnvoyConfig::new(vec![], "{}").ports(listener_port, admin_port);
            let p = Self::spawn_in(config, concurrency, |dir, _| {
                let bootstrap_path = dir.join("envoy.json");
                std::fs::write(&bootstrap_path, render(listener_port, admin_port).to_string())?;
                Ok((bootstrap_path, None))
            })?;
            Ok(async move { p.wait_ready(timeout).await.map(|()| p) })
        })
        .await
    }

    /// Runs `envoy --mode validate` on the static bootstrap of `config`; returns Envoy's output on success and an
    /// error carrying it on failure.
    pub fn validate(config: &EnvoyConfig) -> Result<String> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, to_yaml(&config.static_bootstrap()))?;
        validate_file(&path)
    }

    /// `http://127.0.0.1:<listener port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.config.listener_port)
    }

    /// `http://127.0.0.1:<admin port>`.
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.config.admin_port)
    }

    /// The process id (for CPU accounting from `/proc/<pid>/stat`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config Envoy currently runs with.
    pub fn config(&self) -> &EnvoyConfig {
        &self.config
    }

    /// Envoy's log so far (stdout + stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Whether the process has exited, with its exit code.
    pub fn try_exit_code(&mut self) -> Option<i32> {
        self.child.try_wait().ok().flatten().map(|s| s.code().unwrap_or(-1))
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<i32> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(code) = self.try_exit_code() {
                return Ok(code);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("envoy still running after {timeout:?}")
    }

    /// Waits until `/ready` answers 200 and the listener accepts TCP connections; fails early (with Envoy's log) if
    /// the process exits.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Ok(r) = self.http.get(format!("{}/ready", self.admin_url())).send().await {
                if r.status().is_success()
                    && tokio::net::TcpStream::connect(("127.0.0.1", self.config.listener_port)).await.is_ok()
                {
                    return Ok(());
                }
            }
            // A dead process never becomes ready: report its log instead of timing out (try_wait needs &mut).
            if !crate::process::alive(self.child.id()) {
                bail!("envoy exited before becoming ready; log:\n{}", self.log());
            }
            if start.elapsed() > timeout {
                bail!("envoy not ready after {timeout:?}; log:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// All counters and gauges from the admin `/stats` endpoint.
    pub async fn stats(&self) -> Result<Stats> {
        let text = self.http.get(format!("{}/stats", self.admin_url())).send().await?.text().await?;
        Ok(Stats::parse(&text))
    }

    /// Rewrites the LDS file with the listener of `config` (write to a temp file, then rename, which is what Envoy's
    /// directory watch reacts to) and waits until Envoy accepted or rejected it.
    ///
    /// Returns `Ok(true)` when `listener_manager.lds.update_success` went up, `Ok(false)` when
    /// `update_rejected` went up. Errors if the process was started without LDS or nothing happened in 15 s.
    /// Ports are kept from the running config.
    pub async fn update_listener(&mut self, mut config: EnvoyConfig) -> Result<bool> {
        let Some(lds) = self.lds_path.clone() else { bail!("update_listener needs start_dynamic") };
        config.listener_port = self.config.listener_port;
        config.admin_port = self.config.admin_port;
        let before = self.stats().await?;
        let (ok0, rej0) =
            (before.get("listener_manager.lds.update_success"), before.get("listener_manager.lds.update_rejected"));
        self.lds_version += 1;
        let mut doc = config.lds_document();
        doc["version_info"] = self.lds_version.to_string().into();
        let tmp = self.dir.path().join("lds").join(".listeners.yaml.tmp");
        std::fs::write(&tmp, to_yaml(&doc))?;
        std::fs::rename(&tmp, &lds)?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            let s = self.stats().await?;
            if s.get("listener_manager.lds.update_success") > ok0 {
                self.config = config;
                // The new filter chain is in place once the old listener has drained; wait for the new one to serve.
                self.wait_ready(Duration::from_secs(15)).await?;
                return Ok(true);
            }
            if s.get("listener_manager.lds.update_rejected") > rej0 {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("envoy neither accepted nor rejected the LDS update in 15 s; log:\n{}", self.log())
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("WARMPATH_KEEP_ENVOY_LOG").is_some() || std::thread::panicking() {
            eprintln!("--- envoy log ({}) ---\n{}", self.log_path.display(), self.log());
        }
    }
}

/// Spawns `envoy -c bootstrap --concurrency N` on loopback with its output in `log_path`.
fn launch(bootstrap_path: &Path, log_path: &Path, concurrency: u32) -> Result<Child> {
    let log = std::fs::File::create(log_path)?;
    Command::new(envoy_binary()?)
        .arg("-c")
        .arg(bootstrap_path)
        .args(["--concurrency", &concurrency.to_string()])
        // Access logs (only the timing log, when asked for) reach the file this soon after a request ends.
        .args(["--file-flush-interval-msec", &crate::timing::FLUSH_INTERVAL_MS.to_string()])
        .args(["--disable-hot-restart", "--log-level", "info", "--log-format", "[%Y-%m-%d %T.%e][%l][%n] %v"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("spawning envoy")
}

/// Runs `envoy --mode validate -c path`; returns the output on success, an error with the output otherwise.
pub fn validate_file(path: &Path) -> Result<String> {
    let out = Command::new(envoy_binary()?)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(path)
        .output()
        .context("running envoy --mode validate")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("envoy rejected {}:\n{text}", path.display());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::port_was_taken;

    /// A listener port taken between its pick and Envoy's bind (here: taken on purpose) costs one more start, with
    /// fresh ports, not the test; a port the caller chose is not replaced. Needs `.venv/bin/envoy`.
    #[tokio::test]
    async fn a_picked_port_taken_before_envoy_binds_it_is_picked_again() {
        let mut ports = crate::paths::TakenFirst::new().expect("bind");
        let envoy = EnvoyProcess::start_picking(EnvoyConfig::new(vec![], "{}"), 1, false, &mut || ports.pick())
            .await
            .expect("started");
        assert_ne!(envoy.config().listener_port, ports.port());
        assert_eq!(ports.picks, 4, "two ports for each of two starts");
        drop(envoy);

        let chosen = EnvoyConfig::new(vec![], "{}").ports(ports.port(), free_port().expect("port"));
        let err = EnvoyProcess::start(chosen, 1).await.err().expect("a chosen port in use is an error");
        assert!(port_was_taken(&err), "{err}");
    }
}
