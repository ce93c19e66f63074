//! The per-endpoint work of a PREFIX_AWARE decision: a key's top rendezvous endpoints and the least-loaded endpoint
//! the overload guard admits. Everything else a decision does looks at a few candidates; these two look at every
//! endpoint, so they set how the decision grows with the fleet (BENCHMARKS.md §3).
//!
//! - The rendezvous top of a key depends only on the key and the endpoint list, so it is remembered per key
//!   ([`TopCache`]): a conversation's turns, a repeated document or template, share one key (module docs of
//!   [`super::prefix_aware`]) and pay for the scores once per endpoint list instead of once per request.
//! - The least-loaded search runs on every request (the loads are a fresh snapshot): one integer rank per
//!   endpoint and one comparison with a threshold that falls as less-loaded endpoints are seen; the rendezvous
//!   score, which only breaks ties, is computed only when there is a tie. When some endpoint prefills more slowly
//!   than the others, the same pass and the same comparison also find the least loaded in time.

use crate::endpoint::EndpointLoad;
use crate::hrw;
use crate::load::{load_at, LoadGuard};
use crate::prefill_rate::in_time;

/// Rendezvous candidates of a request's key compared by predicted time to first token (besides the match's
/// holders and the least-loaded endpoint). Two: the key's top, and one consistent alternative every replica
/// agrees on when the top is busy.
pub const RENDEZVOUS_CANDIDATES: usize = 2;

/// Positions of a key's top [`RENDEZVOUS_CANDIDATES`] rendezvous endpoints, best first; `usize::MAX` past the list.
pub type Top = [usize; RENDEZVOUS_CANDIDATES];

/// The top [`RENDEZVOUS_CANDIDATES`] endpoints for the key with [`hrw::key_factor`] `kf`, over the endpoints whose
/// [`hrw::address_hash`]es are `addr_hashes` (in list order). Equal scores go to the earlier position.
pub fn rendezvous_top(kf: u64, addr_hashes: &[u64]) -> Top {
    let mut top = [(0u64, usize::MAX); RENDEZVOUS_CANDIDATES];
    for (i, &h) in addr_hashes.iter().enumerate() {
        let score = hrw::score_hashed(kf, h);
        let last = RENDEZVOUS_CANDIDATES - 1;
        if score > top[last].0 || top[last].1 == usize::MAX {
            let mut j = last;
            top[j] = (score, i);
            while j > 0 && (top[j - 1].1 == usize::MAX || score > top[j - 1].0) {
                top.swap(j, j - 1);
                j -= 1;
            }
        }
    }
    top.map(|t| t.1)
}

/// Bits of the outstanding count kept in a [`rank`] (above it, the 32-bit pending prefill work).
const RANK_OUTSTANDING_BITS: u32 = 24;

/// The least-loaded order as one integer: pending prefill work in the high bits, the outstanding count (saturated
/// at a width no real queue reaches) in the low ones; `u64::MAX` for an endpoint the guard refuses.
fn rank(l: &EndpointLoad, guard: LoadGuard) -> u64 {
    let outstanding = l.effective();
    if !guard.admits_outstanding(outstanding) {
        return u64::MAX;
    }
    u64::from(l.pending_prefill) << RANK_OUTSTANDING_BITS | u64::from(outstanding).min((1 << RANK_OUTSTANDING_BITS) - 1)
}

/// Of `n` endpoints (`loads[i]` belongs to position `i`, positions past the end are idle), the one the guard admits
/// with the least waiting work, then the fewest outstanding requests, then the higher score for the key (`score`
/// of a position; `top` is the key's [`rendezvous_top`], which settles most ties without scoring). `None` when the
/// guard refuses every endpoint. The pass of [`least_admitted_and_in_time`] with every endpoint as fast as the
/// fastest and no prompt: its gate turns away every endpoint with more waiting work than the least seen so far.
pub fn least_admitted(
    loads: &[EndpointLoad],
    n: usize,
    guard: LoadGuard,
    top: &Top,
    score: impl Fn(usize) -> u64,
) -> Option<usize> {
    least_admitted_and_in_time(loads, n, guard, top, score, &[], 0).0
}

