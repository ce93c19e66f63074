//! KV-block cost routing, client-side: a Dynamo-style baseline that estimates every term from its own routing
//! history, and `ORACLE`, the same cost computed from each simulated server's true cache and queue.
//!
//! **Cost** (NVIDIA Dynamo KV router, ai-dynamo/dynamo `lib/kv-router/src/scheduling/selector.rs`,
//! `DefaultWorkerSelector::select_worker`; documented in `docs/router/README.md`, "Cost Function"), per worker, in
//! KV blocks, lowest wins:
//!
//! ```text
//! cost = overlap_score_weight × prefill_tokens / block_size + decode_blocks
//! prefill_tokens = active_prefill_tokens + prompt_tokens − overlap_blocks × block_size   (≥ 0)
//! decode_blocks  = active_blocks + the request's blocks not already active there
//! ```
//!
//! Parameters are Dynamo's defaults: `overlap_score_weight` (`--kv-overlap-score-weight`, called
//! `prefill_load_scale` here) 1.0; `router_temperature` 0, i.e. the lowest cost wins deterministically (ties broken
//! at random); the block size is the engine's KV block size (the simulated servers' `block_tokens`, vLLM's 16).
//!
//! - [`CostKind::Dynamo`] runs as Dynamo does without KV events (`--no-kv-events`, the `ApproxKvIndexer`):
//!   `overlap_blocks` comes from the blocks it routed to each worker, forgotten after a TTL of 120 s (simulated);
//!   `active_prefill_tokens` and `active_blocks` come from its own request tracking (`ActiveSequences`): a
//!   request's new prefill tokens count until its first token arrives, its blocks until it ends.
//! - [`CostKind::Oracle`] reads the truth through [`SimProbe`]: cached blocks from the server's cache, pending
//!   prefill (admitted requests' uncached tokens plus the prompts still waiting for a batch slot) and pinned blocks
//!   from its queue. It is what a router fed by exact engine KV events can at best know — a yardstick for the
//!   other strategies, not a competitor.
//! - [`CostKind::OracleTtft`] reads the same truth but drops the decode term (cost = prefill tokens the server
//!   would owe, i.e. its predicted prefill-lane wait plus this request's uncached prefill). In the simulated
//!   servers decode does not slow down with the batch (`warmpath_sim::latency`), so this is the exact-state
//!   TTFT-greedy placement there; Dynamo's decode term trades TTFT for decode balance.
//!
//! Prompts are tokenized as the servers do ([`warmpath_sim::tokens`]): the harness hands the router the rendered
//! prompt, which for a real router is the tokenizer plus chat template.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use warmpath_sim::tokens::{block_hashes, token_count};
use warmpath_sim::SimProbe;

/// Dynamo's default `--kv-overlap-score-weight`.
pub const DEFAULT_PREFILL_LOAD_SCALE: f64 = 1.0;
/// Dynamo's default TTL of routed blocks in its approximate indexer, seconds.
pub const APPROX_INDEX_TTL_S: f64 = 120.0;

/// Which state the cost is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostKind {
    /// Dynamo-style: its own routing history.
    Dynamo,
    /// Exact state of every simulated server, Dynamo's cost.
    Oracle,
    /// Exact state of every simulated server, prefill work only (predicted TTFT).
    OracleTtft,
}

impl CostKind {
    /// Every kind, in report order.
    pub const ALL: [CostKind; 3] = [CostKind::Dynamo, CostKind::Oracle, CostKind::OracleTtft];

    /// The strategy label (command-line name).
    pub fn label(self) -> &'static str {
        match self {
            CostKind::Dynamo => "DYNAMO_KV",
            CostKind::Oracle => "ORACLE",
            CostKind::OracleTtft => "ORACLE_TTFT",
        }
    }

    /// True for the exact-state references (`ORACLE`, `ORACLE_TTFT`): they read every server's true cache and
    /// queue, which no router can, so they are yardsticks rather than routers to rank.
    pub fn is_reference(self) -> bool {
        matches!(self, CostKind::Oracle | CostKind::OracleTtft)
    }

    /// Weight of the decode-blocks term: 1 in Dynamo's cost, 0 for the TTFT-only reference.
    pub fn decode_weight(self) -> f64 {
        match self {
            CostKind::Dynamo | CostKind::Oracle => 1.0,
            CostKind::OracleTtft => 0.0,
        }
    }
}

