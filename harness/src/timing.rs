//! Envoy's own account of where a request's time went, from a file access log ([`EnvoyConfig::with_timing_log`]):
//! per request, how long the proxy held the request after its last byte arrived and how long it took to pass the
//! answer's first byte on. Envoy stamps these moments itself (`%COMMON_DURATION%`, Envoy's access-log command
//! operators), so the figures cover the filter chain, the pick and Envoy's own forwarding, not the client or the
//! network.
//!
//! [`EnvoyConfig::with_timing_log`]: crate::EnvoyConfig::with_timing_log

use std::path::Path;

use serde_json::{json, Value};

/// How often Envoy writes its access logs to disk, ms (Envoy's `--file-flush-interval-msec`; its default of 10 s
/// would leave a short run's lines in memory when it is read). Read the log this long after the last request ends.
pub const FLUSH_INTERVAL_MS: u64 = 100;

/// One line per request, µs: last request byte received → last request byte sent upstream; first upstream response
/// byte → first byte sent to the client; then the request's path. A moment Envoy did not reach prints `-`.
const FORMAT: &str =
    "%COMMON_DURATION(DS_RX_END:US_TX_END:us)% %COMMON_DURATION(US_RX_BEG:DS_TX_BEG:us)% %REQ(:PATH)%\n";

/// The listener's `access_log` entry writing [`FORMAT`] to `path`.
pub(crate) fn access_log(path: &Path) -> Value {
    json!([{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path.to_string_lossy(),
            "log_format": { "text_format_source": { "inline_string": FORMAT } },
        },
    }])
}

/// One request's time inside Envoy, µs (`None`: Envoy never reached one of the two moments, e.g. a reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyTiming {
    /// Last request byte received from the client → last request byte sent to the server: what the proxy adds
    /// before the server has the whole request (the filter's pick, for a filter that waits for the body).
    pub request_us: Option<u64>,
    /// First response byte from the server → first byte to the client.
    pub first_byte_us: Option<u64>,
}

/// The requests logged in `text` (the log's content) whose path starts with `path_prefix`; other lines (another
/// format, a health check) are skipped.
pub fn parse(text: &str, path_prefix: &str) -> Vec<ProxyTiming> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let (request, first_byte, path) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(path_prefix)
                .then(|| ProxyTiming { request_us: request.parse().ok(), first_byte_us: first_byte.parse().ok() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_missing_moments_stay_missing() {
        let log = "81 21 /v1/chat/completions\n- 12 /v1/completions\n33 - /v1/chat/completions\n5 5 /ready\nbad\n";
        let t = parse(log, "/v1/");
        assert_eq!(
            t,
            vec![
                ProxyTiming { request_us: Some(81), first_byte_us: Some(21) },
                ProxyTiming { request_us: None, first_byte_us: Some(12) },
                ProxyTiming { request_us: Some(33), first_byte_us: None },
            ]
        );
    }
}
