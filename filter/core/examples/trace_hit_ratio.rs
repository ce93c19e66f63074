//! Offline hit-ratio check of the routing policies on the Mooncake trace (orientation only: it measures
//! prefix-cache hit ratio and request share, not TTFT — the bench crate measures TTFT through real Envoy).
//!
//! Each trace `hash_id` becomes one fixed block of text (one core block), so requests sharing leading ids
//! share a byte-identical prefix. N endpoints each hold an LRU cache of C blocks; a request hits the leading
//! blocks its endpoint has cached. In-flight load follows a simple time model (prefill of uncached tokens at
//! 20k tokens/s, 20 ms per output token).
//!
//! `cargo run --release -p warmpath-core --example trace_hit_ratio [-- TRACE.jsonl]`; without an argument it reads
//! `mooncake_synthetic_trace.jsonl` from the directory named by `WARMPATH_TRACES` (the public traces are not part
//! of the repository).

use std::collections::{HashMap, VecDeque};

use warmpath_core::{BodyKind, EndpointLoad, Reason, RequestKey, Router, Settings, Strategy};
use xxhash_rust::xxh3::xxh3_64;

const BLOCK: usize = 128;

struct Req {
    t_ms: u64,
    input: u64,
    output: u64,
    ids: Vec<u64>,
}

/// LRU of chained block ids (`(position, id)` chains are unique by construction of the trace).
struct Lru {
    cap: usize,
    tick: u64,
    map: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl Lru {
    fn new(cap: usize) -> Lru {
        Lru { cap, tick: 0, map: HashMap::new(), order: VecDeque::new() }
    }
    fn hits(&self, ids: &[u64]) -> usize {
        ids.iter().take_while(|id| self.map.contains_key(id)).count()
    }
    fn touch(&mut self, ids: &[u64]) {
        for &id in ids {
            self.tick += 1;
            self.map.insert(id, self.tick);
            self.order.push_back((id, self.tick));
        }
        while self.map.len() > self.cap {
            let (id, t) = self.order.pop_front().unwrap();
            if self.map.get(&id) == Some(&t) {
                self.map.remove(&id);
            }
        }
    }
}

fn load(path: &str) -> Option<Vec<Req>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| Req {
                t_ms: v["timestamp"].as_u64().unwrap_or(0),
                input: v["input_length"].as_u64().unwrap_or(0),
                output: v["output_length"].as_u64().unwrap_or(0),
                ids: v["hash_ids"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
                    .unwrap_or_default(),
            })
            .collect(),
    )
}

fn text(ids: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * BLOCK);
    for id in ids {
        for j in 0..(BLOCK / 8) as u64 {
            out.extend_from_slice(&xxh3_64(&[id.to_le_bytes(), j.to_le_bytes()].concat()).to_le_bytes());
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Pol {
    Core(Strategy),
    FirstBlockHash,
}

fn run(reqs: &[Req], n: usize, cap: usize, pol: Pol) -> (f64, f64, f64) {
    let strategy = match pol {
        Pol::Core(s) => s,
        Pol::FirstBlockHash => Strategy::Random,
    };
    let settings = Settings {
        strategy,
        prefix_length: 65536,
        block_size: BLOCK,
        concurrency_threshold: 10,
        index_capacity: 1 << 18,
        endpoints: (0..n).map(|i| format!("10.0.0.{i}:8000")).collect(),
        ..Settings::default()
    };
    let mut router = Router::new(settings);
    let mut caches: Vec<Lru> = (0..n).map(|_| Lru::new(cap)).collect();
    let mut busy: Vec<Vec<u64>> = vec![Vec::new(); n]; // end times (ms) of in-flight requests
    let (mut hit_blocks, mut all_blocks, mut overflow) = (0u64, 0u64, 0u64);
    let mut share = vec![0u64; n];
    for (k, r) in reqs.iter().enumerate() {
        for b in busy.iter_mut() {
            b.retain(|&end| end > r.t_ms);
        }
        let loads: Vec<EndpointLoad> = busy.iter().map(|b| EndpointLoad::in_flight(b.len() as u32)).collect();
        let e = match pol {
            Pol::FirstBlockHash => {
                // First-block baseline: rendezvous on the first block, threshold 10, else least loaded.
                let key = r.ids.first().copied().unwrap_or(0);
                let eps = router.endpoints().to_vec();
                let order = warmpath_core::hrw::order(key, &eps);
                match order.iter().find(|&&i| loads[i].in_flight < 10) {
                    Some(&i) => i,
                    None => (0..n).min_by_key(|&i| loads[i].in_flight).unwrap(),
                }
            }
            Pol::Core(..) => {
                let key = RequestKey::new(BodyKind::Raw, None, None, text(&r.ids));
                let d = router.route_key(&key, xxh3_64(&k.to_le_bytes()), &loads).unwrap();
                overflow += (d.reason == Reason::Overflow) as u64;
                d.endpoint
            }
        };
        let hits = caches[e].hits(&r.ids);
        caches[e].touch(&r.ids);
        hit_blocks += hits as u64;
        all_blocks += r.ids.len() as u64;
        share[e] += 1;
        let uncached_tokens = r.input.saturating_sub(hits as u64 * 512);
        busy[e].push(r.t_ms + uncached_tokens / 20 + r.output * 20);
    }
    let max_share = *share.iter().max().unwrap() as f64 / reqs.len() as f64;
    (hit_blocks as f64 / all_blocks as f64, max_share, overflow as f64 / reqs.len() as f64)
}

fn main() {
    let Some(path) = std::env::args().nth(1).or_else(|| {
        let dir = std::env::var("WARMPATH_TRACES").ok().filter(|d| !d.is_empty())?;
        Some(format!("{dir}/mooncake_synthetic_trace.jsonl"))
    }) else {
        eprintln!("no trace: pass a path as the first argument or set WARMPATH_TRACES");
        return;
    };
    let Some(reqs) = load(&path) else {
        eprintln!("trace not found at {path}; skipping (pass a path as the first argument)");
        return;
    };
    println!("{} requests, 8 endpoints; block hit ratio (max endpoint share, overflow share)", reqs.len());
    let pols = [
        ("random", Pol::Core(Strategy::Random)),
        ("least outstanding", Pol::Core(Strategy::LeastOutstandingRequests)),
        ("hash of first block + threshold 10", Pol::FirstBlockHash),
        ("PREFIX_AWARE threshold 10", Pol::Core(Strategy::PrefixAware)),
    ];
    println!("| policy | C = 1000 blocks | C = 3000 blocks |\n|---|---|---|");
    for (name, p) in pols {
        let a = run(&reqs, 8, 1000, p);
        let b = run(&reqs, 8, 3000, p);
        println!("| {name} | {:.3} ({:.3}, {:.3}) | {:.3} ({:.3}, {:.3}) |", a.0, a.1, a.2, b.0, b.1, b.2);
    }
}