/// One worker's view for one request, the inputs of [`cost`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerView {
    /// Prompt blocks of this request already cached on the worker.
    pub overlap_blocks: usize,
    /// Prefill tokens the worker still owes other requests.
    pub active_prefill_tokens: u64,
    /// KV blocks the worker's running requests hold.
    pub active_blocks: usize,
    /// Of this request's blocks, those already active on the worker (not added again).
    pub shared_active_blocks: usize,
}

/// Dynamo's cost of sending a `prompt_tokens`-token prompt to a worker in state `w`, in blocks of `block_tokens`,
/// with the decode term weighted by `decode_weight` (Dynamo: 1).
pub fn cost(
    prefill_load_scale: f64,
    decode_weight: f64,
    prompt_tokens: u64,
    block_tokens: usize,
    w: &WorkerView,
) -> f64 {
    let bt = block_tokens.max(1) as u64;
    let cached = w.overlap_blocks as u64 * bt;
    let prefill_tokens = (w.active_prefill_tokens + prompt_tokens).saturating_sub(cached);
    let request_blocks = prompt_tokens.div_ceil(bt) as usize;
    let decode_blocks = w.active_blocks + request_blocks.saturating_sub(w.shared_active_blocks);
    prefill_load_scale * prefill_tokens as f64 / bt as f64 + decode_weight * decode_blocks as f64
}

/// Index of the lowest cost; ties go to the first one at or after `tiebreak % n` (so equal costs spread).
pub fn lowest(costs: &[f64], tiebreak: u64) -> Option<usize> {
    let n = costs.len();
    let start = (tiebreak % n.max(1) as u64) as usize;
    (0..n).map(|k| (start + k) % n).min_by(|&a, &b| costs[a].total_cmp(&costs[b]))
}

/// A request the Dynamo-style router is tracking on one worker.
#[derive(Debug)]
struct Active {
    prefill_tokens: u64,
    prefill_done: bool,
    blocks: Vec<u64>,
}

/// Dynamo-style per-worker state, from routing history only.
#[derive(Debug, Default)]
struct WorkerHistory {
    /// Block hash → simulated ms after which the approximate index forgets it.
    routed: HashMap<u64, f64>,
    active: HashMap<u64, Active>,
    active_prefill_tokens: u64,
    /// Block hash → active requests holding it.
    active_blocks: HashMap<u64, u32>,
}

impl WorkerHistory {
    fn view(&self, hashes: &[u64], now_ms: f64) -> WorkerView {
        WorkerView {
            overlap_blocks: hashes.iter().take_while(|h| self.routed.get(h).is_some_and(|&exp| exp > now_ms)).count(),
            active_prefill_tokens: self.active_prefill_tokens,
            active_blocks: self.active_blocks.len(),
            shared_active_blocks: hashes.iter().filter(|h| self.active_blocks.contains_key(h)).count(),
        }
    }

    fn add(&mut self, id: u64, hashes: Vec<u64>, prefill_tokens: u64, expiry_ms: f64) {
        for &h in &hashes {
            self.routed.insert(h, expiry_ms);
            *self.active_blocks.entry(h).or_default() += 1;
        }
        self.active_prefill_tokens += prefill_tokens;
        self.active.insert(id, Active { prefill_tokens, prefill_done: false, blocks: hashes });
    }

    fn prefill_done(&mut self, id: u64) {
        if let Some(a) = self.active.get_mut(&id) {
            if !a.prefill_done {
                a.prefill_done = true;
                self.active_prefill_tokens -= a.prefill_tokens;
            }
        }
    }

