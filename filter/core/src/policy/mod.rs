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
mod scan;

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
    /// Size of the request body in bytes, or 0 when unknown. When the key was cut at `prefix_length`
    /// (`key.truncated`), PREFIX_AWARE takes it as the prompt's length for the uncached-work estimate (the text
    /// past the key is never in the index, so all of it is uncached).
    pub body_len: usize,
    /// Each endpoint's extra prefill time per byte, parallel to the endpoints, in
    /// [`crate::prefill_rate::SLOWDOWN_UNIT`]ths of the fastest endpoint's
    /// ([`crate::prefill_rate::PrefillFits::slowdowns`]); empty when no endpoint is told apart from the fastest
    /// (missing entries count as 0). PREFIX_AWARE predicts in time when it is not empty.
    pub slowdowns: &'a [u32],
}

/// A routing policy. `pick` is the only required method; the hooks default to doing nothing.
pub trait Policy: Send {
    /// Metric label of the policy (the strategy name, e.g. `PREFIX_AWARE`).
    fn name(&self) -> &'static str;

    /// Chooses an endpoint for one request and updates the policy's own state for it (e.g. records the prefix
    /// in the index) in the same call: one call per request, so nothing is carried between a choice and its
    /// bookkeeping. `loads[i]` belongs to `endpoints[i]` (missing entries count as idle).
    /// Returns `None` only when `endpoints` is empty.
    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision>;

    /// Called when the endpoint set changed; `endpoints` is the new set.
    fn on_endpoints_changed(&mut self, _endpoints: &[Endpoint]) {}

    /// Offers new settings of the same strategy. Returns true if the policy adopted them in place (keeping its
    /// state); false asks the router to build a fresh policy.
    fn reconfigure(&mut self, _settings: &Settings) -> bool {
        false
    }

    /// The chain the last `pick` recorded in the policy's index (empty when it recorded nothing, or the policy
    /// keeps no index), for the other routers serving the same traffic ([`crate::exchange`]).
    fn last_recorded(&self) -> &[u64] {
        &[]
    }

    /// Records `chain` under endpoint `id` as if this policy had routed it: what another router serving the same
    /// traffic recorded ([`crate::exchange`]). Policies without an index ignore it.
    fn learn(&mut self, _chain: &[u64], _id: u32) {}
}
