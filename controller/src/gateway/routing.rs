//! Routing intent: what the user asked for, from an `InferenceRoutingPolicy` or from HTTPRoute
//! annotations, validated against the filter's own ranges and turned into the filter's plugin
//! configuration (checked with `warmpath_core::Settings::from_json`, so the controller never writes
//! a configuration the filter would refuse).
//!
//! Precedence (documented in docs/controller.md): a policy that targets a route wins over that
//! route's annotations; among several policies targeting one route the oldest wins (creation
//! time, then namespace/name — the Gateway API conflict rule of GEP-713); the others report
//! `Accepted=False` with reason `Conflicted`.

use std::collections::BTreeMap;

use serde_json::Value;
use warmpath_core::config::{BLOCK_SIZE_RANGE, CONCURRENCY_THRESHOLD_RANGE, PREFIX_LENGTH_RANGE};
use warmpath_core::{RawConfig, RawFeed, Settings, Strategy};

use crate::crd::routing_policy::{BackendRef, FailureMode, InferenceRoutingPolicySpec, LoadSource};

/// Annotation turning routing on for an HTTPRoute: `RANDOM`, `LEAST_OUTSTANDING_REQUESTS` or
/// `PREFIX_AWARE` — the `InferenceRoutingPolicy` CRD's `strategy` values, spelled exactly so.
pub const ANNOTATION_STRATEGY: &str = "warmpath.dev/routing-strategy";
/// Annotation: prefix length in characters (1024–65536).
pub const ANNOTATION_PREFIX_LENGTH: &str = "warmpath.dev/prefix-length";
/// Annotation: concurrency threshold in in-flight requests (1–1024).
pub const ANNOTATION_CONCURRENCY_THRESHOLD: &str = "warmpath.dev/concurrency-threshold";
/// Annotation: `"true"` adds the `x-warmpath-decision` response header (the policy's `debugHeader`): the strategy
/// that ran, nothing about the pick.
pub const ANNOTATION_DEBUG_HEADER: &str = "warmpath.dev/debug-header";

pub use warmpath_core::headers::DESTINATION_HEADER;

/// Validated routing intent for one HTTPRoute.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingIntent {
    /// Routing strategy.
    pub strategy: Strategy,
    /// Prefix length in characters, if set.
    pub prefix_length: Option<u64>,
    /// Block size in bytes, if set.
    pub block_size: Option<u64>,
    /// Concurrency threshold in in-flight requests, if set.
    pub concurrency_threshold: Option<u64>,
    /// Tenant-id header name, if set.
    pub tenant_header: Option<String>,
    /// True unless the user asked for `FailClosed`.
    pub fail_open: bool,
    /// Explicit backend, if any (else the route's first backendRef).
    pub backend: Option<BackendRef>,
    /// Load scraping settings.
    pub load: LoadSource,
    /// Add the `x-warmpath-decision` response header.
    pub debug_header: bool,
}

/// The accepted strategy names: the CRD's `strategy` enum, one spelling for the policy and the
/// annotation alike.
pub const STRATEGIES: [&str; 3] = crate::crd::routing_policy::STRATEGIES;

/// Parses a strategy name, spelled exactly as the CRD's enum (`PREFIX_AWARE`, not `prefix-aware`
/// or `Prefix_Aware`): the API server refuses any other spelling in a policy, so the annotation
/// and `render -f` do too.
///
/// Errors: a message naming the accepted values (and the one meant, for a different spelling).
pub fn parse_strategy(s: &str) -> Result<Strategy, String> {
    match s {
        "RANDOM" => Ok(Strategy::Random),
        "LEAST_OUTSTANDING_REQUESTS" => Ok(Strategy::LeastOutstandingRequests),
        "PREFIX_AWARE" => Ok(Strategy::PrefixAware),
        _ => {
            let canonical = s.trim().to_ascii_uppercase().replace('-', "_");
            let hint = STRATEGIES
                .iter()
                .find(|v| **v == canonical)
                .map(|v| format!(" (did you mean {v}?)"))
                .unwrap_or_default();
            Err(format!("unknown strategy {s:?}: accepted values are {}{hint}", STRATEGIES.join(", ")))
        }
    }
}

