//! Endpoints (model-server upstream hosts) and their load as seen by the gateway.

/// One model-server endpoint. Identity is the address: the router gives every distinct address a stable
/// numeric `id` that survives endpoint-set changes, so the prefix index keeps its entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// `IP:port` as Envoy's override_host policy expects it (IPv6 as `[addr]:port`), canonical `SocketAddr` form.
    pub address: String,
    /// Stable id of this address inside one [`crate::Router`] (not meaningful across routers or replicas).
    pub id: u32,
}

impl Endpoint {
    /// An endpoint with the given address and id.
    pub fn new(address: impl Into<String>, id: u32) -> Endpoint {
        Endpoint { address: address.into(), id }
    }
}

/// `address` as one token of an Envoy stat name: every character other than an ASCII letter or digit becomes `_`
/// (`10.0.0.1:8000` → `10_0_0_1_8000`, `[::1]:80` → `___1__80`). The filter's per-endpoint gauges end with it.
pub fn stat_token(address: &str) -> String {
    address.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// Load reported by the model server itself (fed later by the controller from the server's metrics).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ServerLoad {
    /// Requests queued at the server, not yet scheduled (e.g. vLLM `num_requests_waiting`).
    pub waiting: u32,
    /// Requests being decoded/prefilled at the server (e.g. vLLM `num_requests_running`).
    pub running: u32,
    /// Fraction of the KV cache in use, 0.0..=1.0 (e.g. vLLM `gpu_cache_usage_perc`).
    pub kv_cache_usage: f32,
}

impl ServerLoad {
    /// The report moved by this gateway's own change there since it was taken: its in-flight count went from
    /// `then` to `now`. Requests sent since wait (`waiting` grows); requests finished since leave, from `waiting`
    /// first, then `running`, down to none.
    pub fn moved_by(self, now: u32, then: u32) -> ServerLoad {
        if now >= then {
            return ServerLoad { waiting: self.waiting.saturating_add(now - then), ..self };
        }
        let gone = then - now;
        let from_waiting = gone.min(self.waiting);
        ServerLoad {
            waiting: self.waiting - from_waiting,
            running: self.running.saturating_sub(gone - from_waiting),
            ..self
        }
    }
}

/// Load of one endpoint as the router sees it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EndpointLoad {
    /// Requests this gateway has sent to the endpoint that have not finished (shared across Envoy workers).
    pub in_flight: u32,
    /// Server-side load, when the feed provides it.
    pub server: Option<ServerLoad>,
    /// Prefill work sent to the endpoint that has not produced its first response byte yet, in bytes of prompt
    /// text: the sum of [`crate::Decision::prefill_bytes`] of the requests this gateway sent (shared across Envoy
    /// workers), plus what the other gateways reported through the feed ([`crate::exchange`]; as the feed last
    /// answered, renewed every tick while it answers).
    /// It is the queue a new request waits behind before its own prefill starts. Once the gateway has learned the
    /// pool's prefill speed, the shell passes its own part drained at that speed
    /// ([`crate::prefill_rate::PrefillEstimate::left_after`]).
    pub pending_prefill: u32,
}

impl EndpointLoad {
    /// Load with only an in-flight count.
    pub fn in_flight(n: u32) -> EndpointLoad {
        EndpointLoad { in_flight: n, ..EndpointLoad::default() }
    }

    /// Outstanding requests used by the policies: the larger of this gateway's in-flight count and the
    /// server's waiting + running count (the server also counts other gateways' requests; in-flight is fresher).
    pub fn effective(&self) -> u32 {
        match self.server {
            Some(s) => self.in_flight.max(s.waiting.saturating_add(s.running)),
            None => self.in_flight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_report_moves_by_what_this_gateway_did_since() {
        let r = ServerLoad { waiting: 3, running: 10, kv_cache_usage: 0.5 };
        assert_eq!(r.moved_by(7, 7), r, "nothing changed");
        assert_eq!((r.moved_by(9, 5).waiting, r.moved_by(9, 5).running), (7, 10), "4 sent since wait");
        assert_eq!((r.moved_by(3, 5).waiting, r.moved_by(3, 5).running), (1, 10), "2 finished: off the queue");
        assert_eq!((r.moved_by(0, 8).waiting, r.moved_by(0, 8).running), (0, 5), "then off the running");
        assert_eq!((r.moved_by(0, 100).waiting, r.moved_by(0, 100).running), (0, 0), "never below none");
        assert_eq!(r.moved_by(0, 100).kv_cache_usage, 0.5);
    }
}
