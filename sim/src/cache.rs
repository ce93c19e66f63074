//! A vLLM-style automatic prefix cache (APC) model, counted in token blocks.
//!
//! Modelled on vLLM's v1 KV-cache manager (`vllm/v1/core/kv_cache_manager.py`, `block_pool.py`; design doc
//! "Automatic Prefix Caching"):
//! - the KV cache is `capacity` blocks of `block_tokens` tokens (vLLM default block size 16);
//! - a block is identified by the hash of its tokens **chained** with the previous block's hash, so a request hits
//!   only the longest run of cached blocks from the start of its prompt;
//! - only full blocks are cached, and at least one prompt token is always recomputed (a fully cached prompt hits
//!   `prompt_tokens - 1` tokens rounded down to a block);
//! - blocks referenced by running requests are pinned; unreferenced blocks stay cached and are evicted
//!   least-recently-used first, and a request's blocks are freed tail-first so its tail is evicted before its head;
//! - a block becomes hittable only after its prefill finished ([`PrefixCache::mark_ready`]); a concurrent request for
//!   the same prefix shares the block but recomputes it, as in vLLM where blocks are cached once computed.
//!
//! When every block is pinned the remaining blocks of a request are simply not cached (vLLM would preempt);
//! [`CacheStats::uncacheable_blocks`] counts them.

use std::collections::{BTreeMap, HashMap};

/// One cached block: reference count, whether its KV is computed, and its slot in the free LRU when unreferenced.
#[derive(Debug)]
struct Block {
    refs: u32,
    ready: bool,
    free_tick: Option<u64>,
}

/// Blocks a request pinned on admission, and how many of its leading blocks were cache hits.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Block hashes pinned by this request (prompt blocks first, then generated-output blocks), in sequence order.
    pub blocks: Vec<u64>,
    /// Leading blocks that were already computed: the prefix-cache hit, in blocks.
    pub hit_blocks: usize,
}

/// Counters since the cache was created. Tokens are simulated tokens (see [`crate::tokens`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompt tokens looked up (vLLM `prefix_cache_queries`).
    pub query_tokens: u64,
    /// Prompt tokens served from cache (vLLM `prefix_cache_hits`).
    pub hit_tokens: u64,
    /// Blocks evicted from the free LRU to make room.
    pub evicted_blocks: u64,
    /// Blocks that could not be cached because every block was pinned.
    pub uncacheable_blocks: u64,
}

/// The prefix cache of one simulated server. Not thread-safe by itself; the server wraps it in a mutex.
#[derive(Debug)]
pub struct PrefixCache {
    block_tokens: usize,
    capacity: usize,
    blocks: HashMap<u64, Block>,
    /// Unreferenced blocks by free order (smallest tick = evicted first).
    free_lru: BTreeMap<u64, u64>,
    tick: u64,
    pinned: usize,
    stats: CacheStats,
}

impl PrefixCache {
    /// A cache of `capacity` blocks of `block_tokens` tokens each. Both are clamped to at least 1.
    pub fn new(capacity: usize, block_tokens: usize) -> Self {
        Self {
            block_tokens: block_tokens.max(1),
            capacity: capacity.max(1),
            blocks: HashMap::new(),
            free_lru: BTreeMap::new(),
            tick: 0,
            pinned: 0,
            stats: CacheStats::default(),
        }
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counters since creation.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Blocks currently held (pinned or free-but-cached).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when no block is cached.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks pinned by running requests.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    /// Fraction of blocks pinned by running requests, 0.0–1.0 (vLLM `kv_cache_usage_perc`, which counts cached but
    /// unreferenced blocks as free).
    pub fn usage(&self) -> f64 {
        self.pinned as f64 / self.capacity as f64
    }

    /// Leading computed blocks of `hashes`, without side effects.
    pub fn peek_hit_blocks(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.blocks.get(h).is_some_and(|b| b.ready)).count()
    }

    /// Blocks a request with `prompt_tokens` tokens and full-block hashes `hashes` would hit now: the leading
    /// computed ones, capped so at least one prompt token is recomputed. Changes nothing.
    pub fn hit_blocks(&self, hashes: &[u64], prompt_tokens: u64) -> usize {
        let max_hit = (prompt_tokens.saturating_sub(1) as usize) / self.block_tokens;
        self.peek_hit_blocks(hashes).min(max_hit)
    }

