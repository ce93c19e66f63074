//! What happened to a request the filter placed, read from Envoy's stream attributes when the stream ends: did the
//! picked endpoint serve it, fail it, or did Envoy send it elsewhere? Pure functions; `http` reads the attributes.
//!
//! Envoy's `override_host` policy sends the first attempt to the picked host when it is a member of the cluster;
//! a retry (connect failure, reset, 503 under the rendered retry policy) goes to another host chosen by the
//! fallback policy. So a final upstream other than the pick means the pick failed when there was more than one
//! attempt, and that Envoy did not honour the pick (a host outside the cluster) when there was one.

/// Envoy's `response.code_details` prefix for a stream whose upstream failed before any response byte (connection
/// failure, reset, overflow).
const RESET_BEFORE_RESPONSE: &str = "upstream_reset_before_response_started";

/// The upstream statuses that mean "this server cannot serve now" rather than "this request is bad": bad gateway,
/// unavailable (also what Envoy answers after a connect failure), gateway timeout.
const UNAVAILABLE_STATUSES: [u16; 3] = [502, 503, 504];

/// The attributes of an ended stream that tell how the pick fared.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observed<'a> {
    /// The endpoint the filter picked (`IP:port`).
    pub picked: &'a str,
    /// `upstream.address`: the host of the last upstream attempt, when there was one.
    pub upstream: Option<&'a str>,
    /// `response.code`: the status sent to the client (Envoy's own for local replies), when there was a response.
    pub status: Option<u16>,
    /// `upstream.request_attempt_count`: upstream attempts made, when Envoy reports it.
    pub attempts: Option<u64>,
    /// `response.code_details`.
    pub details: Option<&'a str>,
    /// The request's body was larger than the filter holds (`max_body_bytes`).
    pub oversized: bool,
}

/// How the pick fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The picked endpoint answered (with a status that is not "unavailable").
    Succeeded,
    /// The picked endpoint failed the request before answering: connect failure, reset, an unavailable status, or
    /// a retry elsewhere.
    Failed,
    /// Envoy sent the only attempt to another host: the pick was not honoured (not a member of the cluster).
    NotHonoured,
    /// Nothing to learn (e.g. the client went away before an answer).
    Unknown,
}

/// The resets of a connection the endpoint had accepted (`response.code_details` of a reset before the response):
/// what a server that stops reading an upload and closes the connection causes, unlike a connect failure or an
/// overflow, which an upload cannot.
const CUT_SHORT: [&str; 2] = ["connection_termination", "remote_reset"];

/// Classifies an ended stream.
///
/// An oversized upload (larger than `max_body_bytes`) that the endpoint cut short, or that was then retried
/// elsewhere, is not counted against it: a server refusing an upload too large for it answers and closes the
/// connection while the body still streams, which Envoy sees as a reset, and any client can send such uploads to
/// push healthy endpoints into back-off. A connect failure, an overflow or an unavailable status the endpoint
/// answered still counts.
pub fn classify(o: &Observed<'_>) -> Outcome {
    let reset_before_response = o.details.is_some_and(|d| d.starts_with(RESET_BEFORE_RESPONSE));
    let cut_short = reset_before_response && o.details.is_some_and(|d| CUT_SHORT.iter().any(|r| d.contains(r)));
    let retried_elsewhere = o.upstream.is_some_and(|u| u != o.picked) && o.attempts.is_some_and(|n| n > 1);
    match observed_outcome(o, reset_before_response) {
        Outcome::Failed if o.oversized && (cut_short || retried_elsewhere) => Outcome::Unknown,
        outcome => outcome,
    }
}

/// [`classify`] whatever the request's size.
fn observed_outcome(o: &Observed<'_>, reset_before_response: bool) -> Outcome {
    match o.upstream {
        Some(u) if u == o.picked => {
            if reset_before_response || o.status.is_some_and(|s| UNAVAILABLE_STATUSES.contains(&s)) {
                Outcome::Failed
            } else if o.status.is_some() {
                Outcome::Succeeded
            } else {
                Outcome::Unknown
            }
        }
        Some(_) if o.attempts.is_some_and(|n| n > 1) => Outcome::Failed,
        Some(_) => Outcome::NotHonoured,
        None if reset_before_response => Outcome::Failed,
        None => Outcome::Unknown,
    }
}

