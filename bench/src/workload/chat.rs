//! Multi-turn chat: users start conversations as a Poisson process; every conversation begins with the same
//! 800-token system prompt, and each turn resends the whole history (system, earlier questions, the server's
//! earlier replies) plus a new 30–150-token question. 3–8 turns per conversation, 8 s mean think time.

use rand::rngs::StdRng;
use rand::Rng;
use warmpath_sim::tokens::{chat_prompt, filler_text, reply_text};

use super::{exp_gap_ms, text_seed, Body, GenParams, Request};

/// Tokens of the shared system prompt.
pub const SYSTEM_TOKENS: usize = 800;
/// Mean think time between a reply and the next question, simulated ms.
pub const THINK_MS: f64 = 8000.0;

pub(super) fn generate(rng: &mut StdRng, p: GenParams) -> Vec<Request> {
    let system = filler_text(text_seed(rng), SYSTEM_TOKENS);
    let mean_turns = 5.5;
    let session_rate = p.rate_per_s / mean_turns;
    let mut out = Vec::new();
    let mut start = 0.0;
    while out.len() < p.requests {
        start += exp_gap_ms(rng, session_rate);
        let turns = rng.random_range(3..=8);
        let mut history: Vec<(String, String)> = vec![("system".into(), system.clone())];
        let mut t = start;
        for _ in 0..turns {
            let q = filler_text(text_seed(rng), rng.random_range(30..=150));
            history.push(("user".into(), q));
            let max_tokens = rng.random_range(60..=200u32);
            out.push(Request { id: 0, at_ms: t, body: Body::Chat(history.clone()), max_tokens });
            let prompt = chat_prompt(history.iter().map(|(r, c)| (r.as_str(), c.as_str())));
            history.push(("assistant".into(), reply_text(&prompt, max_tokens as usize)));
            // Next question after the reply streamed (≈12 ms per token) and the user thought.
            t += max_tokens as f64 * 12.0 + exp_gap_ms(rng, 1000.0 / THINK_MS);
        }
    }
    out
}
