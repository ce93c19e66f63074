//! Routing policies behind one trait (after the SGLang router's `LoadBalancingPolicy`): one file per policy,
//! [`factory::create`] maps a [`crate::Strategy`] to a boxed policy.

use crate::config::Settings;
use crate::decision::Decision;
use crate::endpoint::{Endpoint, EndpointLoad};
use crate::extract::RequestKey;
use crate::prefix::PrefixHashes;

pub mod factory;
pub mod least_outstanding;
pub mod prefix_aware;
pub mod random;

pub use factory::create;
pub use least_outstanding::LeastOutstandingPolicy;
pub use prefix_aware::PrefixAwarePolicy;
pub use random::RandomPolicy;

/// Everything a policy may look at for one request. `Default` so new inputs do not change the trait.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickInput<'a> {
    /// The request's key; `None` when extraction failed or there is no body.
    pub key: Option<&'a RequestKey>,
    /// Block hashes of `key.text`; [`crate::Router::route`] fills this in for PREFIX_AWARE.
    pub prefix: Option<&'a PrefixHashes>,
    /// Caller-supplied randomness (the core has no random source), uniform over u64.
    pub random: u64,
    /// Caller-supplied time in milliseconds (any epoch; only differences matter). The core never reads a clock.
    /// The built-in policies do not use it yet (the prefix index ages by CLOCK eviction, not by time).
    pub now_ms: u64,
}

/// A routing policy. `pick` is the only required method; the hooks default to doing nothing.
pub trait Policy: Send {
    /// Metric label of the policy (the strategy name, e.g. `PREFIX_AWARE`).
    fn name(&self) -> &'static str;

    /// Chooses an endpoint. `loads[i]` belongs to `endpoints[i]` (missing entries count as idle).
    /// Returns `None` only when `endpoints` is empty.
    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision>;

    /// Called after the router used `decision` for `input` (e.g. to update the prefix index).
    fn on_routed(&mut self, _input: &PickInput, _endpoints: &[Endpoint], _decision: &Decision) {}

    /// Called when the endpoint set changed; `endpoints` is the new set.
    fn on_endpoints_changed(&mut self, _endpoints: &[Endpoint]) {}

    /// Offers new settings of the same strategy. Returns true if the policy adopted them in place (keeping its
    /// state); false asks the router to build a fresh policy.
    fn reconfigure(&mut self, _settings: &Settings) -> bool {
        false
    }
}
