//! The prefill speed of an endpoint pool, learned from a gateway's own requests.
//!
//! A request that matched nothing in the index, sent to an endpoint on which this gateway has no prefill work
//! pending, waits, as far as the gateway knows, for nothing but its own prefill of its whole prompt. Its time to
//! first byte is then `overhead + bytes / rate`:
//! - `overhead`: the server's fixed cost per request (scheduling, tokenisation) plus the network and proxy path;
//! - `bytes / rate`: the work this gateway charged for the request ([`crate::Decision::prefill_bytes`]) at the pool's
//!   prefill rate.
//!
//! A least-squares line of time against bytes through such samples gives both. The samples decay by half every
//! [`HALF_LIFE`] samples, so the estimate follows a pool whose speed changes (another model, another batch
//! budget). The gateway cannot see the server's own queue, so a sample from a server that was busy with another
//! gateway's work lies above the line. The fit takes that as noise. A non-streamed answer's first byte comes after
//! the whole generation; its decode time goes into the fixed part as long as it does not grow with the prompt.
//!
//! An estimate is given only while the line explains the samples (the slope's relative standard error is at most
//! [`MAX_SLOPE_ERROR`]): samples that are not what the filter took them for scatter, and a speed from them drains
//! pending work wrongly.
//!
//! Only misses are samples: for a request the index expected partly cached, the work charged is the index's guess,
//! and a wrong guess (a hit the index does not know of, a holder that evicted the prefix) is an error in `bytes`,
//! which a least-squares fit does not absorb. Measured on the simulated servers (BENCHMARKS.md §1): with every
//! request to an idle endpoint as a sample, the estimate was up to 11 % above the servers' true rate on the Mooncake
//! trace at 4 × 32k and from 3 % to 30 times above it on the five other workloads. With misses only it is within
//! 2 % on the Mooncake trace and the unique-prompt workload, and absent on chat, rag and templated, where almost
//! every request matches a shared prefix. Code (16 files) gives at most 16 misses a run: with one fit per Envoy
//! about half of its runs reach an estimate, within 6 % of the true speed once the error bound below holds.
//!
//! The estimate serves twice: as gauges, and as the speed at which the shell lets this gateway's pending prefill
//! work on an endpoint drain between the moments it knows that queue exactly ([`PrefillEstimate::left_after`]).
//! Without an estimate the work counts whole until its first response byte.
//!
//! One fit serves every worker of an Envoy: the shell keeps it in shared data ([`PrefillFits::to_bytes`],
//! [`PrefillFits::from_bytes`]), adds each worker's samples to it and hands it to every worker's router, so a
//! worker that has seen few misses (many workers, little traffic each) drains at the speed the others learned.
//!
//! Besides the pool's fit, each endpoint has its own, from the samples it served ([`PrefillFits`]): a pool need not
//! run at one speed (accelerators of two generations, a throttled node), and one speed for all of it drains a slow
//! server's queue too fast and a fast one's too slowly. Measured on the Mooncake trace with two of eight simulated
//! servers at half speed (docs/bench/replay.md §32): the pool's fit learned 1.2–1.5 MB/s against true speeds of
//! 1.59 and 0.80, and draining with it gave a TTFT p50 9 % higher than not draining at all. An endpoint drains at its
//! own speed once its fit gives an estimate, at the pool's until then ([`crate::Router::prefill_estimate_at`]).
//!
//! Units: bytes of prompt text (the unit of pending prefill work) and milliseconds of wall time. The crate reads no
//! clock; the caller measures.

/// Samples after which an old sample weighs half as much as a new one.
pub const HALF_LIFE: f64 = 64.0;

/// Samples needed before an estimate is given.
pub const MIN_SAMPLES: u32 = 16;

/// Learned prefill speed: `time_to_first_byte_ms ≈ overhead_ms + bytes / bytes_per_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillEstimate {
    /// Prefill throughput, bytes of prompt text per ms.
    pub bytes_per_ms: f64,
    /// Time to first byte of a request with nothing to prefill, ms (at least 0).
    pub overhead_ms: f64,
}

