//! `warmpath-agent` binary: `run` (the DaemonSet's node loop), `fetch` (one cache, one shot: used by
//! the pod's cold-node fallback init container and by benchmarks) and `remove`.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Args, Parser, Subcommand};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warmpath_agent::{
    disk::FixedFreeSpace,
    fetch::{DEFAULT_CHUNK_SIZE, DEFAULT_CONCURRENCY},
    source::SourceAuth,
    sync::{remove_cache, DEFAULT_RESERVE_BYTES},
    sync_cache, CacheRequest, SourceSpec, SyncOptions,
};

#[derive(Parser)]
#[command(name = "warmpath-agent", version, about = "warmpath node agent: model weights on node-local disk")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Download one source into <root>/<key>/current (resumable; prints a JSON report).
    Fetch(FetchArgs),
    /// The DaemonSet's node loop: sync the ModelCaches targeting NODE_NAME, report on the Node.
    Run {
        /// Node this agent runs on (downward API `spec.nodeName`).
        #[arg(long, env = "NODE_NAME")]
        node: String,
        /// The node directory mounted at `--root` (ModelCaches with another hostPath are reported as not mounted).
        #[arg(long, default_value = "/opt/warmpath/models")]
        host_path: String,
        /// Seconds between scans of ModelCaches.
        #[arg(long, default_value_t = 15)]
        poll_seconds: u64,
        /// Use a root that holds files the agent did not create (it never touches them); without it
        /// such a root is refused with reason ForeignFiles.
        #[arg(long)]
        allow_foreign_files: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Remove one cache from this node.
    Remove {
        /// Cache root.
        #[arg(long, env = "WARMPATH_CACHE_ROOT", default_value = "/opt/warmpath/models")]
        root: PathBuf,
        /// Cache key (`<namespace>.<name>`).
        #[arg(long)]
        key: String,
    },
}

/// Settings shared by `fetch` and the node loop.
#[derive(Args, Clone)]
struct EngineArgs {
    /// Cache root on the node.
    #[arg(long, env = "WARMPATH_CACHE_ROOT", default_value = "/opt/warmpath/models")]
    root: PathBuf,
    /// Range size of each ranged read, bytes.
    #[arg(long, default_value_t = DEFAULT_CHUNK_SIZE)]
    chunk_size: u64,
    /// Ranged reads in flight (agent-wide).
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Bytes to keep free on the cache filesystem; downloads that would eat into it are refused.
    #[arg(long, default_value_t = DEFAULT_RESERVE_BYTES)]
    reserve_bytes: u64,
    /// Pretend the filesystem has exactly this many free bytes (operator quota; tests).
    #[arg(long)]
    free_bytes_override: Option<u64>,
    /// File holding the Hugging Face token (else `HF_TOKEN`).
    #[arg(long, env = "WARMPATH_HF_TOKEN_FILE")]
    hf_token_file: Option<PathBuf>,
}

impl EngineArgs {
    fn options(&self) -> anyhow_like::Result<SyncOptions> {
        let mut o = SyncOptions::new(&self.root);
        o.fetch.chunk_size = self.chunk_size;
        o.fetch.concurrency = self.concurrency;
        o.fetch.permits = Arc::new(Semaphore::new(self.concurrency.max(1)));
        o.reserve_bytes = self.reserve_bytes;
        if let Some(free) = self.free_bytes_override {
            o.free_space = Arc::new(FixedFreeSpace(free));
        }
        let token = match &self.hf_token_file {
            Some(p) => Some(
                std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?.trim().to_string(),
            ),
            None => std::env::var("HF_TOKEN").ok(),
        };
        o.auth = SourceAuth { hf_token: token.filter(|t| !t.is_empty()) };
        Ok(o)
    }
}

