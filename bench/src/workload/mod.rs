//! Requests to replay, and the built-in workload generators (each seeded, so a run is reproducible).
//!
//! Sizes are in simulated tokens (4 bytes of text each, see [`warmpath_sim::tokens`]); arrival times are simulated
//! milliseconds from the start of the run. Generators build chat histories with the simulator's reply text
//! ([`warmpath_sim::tokens::reply_text`]), so a conversation's next turn carries exactly the reply the server
//! generated and can hit its cached blocks.

use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use warmpath_sim::tokens::chat_prompt;

mod chat;
mod code;
mod rag;
mod templated;
mod unique;

/// The request body an endpoint receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// `/v1/chat/completions` with `(role, content)` messages.
    Chat(Vec<(String, String)>),
    /// `/v1/completions` with one prompt string.
    Completion(String),
}

/// One request of a workload or trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Position in the workload (0-based).
    pub id: usize,
    /// Arrival time, simulated ms since the start of the run.
    pub at_ms: f64,
    /// The body.
    pub body: Body,
    /// Output tokens to generate.
    pub max_tokens: u32,
}

impl Request {
    /// The OpenAI path for this body.
    pub fn path(&self) -> &'static str {
        match self.body {
            Body::Chat(_) => "/v1/chat/completions",
            Body::Completion(_) => "/v1/completions",
        }
    }

    /// The JSON body, streaming with `include_usage` so the last chunk carries the server's cache truth.
    pub fn json(&self, model: &str) -> Value {
        let mut v = match &self.body {
            Body::Chat(msgs) => json!({
                "model": model,
                "messages": msgs.iter().map(|(r, c)| json!({"role": r, "content": c})).collect::<Vec<_>>(),
            }),
            Body::Completion(p) => json!({"model": model, "prompt": p}),
        };
        v["max_tokens"] = json!(self.max_tokens);
        v["stream"] = json!(true);
        v["stream_options"] = json!({"include_usage": true});
        v
    }

    /// A key shared by every turn of one conversation, for sticky spreading over gateways: for chat bodies a hash
    /// of the messages up to and including the first user message (later turns only append); for completion
    /// bodies (traces, code) a hash of the first 2,048 bytes (one 512-token Mooncake block: a session's turns start
    /// alike).
    pub fn session_key(&self) -> u64 {
        match &self.body {
            Body::Chat(msgs) => {
                let end = msgs.iter().position(|(r, _)| r == "user").map_or(msgs.len(), |i| i + 1);
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                for (r, c) in &msgs[..end] {
                    h.update(r.as_bytes());
                    h.update(&[0]);
                    h.update(c.as_bytes());
                    h.update(&[0]);
                }
                h.digest()
            }
            Body::Completion(p) => {
                let b = p.as_bytes();
                xxhash_rust::xxh3::xxh3_64(&b[..b.len().min(2048)])
            }
        }
    }

    /// The prompt text as the simulated server renders it (chat template applied); used for the pooled-cache
    /// bound.
    pub fn server_prompt(&self) -> String {
        match &self.body {
            Body::Chat(msgs) => chat_prompt(msgs.iter().map(|(r, c)| (r.as_str(), c.as_str()))),
            Body::Completion(p) => p.clone(),
        }
    }
}

/// Requests `start..start + n` of `all` as a workload of their own: arrival times shifted so the first arrives at
/// 0 and ids renumbered from 0 (repeated runs over successive stretches of one trace).
pub fn window(all: &[Request], start: usize, n: usize) -> Vec<Request> {
    let part = &all[start.min(all.len())..(start + n).min(all.len())];
    let t0 = part.first().map_or(0.0, |r| r.at_ms);
    part.iter().enumerate().map(|(i, r)| Request { id: i, at_ms: r.at_ms - t0, ..r.clone() }).collect()
}

/// Built-in workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// Multi-turn chat: many users, one shared system prompt, each conversation's history grows turn by turn.
    Chat,
    /// Retrieval-augmented generation: a few long documents, many short questions about them.
    Rag,
    /// Templated assistant: one long system prompt shared by every request, short unique questions.
    Templated,
    /// Code completion: file prefixes that change slowly (edits near the cursor), small completions.
    Code,
    /// Unique prompts: no sharing at all (routing cannot gain hits; shows load balance only).
    Unique,
}

/// Parameters common to every generator.
#[derive(Debug, Clone, Copy)]
pub struct GenParams {
    /// Number of requests to generate.
    pub requests: usize,
    /// Mean arrival rate, requests per simulated second (Poisson arrivals, or session starts for chat).
    pub rate_per_s: f64,
    /// Seed of every random choice.
    pub seed: u64,
}

/// Generates `p.requests` requests of `kind`, sorted by arrival time, ids renumbered in arrival order.
pub fn generate(kind: WorkloadKind, p: GenParams) -> Vec<Request> {
    let mut rng = StdRng::seed_from_u64(p.seed);
    let mut reqs = match kind {
        WorkloadKind::Chat => chat::generate(&mut rng, p),
        WorkloadKind::Rag => rag::generate(&mut rng, p),
        WorkloadKind::Templated => templated::generate(&mut rng, p),
        WorkloadKind::Code => code::generate(&mut rng, p),
        WorkloadKind::Unique => unique::generate(&mut rng, p),
    };
    finish(&mut reqs, p.requests);
    reqs
}

