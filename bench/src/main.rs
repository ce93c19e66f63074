//! `warmpath-bench`: compare routing strategies on a workload or trace, through a real Envoy + the warmpath filter
//! and against client-side baselines, with simulated model servers on loopback. See `docs/demo.md`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};
use warmpath_bench::harness::{
    check_filter_extra, feed_interval_note, run_strategy, ClientHop, RunSettings, Slow, Spread, Strategy,
};
use warmpath_bench::report::{table, table_runs, write_csv, Summary};
use warmpath_bench::workload::{generate, window, GenParams, Request, WorkloadKind};
use warmpath_bench::{plot, pooled, trace};
use warmpath_sim::{LatencyProfile, SimConfig};

/// Replay a workload once per routing strategy and print the comparison table.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Built-in workload (ignored when --trace is given).
    #[arg(long, value_enum, default_value = "chat")]
    workload: WorkloadKind,
    /// Trace file to replay instead: Mooncake `.jsonl` or Azure `.csv` (e.g. $WARMPATH_TRACES/mooncake_synthetic_trace.jsonl).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Tokens of one system prompt put in front of every trace request (0 to 65,536): the traces leave out the
    /// system prompt a deployment sends with every request.
    #[arg(long, default_value_t = 0, requires = "trace",
        value_parser = clap::value_parser!(u64).range(..=trace::MAX_SYSTEM_PROMPT_TOKENS))]
    system_prompt_tokens: u64,
    /// Number of simulated model servers.
    #[arg(long, default_value_t = 4)]
    endpoints: usize,
    /// Prefix-cache capacity per server, in blocks (at least 1).
    #[arg(long, default_value_t = 1024, value_parser = at_least_one)]
    cache_blocks: usize,
    /// Tokens per cache block on the servers (at least 1).
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    block_tokens: usize,
    /// Mean arrival rate of generated workloads, requests per simulated second (> 0).
    #[arg(long, default_value_t = 8.0, value_parser = positive, allow_negative_numbers = true)]
    rate: f64,
    /// Multiplies the arrival rate (divides trace timestamps): 0.5 = half the load.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    /// Requests to generate, or the most to read from a trace, per run (1 to 100,000: the workload is built in memory
    /// before the first request is sent).
    #[arg(long, default_value_t = 1000, value_parser = requests_count)]
    requests: usize,
    /// Wall-clock budget per strategy for sending requests, seconds (> 0; later arrivals are not sent and count as
    /// errors).
    #[arg(long, default_value_t = 60.0, value_parser = positive, allow_negative_numbers = true)]
    max_wall_s: f64,
    /// Strategies, comma-separated: RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE (Envoy + the filter);
    /// SMG_CACHE_AWARE, VLLM_ROUTER_CACHE_AWARE (the peers' real routers, from .venv); SAGEMAKER_PREFIX,
    /// GIE_SCORERS, SGLANG_CACHE_AWARE, DYNAMO_KV (re-implementations, client-side); ORACLE, ORACLE_TTFT (exact-state
    /// references: Dynamo's cost, and prefill work only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "RANDOM,LEAST_OUTSTANDING_REQUESTS,PREFIX_AWARE,SMG_CACHE_AWARE,VLLM_ROUTER_CACHE_AWARE,SAGEMAKER_PREFIX,GIE_SCORERS,SGLANG_CACHE_AWARE,DYNAMO_KV,ORACLE,ORACLE_TTFT"
    )]
    strategies: Vec<String>,
    /// Output folder for CSV and PNG files.
    #[arg(long, default_value = "out/bench")]
    out: PathBuf,
    /// Seed of the workload generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Wall seconds per simulated second (0.1 = ten times faster than real time).
    #[arg(long, default_value_t = 0.1)]
    time_scale: f64,
    /// Server prefill time per uncached token, simulated ms (0 or more).
    #[arg(long, default_value_t = 0.2, value_parser = non_negative, allow_negative_numbers = true)]
    prefill_ms_per_token: f64,
    /// Server batch limit (requests running at once, at least 1).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    max_num_seqs: usize,
    /// Slow servers: the first N servers take --slow-factor times as long per prefilled token and per output
    /// token (a fleet mixing accelerator generations, a throttled node). No router is told which.
    #[arg(long, default_value_t = 0)]
    slow_endpoints: usize,
    /// How many times slower the --slow-endpoints servers are.
    #[arg(long, default_value_t = 2.0)]
    slow_factor: f64,
    /// Extra filter plugin configuration (JSON object merged into the generated one), e.g. '{"concurrency_threshold": 16}'.
    /// Checked by the filter's own validation before anything starts; may not set `strategy` or `endpoints`
    /// (use --strategies and --endpoints).
    #[arg(long, default_value = "{}")]
    filter_config: String,
    /// Characters of request text the client-side baselines key on (at least 1).
    #[arg(long, default_value_t = 65536, value_parser = at_least_one)]
    prefix_length: usize,
    /// Envoy worker threads (per gateway, at least 1).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    envoy_concurrency: u32,
    /// Envoy processes (gateway replicas) for the filter strategies, each with the same plugin configuration; the
    /// client spreads requests over them (see --spread). Above 1, the gateways poll one feed server (as with
    /// --feed) that also carries the index exchange between them (see --no-gateway-exchange). Other strategies use
    /// one router.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    gateways: usize,
    /// How the client spreads requests over --gateways: `random` (per request) or `session` (sticky per
    /// conversation).
    #[arg(long, value_enum, default_value = "random")]
    spread: Spread,
    /// With --gateways above 1, do not exchange index records between the gateways: the harness's feed server
    /// answers the exchange with 404, as a feed server without it would (each gateway then routes on its own
    /// index). By default the gateways exchange them through the feed server, as through the controller's feed.
    #[arg(long)]
    no_gateway_exchange: bool,
    /// With --gateways above 1, exchange index records but not the gateways' pending prefill work: the harness's
    /// feed server answers like one without pending sections, so each gateway sees only the queue it sent itself.
    /// By default the feed server passes each gateway the others' pending work, as the controller's feed does.
    #[arg(long)]
    no_pending_exchange: bool,
    /// With --gateways above 1, exchange index records but not the gateways' prefill-speed fits: the harness's feed
    /// server answers like one without fits sections, so each gateway learns the servers' speeds from its own
    /// samples only. By default the feed server passes each gateway the others' fits, as the controller's feed does.
    #[arg(long)]
    no_fits_exchange: bool,
    /// Feed the filter strategies from a feed server as the controller's feed would, also with one gateway: the
    /// endpoints and each server's load (waiting, running, KV usage from its /metrics), polled every 50 simulated
    /// ms, the filter's tick with a feed (10 ms wall at time scale 0.2, never under 10 ms wall), the loads scraped
    /// every simulated second. Without it and with one gateway, the filter knows only the load it sent itself.
    #[arg(long)]
    feed: bool,
    /// The gateways' feed interval in wall ms instead of the filter's tick in simulated time (above): to measure
    /// what the period of the exchange between gateways costs, apart from the time scale. The filter's tick with a
    /// feed is this or 50 ms, whichever is shorter.
    #[arg(long, value_parser = clap::value_parser!(u64).range(
        warmpath_core::config::FEED_INTERVAL_RANGE.0..=warmpath_core::config::FEED_TICK_MS))]
    feed_interval_ms: Option<u64>,
    /// How the client-side routers (the re-implemented baselines, DYNAMO_KV, ORACLE, ORACLE_TTFT) reach the
    /// servers: `envoy` (their pick through an Envoy without the filter, in `x-gateway-destination-endpoint`: the
    /// same proxy hop the filter and the peers' routers pay) or `direct` (no proxy hop).
    #[arg(long, value_enum, default_value = "envoy")]
    client_hop: ClientHop,
    /// Repetitions: run k uses seed --seed + k (generated workloads) or the k-th stretch of --requests requests of
    /// the trace (evenly spaced, overlapping stretches when the trace is shorter than --runs × --requests); the
    /// table shows each column's mean and min–max, and run k's files go to <out>/run<k>.
    #[arg(long, default_value_t = 1, value_parser = runs_count)]
    runs: usize,
    /// Exit with status 1 unless every request was answered, client and server counts balance, and every
    /// client-side pick reached the server it named.
    #[arg(long)]
    check: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    // SIGTERM (a supervisor, `timeout`, `kill`) is handled like Ctrl-C; left to its default it would orphan Envoy.
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    // `select!` drops the losing `run` future before a handler runs: that kills Envoy (killed on drop, its temp dir
    // removed) and stops the simulated servers.
    let code = tokio::select! {
        r = run(a) => return r,
        _ = tokio::signal::ctrl_c() => 130,
        _ = term.recv() => 143,
    };
    eprintln!("interrupted: stopped Envoy and the simulated servers");
    std::process::exit(code);
}

