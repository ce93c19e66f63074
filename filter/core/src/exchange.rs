//! Index records exchanged between routers that serve the same traffic — the Envoy workers of one Envoy, each of
//! which runs its own VM and so its own [`crate::Router`] and prefix index.
//!
//! PREFIX_AWARE learns where a prefix went only from the requests it routes itself. With several workers, a
//! conversation's next turn often reaches a worker that did not route the previous one: without exchange that
//! worker sees a miss and may place the turn elsewhere, splitting the conversation's cache. After each pick the
//! router hands out the chain it recorded ([`crate::Router::take_index_record`]); the filter sends it to the other
//! workers, which apply it ([`crate::Router::learn`]) before their next pick, so every worker routes with the
//! same index.
//!
//! Wire format of one record (little-endian), self-delimiting so several can be concatenated in one message:
//! `[VERSION: u8][block_size: u32][address length: u8][address bytes][chain length: u16][chain: u64 × length]`.
//! The block size travels with the record because a chain's hashes mean nothing under another block size (a
//! worker that has not applied a new configuration yet drops the record).

/// Format version of a record (the first byte).
pub const VERSION: u8 = 1;

/// Most hashes one record carries; a longer chain is cut (its head is what later requests match first).
pub const MAX_CHAIN: usize = 4096;

/// One decoded record: `chain` was recorded under the endpoint at `address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRecord<'a> {
    /// Block size (bytes) the chain was hashed with.
    pub block_size: u32,
    /// `IP:port` of the endpoint the chain went to.
    pub address: &'a str,
    /// The recorded chain (block and checkpoint hashes, in recording order).
    pub chain: Vec<u64>,
}

/// Appends the record of `chain` under `address` to `out`. An address longer than 255 bytes (not an `IP:port`)
/// appends nothing and returns false.
pub fn encode(out: &mut Vec<u8>, block_size: usize, address: &str, chain: &[u64]) -> bool {
    let (Ok(len), Ok(bs)) = (u8::try_from(address.len()), u32::try_from(block_size)) else { return false };
    let chain = &chain[..chain.len().min(MAX_CHAIN)];
    out.reserve(8 + address.len() + 8 * chain.len());
    out.push(VERSION);
    out.extend_from_slice(&bs.to_le_bytes());
    out.push(len);
    out.extend_from_slice(address.as_bytes());
    out.extend_from_slice(&(chain.len() as u16).to_le_bytes());
    for h in chain {
        out.extend_from_slice(&h.to_le_bytes());
    }
    true
}

/// Decodes every record of `bytes`, in order. Stops at the first malformed record (an unknown version, a
/// truncated record, a non-UTF-8 address) and reports it as `Err` after the records before it.
pub fn decode(bytes: &[u8]) -> impl Iterator<Item = Result<IndexRecord<'_>, &'static str>> + '_ {
    let mut rest = bytes;
    let mut failed = false;
    std::iter::from_fn(move || {
        if rest.is_empty() || failed {
            return None;
        }
        let r = decode_one(rest);
        match r {
            Ok((rec, tail)) => {
                rest = tail;
                Some(Ok(rec))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}

fn decode_one(b: &[u8]) -> Result<(IndexRecord<'_>, &[u8]), &'static str> {
    let (&version, b) = b.split_first().ok_or("empty record")?;
    if version != VERSION {
        return Err("unknown record version");
    }
    let (bs, b) = split(b, 4).ok_or("truncated block size")?;
    let block_size = u32::from_le_bytes(bs.try_into().expect("4 bytes"));
    let (&len, b) = b.split_first().ok_or("truncated address length")?;
    let (addr, b) = split(b, usize::from(len)).ok_or("truncated address")?;
    let address = std::str::from_utf8(addr).map_err(|_| "address is not UTF-8")?;
    let (n, b) = split(b, 2).ok_or("truncated chain length")?;
    let n = usize::from(u16::from_le_bytes(n.try_into().expect("2 bytes")));
    let (hashes, rest) = split(b, n * 8).ok_or("truncated chain")?;
    let chain = hashes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok((IndexRecord { block_size, address, chain }, rest))
}

fn split(b: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (b.len() >= n).then(|| b.split_at(n))
}

#[cfg(test)]
mod tests {
    // Under wasm32 the same tests run through wasm-bindgen-test (scripts/test.d/15-core-wasm.sh).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use super::*;

    #[test]
    fn records_round_trip_and_concatenate() {
        let mut out = Vec::new();
        assert!(encode(&mut out, 128, "10.0.0.1:8000", &[1, 2, u64::MAX]));
        assert!(encode(&mut out, 64, "[::1]:9", &[]));
        let recs: Vec<_> = decode(&out).collect::<Result<_, _>>().expect("well-formed");
        assert_eq!(
            recs,
            vec![
                IndexRecord { block_size: 128, address: "10.0.0.1:8000", chain: vec![1, 2, u64::MAX] },
                IndexRecord { block_size: 64, address: "[::1]:9", chain: vec![] },
            ]
        );
    }

    #[test]
    fn long_addresses_and_chains_are_bounded() {
        let mut out = Vec::new();
        assert!(!encode(&mut out, 128, &"x".repeat(256), &[1]));
        assert!(out.is_empty(), "nothing written for a refused address");
        let long: Vec<u64> = (0..MAX_CHAIN as u64 + 10).collect();
        assert!(encode(&mut out, 128, "a:1", &long));
        let rec = decode(&out).next().expect("one").expect("well-formed");
        assert_eq!(rec.chain.len(), MAX_CHAIN);
        assert_eq!(rec.chain[..3], [0, 1, 2], "the head is kept");
    }

    #[test]
    fn malformed_input_stops_with_an_error_after_the_good_records() {
        let mut out = Vec::new();
        encode(&mut out, 128, "a:1", &[7]);
        let good = out.len();
        encode(&mut out, 128, "b:2", &[8, 9]);
        // Every truncation of the second record is reported, the first still decoded.
        for cut in good + 1..out.len() {
            let recs: Vec<_> = decode(&out[..cut]).collect();
            assert_eq!(recs.len(), 2, "cut at {cut}");
            assert!(recs[0].is_ok() && recs[1].is_err(), "cut at {cut}: {recs:?}");
        }
        assert_eq!(decode(&[9, 0, 0]).next(), Some(Err("unknown record version")));
        let mut bad_utf8 = Vec::new();
        encode(&mut bad_utf8, 128, "ab", &[]);
        bad_utf8[6] = 0xff;
        assert_eq!(decode(&bad_utf8).next(), Some(Err("address is not UTF-8")));
        assert_eq!(decode(&[]).count(), 0);
    }
}