/// Sorts by arrival, keeps the first `limit`, renumbers ids.
pub fn finish(reqs: &mut Vec<Request>, limit: usize) {
    reqs.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
    reqs.truncate(limit);
    for (i, r) in reqs.iter_mut().enumerate() {
        r.id = i;
    }
}

/// Exponential inter-arrival gap for a Poisson process of `rate_per_s`, in ms.
pub(crate) fn exp_gap_ms(rng: &mut StdRng, rate_per_s: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() * 1000.0 / rate_per_s.max(1e-9)
}

/// Poisson arrival times for `n` requests, in ms.
pub(crate) fn poisson_times(rng: &mut StdRng, n: usize, rate_per_s: f64) -> Vec<f64> {
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += exp_gap_ms(rng, rate_per_s);
            t
        })
        .collect()
}

/// A random seed for text that no other request shares.
pub(crate) fn text_seed(rng: &mut StdRng) -> u64 {
    rng.random()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> GenParams {
        GenParams { requests: 200, rate_per_s: 4.0, seed: 7 }
    }

    #[test]
    fn every_generator_is_deterministic_sorted_and_sized() {
        for kind in WorkloadKind::value_variants() {
            let a = generate(*kind, params());
            assert_eq!(a.len(), 200, "{kind:?}");
            assert_eq!(a, generate(*kind, params()), "{kind:?}");
            assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "{kind:?}");
            assert!(a.iter().enumerate().all(|(i, r)| r.id == i));
            let other = generate(*kind, GenParams { seed: 8, ..params() });
            assert_ne!(a, other, "{kind:?}: seed must matter");
        }
    }

    fn shared_prefix_fraction(reqs: &[Request]) -> f64 {
        // Fraction of requests whose first 2 KB of server prompt equals some earlier request's.
        let mut seen = std::collections::HashSet::new();
        let mut shared = 0;
        for r in reqs {
            let p = r.server_prompt();
            let head = p.as_bytes()[..p.len().min(2048)].to_vec();
            if !seen.insert(head) {
                shared += 1;
            }
        }
        shared as f64 / reqs.len() as f64
    }

    #[test]
    fn sharing_workloads_share_and_unique_does_not() {
        for kind in [WorkloadKind::Chat, WorkloadKind::Rag, WorkloadKind::Templated, WorkloadKind::Code] {
            assert!(shared_prefix_fraction(&generate(kind, params())) > 0.5, "{kind:?}");
        }
        assert_eq!(shared_prefix_fraction(&generate(WorkloadKind::Unique, params())), 0.0);
    }

    #[test]
    fn chat_turns_extend_previous_turn_plus_reply() {
        let reqs = generate(WorkloadKind::Chat, params());
        // Some request must start with an earlier request's full server prompt plus its reply.
        let prompts: Vec<String> = reqs.iter().map(|r| r.server_prompt()).collect();
        let found = reqs.iter().enumerate().any(|(i, r)| {
            let with_reply =
                format!("{}{}", prompts[i], warmpath_sim::tokens::reply_text(&prompts[i], r.max_tokens as usize));
            prompts[i + 1..].iter().any(|p| p.starts_with(&with_reply))
        });
        assert!(found);
    }

    #[test]
    fn turns_of_one_conversation_share_a_session_key() {
        let reqs = generate(WorkloadKind::Chat, params());
        let first_user = |r: &Request| match &r.body {
            Body::Chat(m) => m.iter().find(|(role, _)| role == "user").map(|(_, c)| c.clone()),
            Body::Completion(_) => None,
        };
        let mut same = 0;
        for (i, a) in reqs.iter().enumerate() {
            for b in &reqs[i + 1..] {
                let one_conversation = first_user(a) == first_user(b);
                assert_eq!(a.session_key() == b.session_key(), one_conversation, "{} vs {}", a.id, b.id);
                same += usize::from(one_conversation);
            }
        }
        assert!(same > 0, "the chat workload has multi-turn conversations");
    }

    #[test]
    fn window_rebases_times_and_ids() {
        let reqs = generate(WorkloadKind::Rag, params());
        let w = window(&reqs, 10, 5);
        assert_eq!(w.len(), 5);
        assert_eq!((w[0].id, w[0].at_ms), (0, 0.0));
        assert_eq!(w[4].at_ms, reqs[14].at_ms - reqs[10].at_ms);
        assert_eq!(w[2].body, reqs[12].body);
        assert!(window(&reqs, reqs.len(), 5).is_empty());
    }

    #[test]
    fn json_body_streams_with_usage() {
        let r = &generate(WorkloadKind::Rag, params())[0];
        let v = r.json("m");
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["max_tokens"], r.max_tokens);
    }
}