    fn finish(&mut self, id: u64) {
        self.prefill_done(id);
        if let Some(a) = self.active.remove(&id) {
            for h in a.blocks {
                if let Some(n) = self.active_blocks.get_mut(&h) {
                    *n -= 1;
                    if *n == 0 {
                        self.active_blocks.remove(&h);
                    }
                }
            }
        }
    }
}

/// A cost router over a fleet of simulated servers, shared by the replay tasks.
pub struct CostRouter {
    kind: CostKind,
    addresses: Vec<String>,
    probes: Vec<SimProbe>,
    block_tokens: usize,
    /// `overlap_score_weight`.
    pub prefill_load_scale: f64,
    time_scale: f64,
    start: Instant,
    history: Mutex<Vec<WorkerHistory>>,
    seq: AtomicU64,
}

/// A routed request: call [`Ticket::first_token`] when its first token arrives; dropping it ends the request.
pub struct Ticket<'a> {
    router: &'a CostRouter,
    worker: usize,
    id: u64,
}

impl Ticket<'_> {
    /// The request's prefill is over: its prefill tokens stop counting as the worker's load.
    pub fn first_token(&self) {
        if self.router.kind == CostKind::Dynamo {
            self.router.lock()[self.worker].prefill_done(self.id);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.router.kind == CostKind::Dynamo {
            self.router.lock()[self.worker].finish(self.id);
        }
    }
}

