//! [`Router`]: settings + endpoint set + policy (with its prefix index) behind one entry point.

use std::collections::{HashMap, HashSet};

use crate::config::{normalize_address, Settings, Strategy};
use crate::decision::{Decision, Reason};
use crate::endpoint::{Endpoint, EndpointLoad, ServerLoad};
use crate::error::ConfigError;
use crate::extract::RequestKey;
use crate::load::least_loaded;
use crate::policy::{self, PickInput, Policy};
use crate::prefill_rate::{PrefillEstimate, PrefillFits, PrefillRate};
use crate::prefix::PrefixHashes;

/// Addresses remembered beyond the current set, so an endpoint that leaves and comes back keeps its id (and
/// its prefix-index entries). Past this many, ids of absent addresses are forgotten.
pub const REMEMBERED_ADDRESSES: usize = 1024;

/// Routes requests: owns the validated [`Settings`], the endpoint set (stable ids by address) and the policy.
pub struct Router {
    settings: Settings,
    endpoints: Vec<Endpoint>,
    /// Server-reported load of each endpoint (parallel to `endpoints`), from this router's feed.
    server_loads: Vec<Option<ServerLoad>>,
    /// Some entry of `server_loads` is set.
    has_server_loads: bool,
    /// This gateway's in-flight count of each endpoint when the router first routed with the current server loads
    /// (`None`: not taken yet). A server's report already counts the requests this gateway had there; what this
    /// gateway sent or finished since is added to it ([`Router::route`]), or, between two reports, one endpoint
    /// looks the least loaded to every request however many this gateway sends it.
    in_flight_at_report: Option<Vec<u32>>,
    /// The feed has not confirmed the server loads for longer than its polls explain
    /// ([`Router::server_loads_stale`]): they are left out of the loads until it does.
    server_loads_stale: bool,
    ids: HashMap<String, u32>,
    /// Position in `endpoints` of each current address: the per-request lookups by address (loads read from shared
    /// tables, index records from other routers) cost one hash lookup each instead of a scan of the endpoints.
    positions: HashMap<String, usize>,
    next_id: u32,
    policy: Box<dyn Policy>,
    /// Position of the endpoint the last [`Router::route`] call's policy picked (`None` after a fail-open pick or
    /// once its record was taken).
    last_pick: Option<usize>,
    /// The pool's prefill speed as the shell last handed it ([`Router::set_prefill_fits`]): reported, and the speed
    /// at which the shell lets this gateway's pending prefill work drain ([`PrefillEstimate::left_after`]) on an
    /// endpoint without a speed of its own.
    prefill: PrefillRate,
    /// The speed of each endpoint whose own fit gives one, by address.
    endpoint_prefill: HashMap<String, PrefillEstimate>,
    /// The extra prefill time per byte of each endpoint told apart as slower ([`PrefillFits::slowdowns`]), by
    /// address, and the same parallel to `endpoints` (empty when there are none) for [`PickInput::slowdowns`].
    slowdown_by_address: HashMap<String, u32>,
    slowdowns: Vec<u32>,
    /// The fits this Envoy's workers feed ([`Router::set_prefill_fits`]) and the sum of the other gateways'
    /// ([`Router::set_remote_prefill_fits`]): the speeds above come from both.
    own_fits: PrefillFits,
    remote_fits: PrefillFits,
}

impl Router {
    /// A router for `settings` with `settings.endpoints` as the endpoint set and an empty prefix index.
    pub fn new(settings: Settings) -> Router {
        let policy = policy::create(&settings);
        let mut r = Router {
            endpoints: Vec::new(),
            server_loads: Vec::new(),
            has_server_loads: false,
            in_flight_at_report: None,
            server_loads_stale: false,
            ids: HashMap::new(),
            positions: HashMap::new(),
            next_id: 0,
            policy,
            settings,
            last_pick: None,
            prefill: PrefillRate::default(),
            endpoint_prefill: HashMap::new(),
            slowdown_by_address: HashMap::new(),
            slowdowns: Vec::new(),
            own_fits: PrefillFits::default(),
            remote_fits: PrefillFits::default(),
        };
        let eps = r.settings.endpoints.clone();
        r.install_endpoints(eps);
        r
    }

