//! PREFIX_AWARE: longest prefix match against the bounded index, else a consistent (rendezvous) pick keyed on
//! the prefix up to where sharing ends, with an overload guard.
//!
//! ## The chain
//! A request's text is a chain of nodes: full blocks `b_0 .. b_{n-1}` (see [`crate::prefix`]), and inside one
//! block, checkpoints at every [`checkpoint_step`] bytes (quarter blocks) and right after each message
//! separator, hashed with [`checkpoint_hash`]. Checkpoints are only used at two places: the block where the
//! shared part ends (so the key can stop a quarter block or one message after the shared part instead of a
//! whole block), and the trailing partial block (so a later turn that extends this text finds it even when
//! turn 1 is shorter than a block: every chat turn ends with a separator, so its end is a checkpoint).
//!
//! ## Common prefixes
//! A node is *common* when it carries no placement information: it is held by at least half of the endpoints
//! (the key is the prefix up to the first block not cached on most endpoints: a block every endpoint holds says
//! nothing about where to go), or the traffic
//! diverged below it at least [`BRANCH_FACTOR`]·N times (a system prompt followed by many different
//! conversations). Both are monotone along a chain (an ancestor is recorded whenever a descendant is), so the
//! common part and the longest match are each found by binary search over the chain.
//!
//! ## Decision: lowest predicted time to first token
//! 1. Longest match `m`: the deepest full block present in the index (binary search), then the deepest
//!    checkpoint of block `m` present (probed from long to short).
//! 2. The key: the first non-common node (the common blocks, then the first checkpoint of the next block that is
//!    not common, else that whole block, else the whole tail). Every replica computes the same key once it has
//!    seen the shared prefix, and turn k+1 gets turn k's key as long as turn 1 reached that checkpoint.
//! 3. Candidates: the holders of the deepest matched node, the key's top [`RENDEZVOUS_CANDIDATES`] rendezvous
//!    endpoints, and the least-loaded endpoint (least waiting prefill work, then fewest requests outstanding; when
//!    an endpoint is told apart as slower, also the least loaded in time, step 4).
//!    These searches are the only per-endpoint work of a decision (no sort; `policy/scan.rs`): the rendezvous top is
//!    remembered per key until the endpoint list changes, the least-loaded search is one integer comparison per
//!    endpoint.
//! 4. For each candidate `e` the predicted time to first token, in bytes of prompt text to prefill before this
//!    request's first token:
//!
//!    `ttft(e) = waiting(e) + max(prompt − cached(e), 0) + MOVE_CHARGE × (most_cached − cached(e)) + new(e)`
//!
//!    where `most_cached` is the largest `cached` among the admitted candidates when the request is the next of one
//!    line of requests (its deepest matched node has at most [`LINE_CONTINUATIONS`] = 1 recorded continuation: a
//!    conversation's next turn, a repeated document, a file's next version whose edit replaced the tail recorded
//!    after the match), else 0. A move off the best-cached endpoint then computes that difference a second time, for
//!    a prefix only this line of requests reuses, on an endpoint whose next requests wait for it and whose cache
//!    gives up as much to the copy; so it is charged three times ([`MOVE_CHARGE`] = 2 beyond the request's own
//!    prefill), and a holder keeps such a request until its waiting work exceeds three times its cached advantage
//!    (charged twice it measured a longer chat tail, TTFT p90 166 vs 153 simulated ms, and a lower hit ratio on the
//!    Mooncake trace, 0.097 vs 0.104 at 4 × 32k, with TTFT otherwise equal; four times gained nothing more;
//!    BENCHMARKS.md §1). A match that ends where earlier traffic went on in two or more ways is a prefix several
//!    requests share (a system prompt, a template): a second copy of it is reused by the next of them, so it is not
//!    charged (charging it queued the first requests of a template behind its first holder: templated TTFT p99
//!    1,022 vs 490 ms). With one continuation a request cannot tell an edited text from a shared prefix's second
//!    user; it is charged, which keeps a file's edited versions on their holder (code: 16.4 whole-file misses a run
//!    against 17.8, 16 being the files' first requests) and costs nothing measurable elsewhere (docs/bench/replay.md
//!    §28). Requests with nothing cached anywhere are placed by `waiting + prompt` alone.
//!
//!    `new(e)` charges a request without a useful match (its text past the common part is new everywhere) the new part,
//!    `prompt − matched`, once more at a candidate the index lists as the holder of more than
//!    [`BOUND_NUM`]/[`BOUND_DEN`] times the mean share of its entries: the new prefix takes that much of the cache of
//!    an endpoint that already holds more than its share, where it evicts prefixes other requests come back for.
//!    Consistent hashing with bounded loads bounds the placement of every new key this way, not only ties (step 5).
//!    Without it a short prefix held only by the first endpoints to serve (a system prompt continued by a few
//!    documents, below [`BRANCH_FACTOR`]·N) made each new document cheaper there by its length: one rag run in twelve
//!    placed six documents on three of four servers and evicted some of them. Over 24 rag seeds TTFT p90 was 50.5 ± 1.9
//!    simulated ms without the charge (four runs 58.7–83.2) and 46.7 ± 0.1 with it (every run 45.6–48.2; BENCHMARKS.md
//!    §1). Charging the whole uncached work instead, the common part the holders reuse included, fixed rag as well and
//!    measured a Mooncake 4 × 32k hit ratio of 0.099 against 0.102 with this charge (one alternating pass,
//!    docs/bench/replay.md §27), a difference of one invocation's spread (±0.003, §28): the smaller charge is kept as
//!    the one that does what rag needs and no more. Queued work still decides beyond the charge: an idle endpoint over
//!    the bound wins over one within it whose queue is longer than the new part.
//!
//!    - `cached(e)`: the longest match of this request's chain that the index lists `e` as a holder of (the
//!      matched length for holders of the deepest node, else the deepest full block `e` holds, by binary search),
//!      and at least the part of the match the traffic diverged after at least [`BRANCH_FACTOR`]·N times: such a
//!      prefix (a shared system prompt) is continued by many different requests, so it becomes cached wherever
//!      one of them goes once; counting it only at its first holders would send all of its traffic there.
//!    - `prompt`: the extracted text's length, or the body's length when the key was cut at `prefix_length`.
//!      A candidate holding the whole cut key counts the whole prompt as cached: the index cannot see past the
//!      cut, and a prefix shared that far usually goes on (on the Mooncake trace a request matching an earlier
//!      one over its first 2,048 tokens shares 95 % of its prompt with it on average). The pending prefill
//!      charged for the request stays the part past what the index confirms.
//!    - `waiting(e)`: the prefill work sent to `e` that has not produced a first response byte
//!      ([`EndpointLoad::pending_prefill`]: this gateway's, drained at the pool's learned prefill speed once there
//!      is one, and the other gateways' as the feed last reported it, renewed every tick). The server's own
//!      queue from the feed (`waiting` requests, up to one poll old) is
//!      not added: turned into work (× the mean uncached work per request), whether taken when it said more or
//!      counted only beyond this gateway's own pending work, a report of an already drained queue moved requests
//!      off their holders (the Mooncake trace at one gateway: hit ratio 0.272 → 0.245 with the first), and
//!      neither closed the tail that partial knowledge costs several gateways; the gateways' own pending work,
//!      exact in bytes and a tick old, did (BENCHMARKS.md §1, gateway replicas). The server's counts join the
//!      outstanding count ([`EndpointLoad::effective`]).
//!
//!    This is the prefill part of NVIDIA Dynamo's KV router cost (`prefill_load_scale × max(active_prefill +
//!    prompt_blocks − overlap_blocks, 0) + decode_blocks`, Dynamo `docs/architecture/kv_cache_routing.md`) with
//!    scale 1: a first-come-first-served engine (vLLM's and SGLang's default schedulers) prefills what is queued
//!    before a new request, at a rate that is the same for every endpoint of one pool, so the rate cancels out of
//!    the comparison and no coefficient needs tuning. Where the fits of this Envoy's own requests tell an endpoint
//!    apart as slower than the fastest beyond their errors (a server of an older generation, or one sharing its
//!    accelerator; [`crate::prefill_rate::PrefillFits::slowdowns`]), the rate no longer cancels: that endpoint's
//!    prediction is multiplied by its time per byte relative to the fastest one's, and the endpoint with the least
//!    `(waiting + prompt)` in time joins the candidates. Endpoints the fits do not tell apart keep equal scales, so
//!    their ties, and the consistent pick, are kept. The decode term is left out: it needs the output length,
//!    which a gateway does not know, and under chunked prefill decode steps slow prefill by a factor that depends
//!    on the engine's batch budget; the hard cap below bounds it instead.
//! 5. Lowest prediction wins. Ties go in rendezvous order for the key, skipping a candidate the index already lists as
//!    the holder of more than [`BOUND_NUM`]/[`BOUND_DEN`] times the mean share of its entries (consistent hashing with
//!    bounded loads, Mirrokni, Thorup and Zadimoghaddam, SODA 2018). So with equal loads a request with a useful match
//!    goes to a holder, one without to the key's rendezvous top, or to its next top when the index has filled the first
//!    past the bound — the consistent pick every replica computes from the same index. Beyond ties the bound enters
//!    only as the charge `new(e)` of step 4. On ties: a first request of a prefix is a miss everywhere, and without the
//!    bound equal predictions followed rendezvous scores alone, which left one endpoint with the first requests of
//!    seven of the code workload's sixteen files (more than its cache holds) and measured a worse tail (code TTFT p90
//!    106.1 vs 102.6 simulated ms, chat 156.5 vs 151.4, means of 3 in one alternating pass; docs/bench/replay.md §23).
//!    A text too short to record keeps its plain rendezvous pick. A candidate at `concurrency_threshold` (counting the
//!    server's own waiting and running requests when the feed reports them, [`EndpointLoad::effective`]) is never
//!    chosen; when every candidate is, the least-loaded endpoint under the cap is. When every endpoint is at the
//!    cap, the cap holds on this gateway's own in-flight counts alone, and when those too are at it everywhere, it is
//!    lifted; the candidates are compared by predicted time to first token as usual.
//!
//! The chosen endpoint's chain is recorded in the index in the same call.

