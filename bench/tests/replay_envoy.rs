//! A short replay through a real Envoy with the warmpath filter (needs `.venv/bin/envoy` from scripts/setup.sh and
//! the release wasm module; scripts/test.d/40-bench.sh builds it). Behaviour only — no timing assertions.

mod common;

use common::{assert_balanced, settings};
use warmpath_bench::harness::{run_strategy, ClientHop, RunSettings, Spread, Strategy};
use warmpath_bench::report::Summary;
use warmpath_bench::workload::{generate, GenParams, WorkloadKind};

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
    // The Envoy that proxied the requests is the process whose CPU time is counted, and the machine was busy.
    assert!(prefix.proxy_cpu_s.is_some_and(|c| c > 0.0), "proxy CPU {:?}", prefix.proxy_cpu_s);
    assert!(prefix.machine_busy.is_some_and(|b| b > 0.0 && b <= 1.0), "busy share {:?}", prefix.machine_busy);
    // Envoy's own timing of every request, both parts (the `Envoy µs` column).
    assert_eq!(prefix.envoy_timing.len(), reqs.len(), "one timing line per request");
    assert!(prefix.envoy_timing.iter().all(|t| t.request_us.is_some() && t.first_byte_us.is_some()));
    assert!(Summary::of(&prefix).envoy_us.is_some());
    // The outputs carry the filter's counters: one decision per request, and the workers' records exchanged.
    let out = tempfile::tempdir().expect("tempdir");
    let runs = [random, prefix];
    let rows: Vec<Summary> = runs.iter().map(Summary::of).collect();
    warmpath_bench::report::write_csv(out.path(), &runs, &rows).expect("outputs");
    let mut stats = csv::Reader::from_path(out.path().join("filter_stats.csv")).expect("filter_stats.csv");
    let stats: Vec<(String, String, u64)> = stats
        .records()
        .map(|r| r.expect("row"))
        .map(|r| (r[0].to_string(), r[1].to_string(), r[2].parse().expect("value")))
        .collect();
    let sum = |strategy: &str, part: &str| -> u64 {
        stats.iter().filter(|(s, k, _)| s == strategy && k.contains(part)).map(|(_, _, v)| v).sum()
    };
    assert_eq!(sum("PREFIX_AWARE", ".decisions.prefix_aware."), reqs.len() as u64, "{stats:?}");
    assert_eq!(sum("RANDOM", ".decisions.random."), reqs.len() as u64, "{stats:?}");
    assert!(sum("PREFIX_AWARE", "index_exchange.sent") > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baselines_run_in_the_same_harness_and_balance() {
    let reqs = generate(WorkloadKind::Rag, GenParams { requests: 60, rate_per_s: 8.0, seed: 4 });
    let s = settings();
    for b in ["SAGEMAKER_PREFIX", "GIE_SCORERS", "SGLANG_CACHE_AWARE"] {
        let run = run_strategy(&Strategy::parse(b).unwrap(), &reqs, &s).await.expect(b);
        assert!(!run.via_envoy);
        // Their picks travel through an Envoy without the filter, and every one reaches the server it names
        // (assert_balanced compares each pick with the server that answered).
        assert_eq!(run.path, "envoy-pick");
        assert!(run.outcomes.iter().all(|o| o.picked.is_some()), "{b}: every request carries the harness's pick");
        assert!(run.filter_stats.is_empty(), "{b}: no filter on the hop");
        assert_eq!(run.envoy_timing.len(), reqs.len(), "{b}: the hop's Envoy times every request");
        assert_balanced(&run);
        let hit = Summary::of(&run).hit_ratio;
        eprintln!("{b}: hit ratio {hit:.3}");
        assert!(hit > 0.2, "{b} on RAG must reuse the shared documents: {hit:.3}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_answer_every_request_and_each_request_is_decided_once() {
    let reqs = generate(WorkloadKind::Chat, GenParams { requests: 60, rate_per_s: 8.0, seed: 6 });
    for spread in [Spread::Random, Spread::Session] {
        let s = RunSettings { gateways: 2, spread, ..settings() };
        let run = run_strategy(&Strategy::Filter("PREFIX_AWARE".into()), &reqs, &s).await.expect("2 gateways");
        assert_balanced(&run);
        // The decision counters are summed over both Envoys: one decision per request, none lost or doubled.
        let decided: u64 = run.filter_stats.iter().filter(|(k, _)| k.contains(".decisions.")).map(|(_, v)| v).sum();
        assert_eq!(decided, reqs.len() as u64, "{spread:?}: {:?}", run.filter_stats);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gateway_with_the_feed_applies_snapshots_with_server_loads() {
    let reqs = generate(WorkloadKind::Chat, GenParams { requests: 60, rate_per_s: 8.0, seed: 8 });
    let s = RunSettings { feed: true, ..settings() };
    let run = run_strategy(&Strategy::Filter("PREFIX_AWARE".into()), &reqs, &s).await.expect("fed run");
    assert_balanced(&run);
    let stat = |name: &str| run.filter_stats.iter().filter(|(k, _)| k.ends_with(name)).map(|(_, v)| *v).sum::<u64>();
    // The harness's feed server replaces its snapshot (a new version with each server's scraped load) every
    // poll interval; the filter applying versions past the first shows the loads reach it during the run.
    assert!(stat("feed.version") > 1, "{:?}", run.filter_stats);
    assert!(stat("feed.applied") >= 2, "{:?}", run.filter_stats);
    assert_eq!(stat("feed.failures.invalid"), 0, "{:?}", run.filter_stats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_side_pick_goes_straight_to_its_server_without_the_hop() {
    let reqs = generate(WorkloadKind::Chat, GenParams { requests: 40, rate_per_s: 8.0, seed: 7 });
    let s = RunSettings { client_hop: ClientHop::Direct, ..settings() };
    let run = run_strategy(&Strategy::parse("SGLANG_CACHE_AWARE").unwrap(), &reqs, &s).await.expect("direct run");
    assert_eq!(run.path, "direct");
    assert_balanced(&run);
    // No proxy on the path: nothing to count.
    assert_eq!(run.proxy_cpu_s, None);
}
