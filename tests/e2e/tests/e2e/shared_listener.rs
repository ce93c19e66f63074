//! Several warmpath instances on one listener (two routing policies whose HTTPRoutes share a Gateway listener):
//! route `/a/` → cluster `pool-a`, `/b/` → cluster `pool-b`, catch-all `/` → `model_servers`, and two filter
//! instances in the chain (plugin names `warmpath-a`, `warmpath-b`), each with its own pool's endpoints. With
//! `upstream_clusters` each instance acts only on its own cluster's requests; without it the last instance in the
//! chain decides every request (the bug the setting fixes).
//!
//! The filter's metrics are one Envoy stat per name across instances, so per-instance behaviour is read from the
//! arithmetic: each request of a claimed route is decided once and skipped once; a request of the unclaimed
//! route is skipped twice.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use warmpath_harness::{
    filter_wasm, EnvoyConfig, EnvoyProcess, Stats, Upstream, DESTINATION_HEADER, MODEL_CLUSTER, ORIGINAL_DST_HEADER,
};

use crate::common::{prompt, Rig, CONCURRENCY};

/// Upstreams per pool.
const PER_POOL: usize = 3;
const POOLS: [(&str, &str, &str); 2] = [("pool-a", "/a/", "warmpath-a"), ("pool-b", "/b/", "warmpath-b")];

/// The rig's upstreams: pool-a's, then pool-b's, then the one upstream of the unclaimed catch-all route.
fn pool_upstreams(rig: &Rig, pool: usize) -> &[Upstream] {
    &rig.upstreams[pool * PER_POOL..(pool + 1) * PER_POOL]
}

fn addresses(upstreams: &[Upstream]) -> Vec<String> {
    upstreams.iter().map(|u| u.addr().to_string()).collect()
}

/// Two pools plus a catch-all upstream, and one PREFIX_AWARE instance per pool; `gate` adds
/// `upstream_clusters: [<its pool>]` to each instance. Envoy does not strip destination headers itself here, so
/// everything stripped is stripped by the instances.
async fn start(gate: bool) -> Rig {
    let upstreams = Upstream::start_many(2 * PER_POOL + 1).await.expect("upstreams");
    let addrs: Vec<SocketAddr> = upstreams.iter().map(Upstream::addr).collect();
    let mut cfg = EnvoyConfig::new(addrs[2 * PER_POOL..].to_vec(), "{}")
        .with_wasm(filter_wasm().expect("filter module"))
        .with_rig_headers();
    cfg.strip_in_envoy = false;
    for (i, (cluster, prefix, plugin)) in POOLS.iter().enumerate() {
        let pool = addrs[i * PER_POOL..(i + 1) * PER_POOL].to_vec();
        let mut extra = json!({"strategy": "PREFIX_AWARE"});
        if gate {
            extra["upstream_clusters"] = json!([cluster]);
        }
        cfg = cfg.with_plugin(*plugin, EnvoyConfig::plugin_json(&pool, extra)).with_pool(*cluster, *prefix, pool);
    }
    let envoy = EnvoyProcess::start(cfg, CONCURRENCY).await.expect("envoy starts");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    Rig { upstreams, envoy, client }
}

fn chat_body(p: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": p}]}).to_string().into_bytes()
}

fn decisions(s: &Stats) -> u64 {
    s.sum_prefix("wasmcustom.warmpath.decisions.")
}

