//! Passive failure learning: which endpoints are down, from what happened to the requests the filter placed.
//!
//! An endpoint whose request failed before any response byte (connect failure, reset, a 5xx answer, or Envoy
//! retrying the request elsewhere) is down for a back-off period that doubles with each consecutive failure, from
//! [`BACKOFF_BASE_MS`] up to [`BACKOFF_MAX_MS`]. A success clears it at once. When the period expires, one request
//! is sent there as the probe ([`Health::claim_probe`]) while the others keep avoiding it for up to
//! [`PROBE_WINDOW_MS`]: a failed probe doubles the period, a successful one clears it, one that tells nothing
//! ([`Health::probe_told_nothing`]) lets the next request probe. So a dead endpoint costs one
//! request per back-off period (served anyway by Envoy's retry), not every request picked for it in that moment.
//!
//! Down endpoints are not candidates for any policy: [`avoid_down`] moves a pick that landed on a down endpoint to
//! the least-loaded endpoint that is up. When every endpoint is down the pick stands — a request is never dropped
//! for want of a healthy endpoint (Envoy's retries and outlier detection still act on it).
//!
//! Pure state: time comes in as an argument (ms since the epoch), nothing here reads a clock. The filter keeps one
//! [`Health`] per endpoint in shared data (see the shell), so every Envoy worker sees the same state.

use crate::endpoint::EndpointLoad;

/// First back-off period, in ms: long enough that a dead endpoint gets at most a handful of probe requests per
/// second under load, short enough that a restarted model server gets traffic back within about a second.
pub const BACKOFF_BASE_MS: u64 = 1_000;
/// Longest back-off period, in ms: a model server that stays down is probed twice a minute (the same order as
/// Envoy's outlier-detection base ejection time, 30 s).
pub const BACKOFF_MAX_MS: u64 = 30_000;

/// How long the other requests keep away from an endpoint whose probe is under way, in ms: the probe's answer
/// (its response headers) normally comes well within it; if not, the next request becomes a probe too.
pub const PROBE_WINDOW_MS: u64 = 1_000;

/// The failure state of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// Consecutive failures since the last success.
    pub failures: u32,
    /// End of the current back-off period or probe window (ms since the epoch); the endpoint is down before it.
    pub down_until_ms: u64,
    /// True while a probe request is under way (`down_until_ms` is then the end of the probe window).
    pub probing: bool,
}

impl Health {
    /// The back-off period after `failures` consecutive failures (0 for none): base × 2^(failures−1), capped.
    pub fn backoff_ms(failures: u32) -> u64 {
        if failures == 0 {
            return 0;
        }
        let doublings = (failures - 1).min(32);
        BACKOFF_BASE_MS.saturating_mul(1u64 << doublings).min(BACKOFF_MAX_MS)
    }

    /// A request placed on this endpoint failed at `now_ms`: down for the next (doubled) back-off period.
    ///
    /// A failure reported while the endpoint is already down (a request placed before it went down, ending now)
    /// keeps the current period: one outage is one step of back-off, however many requests were in flight.
    pub fn failed(&mut self, now_ms: u64) {
        if self.is_down(now_ms) && !self.probing {
            return;
        }
        self.probing = false;
        self.failures = self.failures.saturating_add(1);
        self.down_until_ms = now_ms.saturating_add(Self::backoff_ms(self.failures));
    }

    /// Claims the probe of an endpoint whose back-off expired (it failed before and is not down at `now_ms`): the
    /// claiming request goes there, every other request avoids it until the probe's outcome or for
    /// [`PROBE_WINDOW_MS`]. False when there is nothing to probe (never failed, or still down).
    pub fn claim_probe(&mut self, now_ms: u64) -> bool {
        if self.failures == 0 || self.is_down(now_ms) {
            return false;
        }
        self.probing = true;
        self.down_until_ms = now_ms.saturating_add(PROBE_WINDOW_MS);
        true
    }

