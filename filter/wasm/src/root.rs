//! The root context: plugin configuration, the router shared by the VM's HTTP contexts, and the tick.
//!
//! One root context exists per VM (one per Envoy worker and two more that route nothing, docs/filter.md) and per plugin
//! configuration. The router — and with it the prefix index and the settings requests are handled with — is shared
//! by every root context of the same plugin (Envoy's `plugin_name`) in the VM: a new configuration (an LDS update)
//! reconfigures it in place, keeping the index when the core says the settings are compatible, and takes effect
//! at once for every connection, including ones still draining on the previous listener.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use log::{info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, Bytes, ContextType};
use warmpath_core::{BodyKind, RequestKey, Router, Settings};

use crate::exchange::Exchange;
use crate::feed::{self, FeedPoller};
use crate::http::FilterHttp;
use crate::{metrics, shared};

/// Tick period without a feed (`warmpath_core::config::TICK_MS`).
const DEFAULT_TICK: Duration = Duration::from_millis(warmpath_core::config::TICK_MS);
/// Longest tick period with a feed (`warmpath_core::config::FEED_TICK_MS`). A feed polled more often
/// (`feed.interval_ms` below this) ticks at its own interval; one polled less often is polled every few ticks.
const FEED_TICK: Duration = Duration::from_millis(warmpath_core::config::FEED_TICK_MS);

thread_local! {
    // One VM = one thread. The router of each plugin (by Envoy plugin name), created by its first valid configuration.
    static ROUTERS: RefCell<HashMap<String, Rc<RefCell<Router>>>> = RefCell::new(HashMap::new());
    // This VM's membership in the index exchange of each plugin (`exchange`), like the router one per plugin.
    static EXCHANGES: RefCell<HashMap<String, Rc<Exchange>>> = RefCell::new(HashMap::new());
    static RNG: RefCell<u64> = const { RefCell::new(0) };
    // The configured root contexts of each plugin in this VM, in the order of their last configuration: the last one
    // is in force (`FilterRoot::in_force`).
    static CONFIGURED: RefCell<HashMap<String, Vec<u32>>> = RefCell::new(HashMap::new());
    // What this VM last wrote to the endpoint gauges of each plugin (`refresh_gauges`). Per VM and plugin, not per
    // root context: after an LDS update the new configuration goes on following the endpoints the old one reported.
    static GAUGES: RefCell<HashMap<String, metrics::EndpointGauges>> = RefCell::new(HashMap::new());
}

