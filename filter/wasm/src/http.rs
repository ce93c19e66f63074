//! Per-request work: skip requests for another instance's upstream cluster (`upstream_clusters`), strip
//! client-sent destination headers, buffer the body (up to `max_body_bytes`), extract the
//! key, pick an endpoint, set `x-gateway-destination-endpoint`, count, and release the in-flight slot in `on_log`.
//!
//! Fail open: any request without a usable key (no body, body over the limit, bad JSON, non-UTF-8, missing fields,
//! bad tenant id) is still routed — by the router's fallback pick (least outstanding requests) — and counted under
//! `warmpath.fail_open.<cause>`. Nothing here returns an error to the client.
//!
//! The settings in force are the router's (see `root`), read once when the request headers arrive.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};
use warmpath_core::headers::{ENVOY_RETRY_ON_HEADER, RETRY_ON};
use warmpath_core::{extract_key, EndpointLoad, PickInput, Reason, RequestKey, Strategy};

use crate::outcome::Outcome;
use crate::root::{now_ms, random_u64, Shared};
use crate::stream::{Mode, RouteOn, Step, Stream};
use crate::{health, shared, DEBUG_HEADER, DECISION_PROPERTY, DESTINATION_HEADER, ORIGINAL_DST_HEADER};

/// Counters of passive failure learning (`health`).
mod metric {
    /// Picks that landed on an endpoint in back-off and went to the least-loaded endpoint that is up instead.
    pub const PICKS_AVOIDED_DOWN: &str = "warmpath.picks_avoided_down";
    /// Requests whose picked endpoint failed them before answering (connect failure, reset, 502/503/504, or a
    /// retry elsewhere; not an oversized upload cut short, `outcome::classify`): each starts or extends that
    /// endpoint's back-off.
    pub const ENDPOINT_FAILURES: &str = "warmpath.endpoint_failures";
    /// Requests Envoy sent to another host on the only attempt: the pick was not honoured (not a cluster member).
    pub const PICKS_NOT_HONOURED: &str = "warmpath.picks_not_honoured";
}

/// Fail-open causes decided by the shell (the core's `ExtractError::as_str` labels cover bad bodies).
mod cause {
    /// The request has no body (GET, or an empty POST).
    pub const NO_BODY: &str = "no_body";
    /// The body is larger than `max_body_bytes`; it is forwarded unparsed.
    pub const BODY_TOO_LARGE: &str = "body_too_large";
    /// The host did not hand out the buffered body.
    pub const BODY_UNAVAILABLE: &str = "body_unavailable";
}

/// Sets (or with `None` removes every value of) a request header. Host errors are ignored: the SDK's trait method
/// would panic on them, and a request must never fail here.
fn set_request_header(name: &str, value: Option<&str>) {
    let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value);
}

/// The first `max` bytes of the buffered request body (`None` on a host error).
fn request_body(max: usize) -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::HttpRequestBody, 0, max).ok().flatten()
}

