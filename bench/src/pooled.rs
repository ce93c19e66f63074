//! The pooled-cache bound: the token hit ratio of ONE simulated cache holding the whole fleet's capacity
//! (endpoints × blocks per endpoint), serving the workload in arrival order with no concurrency. No routing
//! policy over separate caches of the same total size can share more than this, except by luck of timing, so it
//! is the reference line of the report.

use warmpath_sim::tokens::{block_hashes, reply_text, token_count};
use warmpath_sim::PrefixCache;

use crate::workload::Request;

/// Hit ratio (cached prompt tokens / prompt tokens) of one cache of `capacity_blocks` blocks of `block_tokens`.
/// Generated replies are cached too, as the simulated server does.
pub fn pooled_hit_ratio(reqs: &[Request], capacity_blocks: usize, block_tokens: usize) -> f64 {
    let mut cache = PrefixCache::new(capacity_blocks, block_tokens);
    for r in reqs {
        let prompt = r.server_prompt();
        let hashes = block_hashes(prompt.as_bytes(), block_tokens);
        let mut alloc = cache.admit(&hashes, token_count(prompt.len()));
        cache.mark_ready(&alloc.blocks);
        let seq = format!("{prompt}{}", reply_text(&prompt, r.max_tokens as usize));
        let all = block_hashes(seq.as_bytes(), block_tokens);
        let extra = &all[hashes.len().min(all.len())..];
        cache.pin_more(&mut alloc, extra);
        cache.mark_ready(extra);
        cache.release(alloc);
    }
    let s = cache.stats();
    if s.query_tokens == 0 {
        0.0
    } else {
        s.hit_tokens as f64 / s.query_tokens as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{generate, GenParams, WorkloadKind};

    #[test]
    fn bound_grows_with_capacity_and_is_zero_for_unique_prompts() {
        let p = GenParams { requests: 150, rate_per_s: 4.0, seed: 1 };
        let chat = generate(WorkloadKind::Chat, p);
        let small = pooled_hit_ratio(&chat, 200, 16);
        let big = pooled_hit_ratio(&chat, 100_000, 16);
        assert!(big > small, "{big} > {small}");
        assert!(big > 0.5, "chat shares most of its prompt: {big}");
        assert_eq!(pooled_hit_ratio(&generate(WorkloadKind::Unique, p), 100_000, 16), 0.0);
    }
}