    /// Prompt tokens such a request would find cached now ([`Self::hit_blocks`] in tokens). Changes nothing.
    pub fn hit_tokens(&self, hashes: &[u64], prompt_tokens: u64) -> u64 {
        ((self.hit_blocks(hashes, prompt_tokens) * self.block_tokens) as u64).min(prompt_tokens)
    }

    /// Admits a request whose prompt has `prompt_tokens` tokens and full-block hashes `hashes`: computes the hit
    /// (capped so at least one token is recomputed), pins every block it can, evicting free blocks LRU-first, and
    /// updates the query/hit counters. Returns the allocation to pass to [`Self::release`].
    pub fn admit(&mut self, hashes: &[u64], prompt_tokens: u64) -> Allocation {
        let hit_blocks = self.hit_blocks(hashes, prompt_tokens);
        self.stats.query_tokens += prompt_tokens;
        self.stats.hit_tokens += (hit_blocks * self.block_tokens) as u64;
        let mut alloc = Allocation { blocks: Vec::with_capacity(hashes.len()), hit_blocks };
        self.pin_more(&mut alloc, hashes);
        alloc
    }

    /// Pins further blocks for a running request (its generated output), in order; stops at the first block
    /// that cannot be cached because every block is pinned.
    pub fn pin_more(&mut self, alloc: &mut Allocation, hashes: &[u64]) {
        for (i, &h) in hashes.iter().enumerate() {
            if !self.pin(h) {
                self.stats.uncacheable_blocks += (hashes.len() - i) as u64;
                break;
            }
            alloc.blocks.push(h);
        }
    }

    fn pin(&mut self, h: u64) -> bool {
        if let Some(b) = self.blocks.get_mut(&h) {
            if b.refs == 0 {
                self.pinned += 1;
                if let Some(t) = b.free_tick.take() {
                    self.free_lru.remove(&t);
                }
            }
            b.refs += 1;
            return true;
        }
        if self.blocks.len() >= self.capacity {
            let Some((_, victim)) = self.free_lru.pop_first() else {
                return false;
            };
            self.blocks.remove(&victim);
            self.stats.evicted_blocks += 1;
        }
        self.blocks.insert(h, Block { refs: 1, ready: false, free_tick: None });
        self.pinned += 1;
        true
    }

    /// Marks blocks as computed (their prefill or decode finished), making them hittable.
    pub fn mark_ready(&mut self, hashes: &[u64]) {
        for h in hashes {
            if let Some(b) = self.blocks.get_mut(h) {
                b.ready = true;
            }
        }
    }

    /// Releases a finished (or aborted) request's blocks, tail first, so the tail of a sequence is evicted before
    /// its head. Computed blocks stay cached in the free LRU; never-computed blocks are dropped.
    pub fn release(&mut self, alloc: Allocation) {
        for h in alloc.blocks.into_iter().rev() {
            let Some(b) = self.blocks.get_mut(&h) else { continue };
            b.refs = b.refs.saturating_sub(1);
            if b.refs > 0 {
                continue;
            }
            self.pinned -= 1;
            if b.ready {
                self.tick += 1;
                b.free_tick = Some(self.tick);
                self.free_lru.insert(self.tick, h);
            } else {
                self.blocks.remove(&h);
            }
        }
    }