fn check_range(field: &str, v: i64, (lo, hi): (u64, u64)) -> Result<u64, String> {
    if v < lo as i64 || v > hi as i64 {
        return Err(format!("{field} = {v} is out of range {lo}..={hi}"));
    }
    Ok(v as u64)
}

impl RoutingIntent {
    /// Validates a policy spec. Ranges are the filter's (`warmpath_core::config::*_RANGE`).
    ///
    /// Errors: a user-facing message (goes into `Accepted=False, reason Invalid`).
    pub fn from_policy(spec: &InferenceRoutingPolicySpec) -> Result<Self, String> {
        let strategy = parse_strategy(&spec.strategy)?;
        let prefix_length =
            spec.prefix_length.map(|v| check_range("prefixLength", v, PREFIX_LENGTH_RANGE)).transpose()?;
        let block_size = spec.block_size.map(|v| check_range("blockSize", v, BLOCK_SIZE_RANGE)).transpose()?;
        if let (Some(p), Some(b)) = (prefix_length, block_size) {
            if b > p {
                return Err(format!("blockSize = {b} exceeds prefixLength = {p}"));
            }
        }
        let concurrency_threshold = spec
            .concurrency_threshold
            .map(|v| check_range("concurrencyThreshold", v, CONCURRENCY_THRESHOLD_RANGE))
            .transpose()?;
        if let Some(b) = &spec.backend {
            if b.service.is_some() == b.inference_pool.is_some() {
                return Err("backend needs exactly one of service or inferencePool".into());
            }
        }
        let intent = RoutingIntent {
            strategy,
            prefix_length,
            block_size,
            concurrency_threshold,
            tenant_header: spec.tenant_header.clone(),
            fail_open: spec.failure_mode == FailureMode::FailOpen,
            backend: spec.backend.clone(),
            load: spec.load.clone().unwrap_or_default(),
            debug_header: spec.debug_header,
        };
        // Final word: the filter's own validation of the configuration we would write.
        intent.plugin_config(&FeedTarget::placeholder(), &[])?;
        Ok(intent)
    }

    /// Reads the HTTPRoute annotation shortcut. `None` when the strategy annotation is absent
    /// (routing is off for the route); `Some(Err)` when a value is invalid.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<Result<Self, String>> {
        let strategy = annotations.get(ANNOTATION_STRATEGY)?;
        Some((|| {
            let num = |key: &str| -> Result<Option<i64>, String> {
                annotations
                    .get(key)
                    .map(|v| v.trim().parse::<i64>().map_err(|_| format!("annotation {key}: {v:?} is not an integer")))
                    .transpose()
            };
            let spec = InferenceRoutingPolicySpec {
                target_refs: vec![],
                strategy: strategy.clone(),
                prefix_length: num(ANNOTATION_PREFIX_LENGTH)?,
                block_size: None,
                concurrency_threshold: num(ANNOTATION_CONCURRENCY_THRESHOLD)?,
                tenant_header: None,
                failure_mode: FailureMode::FailOpen,
                backend: None,
                load: None,
                debug_header: match annotations.get(ANNOTATION_DEBUG_HEADER).map(String::as_str) {
                    None | Some("false") => false,
                    Some("true") => true,
                    Some(v) => {
                        return Err(format!("annotation {ANNOTATION_DEBUG_HEADER}: {v:?} is not \"true\" or \"false\""))
                    }
                },
            };
            let strategy = parse_strategy(strategy).map_err(|e| format!("annotation {ANNOTATION_STRATEGY}: {e}"))?;
            if spec.prefix_length.is_some() && strategy != Strategy::PrefixAware {
                return Err(format!("annotation {ANNOTATION_PREFIX_LENGTH} applies only to PREFIX_AWARE"));
            }
            let spec = InferenceRoutingPolicySpec { strategy: strategy.as_str().into(), ..spec };
            Self::from_policy(&spec).map_err(|e| format!("annotations: {e}"))
        })())
    }

    /// The filter's plugin configuration (JSON object, snake_case keys as in
    /// `warmpath_core::RawConfig`), validated by `Settings::from_json`.
    ///
    /// Errors: the filter's validation message (never expected for a validated intent).
    pub fn plugin_config(&self, feed: &FeedTarget, upstream_clusters: &[String]) -> Result<Value, String> {
        let raw = RawConfig {
            strategy: Some(self.strategy),
            prefix_length: self.prefix_length,
            block_size: self.block_size,
            concurrency_threshold: self.concurrency_threshold,
            tenant_header: self.tenant_header.clone(),
            feed: Some(RawFeed {
                cluster: Some(feed.cluster.clone()),
                path: Some(feed.path.clone()),
                interval_ms: Some(feed.interval_ms),
            }),
            upstream_clusters: (!upstream_clusters.is_empty()).then(|| upstream_clusters.to_vec()),
            debug_header: self.debug_header.then_some(true),
            ..RawConfig::default()
        };
        let cfg = serde_json::to_value(&raw).map_err(|e| e.to_string())?;
        Settings::from_raw(raw).map_err(|e| format!("filter rejects the configuration: {e}"))?;
        Ok(cfg)
    }
}

