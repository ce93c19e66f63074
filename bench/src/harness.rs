//! Runs one strategy end to end: fresh simulated servers on loopback, then either a real Envoy with the warmpath
//! filter (RANDOM / LEAST_OUTSTANDING_REQUESTS / PREFIX_AWARE), a peer's real router as its own process
//! (SMG_CACHE_AWARE, VLLM_ROUTER_CACHE_AWARE), or client-side routing (a baseline policy, DYNAMO_KV, ORACLE) whose
//! picks travel through the same Envoy without the filter ([`ClientHop`]), an open-loop replay of the workload, and
//! the server-side truth collected afterwards.
//!
//! Every child (Envoy, peer router) is killed on drop, and servers stop on drop, so an error or Ctrl-C cleans up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinSet;
use warmpath_core::feed::{FeedEndpoint, FeedSnapshot};
use warmpath_core::Settings;
use warmpath_harness::cpu::{tree_cpu_seconds, MachineCpu};
use warmpath_harness::timing::{self, ProxyTiming};
use warmpath_harness::{filter_wasm, EnvoyConfig, EnvoyProcess, FeedCluster, FeedServer, FILTER_STAT_PREFIX};
use warmpath_sim::{SimConfig, SimServer};

use crate::baselines::Baseline;
use crate::client::{send, Destination, Outcome};
use crate::kvcost::{CostKind, CostRouter};
use crate::loads::{scrape, ServerMetrics};
use crate::peers::{Peer, PeerProcess};
use crate::router::ClientRouter;
use crate::workload::Request;

/// The filter's strategies (plugin `strategy` values), all run through Envoy.
pub const FILTER_STRATEGIES: [&str; 3] = ["RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE"];

/// A strategy to compare.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// A filter strategy by its plugin-config name, routed by Envoy + the wasm filter.
    Filter(String),
    /// A baseline routed client-side.
    Baseline(Baseline),
    /// A peer's real router, run as its own process.
    Peer(Peer),
    /// KV-block cost routing client-side: Dynamo-style, or the exact-state reference.
    Cost(CostKind),
}

impl Strategy {
    /// Parses a command-line name: a filter strategy or a baseline label.
    pub fn parse(s: &str) -> anyhow::Result<Strategy> {
        let up = s.trim().to_ascii_uppercase();
        if FILTER_STRATEGIES.contains(&up.as_str()) {
            return Ok(Strategy::Filter(up));
        }
        let named = Baseline::ALL
            .into_iter()
            .map(Strategy::Baseline)
            .chain(Peer::ALL.into_iter().map(Strategy::Peer))
            .chain(CostKind::ALL.into_iter().map(Strategy::Cost));
        let mut all = named.clone().map(|s| s.label());
        named.clone().find(|x| x.label() == up).ok_or_else(|| {
            let filters = FILTER_STRATEGIES.iter().map(|s| s.to_string());
            let names: Vec<String> = filters.chain(all.by_ref()).collect();
            anyhow::anyhow!("unknown strategy {s:?}; choose from {}", names.join(", "))
        })
    }

    /// The report label.
    pub fn label(&self) -> String {
        match self {
            Strategy::Filter(s) => s.clone(),
            Strategy::Baseline(b) => b.label().to_string(),
            Strategy::Peer(p) => p.label().to_string(),
            Strategy::Cost(c) => c.label().to_string(),
        }
    }

    /// True when requests go through Envoy and the filter.
    pub fn via_envoy(&self) -> bool {
        matches!(self, Strategy::Filter(_))
    }

    /// The report's path column: `envoy` (Envoy with the filter), the peer's process (`smg`, `vllm-router`), or
    /// for the harness's own routers `envoy-pick` (their pick through Envoy without the filter) or `direct` (no
    /// proxy hop), as `hop` says.
    pub fn path(&self, hop: ClientHop) -> &'static str {
        match (self, hop) {
            (Strategy::Filter(_), _) => "envoy",
            (Strategy::Peer(p), _) => p.binary(),
            (Strategy::Baseline(_) | Strategy::Cost(_), ClientHop::Envoy) => "envoy-pick",
            (Strategy::Baseline(_) | Strategy::Cost(_), ClientHop::Direct) => "direct",
        }
    }
}

