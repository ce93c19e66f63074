//! Unique prompts: every request is a fresh 300–1,500-token question with no shared prefix (not even a system
//! prompt). Poisson arrivals. Cache-aware routing cannot gain here; it must not lose on balance either.

use rand::rngs::StdRng;
use rand::Rng;
use warmpath_sim::tokens::filler_text;

use super::{poisson_times, text_seed, Body, GenParams, Request};

pub(super) fn generate(rng: &mut StdRng, p: GenParams) -> Vec<Request> {
    poisson_times(rng, p.requests, p.rate_per_s)
        .into_iter()
        .map(|at_ms| {
            let q = filler_text(text_seed(rng), rng.random_range(300..=1500));
            Request { id: 0, at_ms, body: Body::Chat(vec![("user".into(), q)]), max_tokens: rng.random_range(50..=200) }
        })
        .collect()
}
