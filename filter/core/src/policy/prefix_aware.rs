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
//! (`routing-findings.md`: "key = prefix up to the first block not cached on most endpoints"), or the traffic
//! diverged below it at least [`BRANCH_FACTOR`]·N times (a system prompt followed by many different
//! conversations). Both are monotone along a chain (an ancestor is recorded whenever a descendant is), so the
//! common part and the longest match are each found by binary search over the chain.
//!
//! ## Decision
//! 1. Longest match `m`: the deepest full block present in the index (binary search), then the deepest
//!    checkpoint of block `m` present (probed from long to short).
//! 2. If the deepest matched node is not common, route to its most recent holder that the overload guard
//!    admits ([`Reason::PrefixMatch`]): a growing conversation keeps landing where its history is cached.
//!    A common match that covers the whole text (a repeated request) goes to a holder too, the first one in
//!    rendezvous order.
//! 3. Otherwise the key is the first non-common node: the common blocks, then the first checkpoint of the next
//!    block that is not common (else that whole block, else the whole tail). The endpoint is the rendezvous
//!    top for that key ([`Reason::ConsistentPick`]); every replica computes the same key once it has seen the
//!    shared prefix, and turn k+1 gets turn k's key as long as turn 1 reached that checkpoint.
//!    With `miss_choices` d ≥ 2 the top yields to the least-loaded of the key's next d − 1 rendezvous
//!    candidates when that one has at least `miss_load_margin` fewer requests in flight (ties to the
//!    higher-ranked one): still a function of (key, endpoint set, loads), so replicas that see the same loads
//!    agree, equal loads give the top candidate, and a key never leaves its d candidates while its top is
//!    admitted. The margin keeps small load differences from scattering a key: a later turn handled by a
//!    replica or Envoy worker whose index lacks the first turn falls back to the same key.
//! 4. Overload guard ([`LoadGuard`]): an endpoint at `concurrency_threshold` in-flight or above the bounded-load
//!    cap is skipped; the request goes to the next endpoint in rendezvous order, else the least-loaded one
//!    ([`Reason::Overflow`]).
//!
//! `on_routed` records the chain under the chosen endpoint.

use std::borrow::Cow;

use super::{PickInput, Policy};
use crate::config::Settings;
use crate::decision::{Decision, Reason};
use crate::endpoint::{Endpoint, EndpointLoad};
use crate::hrw;
use crate::index::{BlockInfo, PrefixIndex, MAX_HOLDERS};
use crate::load::{least_loaded, load_at, LoadGuard};
use crate::prefix::{checkpoint_hash, checkpoint_step, PrefixHashes};

/// A node is common when the traffic diverged below it at least `BRANCH_FACTOR × N` times (N endpoints).
pub const BRANCH_FACTOR: u16 = 2;

/// Message separator byte of the extracted text ([`crate::extract::MSG_SEP`]).
const SEPARATOR: u8 = 0x1e;

/// Most message-end checkpoints per block (bounds the hashing work on adversarial text full of separators).
pub const MAX_SEPARATOR_CHECKPOINTS: usize = 4;

/// Longest-prefix-match + consistent-hash policy owning the bounded prefix index.
pub struct PrefixAwarePolicy {
    block_size: usize,
    threshold: u32,
    load_factor: f64,
    /// Rendezvous candidates compared by load for a request without a useful match (`miss_choices`, ≥ 1).
    miss_choices: usize,
    /// In-flight difference needed to leave the rendezvous top on a miss (`miss_load_margin`, ≥ 1).
    miss_margin: u32,
    index: PrefixIndex,
    /// Endpoint ids of the last endpoint list seen, in order.
    ids: Vec<u32>,
    /// Position of each endpoint id in that list (`usize::MAX` = not present), indexed by id.
    pos_by_id: Vec<usize>,
    /// Common-block count of the last pick, keyed by (namespace, full blocks, last block hash), so `on_routed`
    /// right after `pick` does not search the index again.
    last_common: Option<((u64, usize, u64), usize)>,
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
    /// Hash of the deepest matched full block (for reporting matches of other choices).
    last_full: Option<u64>,
    /// Leading common full blocks.
    common_blocks: usize,
}

impl PrefixAwarePolicy {
    /// A policy with an empty index sized by `settings.index_capacity` blocks.
    pub fn new(settings: &Settings) -> PrefixAwarePolicy {
        PrefixAwarePolicy {
            block_size: settings.block_size,
            threshold: settings.concurrency_threshold,
            load_factor: settings.load_factor,
            miss_choices: settings.miss_choices.max(1),
            miss_margin: settings.miss_load_margin.max(1),
            index: PrefixIndex::new(settings.index_capacity),
            ids: Vec::new(),
            pos_by_id: Vec::new(),
            last_common: None,
        }
    }

