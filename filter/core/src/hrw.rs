//! Rendezvous (highest random weight) hashing over endpoint addresses (Thaler & Ravishankar, "Using
//! name-based mappings to increase hit rates", IEEE/ACM ToN 1998).
//!
//! Every endpoint gets the score `xxh3_64_with_seed(address, key)`; the key goes to the highest score. Scores
//! depend only on the key and the address, so every gateway replica ranks endpoints the same, and removing or
//! adding one of N endpoints moves only the keys whose top choice it was (about 1/N).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::endpoint::Endpoint;

/// Score of `endpoint` for `key` (higher wins).
pub fn score(key: u64, endpoint: &Endpoint) -> u64 {
    xxh3_64_with_seed(endpoint.address.as_bytes(), key)
}

/// Position of the highest-scoring endpoint, or `None` for an empty list. Ties (practically impossible)
/// go to the smaller address so the result never depends on list order.
pub fn top(key: u64, endpoints: &[Endpoint]) -> Option<usize> {
    endpoints
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| score(key, a).cmp(&score(key, b)).then_with(|| b.address.cmp(&a.address)))
        .map(|(i, _)| i)
}

/// Positions of all endpoints, best first (the order an overloaded choice overflows in).
pub fn order(key: u64, endpoints: &[Endpoint]) -> Vec<usize> {
    let mut v: Vec<(u64, usize)> = endpoints.iter().enumerate().map(|(i, e)| (score(key, e), i)).collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| endpoints[a.1].address.cmp(&endpoints[b.1].address)));
    v.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use super::*;

    fn eps(n: usize) -> Vec<Endpoint> {
        (0..n).map(|i| Endpoint::new(format!("10.0.0.{i}:8000"), i as u32)).collect()
    }

    #[test]
    fn top_is_first_of_order_and_order_independent() {
        let e = eps(5);
        let mut rev = e.clone();
        rev.reverse();
        for key in 0..200u64 {
            let o = order(key, &e);
            assert_eq!(o[0], top(key, &e).unwrap());
            assert_eq!(e[o[0]].address, rev[top(key, &rev).unwrap()].address);
            let mut sorted = o.clone();
            sorted.sort();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        }
        assert_eq!(top(1, &[]), None);
    }
}
