//! LEAST_OUTSTANDING_REQUESTS: the endpoint with the fewest outstanding requests.

use super::{PickInput, Policy};
use crate::decision::{Decision, Reason};
use crate::endpoint::{Endpoint, EndpointLoad};
use crate::load::load_at;

/// Picks the endpoint with the lowest [`EndpointLoad::effective`] load; among equals, the caller's randomness
/// chooses (so idle endpoints share traffic evenly instead of the first one taking everything).
#[derive(Debug, Default, Clone)]
pub struct LeastOutstandingPolicy;

/// Position of a least-loaded endpoint, ties broken by `random`. `None` for an empty list.
pub fn pick_least(random: u64, n: usize, loads: &[EndpointLoad]) -> Option<usize> {
    let min = (0..n).map(|i| load_at(loads, i).effective()).min()?;
    let ties = (0..n).filter(|&i| load_at(loads, i).effective() == min).count();
    let nth = (random % ties as u64) as usize;
    (0..n).filter(|&i| load_at(loads, i).effective() == min).nth(nth)
}

impl Policy for LeastOutstandingPolicy {
    fn name(&self) -> &'static str {
        "LEAST_OUTSTANDING_REQUESTS"
    }

    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        let i = pick_least(input.random, endpoints.len(), loads)?;
        Some(Decision::new(endpoints, i, Reason::LeastOutstanding))
    }

    fn reconfigure(&mut self, _settings: &crate::Settings) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    use crate::endpoint::ServerLoad;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn picks_least_loaded_and_breaks_ties_randomly() {
        let eps: Vec<Endpoint> = (0..3).map(|i| Endpoint::new(format!("127.0.0.1:{}", 9000 + i), i)).collect();
        let loads = [EndpointLoad::in_flight(5), EndpointLoad::in_flight(1), EndpointLoad::in_flight(1)];
        let mut p = LeastOutstandingPolicy;
        let mut seen = [0usize; 3];
        for r in 0..100u64 {
            let d = p.pick(&PickInput { random: r, ..Default::default() }, &eps, &loads).unwrap();
            seen[d.endpoint] += 1;
        }
        assert_eq!(seen, [0, 50, 50]);
        // Server-reported queue counts as load.
        let loads = [
            EndpointLoad::in_flight(2),
            EndpointLoad {
                server: Some(ServerLoad { waiting: 4, running: 2, kv_cache_usage: 0.5 }),
                ..Default::default()
            },
            EndpointLoad::in_flight(3),
        ];
        assert_eq!(p.pick(&PickInput::default(), &eps, &loads).unwrap().endpoint, 0);
    }
}