/// Exponentially weighted least-squares fit of time to first byte against prefill bytes.
#[derive(Debug, Clone, Default)]
pub struct PrefillRate {
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    syy: f64,
    samples: u32,
}

/// Length of [`PrefillRate::to_bytes`]: six `f64` sums and the sample count, little-endian.
pub const ENCODED_LEN: usize = 6 * 8 + 4;

impl PrefillRate {
    /// The fit as bytes, for sharing between the VMs of one Envoy ([`Self::from_bytes`] reads it back).
    pub fn to_bytes(&self) -> [u8; ENCODED_LEN] {
        let mut out = [0u8; ENCODED_LEN];
        for (i, v) in [self.w, self.sx, self.sy, self.sxx, self.sxy, self.syy].iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out[48..].copy_from_slice(&self.samples.to_le_bytes());
        out
    }

    /// A fit written by [`Self::to_bytes`]; `None` for any other length or a sum that is not finite.
    pub fn from_bytes(bytes: &[u8]) -> Option<PrefillRate> {
        if bytes.len() != ENCODED_LEN {
            return None;
        }
        let f = |i: usize| f64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let sums = [f(0), f(1), f(2), f(3), f(4), f(5)];
        if sums.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let samples = u32::from_le_bytes(bytes[48..].try_into().expect("4 bytes"));
        let [w, sx, sy, sxx, sxy, syy] = sums;
        Some(PrefillRate { w, sx, sy, sxx, sxy, syy, samples })
    }

    /// Samples observed (merged fits count each other's).
    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// Adds `other`'s samples to these, as if one fit had observed both: the sums add, and each sample keeps the
    /// weight its own fit's age gave it. How the fits of several gateways serving one pool are pooled.
    pub fn merge(&mut self, other: &PrefillRate) {
        self.w += other.w;
        self.sx += other.sx;
        self.sy += other.sy;
        self.sxx += other.sxx;
        self.sxy += other.sxy;
        self.syy += other.syy;
        self.samples = self.samples.saturating_add(other.samples);
    }

    /// Adds one request: `bytes` of prefill work charged, first response byte `ms` after it was sent.
    pub fn observe(&mut self, bytes: u32, ms: u64) {
        let keep = 0.5f64.powf(1.0 / HALF_LIFE);
        let (x, y) = (f64::from(bytes), ms as f64);
        self.w = self.w * keep + 1.0;
        self.sx = self.sx * keep + x;
        self.sy = self.sy * keep + y;
        self.sxx = self.sxx * keep + x * x;
        self.sxy = self.sxy * keep + x * y;
        self.syy = self.syy * keep + y * y;
        self.samples = self.samples.saturating_add(1);
    }

    /// The fitted line, once [`MIN_SAMPLES`] requests of different sizes were seen, time grows with bytes, and the
    /// line explains the samples: its slope's relative standard error is at most [`MAX_SLOPE_ERROR`].
    pub fn estimate(&self) -> Option<PrefillEstimate> {
        let line = self.line()?;
        (line.slope_error <= MAX_SLOPE_ERROR).then_some(line.estimate)
    }

    /// The standard error of the fitted slope relative to the slope, whether or not it is small enough for
    /// [`Self::estimate`] (reported, so an operator can see why no speed is given); `None` where no line is fitted
    /// at all (fewer than [`MIN_SAMPLES`] samples, one size only, time not growing with bytes).
    pub fn slope_error(&self) -> Option<f64> {
        self.line().map(|l| l.slope_error)
    }

