//! Deterministic text ↔ token mapping shared by the simulated server and the workload generators.
//!
//! The simulator has no tokenizer. One token is **4 bytes of UTF-8 text** (the usual "≈4 characters per token"
//! rule of thumb for English with BPE tokenizers, as quoted in OpenAI's tokenizer guide), so a prompt of `n` bytes
//! has `ceil(n / 4)` tokens and a cache block of `b` tokens covers `4·b` bytes. Generated text uses 3-letter words
//! followed by a space, so every generated token is exactly 4 bytes and generated text stays block-aligned.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Bytes of UTF-8 text per simulated token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Number of tokens in `bytes` bytes of text: `ceil(bytes / 4)`.
pub fn token_count(bytes: usize) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN) as u64
}

/// Chained hashes of the **full** token blocks of `text` (a trailing partial block is not hashed, as in vLLM's
/// automatic prefix caching, which only caches full blocks).
///
/// Block `i` covers bytes `[i·4·block_tokens, (i+1)·4·block_tokens)`; its hash is xxh3 of the block bytes seeded with
/// the previous block's hash, so equal hashes mean equal text from the very start (the chained-prefix rule).
/// `block_tokens` must be ≥ 1.
pub fn block_hashes(text: &[u8], block_tokens: usize) -> Vec<u64> {
    let block_bytes = block_tokens.max(1) * BYTES_PER_TOKEN;
    let mut prev = 0x5eed_u64;
    text.chunks_exact(block_bytes)
        .map(|chunk| {
            prev = xxh3_64_with_seed(chunk, prev);
            prev
        })
        .collect()
}

/// Renders chat messages into one prompt string with a fixed template:
/// each message as `<|role|>\n{content}<|end|>\n`, followed by the generation prompt `<|assistant|>\n`.
///
/// The template is chosen so that a conversation's next turn extends the previous prompt *plus the generated reply*
/// byte for byte, which is what lets a multi-turn conversation hit the cache for its whole history.
pub fn chat_prompt<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        out.push_str(content);
        out.push_str("<|end|>\n");
    }
    out.push_str("<|assistant|>\n");
    out
}

const SYLLABLES: [&str; 64] = [
    "ace", "bay", "cab", "dew", "elk", "fig", "gum", "hat", "ink", "jam", "kit", "log", "mud", "net", "oak", "pan",
    "rag", "sun", "tap", "urn", "van", "wax", "yak", "zip", "arc", "bee", "cog", "den", "eel", "fox", "gap", "hop",
    "ivy", "jet", "kin", "lid", "map", "nut", "orb", "pod", "ram", "sip", "tin", "use", "vet", "web", "yam", "zoo",
    "ale", "bud", "cup", "dot", "egg", "fin", "gem", "hub", "ion", "jog", "key", "lab", "mix", "nod", "owl", "pig",
];

/// Deterministic filler text of exactly `tokens` tokens (`4·tokens` bytes): 3-letter words and spaces chosen by
/// xxh3 of `(seed, position)`. Equal seeds give byte-identical text; different seeds give unrelated text.
pub fn filler_text(seed: u64, tokens: usize) -> String {
    let mut out = String::with_capacity(tokens * BYTES_PER_TOKEN);
    let mut word = 0u64;
    let mut bits = 0u32;
    for i in 0..tokens {
        if bits < 6 {
            word = xxh3_64_with_seed(&(i as u64).to_le_bytes(), seed);
            bits = 64;
        }
        out.push_str(SYLLABLES[(word & 63) as usize]);
        out.push(' ');
        word >>= 6;
        bits -= 6;
    }
    out
}

/// The reply the simulator generates for `prompt`: `filler_text` seeded by the prompt's hash, `tokens` tokens long.
/// Workload generators call this to know a reply in advance, so a conversation's next turn can carry the exact
/// text the server produced (and therefore hit the blocks it cached).
pub fn reply_text(prompt: &str, tokens: usize) -> String {
    filler_text(xxh3_64(prompt.as_bytes()), tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_count_rounds_up() {
        assert_eq!(token_count(0), 0);
        assert_eq!(token_count(1), 1);
        assert_eq!(token_count(4), 1);
        assert_eq!(token_count(5), 2);
    }

    #[test]
    fn filler_is_deterministic_and_exact_length() {
        let a = filler_text(7, 100);
        assert_eq!(a.len(), 400);
        assert_eq!(a, filler_text(7, 100));
        assert_ne!(a, filler_text(8, 100));
        // Prefix property: a shorter text with the same seed is a prefix of the longer one.
        assert!(filler_text(7, 300).starts_with(&a));
    }

    #[test]
    fn block_hashes_chain_from_start() {
        let a = filler_text(1, 64);
        let b = format!("{}{}", &a[..128], filler_text(2, 32));
        let ha = block_hashes(a.as_bytes(), 16);
        let hb = block_hashes(b.as_bytes(), 16);
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        // Same block content at a different position hashes differently (chained).
        let c = format!("{}{}", filler_text(3, 16), &a[..64]);
        assert_ne!(block_hashes(c.as_bytes(), 16)[1], ha[0]);
        // Partial trailing block is not hashed.
        assert_eq!(block_hashes(&a.as_bytes()[..100], 16).len(), 1);
    }

    #[test]
    fn next_turn_extends_prompt_plus_reply() {
        let p1 = chat_prompt([("system", "sys"), ("user", "hi")]);
        let r1 = reply_text(&p1, 8);
        let p2 = chat_prompt([("system", "sys"), ("user", "hi"), ("assistant", r1.as_str()), ("user", "more")]);
        assert!(p2.starts_with(&format!("{p1}{r1}")));
    }
}
