//! SGLang-router-style cache-aware routing: an approximate radix tree of the text sent to each worker, plus a
//! load-imbalance escape hatch.
//!
//! Source: sgl-project/sglang `sgl-router` (`src/policies/cache_aware.rs`, `src/tree.rs`; CLI flags
//! `--cache-threshold`, `--balance-abs-threshold`, `--balance-rel-threshold`). Per request:
//! 1. if the fleet is imbalanced — `max_load − min_load > balance_abs_threshold` **and**
//!    `max_load > min_load × balance_rel_threshold`, loads being the router's in-flight counts — route to the least
//!    loaded worker;
//! 2. otherwise find the longest prefix of the request text in the tree; if `matched / len > cache_threshold`
//!    route to the worker that holds it (most recently used one if several), else to the worker whose tree holds
//!    the fewest characters (the most free cache);
//! 3. insert the text into the tree for the chosen worker.
//!
//! Parameters are the router's current defaults: `cache_threshold` 0.3, `balance_abs_threshold` 64,
//! `balance_rel_threshold` 1.5 (older releases used 0.5 / 32 / 1.1). The router's size-based tree eviction
//! (`max_tree_size` 67,108,864 characters per worker, checked every 120 s) is not modelled: no run here inserts
//! that much text per worker.

use std::collections::HashMap;

use warmpath_core::decision::{Decision, Reason};
use warmpath_core::endpoint::{Endpoint, EndpointLoad};
use warmpath_core::policy::{PickInput, Policy};

use super::argmin_by;

#[derive(Debug, Default)]
struct Node {
    label: Vec<u8>,
    children: HashMap<u8, usize>,
    /// Tenant (endpoint address) → last access tick.
    tenants: HashMap<String, u64>,
}

/// A radix tree over bytes shared by all tenants, as in sgl-router's approximate tree.
#[derive(Debug)]
pub struct RadixTree {
    nodes: Vec<Node>,
    chars: HashMap<String, usize>,
    tick: u64,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self { nodes: vec![Node::default()], chars: HashMap::new(), tick: 0 }
    }
}

fn lcp(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl RadixTree {
    /// Characters (bytes) of text held for `tenant`.
    pub fn tenant_chars(&self, tenant: &str) -> usize {
        self.chars.get(tenant).copied().unwrap_or(0)
    }

    fn mark(&mut self, node: usize, tenant: &str) {
        self.tick += 1;
        let len = self.nodes[node].label.len();
        if self.nodes[node].tenants.insert(tenant.to_string(), self.tick).is_none() {
            *self.chars.entry(tenant.to_string()).or_default() += len;
        }
    }

    /// Inserts `text` for `tenant`.
    pub fn insert(&mut self, text: &[u8], tenant: &str) {
        let (mut cur, mut pos) = (0usize, 0usize);
        self.mark(0, tenant);
        while pos < text.len() {
            let b = text[pos];
            let Some(&child) = self.nodes[cur].children.get(&b) else {
                let leaf = self.nodes.len();
                self.nodes.push(Node { label: text[pos..].to_vec(), ..Default::default() });
                self.nodes[cur].children.insert(b, leaf);
                self.mark(leaf, tenant);
                return;
            };
            let l = lcp(&self.nodes[child].label, &text[pos..]);
            let next = if l < self.nodes[child].label.len() {
                // Split `child` at l: a new middle node keeps the first l bytes and the child's tenants.
                let mid = self.nodes.len();
                let rest = self.nodes[child].label.split_off(l);
                let head = std::mem::replace(&mut self.nodes[child].label, rest);
                let tenants = self.nodes[child].tenants.clone();
                let mut children = HashMap::new();
                children.insert(self.nodes[child].label[0], child);
                self.nodes.push(Node { label: head, children, tenants });
                self.nodes[cur].children.insert(b, mid);
                mid
            } else {
                child
            };
            self.mark(next, tenant);
            pos += l;
            cur = next;
        }
    }

    /// Longest stored prefix of `text`: `(matched bytes, most recently used tenant holding it)`.
    pub fn prefix_match(&self, text: &[u8]) -> (usize, Option<&str>) {
        let (mut cur, mut pos) = (0usize, 0usize);
        while pos < text.len() {
            let Some(&child) = self.nodes[cur].children.get(&text[pos]) else { break };
            let l = lcp(&self.nodes[child].label, &text[pos..]);
            pos += l;
            cur = child;
            if l < self.nodes[child].label.len() {
                break;
            }
        }
        if pos == 0 {
            return (0, None);
        }
        let tenant = self.nodes[cur].tenants.iter().max_by_key(|(_, t)| **t).map(|(k, _)| k.as_str());
        (pos, tenant)
    }
}

/// SGLang-router cache-aware policy.
#[derive(Debug)]
pub struct SgLangCacheAware {
    /// Minimum matched fraction of the text to follow the match. Default 0.3.
    pub cache_threshold: f64,
    /// Absolute in-flight gap that (with the relative one) counts as imbalance. Default 64.
    pub balance_abs_threshold: u32,
    /// Relative in-flight ratio that (with the absolute one) counts as imbalance. Default 1.5.
    pub balance_rel_threshold: f64,
    tree: RadixTree,
}

impl Default for SgLangCacheAware {
    fn default() -> Self {
        Self { cache_threshold: 0.3, balance_abs_threshold: 64, balance_rel_threshold: 1.5, tree: RadixTree::default() }
    }
}

impl Policy for SgLangCacheAware {
    fn name(&self) -> &'static str {
        "SGLANG_CACHE_AWARE"
    }

    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        // One call per request: choose, then record the choice in this policy's own index.
        let d = self.choose(input, endpoints, loads)?;
        self.record(input, &d);
        Some(d)
    }
}