    /// Current settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Replaces this Envoy's fits with `fits`: the ones every worker of this Envoy feeds (`prefill_rate`, shared
    /// data).
    pub fn set_prefill_fits(&mut self, fits: &PrefillFits) {
        self.replace_fits(Some(fits.clone()), None);
    }

    /// Replaces the other gateways' fits with `fits`, the sum the feed last answered with ([`crate::exchange`],
    /// "Prefill speeds between gateways"; empty when there is none or it is too old).
    pub fn set_remote_prefill_fits(&mut self, fits: &PrefillFits) {
        self.replace_fits(None, Some(fits.clone()));
    }

    /// Replaces this Envoy's fits, the other gateways' or both (`None` keeps what the router has) and computes the
    /// speeds once: the shell hands over what changed since its last tick in one call.
    pub fn replace_fits(&mut self, own: Option<PrefillFits>, remote: Option<PrefillFits>) {
        if own.is_none() && remote.is_none() {
            return;
        }
        if let Some(own) = own {
            self.own_fits = own;
        }
        if let Some(remote) = remote {
            self.remote_fits = remote;
        }
        self.refit();
    }

    /// The speeds from this Envoy's fits and the other gateways' together, for the current endpoints only (a faster
    /// server that is not one of them must not make them look slow).
    fn refit(&mut self) {
        let mut fits = self.own_fits.clone();
        fits.merge([&self.remote_fits]);
        fits.endpoints.retain(|(a, _)| self.positions.contains_key(a));
        self.prefill = fits.pool.clone();
        self.endpoint_prefill = fits.endpoints.iter().filter_map(|(a, f)| Some((a.clone(), f.estimate()?))).collect();
        self.slowdown_by_address = fits.slowdowns().into_iter().collect();
        self.place_slowdowns();
    }

    /// Lays the slowdowns out by endpoint position (none at all when no current endpoint has one).
    fn place_slowdowns(&mut self) {
        self.slowdowns.clear();
        if self.endpoints.iter().any(|e| self.slowdown_by_address.contains_key(&e.address)) {
            let by = &self.slowdown_by_address;
            self.slowdowns = self.endpoints.iter().map(|e| by.get(&e.address).copied().unwrap_or(0)).collect();
        }
    }

    /// The extra prefill time per byte of each endpoint, by position, when some endpoint is told apart as slower
    /// than the fastest ([`PrefillFits::slowdowns`]); empty otherwise.
    pub fn slowdowns(&self) -> &[u32] {
        &self.slowdowns
    }

    /// The pool's prefill speed learned so far, if the requests seen give one.
    pub fn prefill_estimate(&self) -> Option<PrefillEstimate> {
        self.prefill.estimate()
    }

    /// The prefill speed of the endpoint at position `i` of [`Router::endpoints`]: its own once its samples give
    /// one, else the pool's (`None` when neither does, or for a position out of range).
    pub fn prefill_estimate_at(&self, i: usize) -> Option<PrefillEstimate> {
        let endpoint = self.endpoints.get(i)?;
        self.endpoint_prefill_estimate(&endpoint.address).or_else(|| self.prefill_estimate())
    }

    /// The prefill speed of the endpoint at `address` from its own samples only (`None` until they give one).
    pub fn endpoint_prefill_estimate(&self, address: &str) -> Option<PrefillEstimate> {
        self.endpoint_prefill.get(address).copied()
    }

    /// The relative standard error of the prefill-speed fit's slope, once a line is fitted
    /// ([`PrefillRate::slope_error`]).
    pub fn prefill_slope_error(&self) -> Option<f64> {
        self.prefill.slope_error()
    }