/// Parses an `IP:port` attribute value the way Envoy prints it; `None` for anything else (a pipe, an empty value).
pub fn host_port(value: &str) -> Option<&str> {
    value.rsplit_once(':').filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()).map(|_| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PICK: &str = "127.0.0.1:8001";

    fn observed(
        upstream: Option<&'static str>,
        status: Option<u16>,
        attempts: Option<u64>,
        details: Option<&'static str>,
    ) -> Outcome {
        classify(&Observed { picked: PICK, upstream, status, attempts, details, oversized: false })
    }

    #[test]
    fn the_pick_answering_is_a_success_whatever_the_request_status() {
        assert_eq!(observed(Some(PICK), Some(200), Some(1), Some("via_upstream")), Outcome::Succeeded);
        assert_eq!(observed(Some(PICK), Some(400), Some(1), Some("via_upstream")), Outcome::Succeeded);
        assert_eq!(observed(Some(PICK), Some(500), Some(1), Some("via_upstream")), Outcome::Succeeded, "a bad request");
    }

    #[test]
    fn connect_failures_resets_and_unavailable_statuses_fail_the_pick() {
        let reset = Some("upstream_reset_before_response_started{remote_connection_failure}");
        assert_eq!(observed(Some(PICK), Some(503), Some(1), reset), Outcome::Failed);
        assert_eq!(observed(Some(PICK), Some(503), Some(1), Some("via_upstream")), Outcome::Failed);
        assert_eq!(observed(Some(PICK), Some(502), None, None), Outcome::Failed);
        assert_eq!(observed(None, Some(503), None, reset), Outcome::Failed);
    }

    #[test]
    fn a_retry_elsewhere_fails_the_pick_and_a_single_attempt_elsewhere_is_not_honoured() {
        assert_eq!(observed(Some("127.0.0.1:8002"), Some(200), Some(2), Some("via_upstream")), Outcome::Failed);
        assert_eq!(observed(Some("127.0.0.1:8002"), Some(200), Some(1), Some("via_upstream")), Outcome::NotHonoured);
        assert_eq!(observed(Some("127.0.0.1:8002"), Some(200), None, None), Outcome::NotHonoured);
    }

    #[test]
    fn an_oversized_upload_cut_short_teaches_nothing_but_an_answer_still_does() {
        let reset = Some("upstream_reset_before_response_started{connection_termination}");
        let oversized = |upstream, status, attempts, details| {
            classify(&Observed { picked: PICK, upstream, status, attempts, details, oversized: true })
        };
        assert_eq!(oversized(Some(PICK), Some(503), Some(1), reset), Outcome::Unknown, "a reset mid-upload");
        assert_eq!(oversized(None, Some(503), None, reset), Outcome::Unknown);
        let remote_reset = Some("upstream_reset_before_response_started{remote_reset}");
        assert_eq!(oversized(Some(PICK), Some(503), Some(1), remote_reset), Outcome::Unknown);
        // What an upload cannot cause still counts: the endpoint refused the connection, or Envoy's own overflow.
        let refused =
            Some("upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_111}");
        assert_eq!(oversized(Some(PICK), Some(503), Some(1), refused), Outcome::Failed, "a dead endpoint");
        assert_eq!(oversized(None, Some(503), None, refused), Outcome::Failed);
        let overflow = Some("upstream_reset_before_response_started{overflow}");
        assert_eq!(oversized(Some(PICK), Some(503), Some(1), overflow), Outcome::Failed);
        assert_eq!(oversized(Some("127.0.0.1:8002"), Some(413), Some(2), Some("via_upstream")), Outcome::Unknown);
        assert_eq!(oversized(Some(PICK), Some(503), Some(1), Some("via_upstream")), Outcome::Failed, "its own 503");
        assert_eq!(oversized(Some(PICK), Some(413), Some(1), Some("via_upstream")), Outcome::Succeeded);
        assert_eq!(oversized(Some("127.0.0.1:8002"), Some(200), Some(1), None), Outcome::NotHonoured);
        // The same streams with a body the filter holds.
        assert_eq!(observed(Some(PICK), Some(503), Some(1), reset), Outcome::Failed);
        assert_eq!(observed(Some("127.0.0.1:8002"), Some(413), Some(2), Some("via_upstream")), Outcome::Failed);
    }

    #[test]
    fn nothing_is_learnt_from_a_client_that_left() {
        assert_eq!(observed(Some(PICK), None, Some(1), Some("downstream_remote_disconnect")), Outcome::Unknown);
        assert_eq!(observed(None, None, None, None), Outcome::Unknown);
    }

    #[test]
    fn host_port_accepts_envoy_addresses_only() {
        assert_eq!(host_port("127.0.0.1:8001"), Some("127.0.0.1:8001"));
        assert_eq!(host_port("[::1]:8001"), Some("[::1]:8001"));
        assert_eq!(host_port("/tmp/socket"), None);
        assert_eq!(host_port(":80"), None);
    }
}
