//! Benchmark (not a test): Envoy with vs without the warmpath filter, same run, same upstreams, 4 KB chat bodies.
//!
//! Reports throughput of each config, its ratio to the no-filter baseline, and Envoy's added CPU time per request
//! (user + system time of the Envoy process, `warmpath_harness::cpu`, measured around each bounded run). All configs
//! run side by side and are measured in alternation `--rounds` times; medians are reported.
//!
//! `cargo run -p warmpath-harness --release --bin overhead -- [--requests 20000] [--connections 16] [--rounds 5]
//!  [--filter PREFIX_AWARE] [--filter RANDOM] [--filter STRATEGY=/path/to/variant.wasm] [--endpoints 3] [--feed-interval-ms 200 [--feed-loads]]
//!  [--stream-events 100 [--event-gap-us 1000]]`
//! (needs the release wasm module and `.venv/bin/envoy`). With `--feed-interval-ms`, every filter config is also
//! measured polling a feed (the harness's feed server, serving the upstreams and taking the index exchange and
//! the pending sections) at that interval: the cost of the feed in the gateway's own CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use serde_json::json;
use warmpath_core::feed::{FeedEndpoint, FeedLoad, FeedSnapshot};
use warmpath_harness::cpu::tree_cpu_seconds;
use warmpath_harness::{filter_wasm, EnvoyConfig, EnvoyProcess, FeedCluster, FeedServer, Upstream};

#[derive(Parser)]
#[command(about = "Envoy + warmpath filter overhead vs plain Envoy (4 KB chat bodies, JSON or streamed answers)")]
struct Args {
    /// Requests per measured run (bounded).
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Alternating rounds over all configs (medians reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Distinct prompts cycled through (repeats exercise the prefix index).
    #[arg(long, default_value_t = 256)]
    prompts: usize,
    /// Body size in bytes (approximate; JSON chat request).
    #[arg(long, default_value_t = 4096)]
    body_bytes: usize,
    /// Filter configurations measured against the no-filter baseline, each `STRATEGY` or `STRATEGY=MODULE.wasm`
    /// (default module: the release build); repeat the flag for several.
    #[arg(long = "filter", default_values_t = ["PREFIX_AWARE".to_string(), "RANDOM".to_string()])]
    filters: Vec<String>,
    /// Envoy worker threads.
    #[arg(long, default_value_t = 2)]
    concurrency: u32,
    /// Answer every request as a stream of this many server-sent events (tokens) instead of one JSON body: the
    /// filter is called for every chunk of a response, as for a streamed completion.
    #[arg(long, default_value_t = 0)]
    stream_events: usize,
    /// With `--stream-events`, the pause before each event, µs (long enough that Envoy reads each event as its
    /// own chunk, as it does a model server's tokens).
    #[arg(long, default_value_t = 1000)]
    event_gap_us: u64,
    /// Also measure every filter config polling a feed every this many ms (the exchange runs on every tick: this or
    /// the filter's tick with a feed, whichever is shorter).
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    feed_interval_ms: Option<u64>,
    /// With `--feed-interval-ms`, the feed publishes a new version with a load for every endpoint at that interval,
    /// as the controller's feed does while it scrapes the servers' metrics: every VM then applies a new snapshot
    /// at every poll.
    #[arg(long, requires = "feed_interval_ms")]
    feed_loads: bool,
    /// Upstream servers, every one an endpoint of the cluster and of the filter (the filter's per-request work
    /// that grows with the endpoint count: reading each endpoint's load, the least-loaded search).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=4096))]
    endpoints: u64,
    /// Wall-clock cap per run in seconds.
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
    /// Upstreams answer after the request body's length at this many bytes per ms (as after a prefill), and the
    /// bodies' sizes spread from half to one and a half times `--body-bytes`: the warm-up's one-at-a-time misses
    /// then teach PREFIX_AWARE the prefill speed, and the measured runs pay for the drain of pending work that an
    /// estimate turns on. The learned speed is printed per config.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_bytes_per_ms: Option<u64>,
}

/// Publishes a new snapshot version every `every`, each endpoint with a load that changes from one version to the
/// next, until the feed server is dropped.
async fn publish_loads(feed: std::sync::Weak<FeedServer>, addrs: Vec<std::net::SocketAddr>, every: Duration) {
    let mut version = 1u64;
    loop {
        tokio::time::sleep(every).await;
        let Some(feed) = feed.upgrade() else { return };
        version += 1;
        let endpoints = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let n = (version as usize + i) % 8;
                let load = FeedLoad { waiting: n as u32 / 2, running: n as u32, kv_cache_usage: n as f32 / 8.0 };
                FeedEndpoint { address: a.to_string(), load: Some(load) }
            })
            .collect();
        if let Ok(json) = serde_json::to_string(&FeedSnapshot { version, endpoints }) {
            feed.set_snapshot(json);
        }
    }
}

