//! Re-implementations of peers' published routing policies, used as baselines in the same harness.
//!
//! Each implements the core's [`warmpath_core::policy::Policy`] trait and routes **client-side**: the harness
//! calls `pick` and sends the request straight to the chosen simulated server, skipping Envoy (so the baselines
//! save Envoy's sub-millisecond hop; the report says so). Every baseline reads the request text the same way the
//! filter does ([`warmpath_core::extract_key`]), so they see the same prefix.
//!
//! - [`sagemaker`]: fixed-length-prefix hashing with a concurrency threshold (SageMaker `PrefixAwareRoutingConfig`).
//! - [`gie`]: chained-block prefix scorer + queue scorer + KV-usage scorer, weights 3/2/2 (Gateway API Inference
//!   Extension / llm-d scheduler).
//! - [`sglang`]: cache-aware approximate radix tree with absolute/relative balance thresholds (SGLang router).

pub mod gie;
pub mod sagemaker;
pub mod sglang;

use clap::ValueEnum;
use warmpath_core::policy::Policy;

/// Baseline policies selectable on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// SageMaker-style fixed-length-prefix hash + concurrency threshold.
    #[value(name = "SAGEMAKER_PREFIX")]
    SageMaker,
    /// Gateway API Inference Extension-style scorers (prefix 3, queue 2, KV usage 2).
    #[value(name = "GIE_SCORERS")]
    Gie,
    /// SGLang-router-style cache-aware radix match with balance thresholds.
    #[value(name = "SGLANG_CACHE_AWARE")]
    SgLang,
}

impl Baseline {
    /// Every baseline, in report order.
    pub const ALL: [Baseline; 3] = [Baseline::SageMaker, Baseline::Gie, Baseline::SgLang];

    /// The label used in reports (same as the command-line name).
    pub fn label(self) -> &'static str {
        match self {
            Baseline::SageMaker => "SAGEMAKER_PREFIX",
            Baseline::Gie => "GIE_SCORERS",
            Baseline::SgLang => "SGLANG_CACHE_AWARE",
        }
    }

    /// A fresh policy with its published default parameters.
    pub fn create(self) -> Box<dyn Policy> {
        match self {
            Baseline::SageMaker => Box::new(sagemaker::SageMakerPrefix::default()),
            Baseline::Gie => Box::new(gie::GieScorers::default()),
            Baseline::SgLang => Box::new(sglang::SgLangCacheAware::default()),
        }
    }
}

/// Index of the smallest `f(i)` over `0..n`, ties broken by `tiebreak` (a caller-supplied random number), so
/// equal loads spread instead of piling onto endpoint 0.
pub(crate) fn argmin_by<F: Fn(usize) -> f64>(n: usize, tiebreak: u64, f: F) -> Option<usize> {
    let start = (tiebreak % n.max(1) as u64) as usize;
    (0..n).map(|k| (start + k) % n).min_by(|&a, &b| f(a).total_cmp(&f(b)))
}
