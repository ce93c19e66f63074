//! Plugin configuration: [`RawConfig`] is the JSON as written in Envoy / Istio / Envoy Gateway
//! (`deny_unknown_fields`), [`Settings`] is the validated form the router uses (two-stage config).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Routing strategy, switchable by configuration without rebuilding the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Strategy {
    /// Uniformly random endpoint (randomness supplied by the caller).
    Random,
    /// Endpoint with the fewest in-flight requests (ties broken by the caller's randomness).
    LeastOutstandingRequests,
    /// Longest prefix match against the prefix index, else a consistent (rendezvous) pick, with an overload guard.
    #[default]
    PrefixAware,
}

impl Strategy {
    /// The configuration spelling (`"RANDOM"`, ...), also used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Random => "RANDOM",
            Strategy::LeastOutstandingRequests => "LEAST_OUTSTANDING_REQUESTS",
            Strategy::PrefixAware => "PREFIX_AWARE",
        }
    }
}

/// The plugin configuration JSON exactly as written by the operator. Every field is optional; see
/// [`Settings`] for defaults and allowed ranges. Unknown fields are rejected (typos must not pass silently).
/// Serializing it (absent fields left out) is how the controller writes the configuration it renders, so the
/// field names exist once, here.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // fields are documented on `Settings`
pub struct RawConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_threshold: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_header: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_capacity: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug_header: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feed: Option<RawFeed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_clusters: Option<Vec<String>>,
}

/// Raw form of the optional endpoint/load feed section (filled in later by the controller).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // fields are documented on `FeedSettings`
pub struct RawFeed {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
}

/// Validated endpoint/load feed settings: the filter polls `GET path` on Envoy cluster `cluster` every `interval_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedSettings {
    /// Envoy cluster name serving the feed (non-empty).
    pub cluster: String,
    /// HTTP path of the feed, starting with `/` (default `/v1/endpoints`).
    pub path: String,
    /// Poll period in milliseconds, 10..=60000 (default 1000).
    pub interval_ms: u64,
}

/// Allowed range of `prefix_length` (characters of extracted text for OpenAI bodies, bytes for raw bodies).
pub const PREFIX_LENGTH_RANGE: (u64, u64) = (1024, 65536);
/// Allowed range of `block_size` in bytes of the extracted text.
pub const BLOCK_SIZE_RANGE: (u64, u64) = (16, 8192);
/// Allowed range of `concurrency_threshold` (in-flight requests on one endpoint).
pub const CONCURRENCY_THRESHOLD_RANGE: (u64, u64) = (1, 1024);
/// Default `max_body_bytes`: 1 MiB, Envoy's default per-connection buffer limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// Allowed range of `max_body_bytes`.
pub const MAX_BODY_BYTES_RANGE: (u64, u64) = (1024, 64 * 1024 * 1024);
/// Allowed range of `index_capacity` in blocks.
pub const INDEX_CAPACITY_RANGE: (u64, u64) = (64, 1 << 22);
/// Allowed range of `feed.interval_ms`. The low end serves the benchmark harness, which compresses time (at time
/// scale 0.2 a [`FEED_TICK_MS`] of simulated time is 10 ms of wall time); a deployment polls every second or more.
pub const FEED_INTERVAL_RANGE: (u64, u64) = (10, 60_000);

/// The filter's tick period without a feed, ms: how often batched counters are flushed and gauges refreshed.
pub const TICK_MS: u64 = 200;

/// The filter's longest tick period with a feed, ms: every tick also exchanges index records and pending prefill
/// work with the other gateways through the feed (a feed polled more often ticks at its own interval). Chosen by
/// measurement on the Mooncake trace at four gateways (BENCHMARKS.md §1, gateway replicas): every 500 ms the
/// others' pending work cut TTFT p50 by 6 %, every 200 ms by a third, but four gateways still placed the same new
/// prefixes apart and queued behind each other's work (p50 1.07–1.13×, p90 1.06–1.08× one gateway's); every 50 ms
/// they were no worse than 1.03× on hit ratio, p50 and p90. It costs one small `POST` per Envoy per tick to the feed.
pub const FEED_TICK_MS: u64 = 50;
/// Most endpoints a configuration may list.
pub const MAX_ENDPOINTS: usize = 4096;
/// Most Envoy cluster names `upstream_clusters` may list (one policy's HTTPRoute rules; a longer list is a
/// mistake, not a configuration).
pub const MAX_UPSTREAM_CLUSTERS: usize = 64;
/// Longest Envoy cluster name accepted in `upstream_clusters`, in bytes (Istio names such as
/// `outbound|8000||vllm.llm.svc.cluster.local` stay far below it).
pub const MAX_CLUSTER_NAME_BYTES: usize = 512;
/// Longest `tenant_header` name accepted, in bytes (an HTTP field-name token; real names stay far below it).
pub const MAX_HEADER_NAME_BYTES: usize = 128;