/// How the requests of the harness's own routers (the re-implemented baselines, DYNAMO_KV and the exact-state
/// references) reach the servers. The filter and the peers' routers are proxies, so a request pays one proxy
/// hop (and, with the filter, the body's buffering) before its server sees it; sending the client-side picks
/// through the same hop makes the TTFT columns comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ClientHop {
    /// Through an Envoy started from the same bootstrap as the filter's, without the filter and without the
    /// strip of client destination headers: the pick travels in `x-gateway-destination-endpoint` and Envoy's
    /// `override_host` policy sends the request there (the path column says `envoy-pick`).
    #[default]
    Envoy,
    /// Straight from the client to the picked server, no proxy hop (the path column says `direct`).
    Direct,
}

/// Keys of the plugin configuration the harness sets itself: `strategy` is the strategy being measured (its report
/// label), `endpoints` are the simulated servers, and `feed` is the harness's own feed server (several gateways, or
/// [`RunSettings::feed`]), so extra configuration may not override them.
pub const HARNESS_OWNED_KEYS: [&str; 3] = ["strategy", "endpoints", "feed"];

/// Envoy cluster of the harness's feed server.
const FEED_CLUSTER: &str = "warmpath_feed";

/// The feed path the gateways poll on the harness's feed server.
const FEED_PATH: &str = "/v1/feed/bench";

/// The feed poll interval for time scale `time_scale`: the filter's tick with a feed in simulated time
/// (`warmpath_core::config::FEED_TICK_MS`), so the gateways exchange index records and pending work as often, in
/// simulated time, as a deployment does in real time (at time scale 0.2: every 10 ms). Below time scale 0.2 that
/// would be shorter than the filter takes (`FEED_INTERVAL_RANGE`), so the gateways exchange less often than a
/// deployment (see [`feed_interval_note`]). A gateway polls the snapshot as often, where a deployment polls it every
/// second or more; what changes in it comes from [`load_scrape_ms`].
pub fn feed_interval_ms(time_scale: f64) -> u64 {
    let (lo, hi) = warmpath_core::config::FEED_INTERVAL_RANGE;
    ((warmpath_core::config::FEED_TICK_MS as f64 * time_scale).round() as u64).clamp(lo, hi)
}

/// A warning when the feed interval at `time_scale` is longer, in simulated time, than a deployment's tick: the
/// gateways then learn each other's placements and queued work later than they would in a deployment.
pub fn feed_interval_note(time_scale: f64) -> Option<String> {
    let deployed = warmpath_core::config::FEED_TICK_MS as f64;
    let shortest = warmpath_core::config::FEED_INTERVAL_RANGE.0 as f64;
    // Only when the interval was raised to the filter's shortest (rounding to whole ms is not worth a note).
    let simulated = feed_interval_ms(time_scale) as f64 / time_scale;
    (deployed * time_scale < shortest).then(|| {
        format!(
            "note: at time scale {time_scale} the gateways exchange every {simulated:.0} simulated ms, a deployment \
             every {deployed:.0} ms; use --time-scale {} or more to compare gateway counts",
            shortest / deployed
        )
    })
}

/// The plugin configuration (JSON text) for filter strategy `name` in front of `upstreams`: `strategy` and
/// `endpoints` from the harness, then the fields of `extra` (a JSON object, checked by
/// [`check_filter_extra`]).
pub fn filter_plugin_config(name: &str, upstreams: &[SocketAddr], extra: &Value) -> String {
    let mut fields = json!({"strategy": name});
    if let (Some(dst), Some(src)) = (fields.as_object_mut(), extra.as_object()) {
        for (k, v) in src {
            dst.insert(k.clone(), v.clone());
        }
    }
    EnvoyConfig::plugin_json(upstreams, fields)
}