    /// Current endpoints; `loads` passed to [`Router::route`] are parallel to this slice.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Position of `address` (normalised, as [`Endpoint::address`]) in [`Router::endpoints`], if it is one.
    pub fn position(&self, address: &str) -> Option<usize> {
        self.positions.get(address).copied()
    }

    /// Name of the active policy (metrics label).
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Replaces the endpoint set (e.g. from the controller feed). Addresses are normalised and de-duplicated;
    /// order is kept. The prefix index and counters are kept: endpoints are identified by address, and index
    /// entries of removed endpoints are dropped lazily.
    ///
    /// Errors: [`ConfigError::Invalid`] naming the first address that is not `IP:port`; the set is then unchanged.
    pub fn set_endpoints(&mut self, addresses: Vec<String>) -> Result<(), ConfigError> {
        let mut normalized = Vec::with_capacity(addresses.len());
        let mut seen = HashSet::with_capacity(addresses.len());
        for (i, a) in addresses.iter().enumerate() {
            let n = normalize_address(a).ok_or_else(|| ConfigError::Invalid {
                field: format!("endpoints[{i}]"),
                value: crate::config::shown(a, 100),
                reason: crate::config::ADDRESS_RULE,
            })?;
            if seen.insert(n.clone()) {
                normalized.push(n);
            }
        }
        self.install_endpoints(normalized);
        Ok(())
    }

    /// Replaces the endpoint set and the server-reported loads together (a feed snapshot): `endpoints[i]` is an
    /// address and the load its server reported, if any. The loads belong to this router alone, so two plugins
    /// with two feeds in one VM never see each other's. Endpoints without a load have none; [`Router::set_endpoints`] and
    /// [`Router::reconfigure`] keep the loads of the addresses that stay.
    ///
    /// Errors: as [`Router::set_endpoints`]; the set and the loads are then unchanged.
    pub fn set_feed_endpoints(&mut self, endpoints: Vec<(String, Option<ServerLoad>)>) -> Result<(), ConfigError> {
        // Most snapshots of a feed that reports loads only change the loads: keep the endpoint set as it is (the
        // addresses compared as given: a feed's are already normalised, and any other form takes the full path).
        if endpoints.len() == self.endpoints.len()
            && endpoints.iter().zip(&self.endpoints).all(|((a, _), e)| *a == e.address)
        {
            self.set_server_loads(endpoints.into_iter().map(|(_, l)| l).collect());
            return Ok(());
        }
        let loads: HashMap<String, ServerLoad> =
            endpoints.iter().filter_map(|(a, l)| Some((normalize_address(a)?, (*l)?))).collect();
        self.set_endpoints(endpoints.into_iter().map(|(a, _)| a).collect())?;
        self.set_server_loads(self.endpoints.iter().map(|e| loads.get(&e.address).copied()).collect());
        Ok(())
    }

    /// Replaces the server loads (parallel to `endpoints`), keeping `has_server_loads` in step.
    fn set_server_loads(&mut self, loads: Vec<Option<ServerLoad>>) {
        self.has_server_loads = loads.iter().any(Option::is_some);
        self.server_loads = loads;
        self.in_flight_at_report = None;
        self.server_loads_stale = false;
    }

    /// The feed confirmed the server loads in force (a poll answered with them, changed or not): what this gateway
    /// sends or finishes from now on moves them ([`ServerLoad::moved_by`]), and they are used again if stale.
    pub fn server_loads_confirmed(&mut self) {
        self.in_flight_at_report = None;
        self.server_loads_stale = false;
    }

    /// The feed has not confirmed the server loads for longer than its polls explain (it, or the controller behind
    /// it, stopped answering): routing goes on this gateway's own counts until [`Router::server_loads_confirmed`] or
    /// a new snapshot. A report kept for ever would cap an endpoint on a load it may no longer have.
    pub fn server_loads_stale(&mut self) {
        self.server_loads_stale = true;
    }