/// Validated settings. Construct with [`Settings::from_json`] (or [`Settings::default`] plus field edits in tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Routing strategy; default [`Strategy::PrefixAware`].
    pub strategy: Strategy,
    /// How much leading text forms the key: characters (Unicode scalar values) of extracted text for OpenAI
    /// bodies, bytes for raw bodies. 1024..=65536, default 8192.
    pub prefix_length: usize,
    /// Bytes of extracted text per hashed block (UTF-8 bytes, also for OpenAI bodies). 16..=8192 and at most
    /// `prefix_length`; default 128 (about 32 tokens of English text).
    pub block_size: usize,
    /// An endpoint with this many requests in flight (or more) is overloaded. 1..=1024, default 64: a safety cap
    /// above what a model server runs at once in ordinary operation (the simulated servers' batch limit is 64),
    /// since the feed's server loads count running requests too and a lower cap refuses every busy server, which
    /// sends requests to the least-loaded endpoint whatever they have cached. Against 10, 20 and 40 it measured the
    /// same TTFT on every workload and kept rag's documents on their holders (BENCHMARKS.md §1, "The hard cap").
    pub concurrency_threshold: u32,
    /// Request header carrying the tenant id (lower-cased here; HTTP/2 header names are lower case). Default
    /// `x-warmpath-prefix-id`.
    pub tenant_header: String,
    /// Bodies larger than this many bytes are not parsed (the request fails open). 1024..=67108864, default
    /// [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Endpoint addresses `IP:port` (IPv6 as `[addr]:port`), normalised by `SocketAddr`; duplicates removed,
    /// order kept. May be empty only when `feed` is set.
    pub endpoints: Vec<String>,
    /// Capacity of the bounded prefix index, in blocks. 64..=4194304, default 65536 (8 MiB of prompt text at the
    /// default block size, about 5 MiB of heap per Envoy worker: `examples/index_memory.rs`). The index must
    /// remember a prefix as long as the fleet's caches keep it, or a returning prefix is placed as a miss: on the
    /// Mooncake trace with 8 servers × 1.5 M cached tokens, 16384 blocks held about 250 requests' keys and
    /// reached 0.84× the pooled-cache hit ratio, 65536 reach 0.97× (131072 no more); the other workloads do not
    /// fill either size.
    pub index_capacity: usize,
    /// When true the filter adds the response header `headers::DEBUG_HEADER`: the strategy and the request's own
    /// fail-open cause, nothing that depends on other clients' requests. Default false.
    pub debug_header: bool,
    /// Optional endpoint/load feed; default none.
    pub feed: Option<FeedSettings>,
    /// Envoy cluster names this instance routes for: JSON list of strings, e.g.
    /// `["outbound|8000||vllm.llm.svc.cluster.local"]` (Istio) or `["httproute/llm/chat/rule/0"]` (Envoy
    /// Gateway). When non-empty, a request whose upstream cluster — Envoy's `xds.cluster_name` attribute, the
    /// cluster of the route Envoy selected — is not listed (or that matched no route) is left entirely alone by
    /// this instance: no header stripping, no body buffering, no pick, no in-flight slot. This lets several
    /// instances (one per routing policy, each under its own Envoy `plugin_name`) share one listener, each
    /// acting only on the requests its endpoints can serve. Empty (the default) = act on every request.
    /// At most [`MAX_UPSTREAM_CLUSTERS`] names of 1..=[`MAX_CLUSTER_NAME_BYTES`] bytes without control
    /// characters or surrounding whitespace; duplicates removed, order kept.
    pub upstream_clusters: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            strategy: Strategy::PrefixAware,
            prefix_length: 8192,
            block_size: 128,
            concurrency_threshold: 64,
            tenant_header: "x-warmpath-prefix-id".to_string(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            endpoints: Vec::new(),
            index_capacity: 65536,
            debug_header: false,
            feed: None,
            upstream_clusters: Vec::new(),
        }
    }
}

