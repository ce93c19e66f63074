//! The overload guard shared by the policies: an absolute in-flight threshold plus the bounded-load rule of
//! Mirrokni, Thorup and Zadimoghaddam ("Consistent Hashing with Bounded Loads", SODA 2018): with total load m
//! over N endpoints and factor c, an endpoint may take one more request while load + 1 ≤ ceil(c·(m + 1)/N).

use crate::endpoint::{Endpoint, EndpointLoad};
use crate::hrw;

/// Overload guard for one decision (loads are a snapshot).
#[derive(Debug, Clone, Copy)]
pub struct LoadGuard {
    /// Requests in flight at which an endpoint is overloaded (`concurrency_threshold`).
    pub threshold: u32,
    /// Per-endpoint cap from the bounded-load rule; `u64::MAX` when the factor is 0 (off).
    pub cap: u64,
}

impl LoadGuard {
    /// Guard for `n` endpoints with the given loads (missing entries count as idle).
    pub fn new(threshold: u32, load_factor: f64, n: usize, loads: &[EndpointLoad]) -> LoadGuard {
        let total: u64 = (0..n).map(|i| load_at(loads, i).effective() as u64).sum();
        let cap = if load_factor > 0.0 && n > 0 {
            (load_factor * (total + 1) as f64 / n as f64).ceil() as u64
        } else {
            u64::MAX
        };
        LoadGuard { threshold, cap }
    }

    /// True when endpoint `i` can take one more request.
    pub fn admits(&self, loads: &[EndpointLoad], i: usize) -> bool {
        let l = load_at(loads, i);
        let eff = l.effective();
        eff < self.threshold && (eff as u64) < self.cap && !l.kv_saturated()
    }
}

/// Load of endpoint `i`; positions past the end of `loads` are idle.
pub fn load_at(loads: &[EndpointLoad], i: usize) -> EndpointLoad {
    loads.get(i).copied().unwrap_or_default()
}

/// Position of the endpoint with the lowest effective load; ties go to the best rendezvous score for `key`
/// (deterministic). `None` for an empty list.
pub fn least_loaded(key: u64, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<usize> {
    (0..endpoints.len()).min_by(|&a, &b| {
        load_at(loads, a)
            .effective()
            .cmp(&load_at(loads, b).effective())
            .then_with(|| hrw::score(key, &endpoints[b]).cmp(&hrw::score(key, &endpoints[a])))
    })
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use super::*;

    #[test]
    fn bounded_load_cap_follows_mtz() {
        let loads = [EndpointLoad::in_flight(3), EndpointLoad::in_flight(0), EndpointLoad::in_flight(0)];
        // total 3, c 1.25, N 3: cap = ceil(1.25·4/3) = 2, so endpoint 0 (load 3) is refused, the others admitted.
        let g = LoadGuard::new(100, 1.25, 3, &loads);
        assert_eq!(g.cap, 2);
        assert!(!g.admits(&loads, 0));
        assert!(g.admits(&loads, 1));
        let off = LoadGuard::new(100, 0.0, 3, &loads);
        assert!(off.admits(&loads, 0));
        let thr = LoadGuard::new(3, 0.0, 3, &loads);
        assert!(!thr.admits(&loads, 0), "load 3 at threshold 3 is overloaded");
        assert!(thr.admits(&loads, 1));
    }
}