    /// The probe claimed at `claimed_ms` ended without telling whether the endpoint is up (an upload cut short for
    /// its own size, a client that went away, a request sent elsewhere): its claim is given back at `now_ms`, so
    /// the next request picked for the endpoint probes at once instead of every request keeping away until the
    /// window runs out. Nothing changes when that probe's claim is no longer the one in force (a failure or
    /// success reported meanwhile ended it, or its window ran out and another request claimed the next).
    pub fn probe_told_nothing(&mut self, claimed_ms: u64, now_ms: u64) {
        if self.probing && self.down_until_ms == claimed_ms.saturating_add(PROBE_WINDOW_MS) {
            self.probing = false;
            self.down_until_ms = self.down_until_ms.min(now_ms);
        }
    }

    /// A request placed on this endpoint succeeded: up, back-off reset.
    pub fn succeeded(&mut self) {
        *self = Health::default();
    }

    /// True while the back-off period runs.
    pub fn is_down(&self, now_ms: u64) -> bool {
        now_ms < self.down_until_ms
    }

    /// True when there is nothing to remember (never failed, or cleared by a success).
    pub fn is_clear(&self) -> bool {
        *self == Health::default()
    }
}

/// The endpoint to use instead of `picked` when it is down: the up endpoint with the fewest outstanding requests
/// (ties: lowest index). `None` when `picked` is up, or when no endpoint is up (the pick stands: never drop).
///
/// `down[i]` tells whether endpoint `i` is down; `loads` are the loads the pick was made with.
pub fn avoid_down(picked: usize, down: &[bool], loads: &[EndpointLoad]) -> Option<usize> {
    if !down.get(picked).copied().unwrap_or(false) {
        return None;
    }
    (0..down.len()).filter(|&i| !down[i]).min_by_key(|&i| (loads.get(i).map(EndpointLoad::effective).unwrap_or(0), i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_and_is_capped() {
        assert_eq!(Health::backoff_ms(0), 0);
        assert_eq!(Health::backoff_ms(1), BACKOFF_BASE_MS);
        assert_eq!(Health::backoff_ms(2), 2 * BACKOFF_BASE_MS);
        assert_eq!(Health::backoff_ms(3), 4 * BACKOFF_BASE_MS);
        assert_eq!(Health::backoff_ms(6), BACKOFF_MAX_MS);
        assert_eq!(Health::backoff_ms(u32::MAX), BACKOFF_MAX_MS);
    }

    #[test]
    fn a_failure_takes_the_endpoint_down_until_the_backoff_expires() {
        let mut h = Health::default();
        assert!(!h.is_down(0));
        h.failed(10_000);
        assert!(h.is_down(10_000));
        assert!(h.is_down(10_000 + BACKOFF_BASE_MS - 1));
        assert!(!h.is_down(10_000 + BACKOFF_BASE_MS), "back after the first period");
        assert_eq!(h.failures, 1, "still remembered: the next failure doubles");
    }

    #[test]
    fn failures_during_the_period_count_once_and_a_failed_probe_doubles() {
        let mut h = Health::default();
        h.failed(0);
        // Twenty requests in flight on the dead endpoint end during the period: one step only.
        for t in 1..=20 {
            h.failed(t);
        }
        assert_eq!((h.failures, h.down_until_ms), (1, BACKOFF_BASE_MS));
        // The probe after the period fails: twice as long.
        h.failed(BACKOFF_BASE_MS);
        assert_eq!((h.failures, h.down_until_ms), (2, 3 * BACKOFF_BASE_MS));
    }

    #[test]
    fn one_probe_after_the_backoff_and_its_outcome_decides() {
        let mut h = Health::default();
        assert!(!h.claim_probe(0), "nothing to probe on a healthy endpoint");
        h.failed(0);
        assert!(!h.claim_probe(BACKOFF_BASE_MS - 1), "still down");
        assert!(h.claim_probe(BACKOFF_BASE_MS), "the first request after the period is the probe");
        assert!(h.is_down(BACKOFF_BASE_MS + 1), "the others keep away while it runs");
        assert!(!h.claim_probe(BACKOFF_BASE_MS + 1), "one probe at a time");
        // The probe fails: twice the period, counted from the failure.
        h.failed(BACKOFF_BASE_MS + 5);
        assert_eq!((h.failures, h.down_until_ms, h.probing), (2, BACKOFF_BASE_MS + 5 + 2 * BACKOFF_BASE_MS, false));
        // The next probe succeeds: clear.
        let t = h.down_until_ms;
        assert!(h.claim_probe(t));
        h.succeeded();
        assert!(h.is_clear() && !h.is_down(t));
    }

    #[test]
    fn a_probe_without_an_answer_lets_another_probe_after_the_window() {
        let mut h = Health::default();
        h.failed(0);
        assert!(h.claim_probe(BACKOFF_BASE_MS));
        assert!(h.claim_probe(BACKOFF_BASE_MS + PROBE_WINDOW_MS), "the window ran out: the next request probes");
        assert_eq!(h.failures, 1, "an unanswered probe is not a failure");
    }

    #[test]
    fn a_probe_that_tells_nothing_lets_the_next_request_probe_at_once() {
        let mut h = Health::default();
        h.failed(0);
        assert!(h.claim_probe(BACKOFF_BASE_MS));
        h.probe_told_nothing(BACKOFF_BASE_MS, BACKOFF_BASE_MS + 20);
        assert!(!h.is_down(BACKOFF_BASE_MS + 20), "the others need not keep away");
        assert!(h.claim_probe(BACKOFF_BASE_MS + 20), "the next request probes");
        assert_eq!(h.failures, 1, "not a failure");
        // Outside a probe it changes nothing: a back-off keeps running, a clear endpoint stays clear.
        let mut down = Health::default();
        down.failed(0);
        let before = down;
        down.probe_told_nothing(0, 10);
        assert_eq!(down, before);
        let mut clear = Health::default();
        clear.probe_told_nothing(0, 10);
        assert!(clear.is_clear());
        // A late probe whose window ran out does not give back the claim of the probe after it.
        let mut h = Health::default();
        h.failed(0);
        assert!(h.claim_probe(BACKOFF_BASE_MS));
        let second = BACKOFF_BASE_MS + PROBE_WINDOW_MS;
        assert!(h.claim_probe(second));
        h.probe_told_nothing(BACKOFF_BASE_MS, second + 5);
        assert!(h.probing && h.is_down(second + 5), "the second probe's claim stands");
    }

    #[test]
    fn a_success_clears_everything() {
        let mut h = Health::default();
        h.failed(0);
        h.failed(BACKOFF_BASE_MS);
        h.succeeded();
        assert!(h.is_clear() && !h.is_down(BACKOFF_BASE_MS));
        h.failed(5 * BACKOFF_BASE_MS);
        assert_eq!(h.down_until_ms, 6 * BACKOFF_BASE_MS, "back to the base period");
    }

    #[test]
    fn a_pick_on_a_down_endpoint_moves_to_the_least_loaded_up_endpoint() {
        let loads = [EndpointLoad::in_flight(0), EndpointLoad::in_flight(5), EndpointLoad::in_flight(2)];
        assert_eq!(avoid_down(0, &[true, false, false], &loads), Some(2));
        assert_eq!(avoid_down(1, &[true, false, false], &loads), None, "an up pick stands");
        assert_eq!(avoid_down(0, &[true, true, true], &loads), None, "all down: never drop, the pick stands");
        let equal = [EndpointLoad::in_flight(1); 3];
        assert_eq!(avoid_down(1, &[false, true, false], &equal), Some(0), "ties: lowest index");
    }
}