/// `s` as one bounded line for an error message: control characters escaped, at most `max` characters.
pub(crate) fn shown(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
        .take(max)
        .collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// `v` if it lies in `lo..=hi`; else an error naming the range (from the constant, so it is written once) and
/// `unit`.
fn in_range(field: &'static str, v: u64, (lo, hi): (u64, u64), unit: &str) -> Result<u64, ConfigError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::OutOfRange { field, value: v.to_string(), allowed: format!("{lo}..={hi} {unit}") })
    }
}

/// True for an HTTP field-name token (RFC 9110 §5.1 / §5.6.2 `tchar`).
fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_HEADER_NAME_BYTES
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl Settings {
    /// Parses and validates the plugin configuration bytes (UTF-8 JSON object; empty or whitespace-only input
    /// means `{}`).
    ///
    /// Errors: [`ConfigError::Json`] for bad JSON, unknown fields, unknown `strategy` names or wrong types;
    /// [`ConfigError::OutOfRange`] / [`ConfigError::Invalid`] for values outside the ranges documented on
    /// each field of [`Settings`].
    pub fn from_json(bytes: &[u8]) -> Result<Settings, ConfigError> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        let raw: RawConfig = if first.is_none() {
            RawConfig::default()
        } else if first != Some(&b'{') {
            // serde would report the first field it could not map (e.g. an array's first element as a strategy).
            return Err(ConfigError::Json("the plugin configuration must be a JSON object".into()));
        } else {
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(shown(&e.to_string(), 300)))?
        };
        Settings::from_raw(raw)
    }

    /// Validates an already-parsed [`RawConfig`]; see [`Settings::from_json`] for the errors.
    pub fn from_raw(raw: RawConfig) -> Result<Settings, ConfigError> {
        let d = Settings::default();
        let prefix_length = match raw.prefix_length {
            Some(v) => in_range("prefix_length", v, PREFIX_LENGTH_RANGE, "characters (bytes for raw bodies)")? as usize,
            None => d.prefix_length,
        };
        let block_size = match raw.block_size {
            Some(v) => in_range("block_size", v, BLOCK_SIZE_RANGE, "bytes")? as usize,
            None => d.block_size,
        };
        if block_size > prefix_length {
            return Err(ConfigError::OutOfRange {
                field: "block_size",
                value: block_size.to_string(),
                allowed: "at most prefix_length".into(),
            });
        }
        let concurrency_threshold = match raw.concurrency_threshold {
            Some(v) => in_range("concurrency_threshold", v, CONCURRENCY_THRESHOLD_RANGE, "in-flight requests")? as u32,
            None => d.concurrency_threshold,
        };
        let tenant_header = match raw.tenant_header {
            Some(h) if is_header_name(&h) => h.to_ascii_lowercase(),
            Some(h) => {
                return Err(ConfigError::Invalid {
                    field: "tenant_header".into(),
                    value: shown(&h, 100),
                    reason: "expected an HTTP header name (1..=128 token characters)",
                })
            }
            None => d.tenant_header,
        };
        let max_body_bytes = match raw.max_body_bytes {
            Some(v) => in_range("max_body_bytes", v, MAX_BODY_BYTES_RANGE, "bytes")? as usize,
            None => d.max_body_bytes,
        };
        let index_capacity = match raw.index_capacity {
            Some(v) => in_range("index_capacity", v, INDEX_CAPACITY_RANGE, "blocks")? as usize,
            None => d.index_capacity,
        };
        let feed = raw.feed.map(validate_feed).transpose()?;
        let upstream_clusters = validate_upstream_clusters(raw.upstream_clusters.unwrap_or_default())?;
        let raw_endpoints = raw.endpoints.unwrap_or_default();
        if raw_endpoints.len() > MAX_ENDPOINTS {
            return Err(ConfigError::OutOfRange {
                field: "endpoints",
                value: format!("{} entries", raw_endpoints.len()),
                allowed: format!("at most {MAX_ENDPOINTS} entries"),
            });
        }
        let mut endpoints: Vec<String> = Vec::with_capacity(raw_endpoints.len());
        for (i, e) in raw_endpoints.into_iter().enumerate() {
            let addr = normalize_address(&e).ok_or_else(|| ConfigError::Invalid {
                field: format!("endpoints[{i}]"),
                value: shown(&e, 100),
                reason: ADDRESS_RULE,
            })?;
            if !endpoints.contains(&addr) {
                endpoints.push(addr);
            }
        }
        if endpoints.is_empty() && feed.is_none() {
            return Err(ConfigError::Invalid {
                field: "endpoints".into(),
                value: "[]".into(),
                reason: "give at least one \"IP:port\" endpoint, or a `feed`",
            });
        }
        Ok(Settings {
            strategy: raw.strategy.unwrap_or(d.strategy),
            prefix_length,
            block_size,
            concurrency_threshold,
            tenant_header,
            max_body_bytes,
            endpoints,
            index_capacity,
            debug_header: raw.debug_header.unwrap_or(d.debug_header),
            feed,
            upstream_clusters,
        })
    }
}