use std::borrow::Cow;

use super::scan::{least_admitted, least_admitted_and_in_time, TopCache};
use super::{PickInput, Policy};
use crate::config::Settings;
use crate::decision::{Decision, Reason};
use crate::endpoint::{Endpoint, EndpointLoad};
use crate::hrw;
use crate::index::{BlockInfo, PrefixIndex, MAX_HOLDERS};
use crate::load::{least_loaded, load_at, LoadGuard};
use crate::prefill_rate::in_time;
use crate::prefix::{checkpoint_hash, checkpoint_step, PrefixHashes};
use crate::RequestKey;

/// A node is common when the traffic diverged below it at least `BRANCH_FACTOR × N` times (N endpoints).
pub const BRANCH_FACTOR: u16 = 2;

/// Bounded-load factor, `BOUND_NUM / BOUND_DEN` = 1.25 (consistent hashing with bounded loads, Mirrokni, Thorup and
/// Zadimoghaddam, SODA 2018; 1.25 is the default of brpc's bounded-load balancer and the factor of Vimeo's HAProxy
/// deployment): an endpoint the index lists as the holder of more than 1.25 × the mean share of its entries loses a
/// tie to one that is not, and a new prefix's new part is charged there twice (module docs, steps 4 and 5). Only
/// measured against no bound (BENCHMARKS.md §1), not tuned.
const BOUND_NUM: u64 = 5;
/// Denominator of the bounded-load factor ([`BOUND_NUM`]).
const BOUND_DEN: u64 = 4;

