//! SageMaker-style prefix-aware routing: hash a fixed-length prefix of the request text, send equal prefixes to
//! the same instance, and go elsewhere when that instance is busy.
//!
//! Source: Amazon SageMaker API `PrefixAwareRoutingConfig` (`PrefixLength`: 1024–65536 characters of the messages'
//! text for OpenAI-compatible requests; `ConcurrencyThreshold`: 1–1024 in-flight requests on the prefix-selected
//! instance before "the endpoint routes the request to an instance with more available capacity").
//! AWS publishes no defaults and not the hash; this re-implementation uses rendezvous hashing of xxh3 of the first
//! `prefix_length` bytes of the extracted text, and the least in-flight instance on overflow.
//! Parameters: `prefix_length` 2048, `concurrency_threshold` 10.

use warmpath_core::decision::{Decision, Reason};
use warmpath_core::endpoint::{Endpoint, EndpointLoad};
use warmpath_core::policy::{PickInput, Policy};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::argmin_by;

/// Fixed-length-prefix hash + concurrency threshold.
#[derive(Debug, Clone)]
pub struct SageMakerPrefix {
    /// Bytes of extracted text hashed (characters for ASCII text).
    pub prefix_length: usize,
    /// In-flight requests on the preferred instance at which requests overflow.
    pub concurrency_threshold: u32,
}

impl Default for SageMakerPrefix {
    fn default() -> Self {
        Self { prefix_length: 2048, concurrency_threshold: 10 }
    }
}

impl Policy for SageMakerPrefix {
    fn name(&self) -> &'static str {
        "SAGEMAKER_PREFIX"
    }

    fn pick(&mut self, input: &PickInput, endpoints: &[Endpoint], loads: &[EndpointLoad]) -> Option<Decision> {
        if endpoints.is_empty() {
            return None;
        }
        let in_flight = |i: usize| loads.get(i).map_or(0, |l| l.in_flight);
        let Some(key) = input.key else {
            let i = argmin_by(endpoints.len(), input.random, |i| in_flight(i) as f64)?;
            return Some(Decision::new(endpoints, i, Reason::FailOpen));
        };
        let text = &key.text[..key.text.len().min(self.prefix_length)];
        let h = xxh3_64_with_seed(text, key.namespace);
        let preferred = (0..endpoints.len())
            .max_by_key(|&i| xxh3_64_with_seed(&h.to_le_bytes(), xxh3_64(endpoints[i].address.as_bytes())))?;
        if in_flight(preferred) < self.concurrency_threshold {
            return Some(Decision::new(endpoints, preferred, Reason::ConsistentPick));
        }
        let i = argmin_by(endpoints.len(), input.random, |i| in_flight(i) as f64)?;
        Some(Decision::new(endpoints, i, Reason::Overflow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmpath_core::extract::{BodyKind, RequestKey};

    fn eps(n: usize) -> Vec<Endpoint> {
        (0..n).map(|i| Endpoint::new(format!("127.0.0.1:{}", 9000 + i), i as u32)).collect()
    }

    #[test]
    fn same_prefix_same_endpoint_until_threshold() {
        let mut p = SageMakerPrefix { prefix_length: 8, concurrency_threshold: 2 };
        let e = eps(4);
        let a = RequestKey::new(BodyKind::Completion, None, None, b"abcdefgh-one".to_vec());
        let b = RequestKey::new(BodyKind::Completion, None, None, b"abcdefgh-two".to_vec());
        let idle = vec![EndpointLoad::default(); 4];
        let da = p.pick(&PickInput { key: Some(&a), ..Default::default() }, &e, &idle).unwrap();
        let db = p.pick(&PickInput { key: Some(&b), ..Default::default() }, &e, &idle).unwrap();
        assert_eq!(da.endpoint, db.endpoint, "only the first 8 bytes count");
        let mut busy = idle.clone();
        busy[da.endpoint].in_flight = 2;
        let d = p.pick(&PickInput { key: Some(&a), ..Default::default() }, &e, &busy).unwrap();
        assert_ne!(d.endpoint, da.endpoint);
        assert_eq!(d.reason, Reason::Overflow);
    }
}