    /// The least-squares line through the samples and its slope's relative standard error (ordinary least squares,
    /// the decayed weight sum taken as the sample count; infinite with two samples or fewer).
    fn line(&self) -> Option<Line> {
        if self.samples < MIN_SAMPLES {
            return None;
        }
        let mean_x = self.sx / self.w;
        let mean_y = self.sy / self.w;
        let var_x = self.sxx / self.w - mean_x * mean_x;
        let cov = self.sxy / self.w - mean_x * mean_y;
        // Relative to the mean: all requests of about one size say nothing about the slope.
        if var_x <= 1e-6 * mean_x * mean_x || cov <= 0.0 {
            return None;
        }
        let slope = cov / var_x;
        let slope_error = if self.w <= 2.0 {
            f64::INFINITY
        } else {
            let var_y = self.syy / self.w - mean_y * mean_y;
            // Variance of the residuals per unit weight: what the line leaves unexplained.
            let residual = (var_y - slope * cov).max(0.0);
            (residual / (var_x * (self.w - 2.0))).sqrt() / slope
        };
        let estimate = PrefillEstimate { bytes_per_ms: 1.0 / slope, overhead_ms: (mean_y - slope * mean_x).max(0.0) };
        Some(Line { estimate, slope_error })
    }
}

/// A fitted line ([`PrefillRate::line`]).
struct Line {
    estimate: PrefillEstimate,
    slope_error: f64,
}

/// Largest standard error of the fitted slope, relative to the slope, for which an estimate is given.
///
/// Measured on the simulated servers (docs/bench/replay.md §19): the fits that recovered the servers' speed had
/// 0.2–0.4 % (the Mooncake trace), 1.2 % (unique prompts) and 2.0–2.7 % (code). On code, six fits of twenty runs
/// had 17–71 % and speeds from 0.74 to 1.6 times the true one (up to 3.6 times in an earlier pass), and four of
/// the six runs that drained with them had TTFT p90 157–474 ms against 108–147 for the rest. 10 % lies between,
/// with margin on both sides.
pub const MAX_SLOPE_ERROR: f64 = 0.1;

impl PrefillEstimate {
    /// What is left of this gateway's `pending` bytes of prefill work on one endpoint after the server has worked
    /// for `elapsed_ms` at this rate (at least 0), while `others` bytes of other gateways' work wait there too.
    ///
    /// The server's speed is shared: this gateway's part drains at the share `pending / (pending + others)` of it,
    /// as if the server worked on all of its queue at once. The gateway cannot see whose request is at the head;
    /// crediting its own work with the whole speed while other gateways' work waited there measured worse on the
    /// Mooncake trace with two gateways (TTFT p50 up 4–8 % on every stretch; BENCHMARKS.md §1).
    ///
    /// The caller measures `elapsed_ms` from the last moment it knew the endpoint's queue exactly: when work arrived
    /// at an endpoint with none pending, or when a request there got its first byte (the next one starts). Between
    /// two such moments the server works on the head of the queue, so with a true rate the credit never exceeds the
    /// head's own charge. The fixed part is not waited for: after a first byte the next request's prefill has
    /// already begun, and before the first one it is a few ms (docs/bench/replay.md §17: draining with it or
    /// without it measured the same hit ratio on the Mooncake trace).
    pub fn left_after(&self, pending: u32, others: u32, elapsed_ms: u64) -> u32 {
        if pending == 0 {
            return 0;
        }
        let share = f64::from(pending) / (f64::from(pending) + f64::from(others));
        let done = self.bytes_per_ms * share * elapsed_ms as f64;
        if done >= f64::from(pending) {
            0
        } else {
            pending - done as u32
        }
    }
}

/// The pool's fit and each endpoint's own, as the shell keeps them in shared data: the pool's fit
/// ([`PrefillRate::to_bytes`]), then one entry per endpoint that has samples — its address's length (one byte), the
/// address, its fit (`crate::exchange::push_entry`'s layout).
#[derive(Debug, Clone, Default)]
pub struct PrefillFits {
    /// Every sample of the pool.
    pub pool: PrefillRate,
    /// Each endpoint's samples, by address (`IP:port`), in the order first sampled.
    pub endpoints: Vec<(String, PrefillRate)>,
}