/// Extra times the work a move redoes is charged, beyond this request's own prefill of it (module docs, step 4):
/// the requests that queue behind it at the new endpoint wait for it, and the copy it leaves takes as much of that
/// endpoint's cache, full in steady state, from prefixes other requests would have reused. Measured against 1 and
/// 3 on every workload (BENCHMARKS.md §1).
const MOVE_CHARGE: u64 = 2;

/// Most recorded continuations of a request's deepest matched node for the request to count as the next of one line
/// of requests, charged [`MOVE_CHARGE`] for moving (module docs, step 4): one, the text the request replaces. A
/// file's next version after an edit near its end goes on from where the previous version went on differently;
/// charging only whole-text continuations (none allowed) spread such requests by load like a shared prefix's, and on
/// the code workload over twelve seeds they were 18 of the 23 whole-file misses SGLang-style's placement did not have
/// (docs/bench/replay.md §28). Two continuations are the least evidence of a prefix several requests share.
const LINE_CONTINUATIONS: u16 = 1;

/// Message separator byte of the extracted text ([`crate::extract::MSG_SEP`]).
const SEPARATOR: u8 = 0x1e;

/// Most message-end checkpoints per block (bounds the hashing work on adversarial text full of separators).
pub const MAX_SEPARATOR_CHECKPOINTS: usize = 4;

