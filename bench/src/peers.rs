//! The peers' real routers, each run as its own process in front of the simulated servers: the SGLang Model Gateway
//! (`smg`, PyPI `smg`) and the vLLM router (`vllm-router`, PyPI `vllm-router`, a fork of SGLang's router), both with
//! their `cache_aware` policy and its defaults. `scripts/setup.sh` installs both, pinned, into the project `.venv`.
//!
//! Both are prebuilt Rust binaries behind a Python entry point. What the harness relies on (read from their
//! `--help` and checked here):
//! - every listener is bound to loopback: `--host 127.0.0.1` for the proxy and `--prometheus-host 127.0.0.1
//!   --prometheus-port Q` for metrics (left out, the metrics listener binds `0.0.0.0:29000`);
//! - at start they health-check each worker's `/health` and discover its model from `/v1/models`, which
//!   `warmpath-sim` serves; the router is ready when its own `/v1/models` lists the model;
//! - they rename their process (`smg::router`, `vllm::router`), so they are stopped by pid (the child handle),
//!   never by name.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warmpath_harness::{free_port, start_on_picked_ports, workspace_root};

/// A peer router run as a separate process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// SGLang Model Gateway, `smg launch --policy cache_aware`.
    Smg,
    /// vLLM router, `vllm-router --policy cache_aware`.
    VllmRouter,
}

impl Peer {
    /// Every peer, in report order.
    pub const ALL: [Peer; 2] = [Peer::Smg, Peer::VllmRouter];

    /// The strategy label (command-line name).
    pub fn label(self) -> &'static str {
        match self {
            Peer::Smg => "SMG_CACHE_AWARE",
            Peer::VllmRouter => "VLLM_ROUTER_CACHE_AWARE",
        }
    }

    /// The executable, which is also what the report's path column shows.
    pub fn binary(self) -> &'static str {
        match self {
            Peer::Smg => "smg",
            Peer::VllmRouter => "vllm-router",
        }
    }

    /// Command-line arguments after the binary: listen on `127.0.0.1:port`, metrics on `127.0.0.1:metrics_port`,
    /// route to `workers` with the `cache_aware` policy, everything else at the peer's defaults.
    pub fn args(self, port: u16, metrics_port: u16, workers: &[SocketAddr]) -> Vec<String> {
        let mut a: Vec<String> = match self {
            Peer::Smg => vec!["launch".into()],
            Peer::VllmRouter => vec![],
        };
        a.extend(["--host".into(), "127.0.0.1".into(), "--port".into(), port.to_string()]);
        a.push("--worker-urls".into());
        a.extend(workers.iter().map(|w| format!("http://{w}")));
        a.extend(["--policy".into(), "cache_aware".into()]);
        a.extend([
            "--prometheus-host".into(),
            "127.0.0.1".into(),
            "--prometheus-port".into(),
            metrics_port.to_string(),
        ]);
        a
    }

    /// The executable's path: `<workspace>/.venv/bin/<binary>`, else the first match on `PATH`.
    ///
    /// Errors with the install command when neither exists.
    pub fn binary_path(self) -> Result<PathBuf> {
        let venv = workspace_root().join(".venv/bin").join(self.binary());
        if venv.is_file() {
            return Ok(venv);
        }
        if let Some(p) = std::env::var_os("PATH")
            .and_then(|path| std::env::split_paths(&path).map(|d| d.join(self.binary())).find(|p| p.is_file()))
        {
            return Ok(p);
        }
        bail!(
            "{} not found in {} or on PATH: run scripts/setup.sh (installs the pinned smg and vllm-router into .venv)",
            self.binary(),
            venv.parent().map(|p| p.display().to_string()).unwrap_or_default()
        )
    }
}

