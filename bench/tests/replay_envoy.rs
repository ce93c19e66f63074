//! A short replay through a real Envoy with the warmpath filter (needs `.venv/bin/envoy` from scripts/setup.sh and
//! the release wasm module; scripts/test.d/40-bench.sh builds it). Behaviour only — no timing assertions.

use std::time::Duration;

use serde_json::json;
use warmpath_bench::harness::{run_strategy, RunSettings, Strategy, StrategyRun};
use warmpath_bench::report::{client_counts, Summary};
use warmpath_bench::workload::{generate, GenParams, WorkloadKind};
use warmpath_sim::{LatencyProfile, SimConfig};

fn settings() -> RunSettings {
    RunSettings {
        endpoints: 4,
        // Small caches: the fleet cannot hold every conversation four times over, so routing decides hits.
        sim: SimConfig {
            cache_blocks: 768,
            latency: LatencyProfile { time_scale: 0.05, ..Default::default() },
            ..Default::default()
        },
        rate_scale: 1.0,
        max_wall: Duration::from_secs(60),
        filter_extra: json!({}),
        prefix_length: 65536,
        envoy_concurrency: 2,
        model: "sim-model".into(),
        progress_every: None,
    }
}

fn assert_balanced(run: &StrategyRun) {
    let s = Summary::of(run);
    assert_eq!(run.not_sent, 0, "{}: every request is sent", run.label);
    assert_eq!(s.errors, 0, "{}: every request answered: {:?}", run.label, run.outcomes.iter().find(|o| !o.ok));
    assert_eq!(s.server_requests, s.client_ok as u64, "{}: client count == sum of server counts", run.label);
    // Per endpoint too: the x-sim-endpoint header the client saw vs each server's own counter.
    let client = client_counts(run);
    for (addr, m) in &run.servers {
        assert_eq!(client.get(addr).copied().unwrap_or(0), m.requests as u64, "{}: {addr}", run.label);
    }
    // Server truth and client-side usage agree on cached tokens.
    let client_cached: u64 = run.outcomes.iter().map(|o| o.usage.prompt_tokens_details.cached_tokens).sum();
    let server_cached: f64 = run.servers.iter().map(|(_, m)| m.prefix_hits).sum();
    assert_eq!(client_cached as f64, server_cached, "{}", run.label);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_aware_beats_random_on_hit_ratio_through_envoy() {
    let reqs = generate(WorkloadKind::Chat, GenParams { requests: 160, rate_per_s: 8.0, seed: 3 });
    let s = settings();
    let random = run_strategy(&Strategy::Filter("RANDOM".into()), &reqs, &s).await.expect("RANDOM run");
    let prefix = run_strategy(&Strategy::Filter("PREFIX_AWARE".into()), &reqs, &s).await.expect("PREFIX_AWARE run");
    assert_balanced(&random);
    assert_balanced(&prefix);
    let (hr, hp) = (Summary::of(&random).hit_ratio, Summary::of(&prefix).hit_ratio);
    eprintln!("hit ratio RANDOM {hr:.3}, PREFIX_AWARE {hp:.3}");
    assert!(hp > hr, "PREFIX_AWARE hit ratio {hp:.3} must exceed RANDOM {hr:.3}");
    // The filter really decided: its decision counters are in Envoy's stats.
    assert!(prefix.filter_stats.iter().any(|(_, v)| *v > 0), "filter stats: {:?}", prefix.filter_stats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baselines_run_in_the_same_harness_and_balance() {
    let reqs = generate(WorkloadKind::Rag, GenParams { requests: 60, rate_per_s: 8.0, seed: 4 });
    let s = settings();
    for b in ["SAGEMAKER_PREFIX", "GIE_SCORERS", "SGLANG_CACHE_AWARE"] {
        let run = run_strategy(&Strategy::parse(b).unwrap(), &reqs, &s).await.expect(b);
        assert!(!run.via_envoy);
        assert_balanced(&run);
        let hit = Summary::of(&run).hit_ratio;
        eprintln!("{b}: hit ratio {hit:.3}");
        assert!(hit > 0.2, "{b} on RAG must reuse the shared documents: {hit:.3}");
    }
}
