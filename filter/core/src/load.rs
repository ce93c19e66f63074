//! The overload guard shared by the policies: a hard cap on requests outstanding per endpoint
//! (`concurrency_threshold`). A server's report of a full KV cache with a queue does not refuse it: the report is up
//! to one feed poll old, and refusing on it moved requests off endpoints holding their prefix (chat demo with the
//! servers' loads in the feed: hit ratio 0.839 with that rule, 0.860 without; BENCHMARKS.md §1, gateway replicas).
//! A server that cannot admit work accumulates waiting requests, which count toward the cap.

use crate::endpoint::{Endpoint, EndpointLoad};
use crate::hrw;

/// Overload guard for one decision (loads are a snapshot).
#[derive(Debug, Clone, Copy)]
pub struct LoadGuard {
    /// Requests in flight at which an endpoint is overloaded (`concurrency_threshold`).
    pub threshold: u32,
}

impl LoadGuard {
    /// Guard with the given `concurrency_threshold`.
    pub fn new(threshold: u32) -> LoadGuard {
        LoadGuard { threshold }
    }

    /// True when endpoint `i` can take one more request: fewer than `threshold` requests outstanding
    /// ([`EndpointLoad::effective`]).
    pub fn admits(&self, loads: &[EndpointLoad], i: usize) -> bool {
        self.admits_load(&load_at(loads, i))
    }

    /// [`LoadGuard::admits`] for one endpoint's load.
    pub fn admits_load(&self, l: &EndpointLoad) -> bool {
        self.admits_outstanding(l.effective())
    }

    /// [`LoadGuard::admits`] for an endpoint with `outstanding` requests ([`EndpointLoad::effective`]).
    pub fn admits_outstanding(&self, outstanding: u32) -> bool {
        outstanding < self.threshold
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
    use super::*;
    use crate::endpoint::ServerLoad;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_threshold_refuses_and_a_full_kv_cache_alone_does_not() {
        let server = |waiting, running| Some(ServerLoad { waiting, running, kv_cache_usage: 0.99 });
        let loads = [
            EndpointLoad::in_flight(3),
            EndpointLoad::in_flight(2),
            EndpointLoad { server: server(1, 0), ..Default::default() },
            EndpointLoad { server: server(2, 1), ..Default::default() },
        ];
        let g = LoadGuard::new(3);
        assert!(!g.admits(&loads, 0), "load 3 at threshold 3 is overloaded");
        assert!(g.admits(&loads, 1));
        assert!(g.admits(&loads, 2), "a full KV cache with a short queue is under the cap");
        assert!(!g.admits(&loads, 3), "the server's waiting + running reach the cap");
        assert!(g.admits(&loads, 7), "missing entries are idle");
    }
}