/// Milliseconds since the Unix epoch from the host clock (0 if the host refuses).
pub fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A uniform u64 for the core's randomised choices: splitmix64 over a per-VM state seeded from the clock (the core
/// needs spread, not unpredictability).
pub fn random_u64(salt: u64) -> u64 {
    RNG.with(|s| {
        let mut s = s.borrow_mut();
        if *s == 0 {
            let nanos = hostcalls::get_current_time()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            *s = xxhash_rust::xxh3::xxh3_64(&(nanos ^ salt).to_le_bytes()) | 1;
        }
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// What a root context hands to each of its HTTP contexts.
pub struct Shared {
    /// The plugin's router in this VM; its `settings()` are the ones in force.
    pub router: Rc<RefCell<Router>>,
    /// The plugin's index exchange with the other VMs (`exchange`).
    pub exchange: Rc<Exchange>,
    /// This root context's metrics (ids are per plugin instance, see `metrics`).
    pub metrics: Rc<metrics::Metrics>,
    /// With a feed: the shared-data key of the other gateways' pending prefill work and how long (ms) it counts
    /// after it arrived (`feed::remote_pending_key`).
    pub remote_pending: Option<(String, u64)>,
    /// Shared-data key of the plugin's prefill-speed fits, fed by every worker (`shared::prefill_fit_key`).
    pub prefill_fit: String,
    /// With a feed: the shared-data key of the other gateways' fits (`feed::remote_fits_key`).
    pub remote_fits: Option<String>,
    /// The key given to strategies that do not look at the request (RANDOM, LEAST_OUTSTANDING_REQUESTS), which
    /// decide at header time: the router treats a request without a key as fail-open.
    pub keyless: RequestKey,
}

/// The root context of one VM and plugin configuration.
///
/// Envoy keeps a superseded configuration's root context, with its tick, while connections of the listener it
/// served drain (up to the drain time, 600 s by default). Only the plugin's newest configuration in the VM polls the
/// feed, reads the exchange's log on its tick and reports gauges: the superseded one shares the plugin's router,
/// and its feed poller would put its own feed's endpoints back on every new version of that feed. It still flushes the counters of the
/// requests it handles, and if the newer configuration goes first (its listener removed), it comes back in force
/// with its own settings.
pub struct FilterRoot {
    context_id: u32,
    /// The Envoy `plugin_name` of the configuration in force (empty until configured).
    plugin: String,
    /// This root context's own settings (`None` until configured), put back in force when it takes over again.
    settings: Option<Settings>,
    /// Whether this root context was in force at its last tick.
    was_in_force: bool,
    shared: Option<Rc<Shared>>,
    feed: Option<FeedPoller>,
    /// The shared-data versions of this Envoy's fits and of the other gateways' that the router last took from
    /// this root context (`None`: none yet, a new configuration, or this one back in force).
    fits_seen: Option<(Option<u32>, Option<u32>)>,
}

impl FilterRoot {
    /// A root context not yet configured.
    pub fn new(context_id: u32) -> Self {
        FilterRoot {
            context_id,
            plugin: String::new(),
            settings: None,
            was_in_force: false,
            shared: None,
            feed: None,
            fits_seen: None,
        }
    }

    /// True when this is the newest configured root context of its plugin in this VM.
    fn in_force(&self) -> bool {
        CONFIGURED.with(|c| c.borrow().get(&self.plugin).and_then(|ids| ids.last()) == Some(&self.context_id))
    }

    /// Whether this root context is in force at this tick. One back in force (the newer configuration went away
    /// while this one still serves) puts its own settings back in the plugin's router and hands the router its fits
    /// again at this tick: the router routed with the newer configuration's meanwhile (its feed's).
    fn note_force(&mut self) -> bool {
        let in_force = self.in_force();
        if in_force && !self.was_in_force {
            if let (Some(shared), Some(settings)) = (&self.shared, &self.settings) {
                if let Ok(mut router) = shared.router.try_borrow_mut() {
                    router.reconfigure(settings.clone());
                }
            }
            self.fits_seen = None;
        }
        self.was_in_force = in_force;
        in_force
    }

    /// Records this root context as its plugin's newest configuration.
    fn take_force(&self) {
        CONFIGURED.with(|c| {
            let mut c = c.borrow_mut();
            forget(&mut c, self.context_id);
            c.entry(self.plugin.clone()).or_default().push(self.context_id);
        });
    }

    /// Reports the endpoint count and the gauges of each endpoint whose value changed ([`metrics::EndpointGauges`]).
    fn refresh_gauges(&self) {
        let Some(shared) = &self.shared else { return };
        let Ok(router) = shared.router.try_borrow() else { return };
        let endpoints = router.endpoints();
        shared.metrics.gauge("warmpath.endpoints", endpoints.len() as u64);
        let table = shared::Table::read();
        let remote = shared.remote_pending.as_ref().map(|(key, age)| shared::Remote::read(key, now_ms(), *age));
        let own = table.per_endpoint(&router);
        let others = remote.as_ref().map(|r| r.per_endpoint(&router));
        let current = endpoints.iter().enumerate().map(|(i, e)| {
            // `as` saturates: a speed above 4 GB/s reads 4 GB/s.
            let speed = router.endpoint_prefill_estimate(&e.address).map_or(0, |s| (s.bytes_per_ms * 1000.0) as u32);
            (e.address.as_str(), [own[i].in_flight, own[i].pending, others.as_ref().map_or(0, |o| o[i]), speed])
        });
        let writes = GAUGES.with(|g| {
            g.borrow_mut()
                .entry(self.plugin.clone())
                .or_default()
                .update(current, others.is_some(), |a| router.position(a).is_none().then(|| table.get(a).in_flight))
        });
        for (gauge, address, value) in writes {
            shared.metrics.gauge(&gauge.name(&address), u64::from(value));
        }
        if let Some(e) = router.prefill_estimate() {
            shared.metrics.gauge(metrics::PREFILL_BYTES_PER_S, (e.bytes_per_ms * 1000.0) as u64);
            shared.metrics.gauge(metrics::PREFILL_OVERHEAD_US, (e.overhead_ms * 1000.0) as u64);
        }
        if let Some(err) = router.prefill_slope_error() {
            // `as` saturates, should the error ever be infinite.
            shared.metrics.gauge(metrics::PREFILL_SLOPE_ERROR_PPM, (err * 1e6) as u64);
        }
    }
}

impl Drop for FilterRoot {
    // Envoy deletes a root context when its configuration's last user goes (`proxy_on_delete`, which drops it): an
    // older configuration still draining comes back in force.
    fn drop(&mut self) {
        let _ = CONFIGURED.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                forget(&mut c, self.context_id);
            }
        });
    }
}

