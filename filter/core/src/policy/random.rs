//! RANDOM: a uniformly random endpoint, from the caller's randomness.

use super::{PickInput, Policy};
use crate::decision::{Decision, Reason};
use crate::endpoint::{Endpoint, EndpointLoad};

/// Picks `endpoints[random mod N]` (the modulo bias is below N/2^64).
#[derive(Debug, Default, Clone)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "RANDOM"
    }

    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], _loads: &[EndpointLoad]) -> Option<Decision> {
        if endpoints.is_empty() {
            return None;
        }
        let i = (input.random % endpoints.len() as u64) as usize;
        Some(Decision::new(endpoints, i, Reason::Random))
    }

    fn reconfigure(&mut self, _settings: &crate::Settings) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn spreads_over_endpoints() {
        let eps: Vec<Endpoint> = (0..4).map(|i| Endpoint::new(format!("127.0.0.1:{}", 9000 + i), i)).collect();
        let mut p = RandomPolicy;
        let mut counts = [0usize; 4];
        // A simple LCG stands in for the filter's random source.
        let mut r = 1u64;
        for _ in 0..4000 {
            r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let d = p.pick(&PickInput { random: r >> 11, ..Default::default() }, &eps, &[]).unwrap();
            assert_eq!(d.reason, Reason::Random);
            counts[d.endpoint] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
        assert!(p.pick(&PickInput::default(), &[], &[]).is_none());
    }
}