/// Where the filter polls its endpoint/load feed: an Envoy cluster name (which differs per
/// provider), the URL path on the controller's HTTP server, and the poll period.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedTarget {
    /// Envoy cluster the filter's `dispatch_http_call` uses.
    pub cluster: String,
    /// URL path, e.g. `/v1/feed/default/my-policy`.
    pub path: String,
    /// Poll period in milliseconds (100–60000).
    pub interval_ms: u64,
}

impl FeedTarget {
    fn placeholder() -> Self {
        Self { cluster: "warmpath-feed".into(), path: "/v1/feed/policy/x/y".into(), interval_ms: 1000 }
    }
}

/// The feed kind of an `InferenceRoutingPolicy` ([`feed_key`]).
pub const FEED_KIND_POLICY: &str = "policy";
/// The feed kind of an HTTPRoute with warmpath annotations ([`feed_key`]).
pub const FEED_KIND_HTTPROUTE: &str = "httproute";

/// Feed key (also the store key) of an owner: `policy/<namespace>/<name>` for an
/// `InferenceRoutingPolicy`, `httproute/<namespace>/<name>` for an annotated HTTPRoute.
pub fn feed_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind}/{namespace}/{name}")
}

/// URL path of a feed on the controller's HTTP server: `/v1/feed/<feed key>`.
pub fn feed_path(key: &str) -> String {
    format!("/v1/feed/{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(strategy: &str) -> InferenceRoutingPolicySpec {
        InferenceRoutingPolicySpec { strategy: strategy.into(), ..InferenceRoutingPolicySpec::default() }
    }

    #[test]
    fn strategies_parse_in_the_crd_spelling_only() {
        assert_eq!(parse_strategy("PREFIX_AWARE"), Ok(Strategy::PrefixAware));
        assert_eq!(parse_strategy("LEAST_OUTSTANDING_REQUESTS"), Ok(Strategy::LeastOutstandingRequests));
        assert_eq!(parse_strategy("RANDOM"), Ok(Strategy::Random));
        for other in ["prefix-aware", "Prefix_Aware", " PREFIX_AWARE"] {
            let e = parse_strategy(other).unwrap_err();
            assert!(
                e.contains(
                    "accepted values are RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE (did you mean PREFIX_AWARE?)"
                ),
                "{e}"
            );
        }
        let e = parse_strategy("round-robin").unwrap_err();
        assert!(
            e.contains("\"round-robin\"")
                && e.contains("accepted values are RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE")
                && !e.contains("did you mean"),
            "{e}"
        );
        // Every value the CRD's enum accepts parses, and the enum is exactly these.
        let crd = serde_json::to_value(
            <crate::crd::routing_policy::InferenceRoutingPolicy as kube::CustomResourceExt>::crd(),
        )
        .unwrap();
        let schema =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["strategy"];
        assert_eq!(schema["enum"], serde_json::json!(STRATEGIES), "{schema}");
        for v in STRATEGIES {
            assert_eq!(parse_strategy(v).unwrap().as_str(), v);
        }
    }

    #[test]
    fn out_of_range_numbers_are_reported_with_the_filter_range() {
        let e = RoutingIntent::from_policy(&InferenceRoutingPolicySpec {
            prefix_length: Some(100),
            ..spec("PREFIX_AWARE")
        })
        .unwrap_err();
        assert!(e.contains("prefixLength = 100") && e.contains("1024..=65536"), "{e}");
        let e = RoutingIntent::from_policy(&InferenceRoutingPolicySpec {
            concurrency_threshold: Some(0),
            ..spec("PREFIX_AWARE")
        })
        .unwrap_err();
        assert!(e.contains("concurrencyThreshold = 0"), "{e}");
        let e = RoutingIntent::from_policy(&InferenceRoutingPolicySpec {
            prefix_length: Some(1024),
            block_size: Some(4096),
            ..spec("PREFIX_AWARE")
        })
        .unwrap_err();
        assert!(e.contains("exceeds"), "{e}");
    }

    #[test]
    fn plugin_config_is_accepted_by_the_filter_core() {
        let intent = RoutingIntent::from_policy(&InferenceRoutingPolicySpec {
            prefix_length: Some(4096),
            concurrency_threshold: Some(8),
            tenant_header: Some("x-tenant".into()),
            ..spec("PREFIX_AWARE")
        })
        .unwrap();
        let feed = FeedTarget {
            cluster: "c".into(),
            path: feed_path(&feed_key(FEED_KIND_POLICY, "ns", "p")),
            interval_ms: 500,
        };
        let cfg = intent.plugin_config(&feed, &["outbound|8000||vllm.llm.svc.cluster.local".into()]).unwrap();
        let s = Settings::from_json(cfg.to_string().as_bytes()).unwrap();
        assert_eq!((s.prefix_length, s.concurrency_threshold, s.tenant_header.as_str()), (4096, 8, "x-tenant"));
        assert!(
            s.acts_on_cluster(Some("outbound|8000||vllm.llm.svc.cluster.local")) && !s.acts_on_cluster(Some("other"))
        );
        assert_eq!(s.feed.unwrap().path, "/v1/feed/policy/ns/p");
        assert!(!s.debug_header, "a rendered configuration never turns the client-facing debug header on");
    }

    #[test]
    fn annotations_shortcut() {
        let mut a = BTreeMap::new();
        assert!(RoutingIntent::from_annotations(&a).is_none());
        a.insert(ANNOTATION_STRATEGY.into(), "PREFIX_AWARE".into());
        a.insert(ANNOTATION_PREFIX_LENGTH.into(), "2048".into());
        a.insert(ANNOTATION_CONCURRENCY_THRESHOLD.into(), "16".into());
        let i = RoutingIntent::from_annotations(&a).unwrap().unwrap();
        assert_eq!(
            (i.strategy, i.prefix_length, i.concurrency_threshold),
            (Strategy::PrefixAware, Some(2048), Some(16))
        );
        a.insert(ANNOTATION_PREFIX_LENGTH.into(), "lots".into());
        assert!(RoutingIntent::from_annotations(&a).unwrap().unwrap_err().contains("not an integer"));
        a.insert(ANNOTATION_PREFIX_LENGTH.into(), "99999999".into());
        assert!(RoutingIntent::from_annotations(&a).unwrap().unwrap_err().contains("out of range"));
        a.insert(ANNOTATION_PREFIX_LENGTH.into(), "2048".into());
        a.insert(ANNOTATION_DEBUG_HEADER.into(), "true".into());
        let i = RoutingIntent::from_annotations(&a).unwrap().unwrap();
        assert!(i.debug_header);
        let cfg = i.plugin_config(&FeedTarget::placeholder(), &[]).unwrap();
        assert_eq!(cfg["debug_header"], true);
        assert!(Settings::from_json(cfg.to_string().as_bytes()).unwrap().debug_header, "the filter reads it");
        a.insert(ANNOTATION_DEBUG_HEADER.into(), "yes".into());
        assert!(RoutingIntent::from_annotations(&a).unwrap().unwrap_err().contains("is not \"true\" or \"false\""));
        a.remove(ANNOTATION_DEBUG_HEADER);
        a.insert(ANNOTATION_STRATEGY.into(), "fastest".into());
        assert!(RoutingIntent::from_annotations(&a).unwrap().unwrap_err().contains("unknown strategy"));
        a.insert(ANNOTATION_STRATEGY.into(), "prefix-aware".into());
        let e = RoutingIntent::from_annotations(&a).unwrap().unwrap_err();
        assert!(
            e.starts_with(
                "annotation warmpath.dev/routing-strategy: unknown strategy \"prefix-aware\": accepted values are"
            ),
            "{e}"
        );
    }
}
