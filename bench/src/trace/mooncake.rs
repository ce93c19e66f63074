//! Mooncake trace format (kvcache-ai/Mooncake `FAST25-release/traces/`): one JSON object per line with
//! `timestamp` (ms since start), `input_length` and `output_length` (tokens) and `hash_ids` (one id per
//! 512-token prefix block, chained from the start: equal leading ids = reusable KV-cache prefix).
//!
//! Each id becomes a fixed 512-token block of text derived only from the id, so requests sharing leading ids get
//! byte-identical prompt prefixes; the prompt is the ids' blocks in order, cut or padded (with text unique to the
//! request) to exactly `input_length` tokens, sent as a `/v1/completions` prompt.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;
use warmpath_sim::tokens::{filler_text, BYTES_PER_TOKEN};

use super::TraceLoad;
use crate::workload::{Body, Request};

/// Tokens per Mooncake hash block.
pub const BLOCK_TOKENS: usize = 512;
/// Largest `input_length` accepted, tokens (a prompt beyond this is a corrupt record, not a workload).
pub const MAX_INPUT_TOKENS: u64 = 1 << 20;

#[derive(Debug, Deserialize)]
struct Record {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Text generator with a memo of block texts by id.
#[derive(Debug, Default)]
pub struct BlockText {
    memo: HashMap<u64, String>,
}

impl BlockText {
    /// The 512-token text of block `id` (4·512 bytes), identical for equal ids.
    pub fn block(&mut self, id: u64) -> &str {
        self.memo
            .entry(id)
            .or_insert_with(|| filler_text(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x3c6e, BLOCK_TOKENS))
    }

    /// The prompt of a record: blocks of `hash_ids`, then padding unique to `line`, cut to `input_length` tokens.
    pub fn prompt(&mut self, hash_ids: &[u64], input_length: usize, line: usize) -> String {
        let want = input_length * BYTES_PER_TOKEN;
        let mut p = String::with_capacity(want);
        for &id in hash_ids {
            if p.len() >= want {
                break;
            }
            p.push_str(self.block(id));
        }
        if p.len() < want {
            p.push_str(&filler_text(0xfade_0000_0000 ^ line as u64, (want - p.len()).div_ceil(BYTES_PER_TOKEN)));
        }
        p.truncate(want);
        p
    }
}

/// Loads up to `limit` requests from a Mooncake JSONL file.
pub fn load(path: &Path, limit: usize) -> anyhow::Result<TraceLoad> {
    let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = TraceLoad::default();
    let mut text = BlockText::default();
    let mut first_ts = None;
    for (i, line) in BufReader::new(file).lines().enumerate() {
        if out.requests.len() >= limit {
            break;
        }
        let n = i + 1;
        let line = line.map_err(|e| anyhow::anyhow!("{}:{n}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: Record = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                out.reject(path, n, format!("not a Mooncake record: {e}"));
                continue;
            }
        };
        if !rec.timestamp.is_finite() || rec.timestamp < 0.0 {
            out.reject(path, n, format!("timestamp {} is not a non-negative number of ms", rec.timestamp));
            continue;
        }
        if rec.input_length == 0 || rec.input_length > MAX_INPUT_TOKENS {
            out.reject(path, n, format!("input_length {} outside 1..={MAX_INPUT_TOKENS}", rec.input_length));
            continue;
        }
        let first = *first_ts.get_or_insert(rec.timestamp);
        let prompt = text.prompt(&rec.hash_ids, rec.input_length as usize, n);
        out.requests.push(Request {
            id: out.requests.len(),
            at_ms: (rec.timestamp - first).max(0.0),
            body: Body::Completion(prompt),
            max_tokens: rec.output_length.clamp(1, 1 << 16) as u32,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(lines: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new().suffix(".jsonl").tempfile().unwrap();
        f.write_all(lines.as_bytes()).unwrap();
        f
    }

    #[test]
    fn shared_ids_give_identical_prefixes_and_exact_lengths() {
        let f = write(concat!(
            "{\"timestamp\": 100, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n",
            "{\"timestamp\": 250, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [1, 9]}\n",
        ));
        let t = load(f.path(), 10).unwrap();
        assert_eq!(t.bad_lines, 0);
        let p: Vec<String> = t.requests.iter().map(|r| r.server_prompt()).collect();
        assert_eq!(p[0].len(), 1100 * 4);
        assert_eq!(p[1].len(), 600 * 4);
        assert_eq!(p[0][..2048], p[1][..2048]);
        assert_ne!(p[0][2048..2400], p[1][2048..2400]);
        assert_eq!(t.requests[0].at_ms, 0.0);
        assert_eq!(t.requests[1].at_ms, 150.0);
        assert_eq!(t.requests[1].max_tokens, 1, "at least one output token");
    }

    #[test]
    fn bad_lines_are_counted_with_line_numbers_and_the_rest_loads() {
        let f = write(concat!(
            "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n",
            "not json\n",
            "\n",
            "{\"timestamp\": 5, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}\n",
            "{\"timestamp\": 9, \"input_length\": 20, \"output_length\": 5, \"hash_ids\": [2]}\n",
        ));
        let t = load(f.path(), 10).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.bad_lines, 2);
        assert_eq!(t.errors[0].line, 2);
        assert!(t.errors[0].to_string().contains(":2: not a Mooncake record"), "{}", t.errors[0]);
        assert_eq!(t.errors[1].line, 4);
        assert!(t.errors[1].message.contains("input_length 0"));
    }

    #[test]
    fn limit_stops_early() {
        let f = write(&"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n".repeat(5));
        assert_eq!(load(f.path(), 3).unwrap().requests.len(), 3);
    }
}