pub use super::scan::RENDEZVOUS_CANDIDATES;

/// Longest-prefix-match + consistent-hash policy owning the bounded prefix index.
pub struct PrefixAwarePolicy {
    block_size: usize,
    threshold: u32,
    index: PrefixIndex,
    /// Endpoint ids of the last endpoint list seen, in order.
    ids: Vec<u32>,
    /// [`hrw::address_hash`] of each endpoint of that list, in order.
    addr_hashes: Vec<u64>,
    /// Position of each endpoint id in that list (`usize::MAX` = not present), indexed by id.
    pos_by_id: Vec<usize>,
    /// The chain the last pick recorded ([`Policy::last_recorded`]).
    last_chain: Vec<u64>,
    /// Rendezvous tops of recent keys over that list (cleared when it changes).
    tops: TopCache,
}

/// One candidate endpoint of a decision.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    pos: usize,
    /// Predicted prefill work before this request's first token, bytes.
    ttft: u64,
    /// `ttft` without the charge for new work on an endpoint over the bound (the prediction rendezvous ties
    /// compare).
    base: u64,
    /// The index lists the endpoint as a holder more than [`BOUND_NUM`]/[`BOUND_DEN`] times the mean over the
    /// endpoints (ties go first to a candidate that is not; a request without a useful match is charged its new part
    /// twice there).
    over: bool,
    /// Rendezvous score for the request's key (then ties go to the higher).
    score: u64,
    /// Bytes of this request's text the index expects cached there.
    cached: usize,
}

/// What the index says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    /// Full blocks matched (longest match).
    matched_blocks: usize,
    /// Bytes matched: full blocks plus a matched checkpoint.
    matched_len: usize,
    /// Deepest matched node (a full block or a checkpoint).
    deepest: Option<u64>,
    /// The deepest matched node is not common: its holders are the placement.
    useful: bool,
    /// Leading common full blocks.
    common_blocks: usize,
    /// Bytes of the match that many requests diverged after (see [`BRANCH_FACTOR`]): counted as cached at every
    /// endpoint.
    shared_len: usize,
    /// The request records at least one node: the load bound applies to its ties (a text too short to record
    /// adds nothing to what the index places anywhere, so it keeps its plain rendezvous pick).
    records: bool,
}

impl PrefixAwarePolicy {
    /// A policy with an empty index sized by `settings.index_capacity` blocks.
    pub fn new(settings: &Settings) -> PrefixAwarePolicy {
        PrefixAwarePolicy {
            block_size: settings.block_size,
            threshold: settings.concurrency_threshold,
            index: PrefixIndex::new(settings.index_capacity),
            ids: Vec::new(),
            addr_hashes: Vec::new(),
            pos_by_id: Vec::new(),
            last_chain: Vec::new(),
            tops: TopCache::default(),
        }
    }

    /// The prefix index (read-only; for metrics and tests).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Adopts `endpoints` as the current list. Per request (from `pick`) only the length and the ends are compared,
    /// so the check stays O(1); a change of the list is announced by [`Policy::on_endpoints_changed`], which
    /// compares everything.
    fn sync(&mut self, endpoints: &[Endpoint]) {
        let ends = |ids: &[u32]| (ids.first().copied(), ids.last().copied());
        if self.ids.len() == endpoints.len()
            && ends(&self.ids) == (endpoints.first().map(|e| e.id), endpoints.last().map(|e| e.id))
        {
            return;
        }
        self.sync_all(endpoints);
    }

    fn sync_all(&mut self, endpoints: &[Endpoint]) {
        if self.ids.len() == endpoints.len() && self.ids.iter().zip(endpoints).all(|(a, e)| *a == e.id) {
            return;
        }
        self.ids = endpoints.iter().map(|e| e.id).collect();
        self.tops.clear();
        self.addr_hashes = endpoints.iter().map(hrw::address_hash).collect();
        self.pos_by_id.iter_mut().for_each(|p| *p = usize::MAX);
        for (i, e) in endpoints.iter().enumerate() {
            let id = e.id as usize;
            if id >= self.pos_by_id.len() {
                self.pos_by_id.resize(id + 1, usize::MAX);
            }
            self.pos_by_id[id] = i;
        }
    }