impl CostRouter {
    /// A router over `addresses` (`IP:port`); `probes` are the servers' state handles in the same order (read by
    /// [`CostKind::Oracle`] only). `time_scale` converts wall time to simulated time for the index TTL.
    pub fn new(
        kind: CostKind,
        addresses: Vec<String>,
        probes: Vec<SimProbe>,
        block_tokens: usize,
        time_scale: f64,
    ) -> Self {
        Self {
            kind,
            history: Mutex::new(addresses.iter().map(|_| WorkerHistory::default()).collect()),
            addresses,
            probes,
            block_tokens: block_tokens.max(1),
            prefill_load_scale: DEFAULT_PREFILL_LOAD_SCALE,
            time_scale: time_scale.max(1e-9),
            start: Instant::now(),
            seq: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<WorkerHistory>> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each worker's view for a request with rendered prompt `prompt` (block hashes `hashes`).
    fn views(&self, prompt: &str, hashes: &[u64], now_ms: f64) -> Vec<WorkerView> {
        match self.kind {
            CostKind::Dynamo => self.lock().iter().map(|w| w.view(hashes, now_ms)).collect(),
            CostKind::Oracle | CostKind::OracleTtft => self
                .probes
                .iter()
                .map(|p| {
                    let t = p.truth(prompt);
                    WorkerView {
                        overlap_blocks: t.cached_blocks,
                        active_prefill_tokens: t.pending_prefill_tokens + t.waiting_prompt_tokens,
                        active_blocks: t.active_blocks,
                        // Cached blocks are shared with whoever holds them: the server pins them, it does not add them.
                        shared_active_blocks: t.cached_blocks,
                    }
                })
                .collect(),
        }
    }

    /// Picks the lowest-cost server for the request whose rendered prompt is `prompt` and starts tracking it.
    /// Returns the server's address and the request's ticket.
    pub fn route(&self, prompt: &str) -> (String, Ticket<'_>) {
        let id = self.seq.fetch_add(1, Ordering::Relaxed);
        let now_ms = self.start.elapsed().as_secs_f64() * 1000.0 / self.time_scale;
        let hashes = block_hashes(prompt.as_bytes(), self.block_tokens);
        let tokens = token_count(prompt.len());
        let views = self.views(prompt, &hashes, now_ms);
        let dw = self.kind.decode_weight();
        let costs: Vec<f64> =
            views.iter().map(|v| cost(self.prefill_load_scale, dw, tokens, self.block_tokens, v)).collect();
        let tiebreak = xxhash_rust::xxh3::xxh3_64(&id.to_le_bytes());
        let worker = lowest(&costs, tiebreak).expect("at least one server");
        if self.kind == CostKind::Dynamo {
            let mut h = self.lock();
            let v = h[worker].view(&hashes, now_ms);
            let new_tokens = tokens.saturating_sub(v.overlap_blocks as u64 * self.block_tokens as u64);
            h[worker].add(id, hashes, new_tokens, now_ms + APPROX_INDEX_TTL_S * 1000.0);
        }
        (self.addresses[worker].clone(), Ticket { router: self, worker, id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_counts_uncached_prefill_plus_queued_prefill_plus_decode_blocks() {
        // 160-token prompt = 10 blocks of 16; 4 cached; 32 tokens of other prefill queued; 5 blocks active.
        let w = WorkerView { overlap_blocks: 4, active_prefill_tokens: 32, active_blocks: 5, shared_active_blocks: 0 };
        // prefill (32 + 160 − 64) / 16 = 8 blocks; decode 5 + 10 = 15.
        assert_eq!(cost(1.0, 1.0, 160, 16, &w), 23.0);
        assert_eq!(cost(2.0, 1.0, 160, 16, &w), 31.0);
        assert_eq!(cost(1.0, 0.0, 160, 16, &w), 8.0, "the TTFT-only reference counts prefill work alone");
        // Overlap beyond the queued work never makes prefill negative.
        let all = WorkerView { overlap_blocks: 20, ..Default::default() };
        assert_eq!(cost(1.0, 1.0, 160, 16, &all), 10.0);
    }

    #[test]
    fn lowest_cost_wins_and_ties_spread() {
        assert_eq!(lowest(&[3.0, 1.0, 2.0], 0), Some(1));
        assert_eq!(lowest(&[1.0, 1.0, 5.0], 0), Some(0));
        assert_eq!(lowest(&[1.0, 1.0, 5.0], 1), Some(1));
        assert_eq!(lowest(&[], 0), None);
    }

    #[test]
    fn dynamo_follows_its_history_and_releases_load_on_first_token_and_end() {
        let addrs: Vec<String> = (0..2).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        let r = CostRouter::new(CostKind::Dynamo, addrs, vec![], 16, 1.0);
        let shared = warmpath_sim::tokens::filler_text(1, 640); // 40 blocks
        let (a, t1) = r.route(&format!("{shared}one"));
        t1.first_token();
        // `a` holds the 40 shared blocks and no prefill work: the same prefix goes there (cost 1/16 + 41 blocks
        // against 641/16 + 41 on the idle worker).
        let (b, t2) = r.route(&format!("{shared}two"));
        assert_eq!(a, b);
        {
            let h = r.lock();
            let w = h.iter().find(|w| !w.active.is_empty()).unwrap();
            assert_eq!(w.active.len(), 2);
            assert_eq!(w.active_prefill_tokens, 1, "the second request only owes its uncached tail");
            assert_eq!(w.active_blocks.len(), 40, "shared blocks are held once");
        }
        t2.first_token();
        assert_eq!(r.lock().iter().map(|w| w.active_prefill_tokens).sum::<u64>(), 0);
        drop(t1);
        drop(t2);
        let h = r.lock();
        assert!(h.iter().all(|w| w.active.is_empty() && w.active_prefill_tokens == 0 && w.active_blocks.is_empty()));
        assert!(h.iter().any(|w| w.routed.len() >= 40), "routed blocks stay in the approximate index");
    }

    #[test]
    fn dynamo_counts_a_cached_prefix_still_under_prefill_as_queued_work() {
        let addrs: Vec<String> = (0..2).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        let r = CostRouter::new(CostKind::Dynamo, addrs, vec![], 16, 1.0);
        let shared = warmpath_sim::tokens::filler_text(1, 640);
        let (a, _t1) = r.route(&format!("{shared}one"));
        // The first request has not produced a token: its 641 prefill tokens are still owed on `a`, which then
        // costs 642/16 + 41 against 641/16 + 41 on the idle worker.
        let (b, _t2) = r.route(&format!("{shared}two"));
        assert_ne!(a, b);
    }

    #[test]
    fn dynamo_sends_an_unrelated_prompt_to_the_idle_worker() {
        let addrs: Vec<String> = (0..2).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        let r = CostRouter::new(CostKind::Dynamo, addrs, vec![], 16, 1.0);
        let (a, _t1) = r.route(&warmpath_sim::tokens::filler_text(1, 640));
        let (b, _t2) = r.route(&warmpath_sim::tokens::filler_text(2, 640));
        assert_ne!(a, b, "the busy worker costs 40 prefill + 40 decode blocks more");
    }

    /// Two live simulated servers at real time with 1 ms of prefill per token, so a request's prefill can be
    /// watched while it runs.
    async fn two_servers() -> (Vec<warmpath_sim::SimServer>, CostRouter, CostRouter) {
        let cfg = warmpath_sim::SimConfig {
            latency: warmpath_sim::LatencyProfile {
                prefill_ms_per_token: 1.0,
                overhead_ms: 0.0,
                itl_ms: 1.0,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut servers = Vec::new();
        for _ in 0..2 {
            servers.push(warmpath_sim::SimServer::start(cfg.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap());
        }
        let addrs: Vec<String> = servers.iter().map(|s| s.addr().to_string()).collect();
        let probes = || servers.iter().map(|s| s.probe()).collect();
        let oracle = CostRouter::new(CostKind::Oracle, addrs.clone(), probes(), 16, 1.0);
        let ttft = CostRouter::new(CostKind::OracleTtft, addrs, probes(), 16, 1.0);
        (servers, oracle, ttft)
    }

    async fn complete(addr: &std::net::SocketAddr, prompt: &str) -> reqwest::Response {
        let body = serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 1});
        reqwest::Client::new().post(format!("http://{addr}/v1/completions")).json(&body).send().await.unwrap()
    }

    #[tokio::test]
    async fn oracles_follow_the_true_cache_and_avoid_the_true_queue() {
        let (servers, oracle, ttft) = two_servers().await;
        let shared = warmpath_sim::tokens::filler_text(3, 320); // 20 blocks
        complete(&servers[1].addr(), &shared).await.bytes().await.unwrap();
        let holder = servers[1].addr().to_string();
        // Idle fleet: both references go where the prefix truly is (no routing history involved).
        assert_eq!(oracle.route(&format!("{shared}a")).0, holder);
        assert_eq!(ttft.route(&format!("{shared}b")).0, holder);
        // A 1,000-token prefill now runs on the holder: it owes 1,000 tokens, more than the 321 this prompt
        // costs cold on the idle server, so the prefill-work reference goes to the idle one.
        let long = warmpath_sim::tokens::filler_text(4, 1000);
        let busy = tokio::spawn({
            let a = servers[1].addr();
            async move { complete(&a, &long).await.bytes().await.unwrap() }
        });
        let start = std::time::Instant::now();
        while servers[1].probe().truth("").pending_prefill_tokens == 0 {
            assert!(start.elapsed() < std::time::Duration::from_secs(5), "the long prefill never started");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(ttft.route(&format!("{shared}c")).0, servers[0].addr().to_string());
        busy.await.unwrap();
        for s in servers {
            s.stop().await;
        }
    }

    #[test]
    fn approximate_index_forgets_after_its_ttl() {
        let mut w = WorkerHistory::default();
        w.add(1, vec![10, 11, 12], 48, 1000.0);
        w.finish(1);
        assert_eq!(w.view(&[10, 11, 12, 13], 999.0).overlap_blocks, 3);
        assert_eq!(w.view(&[10, 11, 12, 13], 1000.0).overlap_blocks, 0);
        assert_eq!(w.view(&[9, 10, 11], 0.0).overlap_blocks, 0, "overlap is a run from the first block");
    }
}
