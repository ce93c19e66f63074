//! Maps a configured [`Strategy`] to its policy.

use super::{LeastOutstandingPolicy, Policy, PrefixAwarePolicy, RandomPolicy};
use crate::config::{Settings, Strategy};

/// Builds the policy for `settings.strategy`.
pub fn create(settings: &Settings) -> Box<dyn Policy> {
    match settings.strategy {
        Strategy::Random => Box::new(RandomPolicy),
        Strategy::LeastOutstandingRequests => Box::new(LeastOutstandingPolicy),
        Strategy::PrefixAware => Box::new(PrefixAwarePolicy::new(settings)),
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn names_match_strategies() {
        for s in [Strategy::Random, Strategy::LeastOutstandingRequests, Strategy::PrefixAware] {
            let settings = Settings { strategy: s, ..Settings::default() };
            assert_eq!(create(&settings).name(), s.as_str());
        }
    }
}