/// Parses `IP:port` and returns its canonical text form (`SocketAddr` display), or `None` if it is not one an
/// Envoy endpoint can have. Refused: host names (Envoy's override_host policy matches endpoint addresses, not
/// names), port 0, the unspecified address (`0.0.0.0`, `::`), and IPv4-mapped IPv6 (`[::ffff:a.b.c.d]`, which
/// Envoy never uses as an endpoint address: name the IPv4 address itself).
pub fn normalize_address(s: &str) -> Option<String> {
    let a = s.trim().parse::<SocketAddr>().ok()?;
    let mapped = match a.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
        std::net::IpAddr::V4(_) => false,
    };
    (a.port() != 0 && !a.ip().is_unspecified() && !mapped).then(|| a.to_string())
}

/// Why [`normalize_address`] refuses an address, for error messages.
pub const ADDRESS_RULE: &str =
    "expected IP:port (IPv6 as [addr]:port) with a port in 1..=65535, not 0.0.0.0/:: and not IPv4-mapped IPv6";

impl Settings {
    /// Whether this instance acts on a request whose upstream cluster is `cluster` (Envoy's `xds.cluster_name`;
    /// `None` when Envoy knows none, e.g. no route matched). True for every request when `upstream_clusters` is
    /// empty; otherwise only for a listed name (exact, case-sensitive: Envoy cluster names are).
    pub fn acts_on_cluster(&self, cluster: Option<&str>) -> bool {
        self.upstream_clusters.is_empty() || cluster.is_some_and(|c| self.upstream_clusters.iter().any(|u| u == c))
    }
}

