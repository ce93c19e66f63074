//! Renders and runs warmpath Envoy configs.
//!
//! ```text
//! warmpath-envoy render   [OPTIONS]            # print the bootstrap YAML
//! warmpath-envoy run      [OPTIONS]            # render into <workspace>/out/envoy/ and exec envoy --concurrency N
//! warmpath-envoy examples                     # rewrite envoy/envoy.yaml and envoy/envoy-no-filter.yaml
//! warmpath-envoy validate FILE...              # envoy --mode validate on each file
//! ```
//! `scripts/envoy.sh` wraps `run`; `envoy/*.yaml` are `render` outputs (kept in sync by a test). Paths given on the
//! command line are read from the working directory; the defaults are the workspace's files, wherever it runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use warmpath_core::Settings;
use warmpath_harness::{envoy_binary, filter_wasm, workspace_root, EnvoyConfig, FeedCluster};

#[derive(Parser)]
#[command(about = "Render, run and validate warmpath Envoy configs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the static bootstrap YAML.
    Render(RenderArgs),
    /// Render the bootstrap into --out and exec Envoy on it (foreground).
    Run {
        #[command(flatten)]
        render: RenderArgs,
        /// Envoy worker threads.
        #[arg(long, default_value_t = 2)]
        concurrency: u32,
        /// Directory for the rendered bootstrap [default: <workspace>/out/envoy].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Rewrite the committed example configs `envoy/*.yaml` of the workspace.
    Examples,
    /// Run `envoy --mode validate` on each file.
    Validate {
        /// Bootstrap files (at least one).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Args)]
struct RenderArgs {
    /// Model-server endpoint (IP:port); repeat for each. Also written into the plugin config's `endpoints` unless
    /// the plugin config sets them.
    #[arg(long = "upstream", required = true)]
    upstreams: Vec<SocketAddr>,
    /// Listener port on 127.0.0.1.
    #[arg(long, default_value_t = 10000)]
    listener_port: u16,
    /// Admin port on 127.0.0.1.
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// Filter module path (as Envoy should read it; relative paths resolve against Envoy's working directory)
    /// [default: the release build, `$WARMPATH_FILTER_WASM` or `<target dir>/wasm32-wasip1/release/warmpath_filter.wasm`].
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// Leave the wasm filter out (plain override_host cluster; the benchmark baseline).
    #[arg(long)]
    no_filter: bool,
    /// Plugin configuration: a JSON file path, or inline JSON starting with `{` [default:
    /// <workspace>/envoy/plugin-config.json].
    #[arg(long)]
    plugin_config: Option<String>,
    /// Feed cluster as NAME=IP:port.
    #[arg(long)]
    feed: Option<String>,
    /// Add the test-rig response headers `x-rig-upstream-host` (Envoy's upstream host) and `x-rig-decision` (the
    /// filter's decision record): for measuring rigs whose client is the operator, never in front of clients.
    #[arg(long)]
    rig_headers: bool,
}

impl RenderArgs {
    fn config(&self) -> Result<EnvoyConfig> {
        let text = match self.inline_plugin_config() {
            Some(json) => json.to_string(),
            None => {
                let path = self.plugin_config_path();
                std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?
            }
        };
        let mut plugin: serde_json::Value = serde_json::from_str(&text).context("plugin config is not JSON")?;
        if let Some(obj) = plugin.as_object_mut() {
            obj.entry("endpoints").or_insert_with(|| self.upstreams.iter().map(|a| a.to_string()).collect());
        }
        if !self.no_filter {
            // Envoy would only log the filter's rejection and then fail open on every request; refuse up front.
            let bytes = serde_json::to_vec(&plugin)?;
            let settings = match Settings::from_json(&bytes) {
                Ok(settings) => settings,
                Err(e) => bail!("plugin config {}: {e}", self.plugin_config_name()),
            };
            // Allowed (a feed may list the cluster's members later), but Envoy sends a pick of a host outside the
            // cluster elsewhere: say so now rather than only in the filter's counters.
            let members: Vec<String> = self.upstreams.iter().map(SocketAddr::to_string).collect();
            for e in settings.endpoints.iter().filter(|e| !members.contains(e)) {
                eprintln!(
                    "warmpath-envoy: warning: plugin config endpoint {e} is not an --upstream; Envoy will not honour \
                     picks of it (counted in warmpath.picks_not_honoured)"
                );
            }
        }
        let mut cfg = EnvoyConfig::new(self.upstreams.clone(), serde_json::to_string_pretty(&plugin)?)
            .ports(self.listener_port, self.admin_port);
        if !self.no_filter {
            let wasm = match &self.wasm {
                Some(w) => w.clone(),
                None => filter_wasm()?,
            };
            cfg = cfg.with_wasm(&wasm);
        }
        if self.rig_headers {
            cfg = cfg.with_rig_headers();
        }
        if let Some(feed) = &self.feed {
            let (name, addr) = feed.split_once('=').context("--feed wants NAME=IP:port")?;
            cfg = cfg.with_feed(FeedCluster { name: name.to_string(), address: addr.parse()? });
        }
        Ok(cfg)
    }

    /// The inline JSON given as `--plugin-config`, if that is what it is.
    fn inline_plugin_config(&self) -> Option<&str> {
        self.plugin_config.as_deref().filter(|c| c.trim_start().starts_with('{'))
    }

    /// The plugin config file: the one given, else the workspace's example.
    fn plugin_config_path(&self) -> PathBuf {
        match &self.plugin_config {
            Some(p) => PathBuf::from(p),
            None => workspace_root().join("envoy/plugin-config.json"),
        }
    }

    /// The plugin config as named in messages: the file path, or `(inline)`.
    fn plugin_config_name(&self) -> String {
        match self.inline_plugin_config() {
            Some(_) => "(inline)".to_string(),
            None => self.plugin_config_path().display().to_string(),
        }
    }
}

/// Runs Envoy in the foreground until it exits or the launcher gets SIGINT/SIGTERM; on a signal Envoy is killed
/// and waited for (so a supervisor's SIGTERM does not orphan it) and the exit code is 128 + the signal number.
async fn run_envoy(path: &Path, concurrency: u32) -> Result<i32> {
    let mut child = tokio::process::Command::new(envoy_binary()?)
        .arg("-c")
        .arg(path)
        .args(["--concurrency", &concurrency.to_string(), "--disable-hot-restart"])
        .kill_on_drop(true)
        .spawn()
        .context("spawning envoy")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let code = tokio::select! {
        status = child.wait() => return Ok(status?.code().unwrap_or(1)),
        _ = tokio::signal::ctrl_c() => 130,
        _ = term.recv() => 143,
    };
    eprintln!("warmpath-envoy: signal received, stopping Envoy");
    child.kill().await.context("stopping envoy")?;
    Ok(code)
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Render(r) => print!("{}", r.config()?.render_static_yaml()),
        Cmd::Run { render, concurrency, out } => {
            let out = out.unwrap_or_else(|| workspace_root().join("out/envoy"));
            std::fs::create_dir_all(&out)?;
            let path = out.join("envoy.yaml");
            std::fs::write(&path, render.config()?.render_static_yaml())?;
            eprintln!(
                "warmpath-envoy: {} (listener 127.0.0.1:{}, admin 127.0.0.1:{})",
                path.display(),
                render.listener_port,
                render.admin_port
            );
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let code = rt.block_on(run_envoy(&path, concurrency))?;
            std::process::exit(code);
        }
        Cmd::Examples => {
            for (file, cfg) in warmpath_harness::example_configs() {
                std::fs::write(workspace_root().join(file), cfg.render_static_yaml())?;
                println!("wrote {file}");
            }
        }
        Cmd::Validate { files } => {
            for f in files {
                warmpath_harness::validate_file(&f)?;
                println!("{}: OK", f.display());
            }
        }
    }
    Ok(())
}
