//! Templated assistant: one 2,000-token system prompt shared by every request and a unique 30–120-token question.
//! The trap for prefix routing: the only shared prefix is common to all traffic, so sending it all to one endpoint
//! would hot-spot. Poisson arrivals.

use rand::rngs::StdRng;
use rand::Rng;
use warmpath_sim::tokens::filler_text;

use super::{poisson_times, text_seed, Body, GenParams, Request};

/// Tokens of the shared system prompt.
pub const SYSTEM_TOKENS: usize = 2000;

pub(super) fn generate(rng: &mut StdRng, p: GenParams) -> Vec<Request> {
    let system = filler_text(text_seed(rng), SYSTEM_TOKENS);
    poisson_times(rng, p.requests, p.rate_per_s)
        .into_iter()
        .map(|at_ms| {
            let q = filler_text(text_seed(rng), rng.random_range(30..=120));
            let body = Body::Chat(vec![("system".into(), system.clone()), ("user".into(), q)]);
            Request { id: 0, at_ms, body, max_tokens: rng.random_range(50..=200) }
        })
        .collect()
}