    /// The prefix index (read-only; for metrics and tests).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    fn sync(&mut self, endpoints: &[Endpoint]) {
        if self.ids.len() == endpoints.len() && self.ids.iter().zip(endpoints).all(|(a, e)| *a == e.id) {
            return;
        }
        self.ids = endpoints.iter().map(|e| e.id).collect();
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
        Plan { matched_blocks: m, matched_len, deepest, useful, last_full, common_blocks: common }
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
            self.checkpoints(text, common).into_iter().map(|c| checkpoint_hash(ph.parent(common), &text[begin..begin + c])),
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

/// The endpoint for a request without a useful match, or `None` when the key's rendezvous top is not admitted
/// by the guard (the caller overflows along the rendezvous order, as with one choice). Otherwise the top,
/// unless one of the next `d` − 1 endpoints in rendezvous order is admitted and has at least `margin` fewer
/// requests in flight (effective load): then the least-loaded of those, ties to the better rendezvous rank.
/// With `d` = 1, or equal loads, this is the rendezvous top.
fn miss_choice(
    key: u64,
    d: usize,
    margin: u32,
    endpoints: &[Endpoint],
    loads: &[EndpointLoad],
    guard: &LoadGuard,
) -> Option<usize> {
    let load = |i| load_at(loads, i).effective();
    if d <= 1 {
        return hrw::top(key, endpoints).filter(|&i| guard.admits(loads, i));
    }
    let order = hrw::order(key, endpoints);
    let top = *order.first()?;
    if !guard.admits(loads, top) {
        return None;
    }
    // `min_by_key` keeps the first of equal minima, i.e. the better rendezvous rank.
    let best = order.into_iter().take(d).skip(1).filter(|&i| guard.admits(loads, i)).min_by_key(|&i| load(i));
    match best {
        Some(b) if load(b).saturating_add(margin) <= load(top) => Some(b),
        _ => Some(top),
    }
}

fn fingerprint(ph: &PrefixHashes) -> (u64, usize, u64) {
    (ph.namespace, ph.blocks.len(), ph.blocks.last().copied().unwrap_or(0))
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
        let n = endpoints.len();
        let guard = LoadGuard::new(self.threshold, self.load_factor, n, loads);
        let Some(key) = input.key.filter(|k| !k.text.is_empty()) else {
            let i = least_loaded(input.random, endpoints, loads)?;
            return Some(Decision::new(endpoints, i, Reason::LeastOutstanding));
        };
        let ph: Cow<PrefixHashes> = match input.prefix {
            Some(p) if p.block_size == self.block_size && p.namespace == key.namespace => Cow::Borrowed(p),
            _ => Cow::Owned(PrefixHashes::compute(key.namespace, &key.text, self.block_size)),
        };
        let plan = self.plan(&key.text, &ph);
        self.last_common = Some((fingerprint(&ph), plan.common_blocks));
        let blocks = plan.matched_blocks as u32;
        // Follow the match when it is useful, or when it covers the whole text (a repeat: any holder has it
        // all; holders are tried in rendezvous order so replicas agree).
        if let Some(h) = plan.deepest.filter(|_| plan.useful || plan.matched_len >= key.text.len()) {
            let mut holders: Vec<usize> = self
                .index
                .get(h)
                .map(|i| i.holders.iter().filter_map(|&id| self.pos(id)).collect())
                .unwrap_or_default();
            if !plan.useful {
                let key_hash = self.consistent_key(&key.text, &ph, plan.common_blocks);
                holders.sort_by_key(|&i| std::cmp::Reverse(hrw::score(key_hash, &endpoints[i])));
            }
            if let Some(&i) = holders.iter().find(|&&i| guard.admits(loads, i)) {
                return Some(Decision::new(endpoints, i, Reason::PrefixMatch).with_match(blocks, plan.matched_len));
            }
        }
        let report = |s: &Self, i: usize, reason| {
            let d = Decision::new(endpoints, i, reason);
            if s.holds(plan.deepest, i) {
                d.with_match(blocks, plan.matched_len)
            } else if s.holds(plan.last_full, i) {
                d.with_match(blocks, plan.matched_blocks * s.block_size)
            } else {
                d
            }
        };
        let key_hash = self.consistent_key(&key.text, &ph, plan.common_blocks);
        if !plan.useful {
            if let Some(i) = miss_choice(key_hash, self.miss_choices, self.miss_margin, endpoints, loads, &guard) {
                return Some(report(self, i, Reason::ConsistentPick));
            }
        }
        let next = hrw::order(key_hash, endpoints).into_iter().find(|&i| guard.admits(loads, i));
        let i = match next {
            Some(i) => i,
            None => least_loaded(key_hash, endpoints, loads)?,
        };
        Some(report(self, i, Reason::Overflow))
    }

    fn on_routed(&mut self, input: &PickInput, endpoints: &[Endpoint], decision: &Decision) {
        let Some(key) = input.key.filter(|k| !k.text.is_empty()) else { return };
        if decision.reason == Reason::FailOpen || decision.endpoint >= endpoints.len() {
            return;
        }
        self.sync(endpoints);
        let id = endpoints[decision.endpoint].id;
        let ph: Cow<PrefixHashes> = match input.prefix {
            Some(p) if p.block_size == self.block_size && p.namespace == key.namespace => Cow::Borrowed(p),
            _ => Cow::Owned(PrefixHashes::compute(key.namespace, &key.text, self.block_size)),
        };
        let common = match self.last_common.take() {
            Some((f, c)) if f == fingerprint(&ph) => c,
            _ => self.plan(&key.text, &ph).common_blocks,
        };
        let chain = self.chain(&key.text, &ph, common);
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

    fn on_endpoints_changed(&mut self, endpoints: &[Endpoint]) {
        self.sync(endpoints);
    }

    fn reconfigure(&mut self, settings: &Settings) -> bool {
        if settings.block_size != self.block_size {
            return false;
        }
        self.threshold = settings.concurrency_threshold;
        self.load_factor = settings.load_factor;
        self.miss_choices = settings.miss_choices.max(1);
        self.miss_margin = settings.miss_load_margin.max(1);
        if settings.index_capacity != self.index.capacity() {
            self.index.set_capacity(settings.index_capacity);
        }
        true
    }
}

#[cfg(test)]
#[path = "prefix_aware_tests.rs"]
mod tests;