/// Most requests per run (`--requests`): the workload is generated or read whole before the first request.
const MAX_REQUESTS: usize = 100_000;
/// Most runs (`--runs`).
const MAX_RUNS: usize = 100;

/// Clap parser for counts that must be at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Clap parser for `--requests`: 1 to [`MAX_REQUESTS`].
fn requests_count(s: &str) -> Result<usize, String> {
    at_least_one(s).and_then(|n| {
        if n <= MAX_REQUESTS {
            Ok(n)
        } else {
            Err(format!("at most {MAX_REQUESTS} (the workload is built in memory before the first request), got {n}"))
        }
    })
}

/// Clap parser for `--runs`: 1 to [`MAX_RUNS`].
fn runs_count(s: &str) -> Result<usize, String> {
    at_least_one(s).and_then(|n| if n <= MAX_RUNS { Ok(n) } else { Err(format!("at most {MAX_RUNS}, got {n}")) })
}

/// Clap parser for numbers that must be finite and > 0 (a rate, a duration).
fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(x) => Err(format!("must be a number > 0, got {x}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Clap parser for times that must be finite and 0 or more.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Ok(x) => Err(format!("must be a number ≥ 0, got {x}")),
        Err(e) => Err(e.to_string()),
    }
}

async fn run(a: Args) -> anyhow::Result<()> {
    // The output folder is checked first: finding it unwritable after every strategy ran would lose the run.
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating the output folder {}", a.out.display()))?;
    let probe = a.out.join(".warmpath-bench-write-check");
    std::fs::write(&probe, b"").with_context(|| format!("the output folder {} is not writable", a.out.display()))?;
    let _ = std::fs::remove_file(&probe);
    anyhow::ensure!(a.time_scale > 0.0, "--time-scale must be > 0, got {}", a.time_scale);
    anyhow::ensure!(a.rate_scale > 0.0, "--rate-scale must be > 0, got {}", a.rate_scale);
    anyhow::ensure!(a.endpoints >= 1, "--endpoints must be at least 1");
    anyhow::ensure!(
        a.slow_endpoints <= a.endpoints,
        "--slow-endpoints ({}) must not exceed --endpoints ({})",
        a.slow_endpoints,
        a.endpoints
    );
    anyhow::ensure!(
        a.slow_factor.is_finite() && a.slow_factor > 0.0,
        "--slow-factor must be a number > 0, got {}",
        a.slow_factor
    );
    let strategies: Vec<Strategy> = a.strategies.iter().map(|s| Strategy::parse(s)).collect::<Result<_, _>>()?;
    let filter_extra: Value =
        serde_json::from_str(&a.filter_config).with_context(|| format!("--filter-config {:?}", a.filter_config))?;
    check_filter_extra(&filter_extra, &strategies)?;

    // One workload per run: successive seeds, or successive stretches of the trace.
    let workloads: Vec<(Vec<Request>, String)> = match &a.trace {
        Some(path) => {
            let mut t = trace::load(path, a.requests.saturating_mul(a.runs))?;
            // At most MAX_SYSTEM_PROMPT_TOKENS (the parser's range): fits any usize.
            trace::with_system_prompt(&mut t.requests, a.system_prompt_tokens as usize);
            for e in &t.errors {
                eprintln!("trace: skipped {e}");
            }
            if t.bad_lines > 0 {
                eprintln!("trace: {} bad line(s) skipped ({} shown)", t.bad_lines, t.errors.len());
            }
            anyhow::ensure!(!t.requests.is_empty(), "{}: no usable requests", path.display());
            // Successive stretches when the trace is long enough, else stretches at evenly spaced offsets
            // (overlapping), so every run replays --requests requests.
            let (n, len) = (a.requests.min(t.requests.len()), t.requests.len());
            let offset = |k: usize| {
                if n * a.runs <= len || a.runs == 1 {
                    k * n
                } else {
                    k * (len - n) / (a.runs - 1)
                }
            };
            if n * a.runs > len && a.runs > 1 {
                eprintln!(
                    "trace: {len} usable requests, fewer than --runs × --requests: runs start at evenly spaced offsets"
                );
            }
            let system = match a.system_prompt_tokens {
                0 => String::new(),
                t => format!(", each behind one {t}-token system prompt"),
            };
            let mut w = Vec::new();
            for k in 0..a.runs {
                let part = window(&t.requests, offset(k), n);
                w.push((part, format!("trace {} (requests {}..{}{system})", path.display(), offset(k), offset(k) + n)));
            }
            w
        }
        None => (0..a.runs as u64)
            .map(|k| {
                let seed = a.seed + k;
                let reqs = generate(a.workload, GenParams { requests: a.requests, rate_per_s: a.rate, seed });
                (reqs, format!("workload {:?} (seed {seed}, {} req/s)", a.workload, a.rate))
            })
            .collect(),
    };

    let settings = RunSettings {
        endpoints: a.endpoints,
        sim: SimConfig {
            cache_blocks: a.cache_blocks,
            block_tokens: a.block_tokens,
            latency: LatencyProfile {
                prefill_ms_per_token: a.prefill_ms_per_token,
                max_num_seqs: a.max_num_seqs,
                time_scale: a.time_scale,
                ..Default::default()
            },
            ..Default::default()
        },
        slow: Slow { endpoints: a.slow_endpoints, factor: a.slow_factor },
        rate_scale: a.rate_scale,
        max_wall: Duration::from_secs_f64(a.max_wall_s),
        filter_extra,
        prefix_length: a.prefix_length,
        envoy_concurrency: a.envoy_concurrency,
        gateways: a.gateways,
        spread: a.spread,
        client_hop: a.client_hop,
        gateway_exchange: !a.no_gateway_exchange,
        pending_exchange: !a.no_pending_exchange,
        fits_exchange: !a.no_fits_exchange,
        feed: a.feed,
        feed_interval_ms: a.feed_interval_ms,
        model: "sim-model".into(),
        progress_every: Some(Duration::from_secs(5)),
    };

    if settings.gateways > 1 || settings.feed {
        match a.feed_interval_ms {
            Some(ms) => eprintln!("feed interval {ms} ms: every {:.0} simulated ms", ms as f64 / a.time_scale),
            None => {
                if let Some(note) = feed_interval_note(a.time_scale) {
                    eprintln!("{note}");
                }
            }
        }
    }
    let mut all_rows: Vec<Vec<Summary>> = Vec::new();
    let mut all_pooled = Vec::new();
    for (k, (reqs, source)) in workloads.iter().enumerate() {
        let span_s = reqs.last().map_or(0.0, |r| r.at_ms) / 1000.0 / a.rate_scale;
        eprintln!(
            "{}{source}: {} requests over {span_s:.0} simulated s (a mean {:.1} req/s; ≈{:.0} s wall per strategy at time scale {}), {} endpoints × {} blocks",
            if a.runs > 1 { format!("run {}/{}: ", k + 1, a.runs) } else { String::new() },
            reqs.len(),
            reqs.len() as f64 / span_s.max(1e-9),
            span_s * a.time_scale,
            a.time_scale,
            a.endpoints,
            a.cache_blocks
        );
        if a.slow_endpoints > 0 {
            eprintln!("  slow servers: {} of {}, {}× per token", a.slow_endpoints, a.endpoints, a.slow_factor);
        }
        let mut runs = Vec::new();
        for s in &strategies {
            let run = run_strategy(s, reqs, &settings).await.with_context(|| format!("strategy {}", s.label()))?;
            runs.push(run);
        }
        let rows: Vec<Summary> = runs.iter().map(Summary::of).collect();
        let sent = runs.iter().map(|r| r.outcomes.len()).max().unwrap_or(0);
        let pooled =
            pooled::pooled_hit_ratio(&reqs[..sent.min(reqs.len())], a.endpoints * a.cache_blocks, a.block_tokens);
        let t = table(&rows, Some(pooled));
        println!("\n{t}");
        let out = if a.runs > 1 { a.out.join(format!("run{}", k + 1)) } else { a.out.clone() };
        write_outputs(&out, &t, &runs, &rows)?;
        all_rows.push(rows);
        all_pooled.push(pooled);
    }
    if a.runs > 1 {
        let t = table_runs(&all_rows, &all_pooled);
        println!("\n{t}");
        std::fs::write(a.out.join("table.md"), &t)?;
        eprintln!("wrote {}/table.md (mean and min–max over {} runs)", a.out.display(), a.runs);
    }
    if a.check {
        let bad: Vec<&Summary> = all_rows.iter().flatten().filter(|r| !r.balanced()).collect();
        for r in &bad {
            eprintln!(
                "check failed for {}: errors {}, client completed {}, servers finished {}, answered elsewhere than \
                 picked {}, answered without the server's timing {}",
                r.label, r.errors, r.client_ok, r.server_requests, r.misrouted, r.untimed
            );
        }
        anyhow::ensure!(bad.is_empty(), "counters do not balance");
    }
    Ok(())
}

/// Writes one run's table, CSVs and charts into `out`.
fn write_outputs(
    out: &std::path::Path,
    table: &str,
    runs: &[warmpath_bench::harness::StrategyRun],
    rows: &[Summary],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("table.md"), table)?;
    write_csv(out, runs, rows)?;
    if let Err(e) = plot::ttft_cdf(&out.join("ttft_cdf.png"), runs) {
        eprintln!("plot ttft_cdf.png failed: {e}");
    }
    if let Err(e) = plot::load_per_endpoint(&out.join("load_per_endpoint.png"), runs) {
        eprintln!("plot load_per_endpoint.png failed: {e}");
    }
    eprintln!(
        "wrote {}/{{table.md,summary.csv,requests.csv,endpoints.csv,filter_stats.csv,ttft_cdf.png,load_per_endpoint.png}}",
        out.display()
    );
    Ok(())
}