impl SgLangCacheAware {
    fn choose(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        if endpoints.is_empty() {
            return None;
        }
        let load = |i: usize| loads.get(i).map_or(0, |l| l.in_flight);
        let n = endpoints.len();
        let (min, max) = (0..n).fold((u32::MAX, 0), |(a, b), i| (a.min(load(i)), b.max(load(i))));
        let least = || argmin_by(n, input.random, |i| load(i) as f64);
        let Some(key) = input.key else {
            return Some(Decision::new(endpoints, least()?, Reason::FailOpen));
        };
        if max.saturating_sub(min) > self.balance_abs_threshold && max as f64 > min as f64 * self.balance_rel_threshold
        {
            return Some(Decision::new(endpoints, least()?, Reason::Overflow));
        }
        let (matched, tenant) = self.tree.prefix_match(&key.text);
        let rate = if key.text.is_empty() { 0.0 } else { matched as f64 / key.text.len() as f64 };
        if rate > self.cache_threshold {
            if let Some(i) = tenant.and_then(|t| endpoints.iter().position(|e| e.address == t)) {
                return Some(Decision::new(endpoints, i, Reason::PrefixMatch).with_match(0, matched));
            }
        }
        let i = argmin_by(n, input.random, |i| self.tree.tenant_chars(&endpoints[i].address) as f64)?;
        Some(Decision::new(endpoints, i, Reason::ConsistentPick))
    }

    fn record(&mut self, input: &PickInput, decision: &Decision) {
        if let Some(key) = input.key {
            self.tree.insert(&key.text, &decision.address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmpath_core::extract::{BodyKind, RequestKey};

    #[test]
    fn radix_tree_matches_longest_prefix_and_splits_edges() {
        let mut t = RadixTree::default();
        t.insert(b"hello world", "a");
        t.insert(b"hello there", "b");
        assert_eq!(t.prefix_match(b"hello world!"), (11, Some("a")));
        assert_eq!(t.prefix_match(b"hello thx"), (8, Some("b")));
        assert_eq!(t.prefix_match(b"help").0, 3);
        assert_eq!(t.prefix_match(b"xyz"), (0, None));
        assert_eq!(t.tenant_chars("a"), 11);
        assert_eq!(t.tenant_chars("b"), 11);
    }

    fn eps(n: usize) -> Vec<Endpoint> {
        (0..n).map(|i| Endpoint::new(format!("127.0.0.1:{}", 9000 + i), i as u32)).collect()
    }

    #[test]
    fn follows_match_above_threshold_and_balances_when_imbalanced() {
        let mut p = SgLangCacheAware { balance_abs_threshold: 4, balance_rel_threshold: 1.5, ..Default::default() };
        let e = eps(3);
        let idle = vec![EndpointLoad::default(); 3];
        let k1 = RequestKey::new(BodyKind::Completion, None, None, b"shared document text one".to_vec());
        let input = PickInput { key: Some(&k1), ..Default::default() };
        let d1 = p.pick(&input, &e, &idle).unwrap();
        let k2 = RequestKey::new(BodyKind::Completion, None, None, b"shared document text two".to_vec());
        let in2 = PickInput { key: Some(&k2), random: 5, ..Default::default() };
        let d2 = p.pick(&in2, &e, &idle).unwrap();
        assert_eq!((d2.endpoint, d2.reason), (d1.endpoint, Reason::PrefixMatch));
        let mut loaded = idle.clone();
        loaded[d1.endpoint].in_flight = 10;
        let d3 = p.pick(&in2, &e, &loaded).unwrap();
        assert_eq!(d3.reason, Reason::Overflow);
        assert_ne!(d3.endpoint, d1.endpoint);
    }
}
