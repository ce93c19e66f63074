//! Code completion: 16 source files (1,500–3,000 tokens) with Zipf(1) popularity, sent as `/v1/completions`
//! prompts. Before 30 % of requests the file is edited near its end (the tail after a point in its last 10 % is
//! rewritten), so prefixes change slowly. 16–64 output tokens. Poisson arrivals.

use rand::rngs::StdRng;
use rand::Rng;
use warmpath_sim::tokens::{filler_text, BYTES_PER_TOKEN};

use super::rag::zipf;
use super::{poisson_times, text_seed, Body, GenParams, Request};

/// Number of files.
pub const FILES: usize = 16;

pub(super) fn generate(rng: &mut StdRng, p: GenParams) -> Vec<Request> {
    let mut files: Vec<String> =
        (0..FILES).map(|_| filler_text(text_seed(rng), rng.random_range(1500..=3000))).collect();
    poisson_times(rng, p.requests, p.rate_per_s)
        .into_iter()
        .map(|at_ms| {
            let f = zipf(rng, FILES);
            if rng.random_bool(0.3) {
                let tokens = files[f].len() / BYTES_PER_TOKEN;
                let keep = rng.random_range(tokens * 9 / 10..tokens);
                let tail = filler_text(text_seed(rng), tokens - keep + rng.random_range(0..40));
                files[f].truncate(keep * BYTES_PER_TOKEN);
                files[f].push_str(&tail);
            }
            Request { id: 0, at_ms, body: Body::Completion(files[f].clone()), max_tokens: rng.random_range(16..=64) }
        })
        .collect()
}
