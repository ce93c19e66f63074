#![allow(missing_docs)] // criterion_main! generates an undocumented `main`
//! Native decision time of the core (criterion): key extraction, block hashing and the PREFIX_AWARE pick for
//! 4 KB and 64 KB chat bodies, against a `serde_json::Value` DOM parse of the same body as the baseline; and the
//! PREFIX_AWARE decision (hash + pick + index update, key already extracted) against the endpoint count
//! (`endpoints/route/<N>`, N = 8, 64, 256, 1000), with loads that differ per endpoint; `endpoints/route_cold/<N>`
//! rotates over 4,096 conversations instead of 256, more than the policy remembers rendezvous tops for;
//! `endpoints/route_slow/<N>` is the warm case with every fourth endpoint learned to be twice as slow (predictions in
//! time, and the extra least-in-time search).
//!
//! `cargo bench -p warmpath-core --bench decision -- --warm-up-time 1 --measurement-time 3`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use warmpath_core::{extract_key, EndpointLoad, PrefixHashes, Router, Settings};

mod chat_body;
mod fleet;
use chat_body::{body, dom_extract};

const CHAT: &str = "/v1/chat/completions";

fn settings() -> Settings {
    Settings { endpoints: (0..8).map(|i| format!("10.0.0.{i}:8000")).collect(), ..Settings::default() }
}

fn benches(c: &mut Criterion) {
    let s = settings();
    for size in [4 * 1024, 64 * 1024] {
        let b = body(size, 1);
        let label = format!("{}KB", size / 1024);
        let mut g = c.benchmark_group(format!("chat_{label}"));
        g.throughput(Throughput::Bytes(b.len() as u64));
        g.bench_function(BenchmarkId::new("dom_parse_baseline", &label), |bench| {
            bench.iter(|| black_box(dom_extract(black_box(&b), s.prefix_length)))
        });
        g.bench_function(BenchmarkId::new("extract", &label), |bench| {
            bench.iter(|| black_box(extract_key(CHAT, black_box(&b), None, s.prefix_length).unwrap()))
        });
        g.bench_function(BenchmarkId::new("extract_hash", &label), |bench| {
            bench.iter(|| {
                let k = extract_key(CHAT, black_box(&b), None, s.prefix_length).unwrap();
                black_box(PrefixHashes::compute(k.namespace, &k.text, s.block_size))
            })
        });
        // Full decision on a warmed router: extract + hash + pick + index update. Requests rotate over 256
        // conversations so both prefix matches and index inserts happen, as in steady traffic.
        let others: Vec<Vec<u8>> = (0..256).map(|i| body(size, 1000 + i * 97)).collect();
        let mut r = Router::new(s.clone());
        let loads = vec![EndpointLoad::in_flight(2); 8];
        for o in &others {
            let k = extract_key(CHAT, o, None, s.prefix_length).unwrap();
            r.route_key(&k, 0, &loads);
        }
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("decision", &label), |bench| {
            bench.iter(|| {
                i = (i + 1) % others.len();
                let k = extract_key(CHAT, black_box(&others[i]), None, s.prefix_length).unwrap();
                black_box(r.route_key(&k, i as u64, &loads))
            })
        });
        // Same stream through LEAST_OUTSTANDING_REQUESTS: extraction plus a trivial pick, so the difference to
        // `decision` is the cost of hashing, the index lookups and the index update.
        let mut lor =
            Router::new(Settings { strategy: warmpath_core::Strategy::LeastOutstandingRequests, ..s.clone() });
        g.bench_function(BenchmarkId::new("decision_least_outstanding", &label), |bench| {
            bench.iter(|| {
                i = (i + 1) % others.len();
                let k = extract_key(CHAT, black_box(&others[i]), None, s.prefix_length).unwrap();
                black_box(lor.route_key(&k, i as u64, &loads))
            })
        });
        g.finish();
    }
}

/// The decision against the endpoint count: the same 4 KB conversation stream on a warmed router with N
/// endpoints whose loads (in flight, pending prefill) differ, so candidates are scored, not just the top taken.
fn by_endpoints(c: &mut Criterion) {
    let keys = fleet::keys(256);
    let cold = fleet::keys(4096);
    let mut g = c.benchmark_group("endpoints");
    for n in [8usize, 64, 256, 1000] {
        let (mut r, loads) = fleet::fleet(n);
        for k in &keys {
            r.route_key(k, 0, &loads);
        }
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("route", n), |bench| {
            bench.iter(|| {
                i = (i + 1) % keys.len();
                black_box(r.route_key(black_box(&keys[i]), i as u64, &loads))
            })
        });
        // The same with more conversations than the policy remembers rendezvous tops for, so nearly every
        // request scores every endpoint (and the index evicts, as under a stream of new conversations).
        let mut r = Router::new(r.settings().clone());
        for k in &cold {
            r.route_key(k, 0, &loads);
        }
        g.bench_function(BenchmarkId::new("route_cold", n), |bench| {
            bench.iter(|| {
                i = (i + 1) % cold.len();
                black_box(r.route_key(black_box(&cold[i]), i as u64, &loads))
            })
        });
        // The warm case with every fourth endpoint learned to be twice as slow: predictions in time, and the
        // least loaded in time searched too.
        let mut r = Router::new(r.settings().clone());
        r.set_prefill_fits(&fleet::fits_with_slow_quarter(&r.settings().endpoints));
        assert!(!r.slowdowns().is_empty(), "no endpoint told apart as slower");
        for k in &keys {
            r.route_key(k, 0, &loads);
        }
        g.bench_function(BenchmarkId::new("route_slow", n), |bench| {
            bench.iter(|| {
                i = (i + 1) % keys.len();
                black_box(r.route_key(black_box(&keys[i]), i as u64, &loads))
            })
        });
    }
    g.finish();
}

criterion_group!(decision, benches, by_endpoints);
criterion_main!(decision);
