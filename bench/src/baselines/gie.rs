//! Gateway API Inference Extension (GIE) / llm-d-style scheduling: a weighted sum of scorers, highest score wins.
//!
//! Source: kubernetes-sigs/gateway-api-inference-extension, endpoint picker plugins
//! `pkg/epp/scheduling/framework/plugins/multi/prefix` (prefix-cache scorer: the prompt is cut into blocks of
//! 64 characters, each block hashed chained with the previous one, at most 256 blocks; per server an LRU of
//! 31,250 block hashes remembers what was routed there; score = leading blocks found on that server / blocks of the
//! request), `.../scorer/queue` (queue scorer: `(max − q) / (max − min)` of the servers' waiting-queue sizes, 1 when
//! all are equal) and `.../scorer/kvcache` (KV-cache-utilization scorer: `1 − kv_cache_usage`), combined with
//! weights prefix 3, queue 2, KV usage 2 as in llm-d's default scheduler profile; max-score picker with random
//! tie-break. Queue and KV usage come from the servers' `/metrics` (`vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc`), scraped periodically by the harness, as GIE's metrics collector does.

use std::collections::{BTreeMap, HashMap};

use warmpath_core::decision::{Decision, Reason};
use warmpath_core::endpoint::{Endpoint, EndpointLoad};
use warmpath_core::policy::{PickInput, Policy};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Per-server LRU set of block hashes.
#[derive(Debug, Default, Clone)]
struct Lru {
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, h: u64, tick: u64, cap: usize) {
        if let Some(old) = self.at.insert(h, tick) {
            self.order.remove(&old);
        }
        self.order.insert(tick, h);
        while self.at.len() > cap {
            if let Some((_, v)) = self.order.pop_first() {
                self.at.remove(&v);
            }
        }
    }
}

/// GIE-style weighted scorers.
#[derive(Debug, Clone)]
pub struct GieScorers {
    /// Characters (bytes) per hashed block. Default 64.
    pub block_size: usize,
    /// Blocks hashed per request at most. Default 256.
    pub max_blocks: usize,
    /// Block hashes remembered per server. Default 31,250.
    pub lru_capacity: usize,
    /// Weight of the prefix-cache scorer. Default 3.
    pub prefix_weight: f64,
    /// Weight of the queue scorer. Default 2.
    pub queue_weight: f64,
    /// Weight of the KV-cache-utilization scorer. Default 2.
    pub kv_weight: f64,
    index: HashMap<String, Lru>,
    tick: u64,
}

impl Default for GieScorers {
    fn default() -> Self {
        Self {
            block_size: 64,
            max_blocks: 256,
            lru_capacity: 31_250,
            prefix_weight: 3.0,
            queue_weight: 2.0,
            kv_weight: 2.0,
            index: HashMap::new(),
            tick: 0,
        }
    }
}

impl GieScorers {
    fn hashes(&self, input: &PickInput) -> Vec<u64> {
        let Some(key) = input.key else { return Vec::new() };
        let mut prev = key.namespace;
        key.text
            .chunks(self.block_size)
            .take(self.max_blocks)
            .map(|c| {
                prev = xxh3_64_with_seed(c, prev);
                prev
            })
            .collect()
    }
}

impl Policy for GieScorers {
    fn name(&self) -> &'static str {
        "GIE_SCORERS"
    }

    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        // One call per request: choose, then record the choice in this policy's own index.
        let d = self.choose(input, endpoints, loads)?;
        self.record(input, &d);
        Some(d)
    }
}

impl GieScorers {
    fn choose(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        if endpoints.is_empty() {
            return None;
        }
        let hashes = self.hashes(input);
        let server = |i: usize| loads.get(i).and_then(|l| l.server).unwrap_or_default();
        let queues: Vec<f64> = (0..endpoints.len()).map(|i| server(i).waiting as f64).collect();
        let (qmin, qmax) = queues.iter().fold((f64::MAX, f64::MIN), |(a, b), &q| (a.min(q), b.max(q)));
        let mut best: Option<(f64, usize, u32)> = None;
        let n = endpoints.len();
        let start = (input.random % n as u64) as usize;
        for k in 0..n {
            let i = (start + k) % n;
            let matched = self
                .index
                .get(&endpoints[i].address)
                .map_or(0, |lru| hashes.iter().take_while(|h| lru.at.contains_key(h)).count());
            let prefix = if hashes.is_empty() { 0.0 } else { matched as f64 / hashes.len() as f64 };
            let queue = if qmax > qmin { (qmax - queues[i]) / (qmax - qmin) } else { 1.0 };
            let kv = 1.0 - f64::from(server(i).kv_cache_usage).clamp(0.0, 1.0);
            let score = self.prefix_weight * prefix + self.queue_weight * queue + self.kv_weight * kv;
            if best.is_none_or(|(s, _, _)| score > s) {
                best = Some((score, i, matched as u32));
            }
        }
        let (_, i, matched) = best?;
        let reason = if matched > 0 { Reason::PrefixMatch } else { Reason::LeastOutstanding };
        Some(Decision::new(endpoints, i, reason).with_match(matched, matched as usize * self.block_size))
    }

    fn record(&mut self, input: &PickInput, decision: &Decision) {
        let hashes = self.hashes(input);
        let cap = self.lru_capacity;
        let lru = self.index.entry(decision.address.clone()).or_default();
        for h in hashes {
            self.tick += 1;
            lru.touch(h, self.tick, cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmpath_core::endpoint::ServerLoad;
    use warmpath_core::extract::{BodyKind, RequestKey};

    fn eps(n: usize) -> Vec<Endpoint> {
        (0..n).map(|i| Endpoint::new(format!("127.0.0.1:{}", 9000 + i), i as u32)).collect()
    }

    #[test]
    fn prefix_weight_keeps_a_prompt_on_its_server_unless_load_outweighs_it() {
        let mut p = GieScorers::default();
        let e = eps(3);
        let key = RequestKey::new(BodyKind::Completion, None, None, vec![b'x'; 640]);
        let input = PickInput { key: Some(&key), random: 1, ..Default::default() };
        let idle = vec![EndpointLoad::default(); 3];
        let first = p.pick(&input, &e, &idle).unwrap();
        let again = p.pick(&PickInput { random: 2, ..input }, &e, &idle).unwrap();
        assert_eq!(again.endpoint, first.endpoint);
        assert_eq!(again.matched_blocks, 10);
        // A full KV cache and the longest queue on that server: 3·1 + 0 + 0 < 0 + 2 + 2.
        let mut loaded = idle.clone();
        loaded[first.endpoint].server = Some(ServerLoad { waiting: 5, running: 10, kv_cache_usage: 1.0 });
        let moved = p.pick(&input, &e, &loaded).unwrap();
        assert_ne!(moved.endpoint, first.endpoint);
    }
}