/// [`least_admitted`], and in the same pass over the loads, of the endpoints the guard admits the one with the
/// least `waiting + prompt` in time ([`in_time`]; `slowdowns[i]` belongs to position `i`, positions past its end are
/// as fast as the fastest), ties to the lower position: PREFIX_AWARE's least-loaded endpoint in bytes and in time,
/// when some endpoints prefill more slowly than others.
///
/// One pass reads every endpoint's load once, and most endpoints cost one rank and one comparison. In time an
/// endpoint's work is at least its bytes, so an endpoint whose waiting work is above the best time found so far,
/// less the prompt, can improve neither answer (the least waiting work seen is never above it): one threshold on
/// the rank ([`rank_gate`]) turns it away, and only the others are scaled and compared. A pass that compared every
/// rank with the least so far, and found the least in time in a second comparison, cost 0.1–0.4 µs more at 1,000
/// endpoints (BENCHMARKS.md §3).
pub fn least_admitted_and_in_time(
    loads: &[EndpointLoad],
    n: usize,
    guard: LoadGuard,
    top: &Top,
    score: impl Fn(usize) -> u64,
    slowdowns: &[u32],
    prompt: u64,
) -> (Option<usize>, Option<usize>) {
    let mut best = (u64::MAX, usize::MAX);
    let mut tied = false;
    let mut fastest = (u64::MAX, usize::MAX);
    // Every rank above the gate is turned away; a refusal (`u64::MAX`) passes only while no time is known.
    let mut gate = u64::MAX;
    let mut visit = |i: usize, r: u64, pending: u32| {
        if r > gate {
            return;
        }
        if r != u64::MAX {
            let work = u64::from(pending) + prompt;
            if work < fastest.0 {
                let t = in_time(work, slowdowns.get(i).copied().unwrap_or(0));
                if t < fastest.0 {
                    fastest = (t, i);
                    gate = rank_gate(t, prompt);
                }
            }
        }
        if r < best.0 {
            best = (r, i);
            tied = false;
        } else if r == best.0 {
            tied = true;
        }
    };
    for (i, l) in loads.iter().take(n).enumerate() {
        visit(i, rank(l, guard), l.pending_prefill);
    }
    let idle = rank(&EndpointLoad::default(), guard);
    for i in loads.len().min(n)..n {
        visit(i, idle, 0);
    }
    let least = resolve_least(best, tied, loads, n, guard, top, score);
    (least, (fastest.1 != usize::MAX).then_some(fastest.1))
}

/// The highest [`rank`] whose waiting work, with `prompt` added, is at most `time`: an endpoint ranked above it is
/// slower than `time` in time ([`in_time`] never scales work down), and more loaded than the endpoint whose time
/// `time` is.
fn rank_gate(time: u64, prompt: u64) -> u64 {
    let pending = time.saturating_sub(prompt).min(u64::from(u32::MAX));
    pending << RANK_OUTSTANDING_BITS | ((1 << RANK_OUTSTANDING_BITS) - 1)
}

/// The least-loaded position from a pass's lowest rank `best` (with its first position) and whether another
/// position had it too (`tied`): of the tied, the first of the key's `top` among them, else the highest-scoring;
/// `None` when every rank was a refusal.
fn resolve_least(
    best: (u64, usize),
    tied: bool,
    loads: &[EndpointLoad],
    n: usize,
    guard: LoadGuard,
    top: &Top,
    score: impl Fn(usize) -> u64,
) -> Option<usize> {
    if best.0 == u64::MAX {
        return None;
    }
    if !tied {
        return Some(best.1);
    }
    let at_best = |i: usize| rank(&load_at(loads, i), guard) == best.0;
    // The top scores of all: the first of them among the tied is the highest-scoring tied endpoint.
    if let Some(&t) = top.iter().find(|&&t| t < n && at_best(t)) {
        return Some(t);
    }
    (0..n).filter(|&i| at_best(i)).min_by_key(|&i| std::cmp::Reverse(score(i)))
}

/// Slots of a [`TopCache`] (a power of two): 1,024 × 24 bytes per policy (16 bytes a slot in wasm32).
const TOP_CACHE_SLOTS: usize = 1024;

/// A [`TopCache`] slot that holds no key (the top of a non-empty list always has a position).
const EMPTY_SLOT: (u64, Top) = (0, [usize::MAX; RENDEZVOUS_CANDIDATES]);

/// [`rendezvous_top`] remembered for recent keys, direct-mapped by key factor. The owner clears it whenever its
/// endpoint list changes; until then a key's top cannot change.
pub struct TopCache {
    slots: Vec<(u64, Top)>,
}

impl Default for TopCache {
    fn default() -> TopCache {
        TopCache { slots: vec![EMPTY_SLOT; TOP_CACHE_SLOTS] }
    }
}

impl TopCache {
    /// Forgets every key (the endpoint list changed).
    pub fn clear(&mut self) {
        self.slots.fill(EMPTY_SLOT);
    }

