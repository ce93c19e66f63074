//! Short replays through the peers' real routers (`smg`, `vllm-router` from `.venv`, installed by scripts/setup.sh)
//! and through the KV-cost routers (DYNAMO_KV, ORACLE), in front of the same simulated servers as every other
//! strategy. Behaviour only — no timing assertions.

mod common;

use common::{assert_balanced, settings};
use warmpath_bench::harness::{run_strategy, Strategy};
use warmpath_bench::report::Summary;
use warmpath_bench::workload::{generate, GenParams, WorkloadKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_peers_answer_every_request_and_smg_reuses_repeated_prefixes() {
    // RAG: six long documents asked about again and again, so repeated prefixes dominate.
    let reqs = generate(WorkloadKind::Rag, GenParams { requests: 40, rate_per_s: 8.0, seed: 5 });
    let s = settings();
    for name in ["SMG_CACHE_AWARE", "VLLM_ROUTER_CACHE_AWARE"] {
        let strategy = Strategy::parse(name).unwrap();
        let run = run_strategy(&strategy, &reqs, &s).await.unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(run.path, strategy.path(s.client_hop));
        assert!(!run.via_envoy);
        assert_balanced(&run);
        // The peer's own process did the proxying, so its CPU time is counted.
        assert!(run.proxy_cpu_s.is_some_and(|c| c > 0.0), "{name}: proxy CPU {:?}", run.proxy_cpu_s);
        let cached = run.outcomes.iter().filter(|o| o.usage.prompt_tokens_details.cached_tokens > 0).count();
        eprintln!(
            "{name}: {cached} of {} requests hit the cache, hit ratio {:.3}",
            run.outcomes.len(),
            Summary::of(&run).hit_ratio
        );
        if name == "SMG_CACHE_AWARE" {
            // Six documents over 40 requests: at most six first reads can miss if the router follows the prefix.
            assert!(cached >= 20, "smg cache_aware must send repeated prefixes where they are cached: {cached} hits");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_cost_routers_answer_every_request_and_reuse_prefixes() {
    let reqs = generate(WorkloadKind::Rag, GenParams { requests: 60, rate_per_s: 8.0, seed: 4 });
    let s = settings();
    for name in ["DYNAMO_KV", "ORACLE", "ORACLE_TTFT"] {
        let run = run_strategy(&Strategy::parse(name).unwrap(), &reqs, &s).await.expect(name);
        assert_eq!(run.path, "envoy-pick");
        assert_balanced(&run);
        let hit = Summary::of(&run).hit_ratio;
        eprintln!("{name}: hit ratio {hit:.3}");
        assert!(hit > 0.2, "{name} on RAG must reuse the shared documents: {hit:.3}");
    }
}