    /// Offline use (pooled-cache bound, unit tests): admit, compute and release a request at once.
    /// Returns the hit in tokens.
    pub fn serve_instantly(&mut self, hashes: &[u64], prompt_tokens: u64) -> u64 {
        let alloc = self.admit(hashes, prompt_tokens);
        let hit = (alloc.hit_blocks * self.block_tokens) as u64;
        self.mark_ready(&alloc.blocks);
        self.release(alloc);
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(range: std::ops::Range<u64>) -> Vec<u64> {
        range.collect()
    }

    #[test]
    fn miss_then_hit_on_same_prefix() {
        let mut c = PrefixCache::new(100, 16);
        assert_eq!(c.serve_instantly(&seq(0..4), 70), 0);
        // 4 full blocks cached; same prompt hits all 4 blocks (64 tokens) since 70 - 1 ≥ 64.
        assert_eq!(c.serve_instantly(&seq(0..4), 70), 64);
        assert_eq!(c.stats().query_tokens, 140);
        assert_eq!(c.stats().hit_tokens, 64);
    }

    #[test]
    fn hit_only_for_chained_prefix_from_start() {
        let mut c = PrefixCache::new(100, 16);
        c.serve_instantly(&[1, 2, 3], 48);
        // Blocks 2 and 3 are cached, but the request starts with 9: no hit.
        assert_eq!(c.serve_instantly(&[9, 2, 3], 48), 0);
        // Shared first block only.
        assert_eq!(c.serve_instantly(&[1, 7, 8], 48), 16);
    }

    #[test]
    fn fully_cached_prompt_recomputes_at_least_one_token() {
        let mut c = PrefixCache::new(100, 16);
        c.serve_instantly(&[1, 2], 32);
        // 32 tokens, all cached: at most 31 may hit → one block (16 tokens).
        assert_eq!(c.serve_instantly(&[1, 2], 32), 16);
    }

    #[test]
    fn lru_evicts_least_recently_used_free_blocks() {
        let mut c = PrefixCache::new(4, 16);
        c.serve_instantly(&[1, 2], 40);
        c.serve_instantly(&[3, 4], 40);
        c.serve_instantly(&[1, 2], 40); // refresh 1,2
        c.serve_instantly(&[5, 6], 40); // must evict 3,4
        assert_eq!(c.len(), 4);
        assert_eq!(c.peek_hit_blocks(&[1, 2]), 2);
        assert_eq!(c.peek_hit_blocks(&[3, 4]), 0);
        assert_eq!(c.stats().evicted_blocks, 2);
    }

    #[test]
    fn tail_blocks_are_evicted_before_head() {
        let mut c = PrefixCache::new(3, 16);
        c.serve_instantly(&[1, 2, 3], 60);
        c.serve_instantly(&[9], 20); // evicts exactly one block: the tail (3)
        assert_eq!(c.peek_hit_blocks(&[1, 2, 3]), 2);
    }

    #[test]
    fn pinned_blocks_are_never_evicted() {
        let mut c = PrefixCache::new(2, 16);
        let a = c.admit(&[1, 2], 40);
        assert_eq!(c.usage(), 1.0);
        let b = c.admit(&[3, 4], 40);
        assert!(b.blocks.is_empty());
        assert_eq!(c.stats().uncacheable_blocks, 2);
        c.mark_ready(&a.blocks);
        c.release(a);
        c.release(b);
        assert_eq!(c.usage(), 0.0);
        assert_eq!(c.peek_hit_blocks(&[1, 2]), 2);
    }

    #[test]
    fn blocks_hit_only_after_prefill_completes() {
        let mut c = PrefixCache::new(10, 16);
        let a = c.admit(&[1, 2], 40);
        let b = c.admit(&[1, 2], 40);
        assert_eq!(b.hit_blocks, 0, "in-flight blocks are not computed yet");
        c.mark_ready(&a.blocks);
        let d = c.admit(&[1, 2], 40);
        assert_eq!(d.hit_blocks, 2);
        for x in [a, b, d] {
            c.release(x);
        }
        assert_eq!(c.usage(), 0.0);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn uncomputed_blocks_are_dropped_on_release() {
        let mut c = PrefixCache::new(10, 16);
        let a = c.admit(&[1, 2], 40);
        c.release(a);
        assert!(c.is_empty());
    }

    #[test]
    fn output_blocks_are_cached_for_the_next_turn() {
        let mut c = PrefixCache::new(10, 16);
        let mut a = c.admit(&[1, 2], 40);
        c.mark_ready(&a.blocks.clone());
        c.pin_more(&mut a, &[3]);
        c.mark_ready(&[3]);
        c.release(a);
        assert_eq!(c.serve_instantly(&[1, 2, 3, 4], 70), 48);
    }
}