    /// The top of the key with factor `kf` over `addr_hashes`, computed on the first request of the key since the
    /// last [`TopCache::clear`] or since another key took its slot.
    pub fn top(&mut self, kf: u64, addr_hashes: &[u64]) -> Top {
        // The key factor is a full-avalanche hash, so its low bits pick a slot evenly.
        let slot = &mut self.slots[kf as usize & (TOP_CACHE_SLOTS - 1)];
        if slot.0 != kf || *slot == EMPTY_SLOT {
            *slot = (kf, rendezvous_top(kf, addr_hashes));
        }
        slot.1
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use xxhash_rust::xxh3::xxh3_64;

    use super::*;
    use crate::endpoint::ServerLoad;

    fn r(seed: u64, i: u64) -> u64 {
        xxh3_64(&[seed.to_le_bytes(), i.to_le_bytes()].concat())
    }

    /// The passes agree with the definitions they pack into integers: the top rendezvous endpoints are the highest
    /// scores, the least-loaded endpoint is the admitted one with the least waiting work, then the fewest
    /// outstanding requests, then the higher score, and the least loaded in time the admitted one with the least
    /// `waiting + prompt` scaled by its slowdown, then the lower position — over loads with and without server
    /// reports, including ties (many idle endpoints among them) and refused endpoints, with fewer loads than
    /// endpoints (the rest are idle) or more (the rest ignored), and fewer slowdowns than endpoints or none (the rest
    /// as fast as the fastest).
    #[test]
    fn the_passes_match_their_definitions() {
        for case in 0..3000u64 {
            let n = 1 + (r(case, 0) % 40) as usize;
            let hashes: Vec<u64> = (0..n as u64).map(|i| r(case, 100 + i)).collect();
            let idle_share = r(case, 3) % 4;
            // Mostly fewer loads than endpoints or as many; sometimes more (a snapshot longer than the list).
            let len = if r(case, 1) % 5 == 4 { n + 2 } else { n.saturating_sub((r(case, 1) % 3) as usize).max(1) };
            let loads: Vec<EndpointLoad> = (0..len as u64)
                .map(|i| {
                    let h = r(case, 1000 + i);
                    if h % 4 < idle_share {
                        return EndpointLoad::default();
                    }
                    EndpointLoad {
                        in_flight: (h >> 4) as u32 % 5,
                        pending_prefill: [0, 100, 100, 5000, u32::MAX][(h >> 8) as usize % 5],
                        server: (h >> 16 & 3 == 0).then_some(ServerLoad {
                            waiting: (h >> 20) as u32 % 3,
                            running: (h >> 24) as u32 % 4,
                            kv_cache_usage: if h >> 28 & 7 == 0 { 0.99 } else { 0.5 },
                        }),
                    }
                })
                .collect();
            let guard = LoadGuard::new(1 + (r(case, 4) % 5) as u32);
            let kf = hrw::key_factor(r(case, 2));
            let score = |i: usize| hrw::score_hashed(kf, hashes[i]);
            let top = rendezvous_top(kf, &hashes);
            let mut by_score: Vec<usize> = (0..n).collect();
            by_score.sort_by_key(|&i| std::cmp::Reverse(score(i)));
            let want_top: Vec<usize> = by_score.iter().copied().take(RENDEZVOUS_CANDIDATES).collect();
            let got_top: Vec<usize> = top.iter().copied().filter(|&i| i != usize::MAX).collect();
            assert_eq!(got_top, want_top, "case {case}");
            let want_least = (0..n).filter(|&i| guard.admits(&loads, i)).min_by_key(|&i| {
                let l = load_at(&loads, i);
                (l.pending_prefill, l.effective(), std::cmp::Reverse(score(i)))
            });
            assert_eq!(least_admitted(&loads, n, guard, &top, score), want_least, "case {case}");
            // Slowdowns for some of the positions (the rest as fast as the fastest).
            let slowdowns: Vec<u32> = (0..n.saturating_sub((r(case, 6) % 3) as usize) as u64)
                .map(|i| [0, 0, 512, 1024, 3000][(r(case, 2000 + i) % 5) as usize])
                .take(if r(case, 8).is_multiple_of(6) { 0 } else { n })
                .collect();
            let prompt = [0, 50, 4000][(r(case, 7) % 3) as usize];
            let want_in_time = (0..n).filter(|&i| guard.admits(&loads, i)).min_by_key(|&i| {
                let work = u64::from(load_at(&loads, i).pending_prefill) + prompt;
                let slowdown = u64::from(slowdowns.get(i).copied().unwrap_or(0));
                (work + work * slowdown / 1024, i)
            });
            assert_eq!(
                least_admitted_and_in_time(&loads, n, guard, &top, score, &slowdowns, prompt),
                (want_least, want_in_time),
                "case {case}"
            );
        }
    }

    #[test]
    fn the_cache_gives_each_key_its_top_until_cleared() {
        let hashes: Vec<u64> = (0..50).map(|i| r(7, i)).collect();
        let mut cache = TopCache::default();
        // More keys than slots, twice over: every answer is the key's own top, whether remembered or evicted.
        for round in 0..2 {
            for k in 0..3 * TOP_CACHE_SLOTS as u64 {
                let kf = hrw::key_factor(k);
                assert_eq!(cache.top(kf, &hashes), rendezvous_top(kf, &hashes), "round {round}, key {k}");
            }
        }
        // A new list: the owner clears, and the tops follow the new list.
        let fewer = &hashes[..10];
        cache.clear();
        for k in 0..100u64 {
            let kf = hrw::key_factor(k);
            let top = cache.top(kf, fewer);
            assert_eq!(top, rendezvous_top(kf, fewer));
            assert!(top.iter().all(|&p| p < fewer.len()), "a position of the old list: {top:?}");
        }
    }
}