/// Checks `--filter-config` before anything starts: it must be a JSON object without the [`HARNESS_OWNED_KEYS`],
/// and the plugin configuration it yields for each filter strategy in `strategies` must pass
/// [`warmpath_core::Settings::from_json`] (the filter's own validation, so Envoy is never started with a config the
/// filter would reject and fail open on).
///
/// Errors with a one-line message naming the offending key or the filter's complaint.
pub fn check_filter_extra(extra: &Value, strategies: &[Strategy]) -> anyhow::Result<()> {
    let Some(obj) = extra.as_object() else { anyhow::bail!("--filter-config must be a JSON object") };
    for key in HARNESS_OWNED_KEYS {
        anyhow::ensure!(
            !obj.contains_key(key),
            "--filter-config may not set `{key}`: the harness sets it per run (choose strategies with --strategies, \
             servers with --endpoints)"
        );
    }
    // Placeholder upstreams: validation only looks at the address form, and the real ports are not known yet.
    let upstreams: Vec<SocketAddr> = (1..=2).map(|p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
    for s in strategies {
        if let Strategy::Filter(name) = s {
            let plugin = filter_plugin_config(name, &upstreams, extra);
            if let Err(e) = Settings::from_json(plugin.as_bytes()) {
                anyhow::bail!("--filter-config rejected by the filter for {name}: {e}");
            }
        }
    }
    Ok(())
}

/// Settings shared by every strategy of a comparison.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Number of simulated servers.
    pub endpoints: usize,
    /// Configuration of each server (cache size, block size, latency model with its time scale).
    pub sim: SimConfig,
    /// Servers slower than the rest: the first `slow.endpoints` servers take `slow.factor` times as long per
    /// prefilled token and per output token (see [`Slow::server_config`]).
    pub slow: Slow,
    /// Arrival-rate multiplier: request `at_ms` is divided by this (2.0 = twice the load).
    pub rate_scale: f64,
    /// Wall-clock budget for sending; requests not sent by then are counted as not sent.
    pub max_wall: Duration,
    /// Extra plugin-configuration fields for the filter (a JSON object), e.g. `{"concurrency_threshold": 16}`.
    pub filter_extra: Value,
    /// Characters of text the baselines key on (the filter uses its own `prefix_length`).
    pub prefix_length: usize,
    /// Envoy worker threads.
    pub envoy_concurrency: u32,
    /// Envoy processes (gateway replicas) for filter strategies, each with the same plugin configuration and
    /// `envoy_concurrency` workers. At least 1.
    pub gateways: usize,
    /// How the client spreads requests over the gateways.
    pub spread: Spread,
    /// With several gateways, exchange index records between them through a feed server as the controller's feed
    /// does (`warmpath_core::exchange`); false answers the exchange with 404, as a feed server without it would.
    pub gateway_exchange: bool,
    /// With the exchange, also pass each gateway the other gateways' pending prefill work (the reports' pending
    /// sections); false makes the feed server answer like one without them, so the gateways send none and each
    /// sees only its own queue.
    pub pending_exchange: bool,
    /// With the exchange, also pass each gateway the other gateways' prefill-speed fits (the reports' fits
    /// sections); false makes the feed server answer like one without them, so the gateways send none and each
    /// learns speeds from its own samples.
    pub fits_exchange: bool,
    /// Feed the filter strategies from the harness's feed server even with one gateway (it always runs with
    /// several): the endpoints and each server's load, scraped every poll interval, as the controller's feed does.
    pub feed: bool,
    /// The feed's poll interval in wall ms, when not [`feed_interval_ms`] of the time scale.
    pub feed_interval_ms: Option<u64>,
    /// How the harness's own routers reach the servers.
    pub client_hop: ClientHop,
    /// Model name sent in requests.
    pub model: String,
    /// Print a progress line every this often (None = quiet).
    pub progress_every: Option<Duration>,
}

/// A fleet whose servers do not all run at one speed: a pool mixing accelerator generations, a throttled node, a
/// noisy neighbour. No router is told which servers are slow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slow {
    /// How many servers (the first ones started) are slow.
    pub endpoints: usize,
    /// How many times longer they take per prefilled token and per output token (their fixed per-request overhead
    /// is unchanged).
    pub factor: f64,
}

impl Default for Slow {
    fn default() -> Self {
        Slow { endpoints: 0, factor: 1.0 }
    }
}

impl Slow {
    /// The configuration of server `i` (0-based, in start order) of a fleet configured as `sim`: a slow server's
    /// when `i` is among the first `endpoints`.
    pub fn server_config(&self, i: usize, sim: &SimConfig) -> SimConfig {
        let mut c = sim.clone();
        if i < self.endpoints {
            c.latency.prefill_ms_per_token *= self.factor;
            c.latency.itl_ms *= self.factor;
        }
        c
    }
}

/// How the client spreads requests over several gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Spread {
    /// Each request to a gateway chosen at random (by a hash of its id).
    #[default]
    Random,
    /// Every request of one conversation to the same gateway (keyed by its conversation).
    Session,
}

impl Spread {
    /// The gateway (0..n) for request `r`.
    pub fn gateway(self, r: &Request, n: usize) -> usize {
        let h = match self {
            Spread::Random => xxhash_rust::xxh3::xxh3_64(&(r.id as u64).to_le_bytes()),
            Spread::Session => r.session_key(),
        };
        (h % n.max(1) as u64) as usize
    }
}