    /// Server-reported load of `endpoints()[i]` from the last feed snapshot, if any.
    pub fn server_load(&self, i: usize) -> Option<ServerLoad> {
        self.server_loads.get(i).copied().flatten()
    }

    fn install_endpoints(&mut self, addresses: Vec<String>) {
        if self.ids.len() > addresses.len() + REMEMBERED_ADDRESSES {
            let keep: HashSet<&String> = addresses.iter().collect();
            self.ids.retain(|a, _| keep.contains(a));
        }
        let old_loads: HashMap<&str, ServerLoad> = self
            .endpoints
            .iter()
            .zip(&self.server_loads)
            .filter_map(|(e, l)| Some((e.address.as_str(), (*l)?)))
            .collect();
        let server_loads: Vec<Option<ServerLoad>> =
            addresses.iter().map(|a| old_loads.get(a.as_str()).copied()).collect();
        drop(old_loads);
        self.set_server_loads(server_loads);
        self.endpoints = addresses
            .into_iter()
            .map(|a| {
                let id = *self.ids.entry(a.clone()).or_insert_with(|| {
                    self.next_id = self.next_id.wrapping_add(1);
                    self.next_id
                });
                Endpoint { address: a, id }
            })
            .collect();
        self.positions = self.endpoints.iter().enumerate().map(|(i, e)| (e.address.clone(), i)).collect();
        self.settings.endpoints = self.endpoints.iter().map(|e| e.address.clone()).collect();
        self.policy.on_endpoints_changed(&self.endpoints);
        // The speeds and slowdowns are of the current endpoints only.
        self.refit();
    }

    /// Applies new settings. The policy (and its prefix index) is kept when the strategy is the same and the
    /// policy accepts the change (PREFIX_AWARE keeps its index unless `block_size` changed); the endpoint set
    /// is replaced by `settings.endpoints` unless that list is empty (feed-driven), keeping endpoint ids.
    pub fn reconfigure(&mut self, settings: Settings) {
        let same = settings.strategy == self.settings.strategy && self.policy.reconfigure(&settings);
        if !same {
            self.policy = policy::create(&settings);
        }
        let eps =
            if settings.endpoints.is_empty() { self.settings.endpoints.clone() } else { settings.endpoints.clone() };
        self.settings = settings;
        self.install_endpoints(eps);
    }

    /// Routes one request. `input.key` is the extracted key (`None` after an extraction error: the request is
    /// routed by least outstanding requests with [`Reason::FailOpen`]); `input.prefix` is filled in here when
    /// absent. `loads[i]` belongs to `endpoints()[i]`; an entry without a server load gets the one from the last
    /// feed snapshot ([`Router::set_feed_endpoints`]), moved by what this gateway's in-flight count there did since
    /// (now against the first pick with that snapshot, [`ServerLoad::moved_by`]). Updates the prefix index. Returns
    /// `None` only when the endpoint set is empty.
    pub fn route(&mut self, input: &PickInput, loads: &[EndpointLoad]) -> Option<Decision> {
        let merged: Vec<EndpointLoad>;
        let loads = if self.has_server_loads && !self.server_loads_stale {
            let n = self.endpoints.len();
            if self.in_flight_at_report.is_none() {
                self.in_flight_at_report = Some((0..n).map(|i| crate::load::load_at(loads, i).in_flight).collect());
            }
            let at_report = self.in_flight_at_report.as_deref().unwrap_or_default();
            merged = (0..n)
                .map(|i| {
                    let mut l = crate::load::load_at(loads, i);
                    let then = at_report.get(i).copied().unwrap_or(0);
                    l.server = l.server.or(self.server_load(i).map(|s| s.moved_by(l.in_flight, then)));
                    l
                })
                .collect();
            &merged[..]
        } else {
            loads
        };
        self.last_pick = None;
        let Some(key) = input.key else {
            return self.fail_open(input.random, loads);
        };
        let computed;
        let mut input = *input;
        input.slowdowns = &self.slowdowns;
        if input.prefix.is_none() && self.settings.strategy == Strategy::PrefixAware {
            computed = PrefixHashes::compute(key.namespace, &key.text, self.settings.block_size);
            input.prefix = Some(&computed);
        }
        let decision = self.policy.pick(&input, &self.endpoints, loads);
        self.last_pick = decision.as_ref().map(|d| d.endpoint);
        decision
    }

