//! The latency profile of a simulated server.
//!
//! Time to first token (TTFT) = `overhead_ms`
//!   + time waiting for a batch slot when `max_num_seqs` requests are already running (queueing)
//!   + time waiting for the prefill lane (`prefill_lanes` prefills at once; prefill is compute-bound, so concurrent
//!     prefills on one GPU share its throughput — a FIFO lane models that sharing)
//!   + uncached prompt tokens × `prefill_ms_per_token`.
//!
//! After the first token, each further output token takes `itl_ms` (inter-token latency; decode is memory-bound and
//! batched, so it is not slowed by other requests in this model).
//!
//! Defaults are the middle of the ranges llm-d-inference-sim tabulates for a 7–8B model on one H100
//! (`llm-d/llm-d-inference-sim`, README latency parameters: prefill 0.15–0.30 ms per uncached token, 25–40 ms
//! overhead, 10–15 ms per output token). All times are *simulated* milliseconds; `time_scale` converts them to wall
//! time (`wall = simulated × time_scale`), so 0.1 runs ten times faster than real.
//!
//! Sleeps are precise to well under a wall millisecond ([`LatencyProfile::sleep`]): tokio's timer rounds each sleep
//! up to its next millisecond tick, which at time scale 0.1 added up to 10 simulated ms to every overhead and every
//! prefill (about 20 of the 70 simulated ms of the templated workload's TTFT median, for every router) and drowned
//! differences between routers smaller than that.

use std::time::Duration;

/// Latency model parameters. Units: milliseconds of simulated time unless stated.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyProfile {
    /// Fixed per-request overhead before prefill (scheduling, tokenization), ms. Default 30.
    pub overhead_ms: f64,
    /// Prefill time per uncached prompt token, ms. Default 0.2.
    pub prefill_ms_per_token: f64,
    /// Inter-token latency for each output token after the first, ms. Default 12.
    pub itl_ms: f64,
    /// Batch limit: requests running at once; further requests wait (vLLM `max_num_seqs`). Default 64.
    pub max_num_seqs: usize,
    /// Prefills that run at once (0 = unlimited, i.e. no prefill contention). Default 1.
    pub prefill_lanes: usize,
    /// Wall-clock seconds per simulated second (0 < scale; 1.0 = real time). Default 1.0.
    pub time_scale: f64,
}

impl Default for LatencyProfile {
    fn default() -> Self {
        Self {
            overhead_ms: 30.0,
            prefill_ms_per_token: 0.2,
            itl_ms: 12.0,
            max_num_seqs: 64,
            prefill_lanes: 1,
            time_scale: 1.0,
        }
    }
}

impl LatencyProfile {
    /// Wall-clock duration of `ms` simulated milliseconds.
    pub fn wall(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms * self.time_scale).max(0.0) / 1000.0)
    }

    /// Simulated prefill time of `uncached_tokens` tokens, ms (excluding overhead and queueing).
    pub fn prefill_ms(&self, uncached_tokens: u64) -> f64 {
        uncached_tokens as f64 * self.prefill_ms_per_token
    }

    /// Simulated TTFT of an idle server for a prompt with `uncached_tokens` uncached tokens, ms.
    pub fn idle_ttft_ms(&self, uncached_tokens: u64) -> f64 {
        self.overhead_ms + self.prefill_ms(uncached_tokens)
    }

    /// Sleeps for `ms` simulated milliseconds ([`LatencyProfile::wall`] of them), never less.
    pub async fn sleep(&self, ms: f64) {
        sleep_precisely(self.wall(ms)).await;
    }
}

/// Sleeps for `d` of wall time, never less. On Linux a timerfd wakes the task (nanosecond resolution; the delay past
/// `d` is the scheduler's), elsewhere, or if the timerfd cannot be made, tokio's millisecond timer does.
pub async fn sleep_precisely(d: Duration) {
    if d.is_zero() {
        return;
    }
    let deadline = std::time::Instant::now() + d;
    #[cfg(target_os = "linux")]
    if let Some(delay) = timerfd_delay(deadline) {
        if delay.await.is_ok() {
            return;
        }
    }
    tokio::time::sleep_until(deadline.into()).await;
}

/// A timerfd that fires at `deadline`, registered with the current tokio runtime's I/O driver (every runtime that
/// runs a simulated server enables all drivers); `None` when the kernel gives no timerfd.
#[cfg(target_os = "linux")]
fn timerfd_delay(deadline: std::time::Instant) -> Option<tokio_timerfd::Delay> {
    tokio_timerfd::Delay::new(deadline).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttft_grows_with_uncached_tokens_only() {
        let p = LatencyProfile::default();
        assert_eq!(p.idle_ttft_ms(0), 30.0);
        assert!((p.idle_ttft_ms(1000) - 230.0).abs() < 1e-9);
    }

    /// The precise path is the one taken in the runtimes the servers run in (tokio's with I/O), not the millisecond
    /// fallback.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn sleeps_wake_on_a_timerfd() {
        let delay = timerfd_delay(std::time::Instant::now() + Duration::from_micros(300));
        assert!(delay.is_some(), "no timerfd: sleeps would round up to tokio's millisecond ticks");
        delay.unwrap().await.expect("the timerfd fires");
    }

    #[tokio::test]
    async fn a_sleep_lasts_at_least_its_duration() {
        let p = LatencyProfile { time_scale: 0.01, ..Default::default() };
        for ms in [0.0, 3.0, 30.0, 45.5] {
            let start = std::time::Instant::now();
            p.sleep(ms).await;
            assert!(start.elapsed() >= p.wall(ms), "{ms} simulated ms slept {:?}", start.elapsed());
        }
    }

    #[test]
    fn time_scale_shrinks_wall_time() {
        let p = LatencyProfile { time_scale: 0.1, ..Default::default() };
        assert_eq!(p.wall(100.0), Duration::from_millis(10));
    }
}