/// Everything measured for one strategy.
#[derive(Debug, Clone)]
pub struct StrategyRun {
    /// Strategy label.
    pub label: String,
    /// Whether requests went through Envoy.
    pub via_envoy: bool,
    /// The path column ([`Strategy::path`]).
    pub path: &'static str,
    /// One outcome per request sent.
    pub outcomes: Vec<Outcome>,
    /// Requests of the workload not sent within the wall budget.
    pub not_sent: usize,
    /// `(address, final metrics)` per server.
    pub servers: Vec<(String, ServerMetrics)>,
    /// Overflow decisions: the filter's overflow counter (Envoy stats) or the baseline's own count.
    pub overflows: u64,
    /// The filter's stats (`wasmcustom.warmpath.*`) and the connections each Envoy worker accepted
    /// (`envoy.worker_<w>.downstream_cx_total`), summed over the gateways; empty for baselines.
    pub filter_stats: Vec<(String, u64)>,
    /// Wall time from first send to last completion, seconds.
    pub wall_s: f64,
    /// The time scale used (wall = simulated × scale).
    pub time_scale: f64,
    /// CPU time the proxies on the request path used during the replay, seconds (user + system of every Envoy
    /// started for the strategy, with or without the filter, or of the peer's router process tree); `None` when
    /// requests went straight to the servers.
    pub proxy_cpu_s: Option<f64>,
    /// Share of the machine's cores busy during the replay, 0–1 (everything running counts: proxies, the
    /// simulated servers, the client, and anything else on the machine).
    pub machine_busy: Option<f64>,
    /// Envoy's own timing of each request (`warmpath_harness::timing`), over every Envoy on the path (with or
    /// without the filter); empty when no Envoy was.
    pub envoy_timing: Vec<ProxyTiming>,
}

enum Target {
    /// Proxies' base URLs: the Envoy gateways with the filter, or one peer router.
    Proxy(Vec<String>),
    /// A baseline policy routed by the harness; its picks go through the plain Envoy at this base URL, if any.
    Direct(Arc<ClientRouter>, Option<String>),
    /// A KV-cost router run by the harness; its picks go through the plain Envoy at this base URL, if any.
    Cost(Arc<CostRouter>, Option<String>),
}

