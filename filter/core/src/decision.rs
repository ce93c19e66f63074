//! The outcome of one routing decision.

use crate::endpoint::Endpoint;

/// Why an endpoint was chosen. Labels from [`Reason::as_str`] are stable metric labels and debug-header values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// RANDOM strategy.
    Random,
    /// LEAST_OUTSTANDING_REQUESTS strategy, or PREFIX_AWARE with no text to key on.
    LeastOutstanding,
    /// PREFIX_AWARE: an endpoint holding the longest useful prefix match in the index.
    PrefixMatch,
    /// PREFIX_AWARE: the rendezvous-hash choice for the request's key (no useful match): its top, or its next
    /// top when the index places more than the load bound on the first.
    ConsistentPick,
    /// PREFIX_AWARE: the preferred endpoint (the holder of the longest useful match, else the key's rendezvous
    /// top) was at `concurrency_threshold`, or another candidate had a lower predicted time to first token (or
    /// an equal one, the key's tops being past the load bound).
    Overflow,
    /// No key could be extracted (bad body, GET, too large...): routed by least outstanding requests.
    FailOpen,
}

impl Reason {
    /// Stable snake_case label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Random => "random",
            Reason::LeastOutstanding => "least_outstanding",
            Reason::PrefixMatch => "prefix_match",
            Reason::ConsistentPick => "consistent_pick",
            Reason::Overflow => "overflow",
            Reason::FailOpen => "fail_open",
        }
    }

    /// Every reason, in declaration order (for registering metrics up front).
    pub const ALL: [Reason; 6] = [
        Reason::Random,
        Reason::LeastOutstanding,
        Reason::PrefixMatch,
        Reason::ConsistentPick,
        Reason::Overflow,
        Reason::FailOpen,
    ];
}

/// A routing decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Position of the chosen endpoint in the router's current endpoint list.
    pub endpoint: usize,
    /// Its `IP:port`, the value for `x-gateway-destination-endpoint`.
    pub address: String,
    /// Why it was chosen.
    pub reason: Reason,
    /// Full blocks of the request's prefix the index says the chosen endpoint served (0 when unknown).
    pub matched_blocks: u32,
    /// Bytes of extracted text covered by that match (full blocks plus a matched partial-block checkpoint).
    pub matched_len: usize,
    /// Prefill work this request is expected to cost the chosen endpoint, in bytes of prompt text (prompt length
    /// minus `matched_len`; 0 for policies that do not estimate it). The shell adds it to the endpoint's
    /// [`crate::EndpointLoad::pending_prefill`] until the first response byte arrives.
    pub prefill_bytes: u32,
}

impl Decision {
    /// A decision for `endpoints[i]` with no prefix match.
    pub fn new(endpoints: &[Endpoint], i: usize, reason: Reason) -> Decision {
        Decision {
            endpoint: i,
            address: endpoints[i].address.clone(),
            reason,
            matched_blocks: 0,
            matched_len: 0,
            prefill_bytes: 0,
        }
    }

    /// Sets the matched prefix.
    pub fn with_match(mut self, blocks: u32, len: usize) -> Decision {
        self.matched_blocks = blocks;
        self.matched_len = len;
        self
    }
}