#[derive(Args)]
struct FetchArgs {
    /// `s3://bucket/prefix?region=R&endpoint=URL`, `http(s)://host/path/file`, `hf://org/name?revision=REV`.
    #[arg(long)]
    source: String,
    /// Cache key (`<namespace>.<name>`; one directory under the root).
    #[arg(long)]
    key: String,
    /// Expected checksum of a file: `path/in/cache=HEX` (repeatable).
    #[arg(long = "sha256", value_parser = parse_kv)]
    sha256: Vec<(String, String)>,
    /// Ask the source even when a verified copy made for the same source and checksums is current.
    /// Without it (a pod's start) such a copy is used at once and the source is not contacted: the
    /// node agent checks for updates on its own schedule.
    #[arg(long)]
    refresh: bool,
    /// The only version to make current (`ModelCache.status.pinned.version`, set by the controller): a
    /// copy of it is served at once; a source that no longer lists it is refused (`SourceChanged`).
    #[arg(long)]
    pin: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| format!("{s:?}: expected FILE=HEX"))
}

mod anyhow_like {
    pub type Result<T> = std::result::Result<T, String>;
}

fn fail(reason: &str, message: &str) -> ExitCode {
    println!("{}", serde_json::json!({ "phase": "Failed", "reason": reason, "message": message }));
    ExitCode::FAILURE
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Fetch(a) => {
            let mut opts = match a.engine.options() {
                Ok(o) => o,
                Err(e) => return fail("InvalidConfig", &e),
            };
            opts.local_first = !a.refresh;
            let source = match SourceSpec::parse_uri(&a.source) {
                Ok(s) => s,
                Err(e) => return fail(e.reason(), &e.to_string()),
            };
            let req = CacheRequest {
                key: a.key,
                source,
                sha256: a.sha256.into_iter().collect::<BTreeMap<_, _>>(),
                pin: a.pin,
            };
            // SIGTERM (what the kubelet sends a pod's init container) or Ctrl-C: stop at the next chunk, keep the
            // progress for the next attempt, and report `Cancelled` as JSON like any other outcome.
            let cancel = CancellationToken::new();
            cancel_on_signal(cancel.clone());
            // Listing the source and hashing a file do not stop at a cancel: past a short grace, say so and go,
            // rather than leave a pod's deletion waiting out its grace period.
            let grace = cancel.clone();
            tokio::spawn(async move {
                grace.cancelled().await;
                tokio::time::sleep(std::time::Duration::from_secs(CANCEL_GRACE_S)).await;
                fail("Cancelled", "cancelled while listing the source or hashing a file; progress kept");
                std::process::exit(1);
            });
            match sync_cache(&req, &opts, &cancel, None).await {
                Ok(r) => {
                    println!("{}", serde_json::json!({ "phase": "Ready", "report": r }));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e.reason(), &e.to_string()),
            }
        }
        Cmd::Run { node, host_path, poll_seconds, allow_foreign_files, engine } => {
            let opts = match engine.options() {
                Ok(o) => o,
                Err(e) => return fail("InvalidConfig", &e),
            };
            let client = match kube::Client::try_default().await {
                Ok(c) => c,
                Err(e) => return fail("KubernetesError", &e.to_string()),
            };
            let agent = warmpath_agent::node::NodeAgent::new(client, node, host_path, opts)
                .with_allow_foreign_files(allow_foreign_files);
            let stop = CancellationToken::new();
            cancel_on_signal(stop.clone());
            agent.run(std::time::Duration::from_secs(poll_seconds.max(1)), stop).await;
            ExitCode::SUCCESS
        }
        Cmd::Remove { root, key } => match remove_cache(&root, &key) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => fail(
                "ForeignFiles",
                &format!("{} was not created by the agent; left in place", root.join(&key).display()),
            ),
            Err(e) => fail(e.reason(), &e.to_string()),
        },
    }
}

/// Seconds `fetch` waits, after a signal, for the download to stop at its next chunk before it exits anyway.
const CANCEL_GRACE_S: u64 = 5;

/// Cancels `token` on the first SIGTERM or SIGINT.
fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
        token.cancel();
    });
}