/// How long a peer router may take to come up (it health-checks every server first).
const PEER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `strategy` over `reqs` with fresh servers (and a fresh Envoy for filter strategies).
pub async fn run_strategy(strategy: &Strategy, reqs: &[Request], s: &RunSettings) -> anyhow::Result<StrategyRun> {
    let label = strategy.label();
    let mut servers = Vec::with_capacity(s.endpoints);
    for i in 0..s.endpoints {
        servers.push(SimServer::start(s.slow.server_config(i, &s.sim), "127.0.0.1:0".parse()?).await?);
    }
    let addrs: Vec<String> = servers.iter().map(|x| x.addr().to_string()).collect();
    let mut envoys = Vec::new();
    let mut peer = None;
    let mut scraper = None;
    let mut feed: Option<Arc<FeedServer>> = None;
    let mut timing_logs = TimingLogs::new();
    // The plain Envoy the harness's own picks travel through (ClientHop::Envoy).
    let mut hop = None;
    if matches!(strategy, Strategy::Baseline(_) | Strategy::Cost(_)) && s.client_hop == ClientHop::Envoy {
        let upstreams: Vec<std::net::SocketAddr> = servers.iter().map(|x| x.addr()).collect();
        let mut cfg = EnvoyConfig::new(upstreams, "{}");
        cfg.timing_log = timing_logs.next();
        // No wasm filter, and the client's destination header is honoured: here the client is the router.
        cfg.strip_in_envoy = false;
        let envoy = EnvoyProcess::start(cfg, s.envoy_concurrency).await?;
        hop = Some(envoy.url());
        envoys.push(envoy);
    }
    let target = match strategy {
        Strategy::Filter(name) => {
            let upstreams: Vec<std::net::SocketAddr> = servers.iter().map(|x| x.addr()).collect();
            let mut extra = s.filter_extra.clone();
            let mut feed_cluster = None;
            if s.gateways > 1 || s.feed {
                // The gateways poll one feed, as they would the controller's: it serves the same endpoints with
                // each server's load, and carries the index exchange between gateways.
                let snapshot = FeedSnapshot {
                    version: 1,
                    endpoints: addrs.iter().map(|a| FeedEndpoint { address: a.clone(), load: None }).collect(),
                };
                let f = Arc::new(FeedServer::start(serde_json::to_string(&snapshot)?).await?);
                f.set_index_exchange(s.gateway_exchange);
                f.set_pending_exchange(s.pending_exchange);
                f.set_fits_exchange(s.fits_exchange);
                let interval_ms = s.feed_interval_ms.unwrap_or_else(|| feed_interval_ms(s.sim.latency.time_scale));
                if let Some(o) = extra.as_object_mut() {
                    o.insert(
                        "feed".into(),
                        json!({"cluster": FEED_CLUSTER, "path": FEED_PATH, "interval_ms": interval_ms}),
                    );
                }
                feed_cluster = Some(FeedCluster { name: FEED_CLUSTER.into(), address: f.addr() });
                let scrape = Duration::from_millis(load_scrape_ms(s.sim.latency.time_scale));
                scraper = Some(spawn_feed_loads(&f, addrs.clone(), scrape));
                feed = Some(f);
            }
            let plugin = filter_plugin_config(name, &upstreams, &extra);
            let mut cfg = EnvoyConfig::new(upstreams, plugin).with_wasm(filter_wasm()?);
            if let Some(c) = feed_cluster {
                cfg = cfg.with_feed(c);
            }
            for _ in 0..s.gateways.max(1) {
                let cfg = EnvoyConfig { timing_log: timing_logs.next(), ..cfg.clone() };
                envoys.push(EnvoyProcess::start(cfg, s.envoy_concurrency).await?);
            }
            Target::Proxy(envoys.iter().map(|e| e.url()).collect())
        }
        Strategy::Peer(p) => {
            let upstreams: Vec<std::net::SocketAddr> = servers.iter().map(|x| x.addr()).collect();
            let proc = PeerProcess::start(*p, &upstreams, &s.model, PEER_START_TIMEOUT).await?;
            let url = proc.url();
            peer = Some(proc);
            Target::Proxy(vec![url])
        }
        Strategy::Cost(kind) => {
            let probes = servers.iter().map(|x| x.probe()).collect();
            let r = CostRouter::new(*kind, addrs.clone(), probes, s.sim.block_tokens, s.sim.latency.time_scale);
            Target::Cost(Arc::new(r), hop)
        }
        Strategy::Baseline(b) => {
            let r = ClientRouter::new(b.create(), &addrs, s.prefix_length);
            scraper = Some(r.spawn_scraper(Duration::from_millis(50)));
            Target::Direct(r, hop)
        }
    };

    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let scale = s.sim.latency.time_scale;
    let proxy_pids: Vec<u32> =
        envoys.iter().map(EnvoyProcess::pid).chain(peer.as_ref().map(PeerProcess::pid)).collect();
    let cpu_before = CpuReading::take(&proxy_pids);
    let start = Instant::now();
    let mut tasks: JoinSet<Outcome> = JoinSet::new();
    let mut outcomes = Vec::with_capacity(reqs.len());
    let mut sent = 0usize;
    let mut last_progress = Instant::now();
    for r in reqs {
        let due = Duration::from_secs_f64((r.at_ms / s.rate_scale.max(1e-9)) * scale / 1000.0);
        if due > s.max_wall {
            break;
        }
        // Drain finished tasks while waiting for the next arrival.
        let deadline = tokio::time::Instant::from_std(start + due);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Ok(o) = done { outcomes.push(o); }
                }
            }
        }
        if let Some(every) = s.progress_every {
            if last_progress.elapsed() >= every {
                last_progress = Instant::now();
                progress(&label, sent, reqs.len(), &outcomes, start);
            }
        }
        let body = serde_json::to_vec(&r.json(&s.model))?;
        let sent_ms = start.elapsed().as_secs_f64() * 1000.0;
        let (client, id, path) = (client.clone(), r.id, r.path());
        match &target {
            Target::Proxy(bases) => {
                let to = Destination::routed_by(&bases[s.spread.gateway(r, bases.len())], path);
                tasks.spawn(async move { send(&client, to, body, id, sent_ms, Instant::now(), || {}).await });
            }
            Target::Direct(router, via) => {
                let (router, via) = (router.clone(), via.clone());
                tasks.spawn(async move {
                    let at = Instant::now();
                    let (addr, guard) = router.route(path, &body);
                    let to = Destination::picked(addr, via.as_deref(), path);
                    let o = send(&client, to, body, id, sent_ms, at, || {}).await;
                    drop(guard);
                    o
                });
            }
            Target::Cost(router, via) => {
                let (router, req, via) = (router.clone(), r.clone(), via.clone());
                tasks.spawn(async move {
                    // Rendering the prompt is this router's extraction: on the clock, as the filter's is.
                    let at = Instant::now();
                    let (addr, ticket) = router.route(&req.server_prompt());
                    let to = Destination::picked(addr, via.as_deref(), path);
                    let o = send(&client, to, body, id, sent_ms, at, || ticket.first_token()).await;
                    drop(ticket);
                    o
                });
            }
        }
        sent += 1;
    }
    // Let in-flight requests finish (bounded: a generous multiple of the wall budget).
    let drain_deadline = Instant::now() + s.max_wall.max(Duration::from_secs(30));
    while !tasks.is_empty() {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.max(Duration::from_millis(1)), tasks.join_next()).await {
            Ok(Some(Ok(o))) => outcomes.push(o),
            Ok(Some(Err(_))) => {}
            Ok(None) => break,
            Err(_) => {
                tasks.abort_all();
                break;
            }
        }
        if let Some(every) = s.progress_every {
            if last_progress.elapsed() >= every {
                last_progress = Instant::now();
                progress(&label, sent, reqs.len(), &outcomes, start);
            }
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let (proxy_cpu_s, machine_busy) = CpuReading::take(&proxy_pids).since(&cpu_before);
    outcomes.sort_by_key(|o| o.id);

    let mut server_metrics = Vec::new();
    for a in &addrs {
        server_metrics.push((a.clone(), scrape(&client, a).await?));
    }
    let (overflows, filter_stats) = match &target {
        Target::Proxy(_) if strategy.via_envoy() => {
            // Summed over the gateways: each Envoy counts its own decisions. The filter hands its counters to
            // Envoy once per tick (200 ms, with a feed 50 ms or less), so wait (bounded) until every sent request's
            // decision shows and the in-flight gauges are back to 0 (every stream has ended; read earlier, they show
            // the last tick's count, 1–2 on a few endpoints).
            let settle = Instant::now() + Duration::from_secs(3);
            let sum = loop {
                let mut per_envoy = Vec::with_capacity(envoys.len());
                for e in &envoys {
                    let stats = e.stats().await?;
                    let mut mine: Vec<(String, u64)> =
                        stats.with_prefix(FILTER_STAT_PREFIX).map(|(k, v)| (k.to_string(), v)).collect();
                    // How the connections spread over the workers, which decides what "N workers" measured.
                    let per_worker = stats.worker_connections(e.config().listener_port);
                    mine.extend(per_worker.iter().enumerate().map(|(w, n)| (worker_connections_stat(w), *n)));
                    per_envoy.push(mine);
                }
                let sum = merge_filter_stats(&per_envoy);
                if settled(&sum, sent as u64) || Instant::now() > settle {
                    break sum;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            if s.envoy_concurrency > 1 {
                let per_worker: Vec<String> = (0..s.envoy_concurrency as usize)
                    .map(|w| sum.get(&worker_connections_stat(w)).copied().unwrap_or(0).to_string())
                    .collect();
                eprintln!("[{label}] connections accepted per Envoy worker: {}", per_worker.join(" / "));
            }
            let fs: Vec<(String, u64)> = sum.into_iter().collect();
            let ov = fs.iter().filter(|(k, _)| k.contains("overflow")).map(|(_, v)| *v).sum();
            (ov, fs)
        }
        Target::Direct(r, _) => (r.overflows.load(std::sync::atomic::Ordering::Relaxed), Vec::new()),
        _ => (0, Vec::new()),
    };
    if let Some(t) = scraper {
        t.abort();
    }
    let envoy_timing = timing_logs.read().await;
    drop(envoys);
    drop(feed);
    drop(peer);
    for srv in servers {
        srv.stop().await;
    }
    if let Some(every) = s.progress_every {
        let _ = every;
        progress(&label, sent, reqs.len(), &outcomes, start);
    }
    Ok(StrategyRun {
        label,
        via_envoy: strategy.via_envoy(),
        path: strategy.path(s.client_hop),
        outcomes,
        not_sent: reqs.len() - sent,
        servers: server_metrics,
        overflows,
        filter_stats,
        wall_s,
        time_scale: scale,
        proxy_cpu_s,
        machine_busy,
        envoy_timing,
    })
}

/// The timing logs of one strategy's Envoys (`warmpath_harness::timing`), in a temporary directory removed with this
/// value (after the run, or when a signal stops the bench mid-run).
struct TimingLogs {
    dir: Option<tempfile::TempDir>,
    paths: Vec<std::path::PathBuf>,
}

impl TimingLogs {
    fn new() -> TimingLogs {
        TimingLogs { dir: None, paths: Vec::new() }
    }

    /// A fresh log path for the next Envoy (`None` when no temporary directory can be made: that Envoy is not
    /// timed).
    fn next(&mut self) -> Option<std::path::PathBuf> {
        if self.dir.is_none() {
            self.dir = tempfile::Builder::new().prefix("warmpath-bench-timing-").tempdir().ok();
        }
        let p = self.dir.as_ref()?.path().join(format!("envoy-{}.log", self.paths.len()));
        self.paths.push(p.clone());
        Some(p)
    }

    /// Every request the logs hold, once Envoy has flushed them (the last requests ended before this is called). A
    /// log that cannot be read adds nothing.
    async fn read(self) -> Vec<ProxyTiming> {
        if self.paths.is_empty() {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(3 * timing::FLUSH_INTERVAL_MS)).await;
        let mut all = Vec::new();
        for p in &self.paths {
            if let Ok(text) = std::fs::read_to_string(p) {
                all.extend(timing::parse(&text, "/v1/"));
            }
        }
        all
    }
}

/// The proxies' CPU time and the machine's CPU counters at one moment (either part `None` when procfs could not be
/// read: the run is still reported, without its CPU columns).
struct CpuReading {
    proxies: Option<f64>,
    machine: Option<MachineCpu>,
}

impl CpuReading {
    /// Reads the CPU time of the process trees of `pids` (none: no proxy on the path) and the machine's counters.
    fn take(pids: &[u32]) -> CpuReading {
        let proxies =
            if pids.is_empty() { None } else { pids.iter().map(|&p| tree_cpu_seconds(p).ok()).sum::<Option<f64>>() };
        CpuReading { proxies, machine: MachineCpu::sample().ok() }
    }

    /// The proxies' CPU seconds and the machine's busy share since `earlier`.
    fn since(&self, earlier: &CpuReading) -> (Option<f64>, Option<f64>) {
        let proxies = self.proxies.zip(earlier.proxies).map(|(a, b)| (a - b).max(0.0));
        let busy = self.machine.zip(earlier.machine).and_then(|(a, b)| a.busy_since(&b));
        (proxies, busy)
    }
}

/// How often the harness's feed scrapes the servers' loads, ms of wall time: every simulated second (the
/// controller's shortest load interval), at least every 100 ms, so the scrapes of the servers' `/metrics` do not
/// take the CPU the gateways and servers run on (a server's wall millisecond counts 1 / time scale simulated ones).
pub fn load_scrape_ms(time_scale: f64) -> u64 {
    ((1000.0 * time_scale).round() as u64).max(100)
}

/// Starts a task that, every `every` (wall time), scrapes each server's `/metrics` and makes the endpoints with
/// their loads `feed`'s next snapshot, as the controller's feed does (an endpoint whose scrape failed is served
/// without a load). Ends when the feed server is dropped.
fn spawn_feed_loads(feed: &Arc<FeedServer>, addrs: Vec<String>, every: Duration) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(feed);
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut version = 1;
        loop {
            tokio::time::sleep(every).await;
            let mut endpoints = Vec::with_capacity(addrs.len());
            for a in &addrs {
                let load = scrape(&client, a).await.ok().map(|m| m.load);
                endpoints.push(FeedEndpoint { address: a.clone(), load });
            }
            let Some(f) = weak.upgrade() else { return };
            version += 1;
            if let Ok(json) = serde_json::to_string(&FeedSnapshot { version, endpoints }) {
                f.set_snapshot(json);
            }
        }
    })
}