    /// The index record of the last [`Router::route`] call ([`crate::exchange`]): the chain its policy recorded and
    /// the endpoint it went to, encoded, for the other routers serving the same traffic. `None` when that call
    /// recorded nothing (a strategy without an index, a fail-open pick, no text) or the record was already taken.
    pub fn take_index_record(&mut self) -> Option<Vec<u8>> {
        let i = self.last_pick.take()?;
        let chain = self.policy.last_recorded();
        let endpoint = self.endpoints.get(i)?;
        if chain.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        crate::exchange::encode(&mut out, self.settings.block_size, &endpoint.address, chain).then_some(out)
    }

    /// Applies the index records in `bytes` (one or more, see [`crate::exchange`]) that another router serving the
    /// same traffic produced with [`Router::take_index_record`]. A record for another block size or for an address
    /// not in this router's endpoint set is skipped. Returns the number of records applied, or the reason the
    /// bytes are malformed (the records before the malformed one are applied).
    pub fn learn(&mut self, bytes: &[u8]) -> Result<usize, &'static str> {
        let mut applied = 0;
        for rec in crate::exchange::decode(bytes) {
            let rec = rec?;
            if rec.block_size as usize != self.settings.block_size {
                continue;
            }
            let Some(i) = self.position(rec.address) else { continue };
            self.policy.learn(&rec.chain, self.endpoints[i].id);
            applied += 1;
        }
        Ok(applied)
    }

    /// Convenience: routes a key with the given randomness.
    pub fn route_key(&mut self, key: &RequestKey, random: u64, loads: &[EndpointLoad]) -> Option<Decision> {
        self.route(&PickInput { key: Some(key), random, ..PickInput::default() }, loads)
    }

    /// The fail-open choice: least outstanding requests, ties broken by `random`. `None` when there are no
    /// endpoints.
    pub fn fail_open(&self, random: u64, loads: &[EndpointLoad]) -> Option<Decision> {
        let i = least_loaded(random, &self.endpoints, loads)?;
        Some(Decision::new(&self.endpoints, i, Reason::FailOpen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Strategy;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn prefix_aware(endpoints: &[String]) -> Router {
        Router::new(Settings { strategy: Strategy::PrefixAware, endpoints: endpoints.to_vec(), ..Settings::default() })
    }

    /// A LEAST_OUTSTANDING_REQUESTS router over three endpoints, for the server-load tests.
    fn least_outstanding_of_three() -> Router {
        let endpoints = (0..3).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        Router::new(Settings { strategy: Strategy::LeastOutstandingRequests, endpoints, ..Settings::default() })
    }

    /// A feed snapshot of `r`'s endpoints whose servers report `waiting` requests each.
    fn report(r: &mut Router, waiting: [u32; 3]) {
        let addresses: Vec<String> = r.endpoints().iter().map(|e| e.address.clone()).collect();
        let loads = waiting.map(|waiting| Some(ServerLoad { waiting, running: 0, kv_cache_usage: 0.0 }));
        r.set_feed_endpoints(addresses.into_iter().zip(loads).collect()).expect("valid");
    }

    /// The endpoint `r` picks with this gateway's in-flight counts `in_flight`.
    fn pick_with(r: &mut Router, in_flight: [u32; 3]) -> usize {
        let loads = in_flight.map(EndpointLoad::in_flight);
        r.route(&PickInput { random: 7, ..PickInput::default() }, &loads).expect("a pick").endpoint
    }

    /// Between two feed reports the requests this gateway sends count on top of the reported load, so one report
    /// does not send every request to the endpoint it showed least loaded; what the report already counted (this
    /// gateway's in-flight requests when the router first routes with it) is not counted twice.
    #[test]
    fn requests_sent_since_a_report_count_on_top_of_it() {
        let mut router = least_outstanding_of_three();
        // This gateway already has 2 requests on the first endpoint when the report (which counts them) arrives.
        let mut in_flight = [2u32, 0, 0];
        report(&mut router, [70, 71, 72]);
        let mut picks = [0; 3];
        for _ in 0..9 {
            let i = pick_with(&mut router, in_flight);
            picks[i] += 1;
            in_flight[i] += 1;
        }
        // 70 + 4, 71 + 3, 72 + 2: the loads level out as they would at the servers.
        assert_eq!(picks, [4, 3, 2], "spread as the loads level out");
        assert_eq!(in_flight, [6, 3, 2]);
        // A new report replaces the count: it includes what was sent before it (counted again: 80 / 81 / 79).
        report(&mut router, [76, 78, 77]);
        assert_eq!(pick_with(&mut router, in_flight), 0);
        // Requests this gateway finished since leave the report: 78 - 3.
        assert_eq!(pick_with(&mut router, [6, 0, 2]), 1);
    }

    /// A report the feed no longer confirms is left out until it does: an endpoint last reported busy is not
    /// avoided for as long as the feed is down.
    #[test]
    fn a_report_the_feed_stopped_confirming_is_left_out() {
        let mut router = least_outstanding_of_three();
        report(&mut router, [70, 5, 6]);
        assert_eq!(pick_with(&mut router, [0, 3, 3]), 1, "the report says the first is busy");
        router.server_loads_stale();
        assert_eq!(pick_with(&mut router, [0, 3, 3]), 0, "stale: this gateway's own counts");
        router.server_loads_confirmed();
        assert_eq!(pick_with(&mut router, [0, 3, 3]), 1, "confirmed again");
    }

    #[test]
    fn an_endpoint_drains_at_its_own_speed_once_it_has_one_else_at_the_pools() {
        let endpoints: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        let mut router = prefix_aware(&endpoints);
        assert_eq!(router.prefill_estimate_at(0), None, "nothing learned yet");
        let mut fits = PrefillFits::default();
        // The first endpoint serves at 200 bytes/ms, the second at 400; the third is never sampled.
        for i in 0..40u32 {
            let bytes = 2_000 + (i * 7_919) % 40_000;
            fits.observe(&endpoints[0], bytes, 2 + u64::from(bytes / 200), |_| true);
            fits.observe(&endpoints[1], bytes, 2 + u64::from(bytes / 400), |_| true);
        }
        router.set_prefill_fits(&fits);
        let speed = |r: &Router, i: usize| r.prefill_estimate_at(i).expect("a speed").bytes_per_ms;
        assert!((speed(&router, 0) - 200.0).abs() < 4.0, "{}", speed(&router, 0));
        assert!((speed(&router, 1) - 400.0).abs() < 8.0, "{}", speed(&router, 1));
        // Two speeds in one fit scatter too much for a pool speed: the unsampled endpoint has none either.
        assert_eq!(router.prefill_estimate(), None);
        assert_eq!(router.prefill_estimate_at(2), None);
        // Once the pool's recent samples agree (old ones decay), the unsampled endpoint drains at its speed.
        for i in 0..400u32 {
            let bytes = 2_000 + (i * 7_919) % 40_000;
            fits.observe(&endpoints[1], bytes, 2 + u64::from(bytes / 400), |_| true);
        }
        router.set_prefill_fits(&fits);
        let pool = router.prefill_estimate().expect("the pool's").bytes_per_ms;
        assert_eq!(speed(&router, 2), pool, "an endpoint without samples drains at the pool's speed");
        assert_eq!(router.endpoint_prefill_estimate(&endpoints[2]), None, "but has no speed of its own");
        assert!((speed(&router, 0) - 200.0).abs() < 4.0, "its own speed still");
        assert_eq!(router.prefill_estimate_at(3), None, "no such position");
    }

    /// The other gateways' fits count beside this Envoy's own: samples of one endpoint add up across gateways,
    /// an endpoint only the others sampled gets its speed from them, and fits of addresses that are not this
    /// router's endpoints are left out (a faster server elsewhere does not make this pool's look slow) — also
    /// right after the endpoint list changes.
    #[test]
    fn the_other_gateways_fits_count_beside_this_envoy_s_own() {
        let endpoints: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        let mut router = prefix_aware(&endpoints);
        let sample = crate::prefill_rate::sample_at;
        let mut own = PrefillFits::default();
        sample(&mut own, &endpoints[0], 200, 10);
        router.set_prefill_fits(&own);
        assert_eq!(router.endpoint_prefill_estimate(&endpoints[0]), None, "10 samples are too few");
        let mut remote = PrefillFits::default();
        sample(&mut remote, &endpoints[0], 200, 10);
        sample(&mut remote, &endpoints[1], 100, 40);
        sample(&mut remote, "127.0.0.1:9999", 800, 40);
        router.set_remote_prefill_fits(&remote);
        let speed = |r: &Router, i: usize| r.endpoint_prefill_estimate(&endpoints[i]).map(|e| e.bytes_per_ms);
        assert!(speed(&router, 0).is_some_and(|s| (s - 200.0).abs() < 4.0), "20 samples: {:?}", speed(&router, 0));
        assert!(speed(&router, 1).is_some_and(|s| (s - 100.0).abs() < 2.0), "{:?}", speed(&router, 1));
        let slowdowns = router.slowdowns();
        assert!(slowdowns[0] == 0 && slowdowns[2] == 0 && slowdowns[1] > 900, "{slowdowns:?}");
        // This Envoy's own samples keep counting with the others' when they change.
        sample(&mut own, &endpoints[2], 200, 40);
        router.set_prefill_fits(&own);
        assert!(speed(&router, 0).is_some() && speed(&router, 2).is_some() && router.slowdowns()[1] > 900);
        // A new endpoint list: an endpoint only the others sampled joins with their fit, one that left loses its own.
        router.set_endpoints(vec![endpoints[0].clone(), endpoints[1].clone(), "127.0.0.1:9999".into()]).expect("valid");
        assert!(speed(&router, 1).is_some() && router.endpoint_prefill_estimate(&endpoints[2]).is_none());
        let slowdowns = router.slowdowns().to_vec();
        assert!(slowdowns[2] == 0 && slowdowns[0] > 2_500 && slowdowns[1] > 6_000, "800 bytes/ms now: {slowdowns:?}");
        router.set_endpoints(endpoints.clone()).expect("valid");
        // Both handed over in one call route as the two calls above did; a call with neither keeps them.
        let mut at_once = prefix_aware(&endpoints);
        at_once.replace_fits(Some(own.clone()), Some(remote.clone()));
        at_once.replace_fits(None, None);
        assert_eq!(at_once.slowdowns(), router.slowdowns());
        assert_eq!(at_once.prefill_estimate(), router.prefill_estimate());
        for i in 0..3 {
            assert_eq!(speed(&at_once, i), speed(&router, i), "endpoint {i}");
        }
        // Without the others' fits (the feed stopped), only what this Envoy learned.
        router.set_remote_prefill_fits(&PrefillFits::default());
        assert_eq!((speed(&router, 0), speed(&router, 1)), (None, None));
        assert!(router.slowdowns().is_empty());
    }
}
