//! The bounded, approximate prefix index: block hash → endpoints that recently served a request containing that
//! block. Capacity is counted in blocks; eviction is CLOCK (second chance), so a block recorded again survives
//! one sweep more than a block seen once, and memory never grows past `capacity` entries.
//!
//! Endpoints are stored by their stable id (see [`crate::Endpoint::id`]); holders that are no longer in the
//! endpoint set are skipped on read and pruned when their entry is next written (lazy removal).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Most endpoints remembered per block (most recent first).
pub const MAX_HOLDERS: usize = 8;

/// Keys are already xxh3 outputs, so the map uses them as their own hash.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; fold anything else defensively.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// One index entry.
#[derive(Debug, Clone)]
struct Slot {
    hash: u64,
    holders: [u32; MAX_HOLDERS],
    n: u8,
    /// Distinct child blocks recorded after this one (saturating): how many ways this prefix continues.
    children: u16,
    /// Divergences recorded at or below this block (saturating): how many times some request's text first
    /// differed from all earlier text somewhere inside this prefix's subtree. Ancestors never have fewer.
    branches: u16,
    referenced: bool,
}

/// What the index knows about one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo<'a> {
    /// Endpoint ids that served the block, most recent first (may include removed endpoints).
    pub holders: &'a [u32],
    /// Distinct continuations seen (saturating at `u16::MAX`).
    pub children: u16,
    /// Divergences seen in this block's subtree (saturating at `u16::MAX`).
    pub branches: u16,
}

/// Bounded map from block hash to recent holders with CLOCK eviction.
pub struct PrefixIndex {
    map: HashMap<u64, u32, BuildHasherDefault<PassThrough>>,
    slots: Vec<Slot>,
    hand: usize,
    capacity: usize,
    /// Per endpoint id, the entries that list it as a holder: how much of the recorded text the index places there.
    held: Vec<u32>,
    /// Sum of `held`.
    total_held: u64,
}

impl PrefixIndex {
    /// An empty index holding at most `capacity` blocks (at least 1).
    pub fn new(capacity: usize) -> PrefixIndex {
        let capacity = capacity.max(1);
        PrefixIndex {
            map: HashMap::with_capacity_and_hasher(capacity.min(1024), Default::default()),
            slots: Vec::new(),
            hand: 0,
            capacity,
            held: Vec::new(),
            total_held: 0,
        }
    }

    /// Blocks currently stored.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Maximum number of blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the capacity; shrinking keeps the most recently referenced entries as far as CLOCK knows them.
    pub fn set_capacity(&mut self, capacity: usize) {
        let capacity = capacity.max(1);
        while self.slots.len() > capacity {
            let victim = self.pick_victim();
            let last = self.slots.len() - 1;
            self.slots.swap(victim, last);
            let gone = self.slots.pop().expect("non-empty");
            self.release(&gone.holders[..gone.n as usize]);
            self.map.remove(&gone.hash);
            if victim < self.slots.len() {
                self.map.insert(self.slots[victim].hash, victim as u32);
            }
            self.hand = 0;
        }
        self.capacity = capacity;
    }

    /// Entries that list endpoint `id` as a holder (removed endpoints included until pruned): the share of the
    /// recorded text the index places on it.
    pub fn held(&self, id: u32) -> u32 {
        self.held.get(id as usize).copied().unwrap_or(0)
    }

    /// Entries that list a holder, summed over holders: [`PrefixIndex::held`] of every endpoint id.
    pub fn total_held(&self) -> u64 {
        self.total_held
    }

    /// Counts one more entry listing `id`.
    fn hold(&mut self, id: u32) {
        let i = id as usize;
        if i >= self.held.len() {
            self.held.resize(i + 1, 0);
        }
        self.held[i] += 1;
        self.total_held += 1;
    }

    /// Counts one entry fewer for each of `ids`.
    fn release(&mut self, ids: &[u32]) {
        for &id in ids {
            if let Some(c) = self.held.get_mut(id as usize) {
                if *c > 0 {
                    *c -= 1;
                    self.total_held -= 1;
                }
            }
        }
    }