/// The name under which [`StrategyRun::filter_stats`] carries the connections Envoy worker `w` accepted (summed
/// over the gateways).
fn worker_connections_stat(w: usize) -> String {
    format!("envoy.worker_{w}.downstream_cx_total")
}

/// The filter's stats of one replay over its gateways: counters and gauges summed, except the prefill-speed fit's
/// gauges (`.prefill.`: speed, fixed part, slope error), estimates per Envoy rather than counts, which are the mean
/// over the Envoys reporting them.
fn merge_filter_stats(per_envoy: &[Vec<(String, u64)>]) -> std::collections::BTreeMap<String, u64> {
    let mut sum: std::collections::BTreeMap<String, u64> = Default::default();
    let mut estimates: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for (k, v) in per_envoy.iter().flatten() {
        if k.contains(".prefill.") {
            let (total, n) = estimates.entry(k).or_default();
            (*total, *n) = (*total + v, *n + 1);
        } else {
            *sum.entry(k.clone()).or_default() += v;
        }
    }
    sum.extend(estimates.into_iter().map(|(k, (total, n))| (k.to_string(), total / n)));
    sum
}

/// True once the merged stats show a decision for each of the `sent` requests and no request in flight: every
/// stream has ended and its counts reached Envoy (the filter hands them over once per tick).
fn settled(sum: &std::collections::BTreeMap<String, u64>, sent: u64) -> bool {
    let decided: u64 = sum.iter().filter(|(k, _)| k.contains(".decisions.")).map(|(_, v)| *v).sum();
    let held: u64 = sum.iter().filter(|(k, _)| k.contains(".in_flight.")).map(|(_, v)| *v).sum();
    decided >= sent && held == 0
}