impl PrefillFits {
    /// The fits as bytes ([`Self::from_bytes`] reads them back); an address longer than 255 bytes (never an
    /// `IP:port`) is left out.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN + self.endpoints.len() * (24 + ENCODED_LEN));
        out.extend_from_slice(&self.pool.to_bytes());
        for (address, fit) in &self.endpoints {
            crate::exchange::push_entry(&mut out, address.as_bytes(), &fit.to_bytes());
        }
        out
    }

    /// Fits written by [`Self::to_bytes`]; empty fits for bytes too short to hold the pool's, and entries read up
    /// to the first one that is truncated, not UTF-8 or not a fit.
    pub fn from_bytes(bytes: &[u8]) -> PrefillFits {
        let Some(pool) = bytes.get(..ENCODED_LEN).and_then(PrefillRate::from_bytes) else {
            return PrefillFits::default();
        };
        let endpoints = crate::exchange::entries(&bytes[ENCODED_LEN..], ENCODED_LEN)
            .map_while(|(a, f)| Some((std::str::from_utf8(a).ok()?.to_string(), PrefillRate::from_bytes(f)?)))
            .collect();
        PrefillFits { pool, endpoints }
    }

    /// Adds each of `others`' fits to these ([`PrefillRate::merge`]): the pool's to the pool's, each endpoint's to the
    /// same address's (an address only the others have joins, while these hold fewer than
    /// [`crate::config::MAX_ENDPOINTS`]). One lookup per entry, however many fits are added.
    pub fn merge<'a>(&mut self, others: impl IntoIterator<Item = &'a PrefillFits>) {
        let mut at: std::collections::HashMap<String, usize> =
            self.endpoints.iter().enumerate().map(|(i, (a, _))| (a.clone(), i)).collect();
        for other in others {
            self.pool.merge(&other.pool);
            for (address, fit) in &other.endpoints {
                match at.get(address) {
                    Some(&i) => self.endpoints[i].1.merge(fit),
                    None if self.endpoints.len() < crate::config::MAX_ENDPOINTS => {
                        at.insert(address.clone(), self.endpoints.len());
                        self.endpoints.push((address.clone(), fit.clone()));
                    }
                    None => {}
                }
            }
        }
    }

    /// Adds one sample of `address` to the pool's fit and to the endpoint's own, and drops the fits of the
    /// addresses `keep` rejects (endpoints that left the pool), so the fits stay bounded by the pool.
    pub fn observe(&mut self, address: &str, bytes: u32, ms: u64, keep: impl Fn(&str) -> bool) {
        self.pool.observe(bytes, ms);
        self.endpoints.retain(|(a, _)| a == address || keep(a));
        match self.endpoints.iter_mut().find(|(a, _)| a == address) {
            Some((_, fit)) => fit.observe(bytes, ms),
            None => {
                let mut fit = PrefillRate::default();
                fit.observe(bytes, ms);
                self.endpoints.push((address.to_string(), fit));
            }
        }
    }
}

/// Extra prefill time per byte, in 1/1024ths of the fastest endpoint's, at which [`PrefillFits::slowdowns`] counts
/// an endpoint's own speed: 1,024 is twice as long per byte.
pub const SLOWDOWN_UNIT: u32 = 1024;

/// `work` (bytes to prefill) in time on an endpoint with `slowdown` ([`PrefillFits::slowdowns`]): in bytes the
/// fastest endpoint would prefill in the same time.
pub fn in_time(work: u64, slowdown: u32) -> u64 {
    work.saturating_add(work.saturating_mul(u64::from(slowdown)) / u64::from(SLOWDOWN_UNIT))
}