/// `n` distinct chat bodies of about `size` bytes each, or with `spread` of sizes from `size / 2` to `3 × size / 2`.
fn bodies(n: usize, size: usize, spread: bool) -> Vec<Arc<Vec<u8>>> {
    (0..n)
        .map(|i| {
            let size = if spread { size / 2 + size * (i % 8) / 7 } else { size };
            let mut text = format!("You are assistant number {i}. ");
            while text.len() + 64 < size {
                text.push_str(&format!("Context line {} for prompt {i} with some words. ", text.len()));
            }
            let body = json!({"model": "bench", "messages": [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]});
            Arc::new(body.to_string().into_bytes())
        })
        .collect()
}

struct RunResult {
    rps: f64,
    cpu_us_per_req: f64,
}

async fn run(envoy: &EnvoyProcess, bodies: &[Arc<Vec<u8>>], args: &Args) -> Result<RunResult> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(args.connections).build()?;
    let url = format!("{}/v1/chat/completions", envoy.url());
    // Warm-up: connections, VM, index.
    for b in bodies.iter().take(200) {
        client.post(&url).body(b.as_ref().clone()).send().await?.bytes().await?;
    }
    let per_conn = args.requests / args.connections;
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let cpu0 = tree_cpu_seconds(envoy.pid())?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.connections {
        let (client, url, bodies) = (client.clone(), url.clone(), bodies.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            for i in 0..per_conn {
                if Instant::now() > deadline {
                    break;
                }
                let b = &bodies[(c * per_conn + i) % bodies.len()];
                let r = client.post(&url).body(b.as_ref().clone()).send().await?;
                if !r.status().is_success() {
                    bail!("status {}", r.status());
                }
                r.bytes().await?;
                done += 1;
            }
            Ok::<usize, anyhow::Error>(done)
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = tree_cpu_seconds(envoy.pid())? - cpu0;
    Ok(RunResult { rps: done as f64 / wall, cpu_us_per_req: cpu * 1e6 / done as f64 })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let upstreams = Upstream::start_many(args.endpoints as usize).await?;
    for u in &upstreams {
        u.set_stream(args.stream_events, Duration::from_micros(args.event_gap_us));
        u.set_body_rate(args.prefill_bytes_per_ms.unwrap_or(0));
    }
    let addrs: Vec<_> = upstreams.iter().map(Upstream::addr).collect();
    let bodies = bodies(args.prompts, args.body_bytes, args.prefill_bytes_per_ms.is_some());
    // Config 0 is the baseline (same listener and cluster, no wasm filter); all Envoys run for the whole session
    // and are measured in alternation, so drift in machine load hits every config alike.
    // (label, Envoy, whether its filter polls the feed)
    let mut configs = vec![(
        "Envoy, no filter".to_string(),
        EnvoyProcess::start(EnvoyConfig::new(addrs.clone(), "{}"), args.concurrency).await?,
        false,
    )];
    let feed = match args.feed_interval_ms {
        Some(interval_ms) => {
            let endpoints = addrs.iter().map(|a| FeedEndpoint { address: a.to_string(), load: None }).collect();
            let server = FeedServer::start(serde_json::to_string(&FeedSnapshot { version: 1, endpoints })?).await?;
            let server = Arc::new(server);
            if args.feed_loads {
                tokio::spawn(publish_loads(Arc::downgrade(&server), addrs.clone(), Duration::from_millis(interval_ms)));
            }
            Some((server, interval_ms))
        }
        None => None,
    };
    for f in &args.filters {
        let (strategy, wasm) = match f.split_once('=') {
            Some((s, w)) => (s.to_string(), std::path::PathBuf::from(w)),
            None => (f.clone(), filter_wasm()?),
        };
        let plugin = EnvoyConfig::plugin_json(&addrs, json!({"strategy": strategy, "debug_header": false}));
        let name = match f.split_once('=') {
            Some((_, w)) => format!("Envoy + warmpath {strategy} ({w})"),
            None => format!("Envoy + warmpath {strategy}"),
        };
        let config = EnvoyConfig::new(addrs.clone(), plugin).with_wasm(wasm.clone());
        configs.push((name.clone(), EnvoyProcess::start(config, args.concurrency).await?, false));
        if let Some((server, interval_ms)) = &feed {
            let cluster = "warmpath_feed";
            // A path of its own for each config: the feed server keeps one exchange per path, and configs sharing
            // one would exchange records and pending work with each other (two gateways, not one).
            let path = format!("/v1/feed/overhead/{}", configs.len());
            let feed = json!({"cluster": cluster, "path": path, "interval_ms": interval_ms});
            let plugin =
                EnvoyConfig::plugin_json(&addrs, json!({"strategy": strategy, "debug_header": false, "feed": feed}));
            let config = EnvoyConfig::new(addrs.clone(), plugin)
                .with_wasm(wasm)
                .with_feed(FeedCluster { name: cluster.into(), address: server.addr() });
            // The module exchanges on every tick, which its own build fixes (this build's: `FEED_TICK_MS`).
            let label = format!("{name}, feed polled every {interval_ms} ms");
            configs.push((label, EnvoyProcess::start(config, args.concurrency).await?, true));
        }
    }
    let mut rps = vec![Vec::new(); configs.len()];
    let mut cpu = vec![Vec::new(); configs.len()];
    for round in 0..args.rounds {
        let mut line = format!("round {round}:");
        for (i, (_, envoy, _)) in configs.iter().enumerate() {
            let r = run(envoy, &bodies, &args).await?;
            line.push_str(&format!(" | {:.0} req/s {:.1} µs", r.rps, r.cpu_us_per_req));
            rps[i].push(r.rps);
            cpu[i].push(r.cpu_us_per_req);
        }
        eprintln!("{line}");
    }
    let (base_rps, base_cpu) = (median(rps[0].clone()), median(cpu[0].clone()));
    println!("| config | throughput (req/s) | ratio to no filter | Envoy CPU per request (µs) | added CPU per request (µs) |");
    println!("|---|---|---|---|---|");
    for (i, (name, envoy, polls_feed)) in configs.iter().enumerate() {
        let (r, c) = (median(rps[i].clone()), median(cpu[i].clone()));
        println!("| {name} | {r:.0} | {:.3} | {c:.1} | {:+.1} |", r / base_rps, c - base_cpu);
        if i > 0 {
            let s = envoy.stats().await?;
            let fail_open = s.sum_prefix("wasmcustom.warmpath.fail_open.");
            if fail_open > 0 {
                println!("|  (fail-open decisions: {fail_open}) | | | | |");
            }
            if args.prefill_bytes_per_ms.is_some() {
                // Proof that the drain ran: without an estimate the filter does not read the moments.
                match s.filter("prefill.bytes_per_s") {
                    0 => println!("|  (no prefill speed learned: pending work was not drained) | | | | |"),
                    b => println!("|  (prefill speed learned: {b} bytes/s) | | | | |"),
                }
            }
            if let Some((server, _)) = feed.as_ref().filter(|_| *polls_feed) {
                // Proof that the feed was polled and the exchange ran rather than failing.
                let (version, records, failures) = (
                    s.filter("feed.version"),
                    s.filter("index_exchange.reported"),
                    s.sum_prefix("wasmcustom.warmpath.feed.failures."),
                );
                println!(
                    "|  (feed snapshot version {version}, {records} index records reported, {failures} feed failures; \
                     {} exchange reports reached the feed server from all configs) | | | | |",
                    server.index_reports()
                );
            }
        }
    }
    println!();
    let answers = match args.stream_events {
        0 => "JSON answers".to_string(),
        n => format!("answers streamed as {n} events {} µs apart", args.event_gap_us),
    };
    let answers = match args.prefill_bytes_per_ms {
        Some(rate) => format!("{answers} after the body's length at {rate} B/ms (body sizes spread ×0.5–1.5)"),
        None => answers,
    };
    println!(
        "medians of {} alternating rounds × {} requests, {} connections, {} distinct ~{} B chat bodies, {answers}, {} upstreams, Envoy --concurrency {}",
        args.rounds, args.requests, args.connections, args.prompts, args.body_bytes, args.endpoints, args.concurrency
    );
    Ok(())
}