fn progress(label: &str, sent: usize, total: usize, outcomes: &[Outcome], start: Instant) {
    let errors = outcomes.iter().filter(|o| !o.ok).count();
    eprintln!(
        "[{label}] {:>5.1}s  sent {sent}/{total}  done {}  errors {errors}",
        start.elapsed().as_secs_f64(),
        outcomes.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_servers_are_slow_and_only_per_token() {
        let sim = SimConfig::default();
        let slow = Slow { endpoints: 2, factor: 3.0 };
        for i in 0..2 {
            let c = slow.server_config(i, &sim);
            assert_eq!(c.latency.prefill_ms_per_token, sim.latency.prefill_ms_per_token * 3.0);
            assert_eq!(c.latency.itl_ms, sim.latency.itl_ms * 3.0);
            assert_eq!(c.latency.overhead_ms, sim.latency.overhead_ms);
            assert_eq!(c.cache_blocks, sim.cache_blocks);
        }
        let fast = slow.server_config(2, &sim);
        assert_eq!(fast.latency.prefill_ms_per_token, sim.latency.prefill_ms_per_token);
        assert_eq!(fast.latency.itl_ms, sim.latency.itl_ms);
        assert_eq!(Slow::default().server_config(0, &sim).latency.itl_ms, sim.latency.itl_ms);
    }

    #[test]
    fn gateways_stats_are_summed_but_the_learned_speed_is_their_mean() {
        let e = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Vec<_>>();
        let merged = merge_filter_stats(&[
            e(&[("w.decisions.a", 10), ("w.in_flight.x", 1), ("w.prefill.bytes_per_s", 190_000)]),
            e(&[("w.decisions.a", 5), ("w.in_flight.x", 0), ("w.prefill.bytes_per_s", 210_000)]),
            e(&[("w.decisions.a", 5)]),
        ]);
        assert_eq!(merged["w.decisions.a"], 20);
        assert_eq!(merged["w.in_flight.x"], 1);
        assert_eq!(merged["w.prefill.bytes_per_s"], 200_000, "the mean of the two Envoys that report it");
        assert!(!settled(&merged, 20), "a request still in flight");
        let mut done = merged.clone();
        done.insert("w.in_flight.x".into(), 0);
        assert!(settled(&done, 20));
        assert!(!settled(&done, 21), "a decision not counted yet");
    }

    #[test]
    fn the_feed_interval_is_the_deployed_tick_in_simulated_time_where_the_filter_takes_it() {
        // 50 ms of simulated time at time scale 0.2 is 10 ms of wall time, the shortest interval the filter takes.
        assert_eq!(feed_interval_ms(0.2), 10);
        assert_eq!(feed_interval_ms(1.0), warmpath_core::config::FEED_TICK_MS);
        assert_eq!((feed_interval_note(0.2), feed_interval_note(0.25), feed_interval_note(1.0)), (None, None, None));
        // Below 0.2 the interval stays at 10 ms of wall time, longer in simulated time than a deployment's tick.
        assert_eq!(feed_interval_ms(0.05), 10);
        let note = feed_interval_note(0.05).expect("a note");
        assert!(note.contains("every 200 simulated ms") && note.contains("--time-scale 0.2"), "{note}");
    }
}