fn validate_upstream_clusters(raw: Vec<String>) -> Result<Vec<String>, ConfigError> {
    if raw.len() > MAX_UPSTREAM_CLUSTERS {
        return Err(ConfigError::OutOfRange {
            field: "upstream_clusters",
            value: format!("{} entries", raw.len()),
            allowed: format!("at most {MAX_UPSTREAM_CLUSTERS} Envoy cluster names"),
        });
    }
    let mut out: Vec<String> = Vec::with_capacity(raw.len());
    for (i, name) in raw.into_iter().enumerate() {
        let reason = if name.is_empty() {
            Some("expected a non-empty Envoy cluster name")
        } else if name.len() > MAX_CLUSTER_NAME_BYTES {
            Some("expected an Envoy cluster name of at most 512 bytes")
        } else if name.trim() != name || name.chars().any(char::is_control) {
            // Envoy would never report such a name, so the entry could never match: refuse the typo.
            Some("expected an Envoy cluster name without control characters or surrounding whitespace")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ConfigError::Invalid {
                field: format!("upstream_clusters[{i}]"),
                value: shown(&name, 100),
                reason,
            });
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

fn validate_feed(raw: RawFeed) -> Result<FeedSettings, ConfigError> {
    let cluster = match raw.cluster {
        Some(c) if !c.trim().is_empty() => c,
        other => {
            return Err(ConfigError::Invalid {
                field: "feed.cluster".into(),
                value: shown(&other.unwrap_or_default(), 100),
                reason: "expected a non-empty Envoy cluster name",
            })
        }
    };
    let path = raw.path.unwrap_or_else(|| "/v1/endpoints".to_string());
    if !path.starts_with('/') || path.chars().any(|c| c.is_ascii_control() || c == ' ') {
        return Err(ConfigError::Invalid {
            field: "feed.path".into(),
            value: shown(&path, 100),
            reason: "expected an HTTP path starting with `/`",
        });
    }
    let interval_ms = match raw.interval_ms {
        Some(v) => in_range("feed.interval_ms", v, FEED_INTERVAL_RANGE, "ms")?,
        None => 1000,
    };
    Ok(FeedSettings { cluster, path, interval_ms })
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn err(json: &str) -> String {
        Settings::from_json(json.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn defaults_apply_with_one_endpoint() {
        let s = Settings::from_json(br#"{"endpoints":["127.0.0.1:8001"]}"#).unwrap();
        assert_eq!(s.strategy, Strategy::PrefixAware);
        assert_eq!(s.prefix_length, 8192);
        assert_eq!(s.index_capacity, 65536);
        assert_eq!(s.tenant_header, "x-warmpath-prefix-id");
        assert_eq!(s.endpoints, vec!["127.0.0.1:8001".to_string()]);
    }

    #[test]
    fn full_config_parses() {
        let s = Settings::from_json(
            br#"{"strategy":"LEAST_OUTSTANDING_REQUESTS","prefix_length":2048,"block_size":64,
                "concurrency_threshold":4,"tenant_header":"X-Tenant","max_body_bytes":4096,
                "endpoints":["127.0.0.1:1"," [::1]:2 ","127.0.0.1:1"],"index_capacity":100,"debug_header":true,
                "feed":{"cluster":"warmpath-controller","interval_ms":500}}"#,
        )
        .unwrap();
        assert_eq!(s.strategy, Strategy::LeastOutstandingRequests);
        assert_eq!(s.block_size, 64);
        assert_eq!(s.tenant_header, "x-tenant");
        assert_eq!(s.endpoints, vec!["127.0.0.1:1".to_string(), "[::1]:2".to_string()]);
        let f = s.feed.unwrap();
        assert_eq!((f.cluster.as_str(), f.path.as_str(), f.interval_ms), ("warmpath-controller", "/v1/endpoints", 500));
    }

    #[test]
    fn errors_name_field_value_and_range() {
        let e = err(r#"{"prefix_length":99,"endpoints":["127.0.0.1:1"]}"#);
        assert!(e.contains("`prefix_length` = 99") && e.contains("1024..=65536"), "{e}");
        let e = err(r#"{"concurrency_threshold":0,"endpoints":["127.0.0.1:1"]}"#);
        assert!(e.contains("concurrency_threshold") && e.contains("1..=1024"), "{e}");
        // The knobs of the earlier load-blind miss placement are gone (the predicted-TTFT rule subsumes them):
        // a configuration still naming one is refused, not silently ignored.
        for old in [r#""load_factor":1.25"#, r#""miss_choices":2"#, r#""miss_load_margin":4"#] {
            let e = err(&format!(r#"{{{old},"endpoints":["127.0.0.1:1"]}}"#));
            assert!(e.contains(old.split('"').nth(1).unwrap()), "{e}");
        }
        let e = err(r#"{"endpoints":["localhost:80"]}"#);
        assert!(e.contains("endpoints[0]") && e.contains("localhost:80") && e.contains("IP:port"), "{e}");
        let e = err(r#"{"endpoints":[]}"#);
        assert!(e.contains("endpoints") && e.contains("at least one"), "{e}");
        let e = err(r#"{"strategy":"ROUND_ROBIN","endpoints":["127.0.0.1:1"]}"#);
        assert!(e.contains("ROUND_ROBIN") && e.contains("PREFIX_AWARE"), "{e}");
        let e = err(r#"{"prefx_length":2048}"#);
        assert!(e.contains("prefx_length"), "{e}");
        let e = err(r#"{"block_size":4096,"prefix_length":2048,"endpoints":["127.0.0.1:1"]}"#);
        assert!(e.contains("block_size") && e.contains("prefix_length"), "{e}");
        let e = err(r#"{"tenant_header":"bad header","endpoints":["127.0.0.1:1"]}"#);
        assert!(e.contains("tenant_header"), "{e}");
        let e = err(r#"{"feed":{"cluster":"c","path":"nope"}}"#);
        assert!(e.contains("feed.path"), "{e}");
        let e = err(r#"{"feed":{"cluster":"c","interval_ms":5}}"#);
        assert!(e.contains("feed.interval_ms") && e.contains("10..=60000"), "{e}");
        let e = err("{\"x\\ny\":1}");
        assert!(!e.contains('\n') && e.contains("x\\ny"), "{e}");
        let e = err(&format!(r#"{{"endpoints":["{}"]}}"#, "9".repeat(5000)));
        assert!(e.len() < 400, "{e}");
        let e = err("{not json");
        assert!(e.starts_with("plugin configuration: invalid JSON"), "{e}");
        for e in [err(r#"{"prefix_length":99}"#), err("[1,2]"), err(r#"{"endpoints":["1.2.3.4"]}"#)] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn upstream_clusters_parse_dedupe_and_gate() {
        let s = Settings::from_json(br#"{"endpoints":["127.0.0.1:1"]}"#).unwrap();
        assert!(s.upstream_clusters.is_empty());
        // Empty list = every request, known cluster or not (today's behaviour).
        assert!(s.acts_on_cluster(Some("anything")) && s.acts_on_cluster(None));
        let s = Settings::from_json(
            br#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":
                ["outbound|8000||vllm.llm.svc.cluster.local","httproute/llm/chat/rule/0","outbound|8000||vllm.llm.svc.cluster.local"]}"#,
        )
        .unwrap();
        assert_eq!(s.upstream_clusters, vec!["outbound|8000||vllm.llm.svc.cluster.local", "httproute/llm/chat/rule/0"]);
        assert!(s.acts_on_cluster(Some("httproute/llm/chat/rule/0")));
        assert!(s.acts_on_cluster(Some("outbound|8000||vllm.llm.svc.cluster.local")));
        assert!(!s.acts_on_cluster(Some("httproute/llm/chat/rule/1")), "other rule of the same route");
        assert!(!s.acts_on_cluster(Some("HTTPROUTE/llm/chat/rule/0")), "cluster names are case-sensitive");
        assert!(!s.acts_on_cluster(Some("")));
        assert!(!s.acts_on_cluster(None), "no route: not ours");
        // An explicit empty list is the default.
        let s = Settings::from_json(br#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":[]}"#).unwrap();
        assert!(s.upstream_clusters.is_empty());
    }

    #[test]
    fn upstream_clusters_errors_name_the_entry() {
        let e = err(r#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":["a",""]}"#);
        assert!(e.contains("upstream_clusters[1]") && e.contains("non-empty"), "{e}");
        let e = err(r#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":[" pool-a"]}"#);
        assert!(e.contains("upstream_clusters[0]") && e.contains("whitespace"), "{e}");
        let e = err(r#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":["pool\nb"]}"#);
        assert!(e.contains("upstream_clusters[0]") && e.contains(r"pool\\nb") && !e.contains('\n'), "{e}");
        let long = "c".repeat(MAX_CLUSTER_NAME_BYTES + 1);
        let e = err(&format!(r#"{{"endpoints":["127.0.0.1:1"],"upstream_clusters":["{long}"]}}"#));
        assert!(e.contains("upstream_clusters[0]") && e.contains("512 bytes") && e.len() < 400, "{e}");
        assert!(Settings::from_json(
            format!(
                r#"{{"endpoints":["127.0.0.1:1"],"upstream_clusters":["{}"]}}"#,
                "c".repeat(MAX_CLUSTER_NAME_BYTES)
            )
            .as_bytes()
        )
        .is_ok());
        let names = |n: usize| (0..n).map(|i| format!("\"c{i}\"")).collect::<Vec<_>>().join(",");
        let e = err(&format!(
            r#"{{"endpoints":["127.0.0.1:1"],"upstream_clusters":[{}]}}"#,
            names(MAX_UPSTREAM_CLUSTERS + 1)
        ));
        assert!(e.contains("`upstream_clusters` = 65 entries") && e.contains("at most 64"), "{e}");
        let ok = Settings::from_json(
            format!(r#"{{"endpoints":["127.0.0.1:1"],"upstream_clusters":[{}]}}"#, names(MAX_UPSTREAM_CLUSTERS))
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(ok.upstream_clusters.len(), MAX_UPSTREAM_CLUSTERS);
        let e = err(r#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":"pool-a"}"#);
        assert!(e.contains("invalid JSON") && e.contains("sequence"), "a bare string is refused: {e}");
        let e = err(r#"{"endpoints":["127.0.0.1:1"],"upstream_clusters":[1]}"#);
        assert!(e.contains("invalid JSON"), "{e}");
    }

    #[test]
    fn empty_config_needs_endpoints() {
        let e = Settings::from_json(b"  ").unwrap_err().to_string();
        assert!(e.contains("endpoints"), "{e}");
        assert!(Settings::from_json(br#"{"feed":{"cluster":"c"}}"#).unwrap().endpoints.is_empty());
    }
}