impl PrefillFits {
    /// The endpoints whose own speed is lower than the fastest endpoint's beyond what the fits' errors explain, each
    /// with its extra prefill time per byte ([`SLOWDOWN_UNIT`]ths of the fastest one's); empty when no endpoint is
    /// told apart (one pool of equal servers, or too few samples).
    ///
    /// An endpoint is told apart when the top of its speed's interval, two standard errors of its slope
    /// ([`PrefillRate::slope_error`]), lies below the bottom of the fastest endpoint's, and it is slower by more than
    /// [`MAX_SLOPE_ERROR`], the error a fit may have and still be used at all. Equal servers then keep equal
    /// predictions and their exact ties, so the consistent pick, the same on every replica, and the bounded placement
    /// of misses are kept: on the Mooncake trace the fits of four equal simulated servers came 0.2–1.9 % apart
    /// with errors small enough for the interval test alone to tell them apart (docs/bench/replay.md §33). Only fits
    /// that give a speed ([`PrefillRate::estimate`]) count.
    pub fn slowdowns(&self) -> Vec<(String, u32)> {
        // One line per fit: `estimate` and `slope_error` would each fit it again.
        let speeds: Vec<(&str, f64, f64)> = self
            .endpoints
            .iter()
            .filter_map(|(a, f)| f.line().map(|l| (a.as_str(), l)))
            .filter(|(_, l)| l.slope_error <= MAX_SLOPE_ERROR)
            .map(|(a, l)| (a, l.estimate.bytes_per_ms, l.slope_error))
            .collect();
        let Some(&(_, fastest, error)) = speeds.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
            return Vec::new();
        };
        let floor = fastest * (1.0 - 2.0 * error);
        speeds
            .iter()
            .filter(|(_, speed, error)| {
                speed * (1.0 + 2.0 * error) < floor && *speed < fastest * (1.0 - MAX_SLOPE_ERROR)
            })
            // `as` saturates: a speed of 0 never comes from a fit (`estimate` needs a positive slope).
            .map(|(a, speed, _)| (a.to_string(), ((fastest / speed - 1.0) * f64::from(SLOWDOWN_UNIT)) as u32))
            .collect()
    }
}