/// Takes root context `context_id` out of the configured ones of every plugin.
fn forget(configured: &mut HashMap<String, Vec<u32>>, context_id: u32) {
    configured.values_mut().for_each(|ids| ids.retain(|&id| id != context_id));
}

impl Context for FilterRoot {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, body_size: usize, _num_trailers: usize) {
        let in_force = self.in_force();
        if let (Some(feed), Some(shared)) = (self.feed.as_mut(), self.shared.as_ref()) {
            // A call sent before a newer configuration arrived: its answer is the old feed's.
            if !in_force {
                return feed.abandon();
            }
            feed.on_response(token_id, body_size, &shared.router, &shared.exchange, &shared.metrics);
        }
    }
}

impl RootContext for FilterRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes: Bytes =
            hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX).ok().flatten().unwrap_or_default();
        let settings = match Settings::from_json(&bytes) {
            Ok(s) => s,
            Err(e) => {
                let msg = e.to_string();
                let msg = msg.strip_prefix("plugin configuration: ").unwrap_or(&msg);
                // Envoy refuses the listener (or the LDS update) when this returns false; the line says why.
                warn!("rejected plugin configuration: {msg}");
                return false;
            }
        };
        let plugin = hostcalls::get_property(vec!["plugin_name"])
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let router = ROUTERS.with(|routers| {
            let mut routers = routers.borrow_mut();
            if let Some(r) = routers.get(&plugin) {
                if let Ok(mut router) = r.try_borrow_mut() {
                    router.reconfigure(settings.clone());
                }
                return r.clone();
            }
            let r = Rc::new(RefCell::new(Router::new(settings.clone())));
            routers.insert(plugin.clone(), r.clone());
            r
        });
        shared::init();
        let tick = settings.feed.as_ref().map_or(DEFAULT_TICK, |f| Duration::from_millis(f.interval_ms).min(FEED_TICK));
        let exchange = EXCHANGES.with(|x| {
            let mut x = x.borrow_mut();
            let e = x.entry(plugin.clone()).or_insert_with(|| {
                Rc::new(Exchange::join(&plugin, shared::unique_id(random_u64(u64::from(self.context_id)))))
            });
            e.clone()
        });
        let prefill_fit = shared::prefill_fit_key(&plugin);
        self.feed = settings.feed.clone().map(|f| FeedPoller::new(f, self.context_id, tick, prefill_fit.clone()));
        self.plugin = plugin.clone();
        self.take_force();
        self.was_in_force = true;
        let _ = hostcalls::set_tick_period(tick);
        info!(
            "configured plugin={plugin} strategy={} endpoints={} prefix_length={} block_size={} concurrency_threshold={} max_body_bytes={} feed={} upstream_clusters={} exchange_writer={:016x}",
            settings.strategy.as_str(),
            settings.endpoints.len(),
            settings.prefix_length,
            settings.block_size,
            settings.concurrency_threshold,
            settings.max_body_bytes,
            settings.feed.as_ref().map(|f| f.cluster.as_str()).unwrap_or("none"),
            if settings.upstream_clusters.is_empty() { "all".to_string() } else { settings.upstream_clusters.join(",") },
            exchange.writer(),
        );
        let keyless = RequestKey::new(BodyKind::Raw, None, None, Vec::new());
        let metrics = Rc::new(metrics::Metrics::new());
        let remote_pending =
            settings.feed.as_ref().map(|f| (feed::remote_pending_key(f), feed::remote_pending_max_age(f, tick)));
        shared::init_prefill_fit(&prefill_fit);
        let remote_fits = settings.feed.as_ref().map(feed::remote_fits_key);
        self.shared =
            Some(Rc::new(Shared { router, exchange, metrics, remote_pending, prefill_fit, remote_fits, keyless }));
        self.fits_seen = None;
        self.settings = Some(settings);
        true
    }

    fn on_tick(&mut self) {
        let in_force = self.note_force();
        if let (Some(feed), Some(shared)) = (self.feed.as_mut(), self.shared.as_ref()) {
            if in_force {
                feed.on_tick(now_ms(), &shared.router, &shared.exchange, &shared.metrics);
            } else {
                feed.abandon();
            }
        }
        if let Some(shared) = &self.shared {
            if in_force {
                if let Ok(mut router) = shared.router.try_borrow_mut() {
                    shared.exchange.on_tick(&mut router, &shared.metrics);
                    // The speeds the other gateways' samples taught (as the feed last answered, while fresh), and
                    // the other workers', for this worker's next picks. They change only when a worker samples a
                    // speed, the feed answers with fits or the others' go stale: a tick that finds both values'
                    // versions as it left them parses neither and does not refit (both cost O(endpoints)); one
                    // that finds either changed refits once. Without a feed the others' fits are empty (a
                    // configuration with a feed may have handed the router some).
                    let first = self.fits_seen.is_none();
                    let (own_seen, remote_seen) = self.fits_seen.unwrap_or_default();
                    let (remote, remote_version) = match &shared.remote_fits {
                        Some(key) => {
                            let remote = shared::Remote::read(key, now_ms(), warmpath_core::exchange::FITS_TTL_MS);
                            let version = remote.version();
                            ((first || version != remote_seen).then(|| remote.fits()), version)
                        }
                        None => (first.then(warmpath_core::prefill_rate::PrefillFits::default), None),
                    };
                    let own = shared::read_prefill_fits_since(&shared.prefill_fit, own_seen);
                    let own_version = own.as_ref().map_or(own_seen, |(v, _)| *v);
                    router.replace_fits(own.map(|(_, fits)| fits), remote);
                    self.fits_seen = Some((own_version, remote_version));
                }
            }
            shared.metrics.flush();
        }
        if in_force {
            self.refresh_gauges();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Unconfigured (cannot happen after a successful on_configure): pass requests through, still stripping.
        Some(Box::new(FilterHttp::new(context_id, self.shared.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(context_id: u32, plugin: &str) -> FilterRoot {
        let mut r = FilterRoot::new(context_id);
        r.plugin = plugin.to_string();
        r.take_force();
        r
    }

    #[test]
    fn the_newest_configuration_of_a_plugin_is_in_force_until_it_goes() {
        let old = configured(1, "p");
        let other = configured(2, "q");
        assert!(old.in_force() && other.in_force(), "one configuration per plugin: each in force");
        let new = configured(3, "p");
        assert!(!old.in_force() && new.in_force() && other.in_force());
        drop(new);
        assert!(old.in_force(), "the older configuration takes over when the newer goes first");
        let newer = configured(4, "p");
        assert!(!old.in_force());
        // Envoy configures an existing root context again when a configuration comes back (an LDS revert).
        old.take_force();
        assert!(old.in_force() && !newer.in_force());
        assert!(!FilterRoot::new(5).in_force(), "an unconfigured root context is never in force");
    }

    #[test]
    fn a_configuration_back_in_force_takes_both_fits_again() {
        let mut old = configured(11, "r");
        assert!(old.note_force());
        old.fits_seen = Some((Some(7), Some(9)));
        let new = configured(12, "r");
        assert!(!old.note_force());
        assert_eq!(old.fits_seen, Some((Some(7), Some(9))), "a superseded configuration's tick changes nothing");
        drop(new);
        assert!(old.note_force());
        assert_eq!(old.fits_seen, None, "back in force: this tick hands the router both fits, changed or not");
        old.fits_seen = Some((Some(8), None));
        assert!(old.note_force());
        assert_eq!(old.fits_seen, Some((Some(8), None)), "still in force: only what changed is parsed");
    }
}