fn metrics(s: &Stats) -> Vec<(&str, u64)> {
    s.with_prefix("wasmcustom.warmpath.").filter(|(k, _)| !k.contains("in_flight")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_routes_only_its_own_clusters_requests() {
    let rig = start(true).await;
    let seeds = ["alpha", "bravo", "charlie", "delta"];
    let repeats = 4;
    // home[pool][seed]: the upstream that answered that prompt on that pool's route.
    let mut home: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for seed in seeds {
        let p = prompt(seed, 3000);
        for (i, (_, prefix, _)) in POOLS.iter().enumerate() {
            let own = addresses(pool_upstreams(&rig, i));
            let mut seen = BTreeSet::new();
            for _ in 0..repeats {
                let r = rig.post(&format!("{prefix}v1/chat/completions"), chat_body(&p), &[]).await;
                assert_eq!(r.status, 200, "{r:?}");
                assert!(own.contains(&r.upstream), "{prefix} answered by {} outside its pool {own:?}", r.upstream);
                // The debug header comes from the instance that decided: its own pool's endpoint.
                assert!(r.decision.starts_with(&format!("{};", r.upstream)), "{r:?}");
                seen.insert(r.upstream);
            }
            assert_eq!(seen.len(), 1, "prefix {seed} on {prefix} spread over {seen:?}");
            home[i].push(seen.into_iter().next().unwrap_or_default());
        }
    }
    let claimed = (seeds.len() * repeats * POOLS.len()) as u64;
    // Every request was decided once (by its own instance) and skipped once (by the other).
    let s = rig.stats_until(|s| decisions(s) >= claimed && s.filter("requests_skipped_other_cluster") >= claimed).await;
    assert_eq!(decisions(&s), claimed, "{:?}", metrics(&s));
    assert_eq!(
        s.filter("decisions.prefix_aware.prefix_match") + s.filter("decisions.prefix_aware.consistent_pick"),
        claimed
    );
    assert_eq!(s.filter("requests_skipped_other_cluster"), claimed, "{:?}", metrics(&s));

    // Spoofed destination headers on either route: another endpoint of the same pool, or one of the other pool.
    let mut spoofed = 0u64;
    for (k, seed) in seeds.iter().enumerate() {
        let p = prompt(seed, 3000);
        for (i, (_, prefix, _)) in POOLS.iter().enumerate() {
            let same_pool =
                addresses(pool_upstreams(&rig, i)).into_iter().find(|a| *a != home[i][k]).expect("other upstream");
            let other_pool = addresses(pool_upstreams(&rig, 1 - i))[k % PER_POOL].clone();
            for target in [same_pool, other_pool] {
                let headers = [(DESTINATION_HEADER, target.as_str()), (ORIGINAL_DST_HEADER, target.as_str())];
                let r = rig.post(&format!("{prefix}v1/chat/completions"), chat_body(&p), &headers).await;
                spoofed += 1;
                assert_eq!(r.status, 200, "{r:?}");
                assert_eq!(r.upstream, home[i][k], "a client header ({target}) steered {prefix}");
            }
        }
    }
    // No pool upstream ever saw a value other than its own address: every pick was honoured (no fallback), and
    // no client value reached it.
    for u in &rig.upstreams[..2 * PER_POOL] {
        for req in u.requests() {
            assert_eq!(req.header(DESTINATION_HEADER), Some(u.addr().to_string().as_str()), "{req:?}");
            assert_eq!(req.header(ORIGINAL_DST_HEADER), None, "{req:?}");
        }
    }
    // Each spoofed request was cleaned once — by its own instance; the other one left it alone.
    let total = claimed + spoofed;
    let s = rig.stats_until(|s| s.filter("requests_skipped_other_cluster") >= total && decisions(s) >= total).await;
    assert_eq!(s.filter("spoofed_header_removed"), spoofed, "{:?}", metrics(&s));
    assert_eq!(s.filter("requests_skipped_other_cluster"), total, "{:?}", metrics(&s));
    assert_eq!(decisions(&s), total);

    // The catch-all route's cluster is in no instance's list: both leave its requests alone (no pick, no
    // buffering, no fail-open count).
    let unclaimed = 5u64;
    for i in 0..unclaimed {
        let r = rig.post("/v1/chat/completions", chat_body(&prompt(&format!("other {i}"), 2000)), &[]).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.upstream, rig.upstreams[2 * PER_POOL].addr().to_string());
        assert_eq!(r.decision, "", "no instance decided: {r:?}");
    }
    for req in rig.upstreams[2 * PER_POOL].requests() {
        assert_eq!(req.header(DESTINATION_HEADER), None, "{req:?}");
    }
    let s = rig.stats_until(|s| s.filter("requests_skipped_other_cluster") >= total + 2 * unclaimed).await;
    assert_eq!(s.filter("requests_skipped_other_cluster"), total + 2 * unclaimed, "{:?}", metrics(&s));
    assert_eq!(decisions(&s), total, "{:?}", metrics(&s));
    assert_eq!(s.sum_prefix("wasmcustom.warmpath.fail_open."), 0, "{:?}", metrics(&s));
    // The log names the cluster left alone and the list it is not in (the one trace of a misspelt list): each
    // instance its own list, though the two share their VMs.
    let log = rig.envoy.log();
    for (cluster, _, _) in POOLS {
        let line = format!(
            "requests for Envoy cluster {MODEL_CLUSTER} are not routed by this instance: upstream_clusters is {cluster};"
        );
        assert!(log.contains(&line), "no line {line:?} in\n{log}");
    }
}

/// The bug without the setting: each instance strips the other's pick as if a client had sent it and picks from
/// its own pool, so the last instance in the chain (`warmpath-b`) decides every request; `/a/` requests reach
/// pool-a's cluster carrying a pool-b address, which its `override_host` policy cannot honour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_upstream_clusters_the_last_instance_decides_every_request() {
    let rig = start(false).await;
    let n = 8;
    for i in 0..n {
        let p = prompt(&format!("ungated {i}"), 2000);
        for (_, prefix, _) in POOLS {
            let r = rig.post(&format!("{prefix}v1/chat/completions"), chat_body(&p), &[]).await;
            assert_eq!(r.status, 200, "{r:?}");
        }
    }
    let b = addresses(pool_upstreams(&rig, 1));
    let pool_a_requests: Vec<_> = pool_upstreams(&rig, 0).iter().flat_map(Upstream::requests).collect();
    assert_eq!(pool_a_requests.len(), n);
    for req in &pool_a_requests {
        let dest = req.header(DESTINATION_HEADER).unwrap_or("");
        assert!(b.iter().any(|x| x == dest), "pool-a request carried {dest:?}, not a pool-b pick: {req:?}");
    }
    // pool-b's requests happen to get their own pool's pick (warmpath-b runs last).
    for u in pool_upstreams(&rig, 1) {
        for req in u.requests() {
            assert_eq!(req.header(DESTINATION_HEADER), Some(u.addr().to_string().as_str()), "{req:?}");
        }
    }
    // Every claimed request was decided twice, and warmpath-b removed warmpath-a's pick from every one of them.
    let claimed = (2 * n) as u64;
    let s = rig.stats_until(|s| decisions(s) >= 2 * claimed).await;
    assert_eq!(decisions(&s), 2 * claimed, "{:?}", metrics(&s));
    assert_eq!(s.filter("spoofed_header_removed"), claimed, "{:?}", metrics(&s));
    assert_eq!(s.filter("requests_skipped_other_cluster"), 0);
}
