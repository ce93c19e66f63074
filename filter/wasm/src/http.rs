//! Per-request work: strip client-sent destination headers, buffer the body (up to `max_body_bytes`), extract the
//! key, pick an endpoint, set `x-gateway-destination-endpoint`, count, and release the in-flight slot in `on_log`.
//!
//! Fail open: any request without a usable key (no body, body over the limit, bad JSON, non-UTF-8, missing fields,
//! bad tenant id) is still routed — by the router's fallback pick (least outstanding requests) — and counted under
//! `warmpath.fail_open.<cause>`. Nothing here returns an error to the client.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use warmpath_core::{extract_key, EndpointLoad, PickInput, RequestKey};

use crate::root::{now_ms, random_u64, Shared};
use crate::{feed, metrics, shared, DEBUG_HEADER, DESTINATION_HEADER, ORIGINAL_DST_HEADER};

/// Fail-open causes decided by the shell (the core's `ExtractError::as_str` labels cover bad bodies).
mod cause {
    /// The request has no body (GET, or an empty POST).
    pub const NO_BODY: &str = "no_body";
    /// The body is larger than `max_body_bytes`; it is forwarded unparsed.
    pub const BODY_TOO_LARGE: &str = "body_too_large";
    /// The host did not hand out the buffered body.
    pub const BODY_UNAVAILABLE: &str = "body_unavailable";
}

/// State of one HTTP stream.
pub struct FilterHttp {
    context_id: u32,
    shared: Option<Rc<Shared>>,
    path: String,
    tenant: Option<String>,
    /// True from `on_http_request_headers` (with a body coming) until the pick is made.
    waiting_for_body: bool,
    /// The endpoint whose in-flight counter this stream holds; released exactly once in `on_log`.
    in_flight: Option<String>,
    debug: Option<String>,
}

impl FilterHttp {
    /// A stream of `context_id` using the root context's settings and router (`None`: unconfigured, pass through).
    pub fn new(context_id: u32, shared: Option<Rc<Shared>>) -> Self {
        FilterHttp { context_id, shared, path: String::new(), tenant: None, waiting_for_body: false, in_flight: None, debug: None }
    }

    /// Reads the request headers in one host call: removes any client-sent destination header (counting one
    /// removal per request that carried any) and keeps `:path` and the tenant header.
    fn read_headers(&mut self, tenant_header: Option<&str>) {
        let mut spoofed = false;
        for (name, value) in self.get_http_request_headers() {
            // Envoy hands header names lower-cased.
            match name.as_str() {
                DESTINATION_HEADER | ORIGINAL_DST_HEADER => spoofed = true,
                ":path" => self.path = value,
                n if Some(n) == tenant_header && self.tenant.is_none() => self.tenant = Some(value),
                _ => {}
            }
        }
        if spoofed {
            // Setting to None removes every value of the header.
            self.set_http_request_header(DESTINATION_HEADER, None);
            self.set_http_request_header(ORIGINAL_DST_HEADER, None);
            metrics::count("warmpath.spoofed_header_removed", 1);
        }
    }

    /// Routes with the body at hand: extract the key (counting the failure cause) and pick.
    fn route_body(&mut self, body: Option<&[u8]>) {
        let Some(shared) = self.shared.clone() else { return };
        let Some(body) = body else {
            self.route(&shared, None, Some(cause::BODY_UNAVAILABLE));
            return;
        };
        match extract_key(&self.path, body, self.tenant.as_deref(), shared.settings.prefix_length) {
            Ok(key) => self.route(&shared, Some(&key), None),
            Err(e) => self.route(&shared, None, Some(e.as_str())),
        }
    }

    /// Picks an endpoint for `key` (`None`: fail open for `cause`), takes an in-flight slot, sets the header.
    fn route(&mut self, shared: &Shared, key: Option<&RequestKey>, cause: Option<&str>) {
        self.waiting_for_body = false;
        let Ok(mut router) = shared.router.try_borrow_mut() else { return };
        // This gateway's in-flight count (all workers) plus what the feed says the server itself reports.
        let table = shared::Table::read();
        let loads: Vec<EndpointLoad> = router
            .endpoints()
            .iter()
            .map(|e| EndpointLoad { in_flight: table.get(&e.address), server: feed::server_load(&e.address) })
            .collect();
        let input = PickInput { key, random: random_u64(u64::from(self.context_id)), now_ms: now_ms(), ..PickInput::default() };
        let Some(decision) = router.route(&input, &loads) else {
            // No endpoints known yet (feed not delivered): leave the header unset so Envoy's fallback policy routes.
            metrics::fail_open("no_endpoints");
            shared.metrics.record(warmpath_core::Reason::FailOpen, None);
            return;
        };
        drop(router);
        if let Some(c) = cause {
            metrics::fail_open(c);
        }
        let matched = (key.is_some() && shared.keyless.is_none()).then_some(decision.matched_len);
        shared.metrics.record(decision.reason, matched);
        // Take the slot from the table the decision was made on; a concurrent change retries the increment only.
        match shared::add(&decision.address, 1, Some(table)) {
            Some(_) => self.in_flight = Some(decision.address.clone()),
            None => metrics::count("warmpath.cas_failures", 1),
        }
        self.set_http_request_header(DESTINATION_HEADER, Some(&decision.address));
        if shared.settings.debug_header {
            self.debug = Some(format!("{};{};matched={}", decision.address, decision.reason.as_str(), decision.matched_len));
        }
    }
}

impl Context for FilterHttp {}

impl HttpContext for FilterHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // First, on every request, whatever happens next: the client does not choose the destination.
        let shared = self.shared.clone();
        self.read_headers(shared.as_ref().map(|s| s.settings.tenant_header.as_str()));
        let Some(shared) = shared else { return Action::Continue };
        if let Some(key) = &shared.keyless {
            // RANDOM / LEAST_OUTSTANDING_REQUESTS ignore the body: decide now, no buffering.
            self.route(&shared, Some(key), None);
            return Action::Continue;
        }
        if end_of_stream {
            self.route(&shared, None, Some(cause::NO_BODY));
            return Action::Continue;
        }
        // Hold the headers until the body is buffered (needs `allow_on_headers_stop_iteration: true`).
        self.waiting_for_body = true;
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.waiting_for_body {
            return Action::Continue;
        }
        let Some(shared) = self.shared.clone() else { return Action::Continue };
        if body_size > shared.settings.max_body_bytes {
            // Stop buffering here so the body never approaches Envoy's buffer limit (which would be a 413).
            self.route(&shared, None, Some(cause::BODY_TOO_LARGE));
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        if body_size == 0 {
            self.route(&shared, None, Some(cause::NO_BODY));
            return Action::Continue;
        }
        let body = self.get_http_request_body(0, body_size);
        self.route_body(body.as_deref());
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // A body followed by trailers never reports end_of_stream in the body callback.
        if self.waiting_for_body {
            let body = self.get_http_request_body(0, usize::MAX);
            match body {
                Some(b) if !b.is_empty() => self.route_body(Some(&b)),
                _ => {
                    if let Some(shared) = self.shared.clone() {
                        self.route(&shared, None, Some(cause::NO_BODY));
                    }
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(d) = self.debug.take() {
            self.set_http_response_header(DEBUG_HEADER, Some(&d));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // Runs once for every stream that ends — finished, reset by either side, or aborted by the client.
        if let Some(address) = self.in_flight.take() {
            if shared::add(&address, -1, None).is_none() {
                metrics::count("warmpath.cas_failures", 1);
            }
        }
    }
}