/// The upstream cluster of the route Envoy selected for this request (Envoy attribute `xds.cluster_name`; the
/// connection manager resolves the route before the HTTP filters run), `None` when Envoy reports none (no route
/// matched, unknown cluster, or a host without the attribute).
fn upstream_cluster() -> Option<String> {
    hostcalls::get_property(vec!["xds", "cluster_name"])
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Most (list, cluster) pairs [`note_other_cluster`] remembers per VM (Envoy's clusters and the policies on one
/// listener bound them anyway).
const NOTED_CLUSTERS: usize = 64;

thread_local! {
    // (upstream_clusters, cluster) pairs this VM has logged as left alone: instances of several policies share a VM,
    // and each logs its own list. Compared in place, so a request for a cluster already noted allocates nothing.
    static NOTED: std::cell::RefCell<Vec<(Vec<String>, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Logs, once per cluster, list and VM, that requests for `cluster` are left alone because it is not in
/// `upstream_clusters`: normal for another policy's cluster on a shared listener, and the one trace of a misspelt
/// list, which turns this instance off (the counter `warmpath.requests_skipped_other_cluster` keeps counting).
fn note_other_cluster(cluster: Option<&str>, upstream_clusters: &[String]) {
    let name = cluster.unwrap_or("(none)");
    let first = NOTED.with(|n| {
        let mut n = n.borrow_mut();
        let seen = n.iter().any(|(list, c)| c == name && list.as_slice() == upstream_clusters);
        let first = !seen && n.len() < NOTED_CLUSTERS;
        if first {
            n.push((upstream_clusters.to_vec(), name.to_string()));
        }
        first
    });
    if first {
        log::info!(
            "requests for Envoy cluster {name} are not routed by this instance: upstream_clusters is {}; counted \
             in warmpath.requests_skipped_other_cluster, logged once per cluster and list",
            upstream_clusters.join(",")
        );
    }
}

/// The settings one request is handled with, copied from the router when its headers arrive.
#[derive(Debug, Clone, Copy)]
struct Params {
    strategy: Strategy,
    prefix_length: usize,
    max_body_bytes: usize,
    debug_header: bool,
}

/// State of one HTTP stream.
pub struct FilterHttp {
    context_id: u32,
    shared: Option<Rc<Shared>>,
    params: Option<Params>,
    path: String,
    tenant: Option<String>,
    /// The request's `content-length`, when valid (bytes).
    content_length: Option<u64>,
    /// Pause/route/slot bookkeeping (`stream`).
    stream: Stream,
    /// When this request claimed the probe of an endpoint whose back-off expired (ms; `health::place`).
    probe: Option<u64>,
    /// Size of the buffered request body, bytes (0 until it is read).
    body_len: usize,
    /// The debug header's value (`debug_header: true`), added to the response headers.
    debug: Option<String>,
    /// When this request was sent (ms) and the prefill bytes charged for it, if it matched nothing in the index
    /// and its endpoint had none of this Envoy's prefill work pending then: a sample of the pool's prefill speed at
    /// its first byte (`shared::add_prefill_sample`).
    prefill_sample: Option<(u64, u32)>,
}

impl FilterHttp {
    /// A stream of `context_id` using the root context's router (`None`: unconfigured, only strip headers).
    pub fn new(context_id: u32, shared: Option<Rc<Shared>>) -> Self {
        FilterHttp {
            context_id,
            shared,
            params: None,
            path: String::new(),
            tenant: None,
            content_length: None,
            stream: Stream::new(),
            probe: None,
            body_len: 0,
            debug: None,
            prefill_sample: None,
        }
    }

    /// True when this instance's `upstream_clusters` is set and the request's upstream cluster is not in it (or
    /// unknown): the request belongs to another instance (or to no warmpath policy) and must be left alone. One
    /// host call, only when the list is non-empty.
    fn for_other_cluster(&self) -> bool {
        let Some(shared) = &self.shared else { return false };
        let Ok(router) = shared.router.try_borrow() else { return false };
        let settings = router.settings();
        if settings.upstream_clusters.is_empty() {
            return false;
        }
        let cluster = upstream_cluster();
        let other = !settings.acts_on_cluster(cluster.as_deref());
        if other {
            note_other_cluster(cluster.as_deref(), &settings.upstream_clusters);
        }
        other
    }

    /// Reads the request headers in one host call: removes any client-sent destination header (counting one
    /// removal per request that carried any), keeps `:path`, `content-length` and the tenant header, and fixes the
    /// request's parameters from the router's settings.
    fn read_headers(&mut self) {
        let shared = self.shared.clone();
        let router = shared.as_ref().and_then(|s| s.router.try_borrow().ok());
        let settings = router.as_ref().map(|r| r.settings());
        let tenant_header = settings.map(|s| s.tenant_header.as_str());
        self.params = settings.map(|s| Params {
            strategy: s.strategy,
            prefix_length: s.prefix_length,
            max_body_bytes: s.max_body_bytes,
            debug_header: s.debug_header,
        });
        let mut spoofed = false;
        // Values as bytes: HTTP allows non-UTF-8 (obs-text) header values, and the SDK's String variant panics on
        // them. Names are tokens (ASCII), validated by Envoy's codecs.
        for (name, value) in hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_default() {
            // Envoy hands header names lower-cased.
            match name.as_str() {
                DESTINATION_HEADER | ORIGINAL_DST_HEADER => spoofed = true,
                ":path" => self.path = String::from_utf8_lossy(&value).into_owned(),
                "content-length" => self.content_length = std::str::from_utf8(&value).ok().and_then(|v| v.parse().ok()),
                // A non-UTF-8 tenant id becomes U+FFFD characters, which the core rejects as an invalid tenant.
                n if Some(n) == tenant_header && self.tenant.is_none() => {
                    self.tenant = Some(String::from_utf8_lossy(&value).into_owned())
                }
                _ => {}
            }
        }
        drop(router);
        if spoofed {
            // Setting to None removes every value of the header.
            set_request_header(DESTINATION_HEADER, None);
            set_request_header(ORIGINAL_DST_HEADER, None);
            if let Some(shared) = &shared {
                shared.metrics.count("warmpath.spoofed_header_removed", 1);
            }
        }
    }

    /// Routes with the body at hand: extract the key (counting the failure cause) and pick.
    fn route_body(&mut self, shared: &Shared, params: Params, body: Option<&[u8]>) {
        let Some(body) = body else {
            self.route(shared, params, None, Some(cause::BODY_UNAVAILABLE));
            return;
        };
        self.body_len = body.len();
        match extract_key(&self.path, body, self.tenant.as_deref(), params.prefix_length) {
            Ok(key) => self.route(shared, params, Some(&key), None),
            Err(e) => self.route(shared, params, None, Some(e.as_str())),
        }
    }

    /// Picks an endpoint for `key` (`None`: fail open for `cause`), takes an in-flight slot, sets the header.
    fn route(&mut self, shared: &Shared, params: Params, key: Option<&RequestKey>, cause: Option<&str>) {
        let Ok(mut router) = shared.router.try_borrow_mut() else { return };
        // What the other workers routed since this VM's last pick, so this pick knows it (`exchange`).
        shared.exchange.drain(&mut router, &shared.metrics);
        // This gateway's in-flight count and pending prefill work (all workers), plus the pending work the other
        // gateways reported through the feed; the router adds what its feed says the server itself reports.
        let table = shared::Table::read();
        let prefix_aware = router.settings().strategy == Strategy::PrefixAware;
        let now = now_ms();
        let remote = shared
            .remote_pending
            .as_ref()
            .filter(|_| prefix_aware)
            .map(|(key, age)| shared::Remote::read(key, now, *age));
        let own = table.per_endpoint(&router);
        let others = remote.as_ref().map(|r| r.per_endpoint(&router));
        let at_others = |i: usize| others.as_ref().map_or(0, |o| o[i]);
        // Once a prefill speed is learned — the endpoint's own, or the pool's until it has one (`prefill_rate`) —
        // this Envoy's pending work on an endpoint drains at that speed from the last moment its queue there was
        // known exactly, sharing the speed with the other gateways' work there (`PrefillEstimate::left_after`),
        // which counts as the feed last reported it. Pending work is PREFIX_AWARE's alone (another instance on this
        // listener may have charged some on a shared endpoint).
        let own_left = |i: usize| match own[i].pending_for_ms(now) {
            _ if !prefix_aware => 0,
            Some(ms) => match router.prefill_estimate_at(i) {
                Some(estimate) => estimate.left_after(own[i].pending, at_others(i), ms),
                None => own[i].pending,
            },
            None => own[i].pending,
        };
        let loads: Vec<EndpointLoad> = (0..own.len())
            .map(|i| EndpointLoad {
                in_flight: own[i].in_flight,
                pending_prefill: own_left(i).saturating_add(at_others(i)),
                server: None,
            })
            .collect();
        let input = PickInput {
            key,
            random: random_u64(u64::from(self.context_id)),
            body_len: self.body_len,
            ..PickInput::default()
        };
        let strategy = router.settings().strategy;
        let routed = router.route(&input, &loads);
        if let Some(record) = router.take_index_record() {
            shared.exchange.publish(&record, &shared.metrics);
        }
        let Some(mut decision) = routed else {
            // No endpoints known yet (feed not delivered): leave the header unset so Envoy's fallback policy routes.
            self.set_debug(params, strategy, Some("no_endpoints"));
            shared.metrics.fail_open("no_endpoints");
            shared.metrics.decision(strategy, Reason::FailOpen, None);
            return;
        };
        // Passive failure learning: a pick on an endpoint in back-off goes to the least-loaded endpoint that is up.
        let placement = health::place(router.endpoints(), &loads, decision.endpoint, now);
        let avoided = placement.instead.is_some();
        if let Some(address) = placement.instead {
            shared.metrics.count(metric::PICKS_AVOIDED_DOWN, 1);
            decision.address = address;
        }
        self.probe = placement.probe.then_some(now);
        drop(router);
        if let Some(c) = cause {
            shared.metrics.fail_open(c);
        }
        let matched = (key.is_some() && strategy == Strategy::PrefixAware).then_some(decision.matched_len);
        shared.metrics.decision(strategy, decision.reason, matched);
        // Take the slot and charge the prefill work in one write, from the table the decision was made on; a
        // concurrent change retries the write only.
        let bytes = decision.prefill_bytes.min(i32::MAX as u32);
        match shared::update(&decision.address, Some(table), |load| load.take(bytes, now)) {
            Some(_) => {
                self.stream.took_slot(decision.address.clone());
                if bytes > 0 {
                    self.stream.took_pending(decision.address.clone(), bytes);
                    // A sample of the prefill speed: no pending work was known there, this gateway's (undrained) or
                    // the other gateways'.
                    let queued = own[decision.endpoint].pending.saturating_add(at_others(decision.endpoint));
                    let idle = !avoided && decision.matched_len == 0 && queued == 0;
                    self.prefill_sample = idle.then_some((now, bytes));
                }
            }
            None => shared.metrics.count("warmpath.cas_failures", 1),
        }
        set_request_header(DESTINATION_HEADER, Some(&decision.address));
        // The retry conditions the pick relies on, whatever the route's own policy says (`ENVOY_RETRY_ON_HEADER`).
        set_request_header(ENVOY_RETRY_ON_HEADER, Some(RETRY_ON));
        // For the operator (access logs), never the client: the pick, why, and how much of the prompt other
        // requests already sent.
        let record = format!("{};{};matched={}", decision.address, decision.reason.as_str(), decision.matched_len);
        let _ = hostcalls::set_property(vec![DECISION_PROPERTY], Some(record.as_bytes()));
        self.set_debug(params, strategy, cause);
    }

    /// Keeps the debug header's value when `debug_header` is on: the strategy and the request's own fail-open
    /// cause, nothing that depends on other clients' requests or on load (see `DEBUG_HEADER`).
    fn set_debug(&mut self, params: Params, strategy: Strategy, cause: Option<&str>) {
        if params.debug_header {
            self.debug = Some(match cause {
                Some(c) => format!("{};fail_open={c}", strategy.as_str()),
                None => strategy.as_str().to_string(),
            });
        }
    }
}

impl Context for FilterHttp {}

impl FilterHttp {
    /// Gives back this stream's pending prefill work if the state machine says it is time, and `slot` (the slot
    /// of a stream that ended), in one write per endpoint.
    fn release(&mut self, slot: Option<String>) {
        let pending = self.stream.take_pending();
        let now = now_ms();
        // The queue is known exactly again: the next request's prefill starts now, or nothing is left.
        let written = match (pending, slot) {
            (Some((address, bytes)), Some(slot)) if address == slot => shared::update(&address, None, |load| {
                load.release_pending(bytes, now);
                load.release_slot();
            })
            .is_some(),
            (pending, slot) => {
                let released = |(a, bytes): (String, u32)| shared::update(&a, None, |l| l.release_pending(bytes, now));
                let pending_done = pending.is_none_or(|p| released(p).is_some());
                slot.is_none_or(|a| shared::update(&a, None, |l| l.release_slot()).is_some()) && pending_done
            }
        };
        if !written {
            if let Some(shared) = &self.shared {
                shared.metrics.count("warmpath.cas_failures", 1);
            }
        }
    }
}

impl FilterHttp {
    /// Carries out a step of the stream state machine.
    fn run(&mut self, step: Step) -> Action {
        let on = match step {
            Step::Continue => return Action::Continue,
            Step::Pause => return Action::Pause,
            Step::Route(on) => on,
        };
        let (Some(shared), Some(params)) = (self.shared.clone(), self.params) else { return Action::Continue };
        match on {
            RouteOn::Keyless => self.route(&shared, params, Some(&shared.keyless), None),
            RouteOn::NoBody => self.route(&shared, params, None, Some(cause::NO_BODY)),
            RouteOn::BodyTooLarge => self.route(&shared, params, None, Some(cause::BODY_TOO_LARGE)),
            RouteOn::Body { len } => {
                let body = request_body(len);
                self.route_body(&shared, params, body.as_deref());
            }
            RouteOn::BodyBeforeTrailers { max } => match request_body(max) {
                Some(b) if !b.is_empty() => self.route_body(&shared, params, Some(&b)),
                _ => self.route(&shared, params, None, Some(cause::NO_BODY)),
            },
        }
        Action::Continue
    }
}

impl HttpContext for FilterHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // Another instance's request (several policies on one listener): not even the destination header is
        // ours to touch — the instance whose cluster it is strips it, and stripping here could remove that
        // instance's pick when it runs earlier in the chain. Nothing is held, so the later callbacks do nothing.
        if self.for_other_cluster() {
            if let Some(shared) = &self.shared {
                shared.metrics.skipped_other_cluster();
            }
            let step = self.stream.on_request_headers(Mode::PassThrough, end_of_stream);
            return self.run(step);
        }
        // First, on every request this instance handles, whatever happens next: the client does not choose the
        // destination.
        self.read_headers();
        let mode = match (&self.shared, self.params) {
            (Some(_), Some(p)) if p.strategy != Strategy::PrefixAware => {
                Mode::Keyless { max_body_bytes: p.max_body_bytes, content_length: self.content_length }
            }
            (Some(_), Some(p)) => Mode::Body { max_body_bytes: p.max_body_bytes, content_length: self.content_length },
            _ => Mode::PassThrough,
        };
        let step = self.stream.on_request_headers(mode, end_of_stream);
        self.run(step)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let step = self.stream.on_request_body(body_size, end_of_stream);
        self.run(step)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let step = self.stream.on_request_trailers();
        self.run(step)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let status = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse::<u16>().ok());
        self.stream.on_response_headers(status);
        if let Some(claimed) = self.probe.take() {
            // This request probes an endpoint whose back-off expired: its answer decides at once, so the requests
            // waiting out the probe window need not wait for the end of a long (streamed) response.
            if let Some(address) = self.stream.slot() {
                health::learn(address, now_ms(), self.stream.oversized(), Some(claimed));
            }
        }
        if let Some(d) = self.debug.take() {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, DEBUG_HEADER, Some(&d));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if self.stream.on_response_body(body_size) {
            self.release(None);
            let sample = self.prefill_sample.take();
            if let (Some((sent, bytes)), Some(shared), Some(address)) = (sample, &self.shared, self.stream.slot()) {
                // Into the pool's fit and this endpoint's, which every worker shares; this worker routes with the
                // result at once, the others from their next tick. Fits of endpoints that left the pool are dropped.
                let ms = now_ms().saturating_sub(sent);
                let Ok(mut router) = shared.router.try_borrow_mut() else { return Action::Continue };
                let keep = |a: &str| router.position(a).is_some();
                match shared::add_prefill_sample(&shared.prefill_fit, address, bytes, ms, keep) {
                    Some(fits) => router.set_prefill_fits(&fits),
                    None => shared.metrics.count("warmpath.cas_failures", 1),
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // Runs once for every stream that ends — finished, reset by either side, or aborted by the client.
        let Some(ended) = self.stream.on_end() else { return };
        if let Some(address) = &ended.slot {
            // A probe whose response headers never came (reset, cut short) is learnt from here.
            let outcome = health::learn(address, now_ms(), ended.oversized, self.probe.take());
            if let Some(shared) = &self.shared {
                match outcome {
                    Outcome::Failed => shared.metrics.count(metric::ENDPOINT_FAILURES, 1),
                    Outcome::NotHonoured => shared.metrics.count(metric::PICKS_NOT_HONOURED, 1),
                    Outcome::Succeeded | Outcome::Unknown => {}
                }
            }
        }
        self.release(ended.slot);
    }
}