    /// Looks up a block without changing eviction state.
    pub fn get(&self, hash: u64) -> Option<BlockInfo<'_>> {
        self.map.get(&hash).map(|&s| {
            let slot = &self.slots[s as usize];
            BlockInfo { holders: &slot.holders[..slot.n as usize], children: slot.children, branches: slot.branches }
        })
    }

    /// Records that endpoint `id` served `hash`: moves `id` to the front of the holders and prunes holders for
    /// which `is_active` is false. Returns true when the block was new (inserted, possibly evicting another).
    pub fn record(&mut self, hash: u64, id: u32, is_active: impl Fn(u32) -> bool) -> bool {
        if let Some(&s) = self.map.get(&hash) {
            let slot = &mut self.slots[s as usize];
            slot.referenced = true;
            if slot.holders[0] == id {
                // Already the most recent holder (the steady state of a sticky prefix); stale holders behind
                // it are pruned when another endpoint is recorded.
                return false;
            }
            let old = slot.holders;
            let old_n = slot.n as usize;
            let mut kept = [0u32; MAX_HOLDERS];
            kept[0] = id;
            let mut n = 1;
            for &h in &old[..old_n] {
                if h != id && n < MAX_HOLDERS && is_active(h) {
                    kept[n] = h;
                    n += 1;
                }
            }
            slot.holders = kept;
            slot.n = n as u8;
            if !old[..old_n].contains(&id) {
                self.hold(id);
            }
            for &h in &old[..old_n] {
                if !kept[..n].contains(&h) {
                    self.release(&[h]);
                }
            }
            return false;
        }
        let mut holders = [0u32; MAX_HOLDERS];
        holders[0] = id;
        let slot = Slot { hash, holders, n: 1, children: 0, branches: 0, referenced: false };
        self.hold(id);
        if self.slots.len() < self.capacity {
            self.map.insert(hash, self.slots.len() as u32);
            self.slots.push(slot);
        } else {
            let victim = self.pick_victim();
            let old = std::mem::replace(&mut self.slots[victim], slot);
            self.release(&old.holders[..old.n as usize]);
            self.map.remove(&old.hash);
            self.map.insert(hash, victim as u32);
            self.hand = (victim + 1) % self.capacity;
        }
        true
    }

    /// Counts one more distinct child of `hash`; returns the new count (0 if `hash` is not stored).
    pub fn add_child(&mut self, hash: u64) -> u16 {
        match self.map.get(&hash) {
            Some(&s) => {
                let slot = &mut self.slots[s as usize];
                slot.children = slot.children.saturating_add(1);
                slot.children
            }
            None => 0,
        }
    }

    /// Counts one more divergence in the subtree of `hash` (no-op if not stored).
    pub fn add_branch(&mut self, hash: u64) {
        if let Some(&s) = self.map.get(&hash) {
            let slot = &mut self.slots[s as usize];
            slot.branches = slot.branches.saturating_add(1);
        }
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        self.held.clear();
        self.total_held = 0;
        self.hand = 0;
    }

    /// CLOCK: clear reference bits until an unreferenced slot is under the hand.
    fn pick_victim(&mut self) -> usize {
        let len = self.slots.len();
        if self.hand >= len {
            self.hand = 0;
        }
        loop {
            let slot = &mut self.slots[self.hand];
            if !slot.referenced {
                return self.hand;
            }
            slot.referenced = false;
            self.hand = (self.hand + 1) % len;
        }
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn record_and_get_most_recent_first() {
        let mut ix = PrefixIndex::new(16);
        assert!(ix.record(1, 7, |_| true));
        assert!(!ix.record(1, 8, |_| true));
        assert_eq!(ix.get(1).unwrap().holders, &[8, 7]);
        ix.record(1, 7, |_| true);
        assert_eq!(ix.get(1).unwrap().holders, &[7, 8]);
        // Removed endpoint 8 is pruned on the next write.
        ix.record(1, 9, |id| id != 8);
        assert_eq!(ix.get(1).unwrap().holders, &[9, 7]);
        assert!(ix.get(2).is_none());
    }

    #[test]
    fn children_count_new_continuations() {
        let mut ix = PrefixIndex::new(16);
        assert_eq!(ix.add_child(1), 0, "absent parent");
        ix.record(1, 0, |_| true);
        assert_eq!(ix.add_child(1), 1);
        assert_eq!(ix.add_child(1), 2);
        ix.add_branch(1);
        let info = ix.get(1).unwrap();
        assert_eq!((info.children, info.branches), (2, 1));
    }

    #[test]
    fn held_counts_the_entries_listing_each_holder() {
        // Inserts, re-records, pruning, eviction and a smaller capacity, against a count over the entries.
        let count =
            |ix: &PrefixIndex, id: u32| ix.slots.iter().filter(|s| s.holders[..s.n as usize].contains(&id)).count();
        let mut ix = PrefixIndex::new(64);
        for step in 0..2_000u64 {
            let hash = step.wrapping_mul(0x9e37_79b9) % 97;
            let id = (step % 7) as u32;
            ix.record(hash, id, |h| step < 1_000 || h != 3);
            if step == 1_500 {
                ix.set_capacity(40);
            }
            if step % 250 == 0 || step == 1_500 {
                for id in 0..8 {
                    assert_eq!(ix.held(id) as usize, count(&ix, id), "step {step}, endpoint {id}");
                }
                assert_eq!(ix.total_held(), (0..8).map(|id| ix.held(id) as u64).sum::<u64>());
            }
        }
        ix.clear();
        assert_eq!((ix.held(0), ix.total_held()), (0, 0));
    }

    #[test]
    fn bounded_with_second_chance() {
        let mut ix = PrefixIndex::new(4);
        for h in 0..4 {
            ix.record(h, 0, |_| true);
        }
        ix.record(0, 1, |_| true); // referenced: survives the next sweep
        for h in 10..13 {
            ix.record(h, 0, |_| true);
        }
        assert_eq!(ix.len(), 4);
        assert!(ix.get(0).is_some(), "re-recorded block kept");
        assert!(ix.get(1).is_none() && ix.get(2).is_none() && ix.get(3).is_none());
        for h in 100..1000 {
            ix.record(h, 0, |_| true);
            assert!(ix.len() <= 4);
        }
        ix.set_capacity(2);
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.capacity(), 2);
        let kept = (100..1000).filter(|&h| ix.get(h).is_some()).count();
        assert_eq!(kept, 2);
    }
}