    fn pos(&self, id: u32) -> Option<usize> {
        self.pos_by_id.get(id as usize).copied().filter(|&p| p != usize::MAX)
    }

    fn active_holders(&self, info: &BlockInfo) -> usize {
        info.holders.iter().filter(|&&h| self.pos(h).is_some()).count()
    }

    fn present(&self, hash: u64) -> bool {
        self.index.get(hash).is_some_and(|i| self.active_holders(&i) > 0)
    }

    /// True when the traffic diverged below `hash` at least `BRANCH_FACTOR × N` times.
    fn is_branching(&self, hash: u64) -> bool {
        let need_branches = (self.ids.len() as u16).saturating_mul(BRANCH_FACTOR).max(2);
        self.index.get(hash).is_some_and(|i| i.branches >= need_branches)
    }

    fn is_common(&self, hash: u64) -> bool {
        let n = self.ids.len();
        let need_holders = (n / 2 + 1).clamp(2, MAX_HOLDERS);
        let need_branches = (n as u16).saturating_mul(BRANCH_FACTOR).max(2);
        self.index.get(hash).is_some_and(|i| i.branches >= need_branches || self.active_holders(&i) >= need_holders)
    }

    /// Largest `k` in `0..=hi` such that `pred(blocks[k-1])` holds, assuming `pred` holds on a prefix.
    fn search(&self, blocks: &[u64], hi: usize, pred: impl Fn(&Self, u64) -> bool) -> usize {
        let (mut lo, mut hi) = (0usize, hi);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if pred(self, blocks[mid - 1]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Checkpoint lengths inside block `i`, ascending: every quarter block, plus the position right after each
    /// message separator (U+001E, at most [`MAX_SEPARATOR_CHECKPOINTS`] per block, the last ones), so a text that
    /// ends with a message (every chat turn does) has a checkpoint exactly at its end. All are shorter than a
    /// block and no longer than the bytes available in block `i`.
    fn checkpoints(&self, text: &[u8], i: usize) -> Vec<usize> {
        let bs = self.block_size;
        let step = checkpoint_step(bs);
        let begin = (i * bs).min(text.len());
        let avail = (text.len() - begin).min(bs);
        let mut out: Vec<usize> = (1..=avail / step).map(|k| k * step).filter(|&c| c < bs).collect();
        let seps = text[begin..begin + avail]
            .iter()
            .enumerate()
            .rev()
            .filter(|&(_, &b)| b == SEPARATOR)
            .map(|(j, _)| j + 1)
            .filter(|&c| c < bs)
            .take(MAX_SEPARATOR_CHECKPOINTS);
        out.extend(seps);
        out.sort_unstable();
        out.dedup();
        out
    }

    fn plan(&self, text: &[u8], ph: &PrefixHashes) -> Plan {
        let bs = self.block_size;
        let blocks = &ph.blocks;
        let nb = blocks.len();
        let m = self.search(blocks, nb, |s, h| s.present(h));
        let common = self.search(blocks, m, |s, h| s.is_common(h));
        // Deepest present checkpoint inside block m.
        let start = m * bs;
        let partial = self
            .checkpoints(text, m)
            .into_iter()
            .rev()
            .map(|c| (c, checkpoint_hash(ph.parent(m), &text[start..start + c])))
            .find(|&(_, h)| self.present(h));
        let last_full = m.checked_sub(1).map(|i| blocks[i]);
        let (deepest, matched_len) = match partial {
            Some((c, h)) => (Some(h), start + c),
            None => (last_full, start),
        };
        let useful = match partial {
            Some((_, h)) => !self.is_common(h) || m > common,
            None => m > common,
        };
        let (deepest, matched_len) = match partial {
            // A common checkpoint below a useful full-block match adds nothing: report the block.
            Some((_, h)) if self.is_common(h) && m > common => (last_full, start),
            _ => (deepest, matched_len),
        };
        // The branching part of the match (a subset of the common part; both are prefixes of the chain).
        let branching = self.search(blocks, common, |s, h| s.is_branching(h));
        let shared_len = match partial {
            Some((c, h)) if branching == m && self.is_branching(h) => start + c,
            _ => branching * bs,
        };
        Plan { matched_blocks: m, matched_len, deepest, useful, common_blocks: common, shared_len, records: false }
    }

    /// Rendezvous key: the first non-common node after the `common` leading blocks (see the module docs).
    fn consistent_key(&self, text: &[u8], ph: &PrefixHashes, common: usize) -> u64 {
        let bs = self.block_size;
        let nb = ph.blocks.len();
        let s = common;
        if s == nb && ph.tail_len() == 0 {
            return ph.blocks.last().copied().unwrap_or(ph.namespace);
        }
        let begin = s * bs;
        let first_new = self
            .checkpoints(text, s)
            .into_iter()
            .map(|c| checkpoint_hash(ph.parent(s), &text[begin..begin + c]))
            .find(|&h| !self.is_common(h));
        match first_new {
            Some(h) => h,
            None if s < nb => ph.blocks[s],
            None => checkpoint_hash(ph.parent(s), &text[begin..]),
        }
    }

    /// The chain recorded for a request: common blocks, checkpoints of the next block, the remaining blocks,
    /// and the largest checkpoint of the trailing partial block.
    fn chain(&self, text: &[u8], ph: &PrefixHashes, common: usize) -> Vec<u64> {
        let bs = self.block_size;
        let nb = ph.blocks.len();
        let mut chain = Vec::with_capacity(nb + 5);
        chain.extend_from_slice(&ph.blocks[..common]);
        let begin = common * bs;
        chain.extend(
            self.checkpoints(text, common)
                .into_iter()
                .map(|c| checkpoint_hash(ph.parent(common), &text[begin..begin + c])),
        );
        if common < nb {
            chain.extend_from_slice(&ph.blocks[common..]);
            if let Some(&c) = self.checkpoints(text, nb).last() {
                chain.push(checkpoint_hash(ph.parent(nb), &text[nb * bs..nb * bs + c]));
            }
        }
        chain
    }

    fn holds(&self, hash: Option<u64>, pos: usize) -> bool {
        let Some(h) = hash else { return false };
        self.index.get(h).is_some_and(|i| i.holders.iter().any(|&id| self.pos(id) == Some(pos)))
    }
}

impl PrefixAwarePolicy {
    /// Bytes of `chain` the index expects cached at endpoint `pos`: `matched_len` for a holder of the deepest
    /// matched node, else the deepest full block (of the `plan.matched_blocks` present) it holds. Holders are
    /// recorded along whole chains, so "holds block k" holds on a prefix of the blocks and a binary search finds
    /// the deepest. The branching part of the match counts as cached everywhere (see the module docs).
    fn cached_at(&self, plan: &Plan, blocks: &[u64], pos: usize) -> usize {
        if self.holds(plan.deepest, pos) {
            return plan.matched_len.max(plan.shared_len);
        }
        let k = self.search(blocks, plan.matched_blocks, |s, h| s.holds(Some(h), pos));
        (k * self.block_size).max(plan.shared_len)
    }

    /// Records `chain` under endpoint `id`, counting divergences (see [`BRANCH_FACTOR`]).
    fn record(&mut self, chain: &[u64], id: u32) {
        let pos_by_id = std::mem::take(&mut self.pos_by_id);
        let active = |h: u32| pos_by_id.get(h as usize).is_some_and(|&p| p != usize::MAX);
        let mut diverged = false;
        for (i, &h) in chain.iter().enumerate() {
            let new = self.index.record(h, id, active);
            if new && i > 0 {
                let siblings = self.index.add_child(chain[i - 1]);
                // Only the first new node of a request can be a divergence; later ones extend it.
                if siblings >= 2 && !diverged {
                    diverged = true;
                    for &a in &chain[..i] {
                        self.index.add_branch(a);
                    }
                }
            }
        }
        self.pos_by_id = pos_by_id;
    }

    /// The index lists endpoint `pos` as a holder more than [`BOUND_NUM`]/[`BOUND_DEN`] times the mean over the
    /// endpoints: it loses ties to candidates that are within the bound.
    fn over_bound(&self, pos: usize) -> bool {
        u64::from(self.index.held(self.ids[pos])) * self.ids.len() as u64 * BOUND_DEN
            > self.index.total_held() * BOUND_NUM
    }

    /// `best` is the key's first rendezvous top within the bound: every top ranked above it was a candidate with
    /// the same prediction over the bound (the bounded-load consistent pick every replica with the same index
    /// computes).
    fn is_bounded_top(&self, top: &[usize], candidates: &[Candidate], best: &Candidate) -> bool {
        for &t in top.iter().filter(|&&t| t != usize::MAX) {
            if t == best.pos {
                return true;
            }
            if !candidates.iter().any(|c| c.pos == t && c.over && c.base == best.base) {
                return false;
            }
        }
        false
    }

    /// The decision for a request with text (steps 1–5 of the module docs), without recording it.
    fn decide(
        &mut self,
        key: &RequestKey,
        ph: &PrefixHashes,
        plan: &Plan,
        input: &PickInput,
        endpoints: &[Endpoint],
        loads: &[EndpointLoad],
    ) -> Decision {
        let mut guard = LoadGuard::new(self.threshold);
        let key_hash = self.consistent_key(&key.text, ph, plan.common_blocks);
        let kf = hrw::key_factor(key_hash);
        let prompt = if key.truncated { key.text.len().max(input.body_len) } else { key.text.len() };
        let top = self.tops.top(kf, &self.addr_hashes);
        let score = |i: usize| hrw::score_hashed(kf, self.addr_hashes[i]);
        let n = self.addr_hashes.len();
        // With endpoints told apart as slower, the least-loaded endpoint in time for a miss too, when it is another
        // than the least in bytes.
        let search = |loads: &[EndpointLoad], guard: LoadGuard| {
            if input.slowdowns.is_empty() {
                (least_admitted(loads, n, guard, &top, score), None)
            } else {
                least_admitted_and_in_time(loads, n, guard, &top, score, input.slowdowns, prompt as u64)
            }
        };
        let (mut least, mut least_timed) = search(loads, guard);
        // When the guard refuses every endpoint, the cap cannot choose. The servers' reports alone can do that: a
        // busy vLLM fleet runs more requests at once than the cap all the time. The cap then holds on this
        // gateway's own requests (exact, where the reports are up to a poll old), and when those reach it
        // everywhere too, it is lifted. Either way the candidates are compared by predicted time to first token
        // as usual, so the request still goes where its prefix is unless its queue there is longer. Before, the
        // endpoint reporting the fewest requests took every request until the next report.
        let own: Vec<EndpointLoad>;
        let mut admitting = loads;
        if least.is_none() {
            own = loads.iter().map(|l| EndpointLoad { server: None, ..*l }).collect();
            admitting = &own;
            (least, least_timed) = search(admitting, guard);
            if least.is_none() {
                guard = LoadGuard::new(u32::MAX);
                (least, least_timed) = search(admitting, guard);
            }
        }
        let mut cands: Vec<usize> = Vec::with_capacity(MAX_HOLDERS + RENDEZVOUS_CANDIDATES + 2);
        if let Some(info) = plan.deepest.and_then(|h| self.index.get(h)) {
            cands.extend(info.holders.iter().filter_map(|&id| self.pos(id)));
        }
        cands.extend(top.iter().copied().filter(|&t| t != usize::MAX));
        cands.extend(least);
        cands.extend(least_timed);
        // Work in time: the same bytes take longer on an endpoint told apart as slower (step 4).
        let timed = |work: u64, i: usize| in_time(work, input.slowdowns.get(i).copied().unwrap_or(0));
        cands.sort_unstable();
        cands.dedup();
        let scored: Vec<(usize, usize)> = cands
            .iter()
            .filter(|&&i| guard.admits(admitting, i))
            .map(|&i| {
                let cached = self.cached_at(plan, &ph.blocks, i);
                // A key cut at `prefix_length` and held whole: the index cannot see past the cut, and a prefix
                // shared that far (a conversation's history, a long document) usually goes on being shared.
                let cached = if key.truncated && cached >= key.text.len() { prompt } else { cached.min(prompt) };
                (i, cached)
            })
            .collect();
        // The charge for moving applies when this request continues one line of requests: its deepest matched
        // node has at most one recorded continuation (a conversation's next turn, a repeated document, a file's
        // next version whose edited tail replaces the one recorded). A move then duplicates a prefix that only this
        // line reuses. A match that ends where earlier traffic already went on in two or more ways is a prefix
        // several requests share: a second copy of it is reused by the next of them, so it is spread by load like
        // a miss.
        let continues = plan.deepest.and_then(|h| self.index.get(h)).is_some_and(|i| i.children <= LINE_CONTINUATIONS);
        let most_cached = if continues { scored.iter().map(|&(_, c)| c).max().unwrap_or(0) } else { 0 };
        // The part of a request without a useful match that is new everywhere: charged once more over the bound.
        let new_part = if plan.useful { 0 } else { prompt.saturating_sub(plan.matched_len) as u64 };
        let candidates: Vec<Candidate> = scored
            .iter()
            .map(|&(i, cached)| {
                let waiting = u64::from(load_at(loads, i).pending_prefill);
                let redo = most_cached.saturating_sub(cached) as u64;
                let over = plan.records && self.over_bound(i);
                let fresh = if over { new_part } else { 0 };
                let base = waiting + (prompt - cached) as u64 + MOVE_CHARGE * redo;
                Candidate { pos: i, ttft: timed(base + fresh, i), base: timed(base, i), over, score: score(i), cached }
            })
            .collect();
        let best = candidates
            .iter()
            .min_by(|a, b| a.ttft.cmp(&b.ttft).then(a.over.cmp(&b.over)).then_with(|| b.score.cmp(&a.score)))
            .copied()
            .expect("endpoints are not empty and the guard admits the least-loaded one");
        let holds_match = best.cached > 0 && self.holds(plan.deepest, best.pos);
        let reason = if holds_match && (plan.useful || plan.matched_len >= key.text.len()) {
            Reason::PrefixMatch
        } else if !plan.useful && self.is_bounded_top(&top, &candidates, &best) {
            Reason::ConsistentPick
        } else {
            Reason::Overflow
        };
        // The work charged to the chosen endpoint (its pending prefill, seen by the next requests) is the part past
        // what the index confirms, without the whole-prompt credit: charging the credited estimate (nothing for a
        // request whose cut key is held) measured worse tails on every workload with long prompts (rag TTFT p99
        // 1,254 vs 897 ms, Mooncake 4 x 32k 6,179 vs 4,004), as holders then look idle while their queue grows.
        let cached = best.cached.min(key.text.len());
        let uncached = prompt.saturating_sub(cached);
        let mut d = Decision::new(endpoints, best.pos, reason)
            .with_match((cached / self.block_size).min(plan.matched_blocks) as u32, cached);
        d.prefill_bytes = u32::try_from(uncached).unwrap_or(u32::MAX);
        d
    }
}

impl Policy for PrefixAwarePolicy {
    fn name(&self) -> &'static str {
        "PREFIX_AWARE"
    }

    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        if endpoints.is_empty() {
            return None;
        }
        self.sync(endpoints);
        self.last_chain.clear();
        let Some(key) = input.key.filter(|k| !k.text.is_empty()) else {
            let i = least_loaded(input.random, endpoints, loads)?;
            return Some(Decision::new(endpoints, i, Reason::LeastOutstanding));
        };
        let ph: Cow<PrefixHashes> = match input.prefix {
            Some(p) if p.block_size == self.block_size && p.namespace == key.namespace => Cow::Borrowed(p),
            _ => Cow::Owned(PrefixHashes::compute(key.namespace, &key.text, self.block_size)),
        };
        let mut plan = self.plan(&key.text, &ph);
        let chain = self.chain(&key.text, &ph, plan.common_blocks);
        plan.records = !chain.is_empty();
        let decision = self.decide(key, &ph, &plan, input, endpoints, loads);
        self.record(&chain, endpoints[decision.endpoint].id);
        self.last_chain = chain;
        Some(decision)
    }

    fn last_recorded(&self) -> &[u64] {
        &self.last_chain
    }

    fn learn(&mut self, chain: &[u64], id: u32) {
        if self.pos(id).is_some() {
            self.record(chain, id);
        }
    }

    fn on_endpoints_changed(&mut self, endpoints: &[Endpoint]) {
        self.sync_all(endpoints);
    }

    fn reconfigure(&mut self, settings: &Settings) -> bool {
        if settings.block_size != self.block_size {
            return false;
        }
        self.threshold = settings.concurrency_threshold;
        if settings.index_capacity != self.index.capacity() {
            self.index.set_capacity(settings.index_capacity);
        }
        true
    }
}

#[cfg(test)]
#[path = "prefix_aware_tests.rs"]
mod tests;