/// A running peer router; dropping it kills the process (by its pid, SIGKILL) and removes its log directory.
pub struct PeerProcess {
    peer: Peer,
    child: Child,
    port: u16,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl PeerProcess {
    /// Starts `peer` in front of `workers` and waits (at most `timeout`) until its `/v1/models` lists `model`.
    ///
    /// Errors: the binary is missing, the process exits early (its log tail is in the message), or it is not ready
    /// in time.
    /// Its two ports are picked free; one taken before the router binds it costs another start with new ports (up to
    /// [`warmpath_harness::PORT_ATTEMPTS`] starts).
    pub async fn start(peer: Peer, workers: &[SocketAddr], model: &str, timeout: Duration) -> Result<Self> {
        Self::start_picking(peer, workers, model, timeout, &mut free_port).await
    }

    /// [`Self::start`] with the ports taken from `pick`.
    async fn start_picking(
        peer: Peer,
        workers: &[SocketAddr],
        model: &str,
        timeout: Duration,
        pick: &mut impl FnMut() -> Result<u16>,
    ) -> Result<Self> {
        start_on_picked_ports(|| Ok(Self::start_on(peer, workers, model, timeout, (pick()?, pick()?)))).await
    }

    async fn start_on(
        peer: Peer,
        workers: &[SocketAddr],
        model: &str,
        timeout: Duration,
        (port, metrics_port): (u16, u16),
    ) -> Result<Self> {
        let bin = peer.binary_path()?;
        let dir = tempfile::Builder::new().prefix("warmpath-peer-").tempdir()?;
        let log_path = dir.path().join(format!("{}.log", peer.binary()));
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(&bin)
            .args(peer.args(port, metrics_port, workers))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let mut p = PeerProcess { peer, child, port, log_path, _dir: dir };
        p.wait_ready(model, timeout).await?;
        Ok(p)
    }

    async fn wait_ready(&mut self, model: &str, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let url = format!("{}/v1/models", self.url());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited during start-up ({status}); log tail:\n{}", self.peer.binary(), self.log_tail(20));
            }
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() && r.text().await.is_ok_and(|t| t.contains(model)) {
                    return Ok(());
                }
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} not ready after {:.0} s (its /v1/models never listed {model:?}); log tail:\n{}",
                    self.peer.binary(),
                    timeout.as_secs_f64(),
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:<port>`, where the router accepts OpenAI requests.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last `n` lines of the router's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listener_is_on_loopback_and_the_policy_is_cache_aware() {
        let w: Vec<SocketAddr> = vec!["127.0.0.1:9001".parse().unwrap(), "127.0.0.1:9002".parse().unwrap()];
        for p in Peer::ALL {
            let a = p.args(7000, 7001, &w);
            let after = |flag: &str| a.iter().position(|x| x == flag).map(|i| a[i + 1].as_str());
            assert_eq!(after("--host"), Some("127.0.0.1"), "{a:?}");
            assert_eq!(after("--prometheus-host"), Some("127.0.0.1"), "{a:?}");
            assert_eq!(after("--prometheus-port"), Some("7001"), "{a:?}");
            assert_eq!(after("--policy"), Some("cache_aware"), "{a:?}");
            assert!(a.contains(&"http://127.0.0.1:9002".to_string()), "{a:?}");
        }
        assert_eq!(Peer::Smg.args(1, 2, &w)[0], "launch");
    }

    /// A port taken between its pick and the router's bind (here: taken on purpose) costs one more start with fresh
    /// ports, not the run. Needs `.venv/bin/smg` (scripts/setup.sh).
    #[tokio::test]
    async fn a_picked_port_taken_before_the_router_binds_it_is_picked_again() {
        let cfg = warmpath_sim::SimConfig::default();
        let model = cfg.model.clone();
        let sim = warmpath_sim::SimServer::start(cfg, "127.0.0.1:0".parse().unwrap()).await.expect("sim");
        // The first listener port is taken; every other pick is free.
        let mut ports = warmpath_harness::TakenFirst::new().expect("bind");
        let p =
            PeerProcess::start_picking(Peer::Smg, &[sim.addr()], &model, Duration::from_secs(60), &mut || ports.pick())
                .await
                .expect("started");
        assert_ne!(p.port, ports.port());
        assert_eq!(ports.picks, 4, "two ports for each of two starts");
        drop(p);
        sim.stop().await;
    }
}
