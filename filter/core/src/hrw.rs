//! Rendezvous (highest random weight) hashing over endpoint addresses (Thaler & Ravishankar, "Using
//! name-based mappings to increase hit rates", IEEE/ACM ToN 1998).
//!
//! Every endpoint gets the score `mix(xxh3_64(address) ^ mix(key))`, `mix` being the MurmurHash3 64-bit
//! finalizer (a bijection with full avalanche); the key goes to the highest score. Scores depend only on the key
//! and the address, so every gateway replica ranks endpoints the same, and removing or adding one of N endpoints
//! moves only the keys whose top choice it was (about 1/N). The address hash does not depend on the key, so a
//! caller scoring many endpoints per request hashes each address once ([`address_hash`]) and pays a few
//! multiplications per endpoint ([`score_hashed`]).

use xxhash_rust::xxh3::xxh3_64;

use crate::endpoint::Endpoint;

/// The key-independent part of an endpoint's score.
pub fn address_hash(endpoint: &Endpoint) -> u64 {
    xxh3_64(endpoint.address.as_bytes())
}

/// MurmurHash3's 64-bit finalizer (Appleby, `fmix64`).
fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The per-key factor of [`score_hashed`]; compute it once per request.
pub fn key_factor(key: u64) -> u64 {
    mix(key)
}

/// Score of an endpoint with [`address_hash`] `h` for a key with [`key_factor`] `k` (higher wins).
pub fn score_hashed(k: u64, h: u64) -> u64 {
    mix(h ^ k)
}

/// Score of `endpoint` for `key` (higher wins).
pub fn score(key: u64, endpoint: &Endpoint) -> u64 {
    score_hashed(key_factor(key), address_hash(endpoint))
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
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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

    #[test]
    fn tops_spread_evenly() {
        let e = eps(8);
        let mut counts = [0usize; 8];
        for key in 0..8000u64 {
            counts[top(xxh3_64(&key.to_le_bytes()), &e).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
        // Sequential keys too (the key factor mixes them).
        let mut counts = [0usize; 8];
        for key in 0..8000u64 {
            counts[top(key, &e).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
    }
}
