//! Chained block hashes of the leading text (xxhash-rust xxh3).
//!
//! Block `i` covers bytes `[i·block_size, (i+1)·block_size)` of the extracted text and its hash is
//! `h_i = xxh3_64_with_seed(block_i, h_{i-1})` with `h_{-1} = namespace`. Because each hash covers the whole
//! prefix up to its block, one equal hash means an equal prefix (up to collisions), and a request whose text
//! extends another's shares exactly the other's full-block hashes. This is the scheme vLLM's prefix cache and
//! the Gateway API Inference Extension prefix plugin use (parent hash chained into each block hash).
//!
//! The trailing partial block (fewer than `block_size` bytes) has no block hash; it is summarised by
//! [`checkpoint_hash`] at multiples of [`checkpoint_step`] so a later turn whose text extends it can find it.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed tweak that separates partial-block (checkpoint) hashes from full-block hashes.
const CHECKPOINT_DOMAIN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Hash of every FULL block of `text`, chained from `namespace` (see the module docs). `block_size` is in
/// bytes and must be > 0; a trailing partial block is not included. Length: `text.len() / block_size`.
pub fn block_hashes(namespace: u64, text: &[u8], block_size: usize) -> Vec<u64> {
    assert!(block_size > 0, "block_size must be > 0");
    let mut out = Vec::with_capacity(text.len() / block_size);
    let mut h = namespace;
    for block in text.chunks_exact(block_size) {
        h = xxh3_64_with_seed(block, h);
        out.push(h);
    }
    out
}

/// Spacing of checkpoints inside a partial block, in bytes: a quarter block (at least 1).
pub fn checkpoint_step(block_size: usize) -> usize {
    (block_size / 4).max(1)
}

/// Hash of the first `partial.len()` bytes of a block whose chained parent hash is `parent` (the previous full
/// block's hash, or the namespace for block 0). Domain-separated from full-block hashes.
pub fn checkpoint_hash(parent: u64, partial: &[u8]) -> u64 {
    xxh3_64_with_seed(partial, parent ^ CHECKPOINT_DOMAIN)
}

/// Block hashes of one request plus the facts about its trailing partial block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHashes {
    /// Full-block hashes, see [`block_hashes`].
    pub blocks: Vec<u64>,
    /// Block size in bytes the hashes were computed with.
    pub block_size: usize,
    /// Namespace the chain starts from.
    pub namespace: u64,
    /// Total text length in bytes (full blocks plus the partial tail).
    pub text_len: usize,
}

impl PrefixHashes {
    /// Hashes `text` in blocks of `block_size` bytes starting from `namespace`.
    pub fn compute(namespace: u64, text: &[u8], block_size: usize) -> PrefixHashes {
        PrefixHashes { blocks: block_hashes(namespace, text, block_size), block_size, namespace, text_len: text.len() }
    }

    /// Chained hash before block `i` (the namespace for `i == 0`).
    pub fn parent(&self, i: usize) -> u64 {
        if i == 0 {
            self.namespace
        } else {
            self.blocks[i - 1]
        }
    }

    /// Bytes in the trailing partial block.
    pub fn tail_len(&self) -> usize {
        self.text_len - self.blocks.len() * self.block_size
    }
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn chain_is_prefix_stable() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
        let short = block_hashes(1, &a[..300], 64);
        let long = block_hashes(1, &a, 64);
        assert_eq!(short.len(), 4);
        assert_eq!(long.len(), 15);
        assert_eq!(&long[..4], &short[..]);
        // A different namespace changes every hash.
        let other = block_hashes(2, &a, 64);
        assert!(long.iter().zip(&other).all(|(x, y)| x != y));
        // Changing one byte changes that block's hash and every later one, never earlier ones.
        let mut b = a.clone();
        b[200] ^= 1;
        let changed = block_hashes(1, &b, 64);
        assert_eq!(&changed[..3], &long[..3]);
        assert!(changed[3..].iter().zip(&long[3..]).all(|(x, y)| x != y));
    }

    #[test]
    fn checkpoints_differ_from_blocks() {
        let t = [7u8; 64];
        let full = block_hashes(5, &t, 64)[0];
        assert_ne!(checkpoint_hash(5, &t), full);
        assert_eq!(checkpoint_step(128), 32);
        assert_eq!(checkpoint_step(2), 1);
        let p = PrefixHashes::compute(5, &[1u8; 150], 64);
        assert_eq!((p.blocks.len(), p.tail_len(), p.parent(0), p.parent(2)), (2, 22, 5, p.blocks[1]));
    }
}
