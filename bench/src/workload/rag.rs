//! RAG: six long documents (2,500–3,500 tokens) with Zipf(1) popularity; each request is a short system prompt,
//! one document as context and a unique 20–60-token question. Poisson arrivals.

use rand::rngs::StdRng;
use rand::Rng;
use warmpath_sim::tokens::filler_text;

use super::{poisson_times, text_seed, Body, GenParams, Request};

/// Number of documents.
pub const DOCUMENTS: usize = 6;

/// Index drawn from Zipf(1) over `n` items (item k has weight 1/(k+1)).
pub(crate) fn zipf(rng: &mut StdRng, n: usize) -> usize {
    let total: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
    let mut x = rng.random_range(0.0..total);
    for k in 0..n {
        x -= 1.0 / (k + 1) as f64;
        if x <= 0.0 {
            return k;
        }
    }
    n - 1
}

pub(super) fn generate(rng: &mut StdRng, p: GenParams) -> Vec<Request> {
    let system = filler_text(text_seed(rng), 150);
    let docs: Vec<String> =
        (0..DOCUMENTS).map(|_| filler_text(text_seed(rng), rng.random_range(2500..=3500))).collect();
    poisson_times(rng, p.requests, p.rate_per_s)
        .into_iter()
        .map(|at_ms| {
            let doc = &docs[zipf(rng, DOCUMENTS)];
            let q = filler_text(text_seed(rng), rng.random_range(20..=60));
            let user = format!("Context:\n{doc}\n\nQuestion: {q}");
            let body = Body::Chat(vec![("system".into(), system.clone()), ("user".into(), user)]);
            Request { id: 0, at_ms, body, max_tokens: rng.random_range(50..=150) }
        })
        .collect()
}