/// Test support: `n` samples of the server at `address` serving `bytes_per_ms` with 2 ms of overhead, of sizes
/// spread over 2–42 KB, each alone on its endpoint.
#[cfg(test)]
pub(crate) fn sample_at(fits: &mut PrefillFits, address: &str, bytes_per_ms: u32, n: u32) {
    for i in 0..n {
        let bytes = 2_000 + (i * 7_919) % 40_000;
        fits.observe(address, bytes, 2 + u64::from(bytes / bytes_per_ms), |_| true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn each_endpoint_learns_its_own_speed_and_the_pool_all_of_them() {
        let mut fits = PrefillFits::default();
        sample_at(&mut fits, "10.0.0.1:8000", 400, 40);
        sample_at(&mut fits, "10.0.0.2:8000", 200, 40);
        let speed = |a: &str| {
            let (_, f) = fits.endpoints.iter().find(|(x, _)| x == a).expect("sampled");
            f.estimate().expect("enough samples").bytes_per_ms
        };
        assert!((speed("10.0.0.1:8000") - 400.0).abs() < 8.0);
        assert!((speed("10.0.0.2:8000") - 200.0).abs() < 4.0);
        assert_eq!(fits.pool.samples, 80);
        let back = PrefillFits::from_bytes(&fits.to_bytes());
        assert_eq!(back.pool.to_bytes(), fits.pool.to_bytes());
        assert_eq!(back.endpoints.len(), 2);
        for ((a, f), (b, g)) in back.endpoints.iter().zip(&fits.endpoints) {
            assert_eq!((a, f.to_bytes()), (b, g.to_bytes()));
        }
    }

    #[test]
    fn fits_of_endpoints_that_left_are_dropped_on_the_next_sample() {
        let mut fits = PrefillFits::default();
        sample_at(&mut fits, "10.0.0.1:8000", 400, 3);
        sample_at(&mut fits, "10.0.0.2:8000", 400, 3);
        fits.observe("10.0.0.3:8000", 5_000, 14, |a| a != "10.0.0.1:8000");
        let kept: Vec<&str> = fits.endpoints.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(kept, ["10.0.0.2:8000", "10.0.0.3:8000"]);
        assert_eq!(fits.pool.samples, 7, "the pool keeps every sample");
    }

    #[test]
    fn bad_fits_bytes_read_as_empty_or_up_to_the_bad_entry() {
        assert_eq!(PrefillFits::from_bytes(&[]).endpoints.len(), 0);
        assert_eq!(PrefillFits::from_bytes(&[1, 2, 3]).pool.samples, 0);
        let mut fits = PrefillFits::default();
        sample_at(&mut fits, "10.0.0.1:8000", 400, 2);
        sample_at(&mut fits, "10.0.0.2:8000", 400, 2);
        let bytes = fits.to_bytes();
        // The second entry cut short: the first survives.
        let back = PrefillFits::from_bytes(&bytes[..bytes.len() - 1]);
        assert_eq!(back.pool.samples, 4);
        assert_eq!(back.endpoints.len(), 1);
        // The old layout (the pool's fit alone) still reads.
        assert_eq!(PrefillFits::from_bytes(&fits.pool.to_bytes()).pool.samples, 4);
    }

    /// A deterministic pseudo-random sequence (xorshift64) from `state` (not 0).
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn a_linear_server_is_recovered() {
        let mut r = PrefillRate::default();
        for i in 0..200u32 {
            let bytes = 1_000 + (i * 7_919) % 50_000;
            // 3 ms of overhead, 200 bytes per ms.
            r.observe(bytes, 3 + u64::from(bytes) / 200);
        }
        let e = r.estimate().expect("enough samples");
        assert!((e.bytes_per_ms - 200.0).abs() < 2.0, "{e:?}");
        assert!((e.overhead_ms - 3.0).abs() < 1.0, "{e:?}");
    }

    #[test]
    fn a_fit_read_back_from_its_bytes_is_the_same_fit() {
        let mut r = PrefillRate::default();
        for i in 0..40u32 {
            r.observe(1_000 + i * 500, 2 + u64::from(i) * 3);
        }
        let back = PrefillRate::from_bytes(&r.to_bytes()).expect("its own bytes");
        assert_eq!(back.estimate(), r.estimate());
        assert_eq!(PrefillRate::from_bytes(&PrefillRate::default().to_bytes()).unwrap().estimate(), None);
        assert!(PrefillRate::from_bytes(&r.to_bytes()[..ENCODED_LEN - 1]).is_none(), "a short value");
        assert!(PrefillRate::from_bytes(&[]).is_none());
        let mut nan = r.to_bytes();
        nan[8..16].copy_from_slice(&f64::NAN.to_le_bytes());
        assert!(PrefillRate::from_bytes(&nan).is_none(), "a sum that is not a number");
    }

    #[test]
    fn no_estimate_from_samples_the_line_does_not_explain() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut scattered = PrefillRate::default();
        for _ in 0..64 {
            let bytes = 6_000 + (next() % 6_000) as u32;
            // 1 ms per 200 bytes, but each sample anywhere from a tenth to twice that: hits the filter did not know
            // of, waits behind work it did not see.
            let ms = u64::from(bytes) / 200 * (1 + next() % 20) / 10;
            scattered.observe(bytes, ms + 1);
        }
        assert_eq!(scattered.estimate(), None);
        let err = scattered.slope_error().expect("a line is fitted, only not trusted");
        assert!(err > MAX_SLOPE_ERROR, "{err}");
        let mut clean = PrefillRate::default();
        for i in 0..64u32 {
            let bytes = 6_000 + (i * 97) % 6_000;
            clean.observe(bytes, 3 + u64::from(bytes) / 200 + u64::from(i % 3));
        }
        let e = clean.estimate().expect("a line with a little noise");
        assert!(clean.slope_error().is_some_and(|err| err <= MAX_SLOPE_ERROR));
        assert!((e.bytes_per_ms - 200.0).abs() < 10.0, "{e:?}");
    }

    #[test]
    fn no_estimate_without_enough_samples_or_spread() {
        let mut r = PrefillRate::default();
        for _ in 0..MIN_SAMPLES - 1 {
            r.observe(4_000, 20);
        }
        r.observe(8_000, 40);
        assert!(r.estimate().is_some(), "16 samples of two sizes give a line");
        let mut same = PrefillRate::default();
        for _ in 0..100 {
            same.observe(4_000, 20);
        }
        assert_eq!(same.estimate(), None, "one size says nothing about the rate");
        assert_eq!(same.slope_error(), None, "and no line is fitted");
        let mut empty = PrefillRate::default();
        empty.observe(4_000, 20);
        assert_eq!(empty.estimate(), None);
        let mut falling = PrefillRate::default();
        for i in 0..50u64 {
            falling.observe(1_000 * (i as u32 + 1), 500 - i);
        }
        assert_eq!(falling.estimate(), None, "time that falls as work grows is not a rate");
    }

    #[test]
    fn the_estimate_follows_a_pool_that_slows_down() {
        let mut r = PrefillRate::default();
        let size = |i: u32| 2_000 + (i * 3_571) % 20_000;
        for i in 0..300 {
            r.observe(size(i), 2 + u64::from(size(i)) / 400);
        }
        let fast = r.estimate().unwrap().bytes_per_ms;
        for i in 0..600 {
            r.observe(size(i), 2 + u64::from(size(i)) / 100);
        }
        let slow = r.estimate().unwrap().bytes_per_ms;
        assert!((fast - 400.0).abs() < 10.0, "{fast}");
        assert!((slow - 100.0).abs() < 5.0, "after ten half-lives the old speed is forgotten: {slow}");
    }

    #[test]
    fn pending_work_drains_at_the_rate_and_not_below_zero() {
        let e = PrefillEstimate { bytes_per_ms: 200.0, overhead_ms: 3.0 };
        assert_eq!(e.left_after(10_000, 0, 0), 10_000, "nothing done yet");
        assert_eq!(e.left_after(10_000, 0, 10), 8_000);
        assert_eq!(e.left_after(10_000, 0, 50), 0, "done");
        assert_eq!(e.left_after(10_000, 0, u64::MAX), 0, "a clock far ahead leaves nothing, never wraps");
        assert_eq!(e.left_after(0, 0, 10), 0);
        assert_eq!(e.left_after(0, 5_000, 10), 0);
        let slow = PrefillEstimate { bytes_per_ms: 0.5, overhead_ms: 0.0 };
        assert_eq!(slow.left_after(10, 0, 3), 9, "fractions of a byte are not credited");
    }

    #[test]
    fn other_gateways_work_takes_its_share_of_the_speed() {
        let e = PrefillEstimate { bytes_per_ms: 200.0, overhead_ms: 0.0 };
        assert_eq!(e.left_after(10_000, 10_000, 10), 9_000, "half the speed for half the queue");
        assert_eq!(e.left_after(10_000, 30_000, 40), 8_000, "a quarter of it");
        assert!(e.left_after(10_000, u32::MAX, 1_000) > 9_990, "work elsewhere in the queue all but stops the drain");
    }

    #[test]
    fn queueing_behind_unseen_work_is_noise_above_the_line() {
        let mut r = PrefillRate::default();
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..400 {
            let bytes = 1_000 + (next() % 30_000) as u32;
            // About one request in ten waited 50 ms behind another gateway's work, whatever its size.
            let wait = if next().is_multiple_of(10) { 50 } else { 0 };
            r.observe(bytes, 5 + u64::from(bytes) / 250 + wait);
        }
        let e = r.estimate().unwrap();
        assert!((e.bytes_per_ms - 250.0).abs() < 25.0, "{e:?}");
        assert!(e.overhead_ms > 5.0, "the waits raise the fixed part, not the rate: {e:?}");
    }

    #[test]
    fn only_an_endpoint_slower_beyond_the_fits_errors_gets_a_slowdown() {
        // Four equal servers at 250 bytes/ms whose times jitter by up to 4 ms: their fits differ by noise only.
        let mut fits = PrefillFits::default();
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let equal: Vec<String> = (1..=4).map(|i| format!("10.0.0.{i}:8000")).collect();
        for _ in 0..100 {
            for a in &equal {
                let bytes = 1_000 + (next() % 30_000) as u32;
                fits.observe(a, bytes, 5 + u64::from(bytes) / 250 + next() % 5, |_| true);
            }
        }
        assert!(fits.slowdowns().is_empty(), "equal servers told apart: {:?}", fits.slowdowns());
        // One 5 % slower, its fit without noise: told apart by the intervals, but within what a usable fit may err.
        for _ in 0..100 {
            let bytes = 1_000 + (next() % 30_000) as u32;
            fits.observe("10.0.0.6:8000", bytes, 5 + u64::from(bytes) * 105 / 25_000, |_| true);
        }
        assert!(fits.slowdowns().is_empty(), "5 % slower told apart: {:?}", fits.slowdowns());
        // A fifth at half their speed is told apart, with its extra time per byte.
        for _ in 0..100 {
            let bytes = 1_000 + (next() % 30_000) as u32;
            fits.observe("10.0.0.5:8000", bytes, 5 + u64::from(bytes) / 125 + next() % 5, |_| true);
        }
        let slow = fits.slowdowns();
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert_eq!(slow[0].0, "10.0.0.5:8000");
        assert!((900..=1_150).contains(&slow[0].1), "twice as long per byte is about {SLOWDOWN_UNIT}: {slow:?}");
    }

    /// The slowdowns follow a server whose speed changes, at the pace of the fits' half-life: one that drops to half
    /// speed after a long history at full speed is told apart within one half-life of its own samples (17 here),
    /// and once it is back at full speed its slowdown shrinks (by more than a quarter in one half-life) and is gone
    /// within three (162 here): its samples weigh by age, so it does not stay marked for what it once was.
    #[test]
    fn a_slowdown_follows_a_server_that_slows_and_recovers() {
        let mut fits = PrefillFits::default();
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let pool: Vec<String> = (1..=4).map(|i| format!("10.0.0.{i}:8000")).collect();
        // Requests of 1–31 KB whose times jitter by up to 4 ms, at `bytes_per_ms`.
        let mut sample = |fits: &mut PrefillFits, address: &str, bytes_per_ms: u64| {
            let bytes = 1_000 + (next() % 30_000) as u32;
            fits.observe(address, bytes, 5 + u64::from(bytes) / bytes_per_ms + next() % 5, |_| true);
        };
        for _ in 0..300 {
            for a in &pool {
                sample(&mut fits, a, 250);
            }
        }
        assert!(fits.slowdowns().is_empty(), "{:?}", fits.slowdowns());
        let throttled = pool[0].as_str();
        let slowdown = |fits: &PrefillFits| fits.slowdowns().into_iter().find(|(a, _)| a == throttled).map(|s| s.1);
        let mut told_apart = None;
        for n in 1..=300 {
            sample(&mut fits, throttled, 125);
            if told_apart.is_none() && slowdown(&fits).is_some() {
                told_apart = Some(n);
            }
        }
        let told_apart = told_apart.expect("a server at half speed is never told apart");
        assert!(f64::from(told_apart) <= HALF_LIFE, "told apart after {told_apart} samples");
        let slowed = slowdown(&fits).expect("still slower");
        assert!((900..=1_150).contains(&slowed), "twice as long per byte: {slowed}");
        // Back at full speed.
        let mut recovered = None;
        for n in 1..=300 {
            sample(&mut fits, throttled, 250);
            let now = slowdown(&fits);
            if n == HALF_LIFE as u32 {
                assert!(now.unwrap_or(0) < slowed * 3 / 4, "after one half-life {now:?} of {slowed}");
            }
            if now.is_none() {
                recovered = Some(n);
                break;
            }
        }
        let recovered = recovered.expect("a recovered server keeps its slowdown");
        assert!(f64::from(recovered) <= 3.0 * HALF_LIFE, "recovered after {recovered} samples");
    }
}
