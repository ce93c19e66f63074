//! Azure LLM inference trace format (Azure/AzurePublicDataset `AzureLLMInferenceTrace_{conv,code}.csv`): a CSV
//! header `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps like `2023-11-16 18:15:46.6805900`.
//!
//! The trace has no prefix information, so every prompt is text unique to its line: it replays arrival times and
//! lengths (load balance, TTFT under load), not cache sharing.

use std::path::Path;

use chrono::NaiveDateTime;
use serde::Deserialize;
use warmpath_sim::tokens::filler_text;

use super::TraceLoad;
use crate::workload::{Body, Request};

#[derive(Debug, Deserialize)]
struct Record {
    #[serde(rename = "TIMESTAMP")]
    timestamp: String,
    #[serde(rename = "ContextTokens")]
    context_tokens: u64,
    #[serde(rename = "GeneratedTokens")]
    generated_tokens: u64,
}

/// Largest `ContextTokens` accepted.
pub const MAX_CONTEXT_TOKENS: u64 = 1 << 20;

fn parse_time(s: &str) -> Option<NaiveDateTime> {
    // The trace has 7 fractional digits; chrono's `%.f` reads up to 9.
    NaiveDateTime::parse_from_str(s.trim(), "%Y-%m-%d %H:%M:%S%.f").ok()
}

/// Loads up to `limit` requests from an Azure CSV trace.
pub fn load(path: &Path, limit: usize) -> anyhow::Result<TraceLoad> {
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = TraceLoad::default();
    let mut first: Option<NaiveDateTime> = None;
    for rec in rdr.deserialize::<Record>() {
        if out.requests.len() >= limit {
            break;
        }
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map(|p| p.line() as usize).unwrap_or(0);
                if let csv::ErrorKind::Io(_) = e.kind() {
                    anyhow::bail!("{}:{line}: {e}", path.display());
                }
                out.reject(path, line, format!("not an Azure trace record: {e}"));
                continue;
            }
        };
        // Header is line 1; data records follow (no multi-line fields in this format).
        let line = out.requests.len() + out.bad_lines + 2;
        let Some(t) = parse_time(&rec.timestamp) else {
            out.reject(path, line, format!("TIMESTAMP {:?} is not YYYY-MM-DD HH:MM:SS.fffffff", rec.timestamp));
            continue;
        };
        if rec.context_tokens == 0 || rec.context_tokens > MAX_CONTEXT_TOKENS {
            out.reject(path, line, format!("ContextTokens {} outside 1..={MAX_CONTEXT_TOKENS}", rec.context_tokens));
            continue;
        }
        let t0 = *first.get_or_insert(t);
        let at_ms = (t - t0).num_microseconds().unwrap_or(0) as f64 / 1000.0;
        out.requests.push(Request {
            id: out.requests.len(),
            at_ms: at_ms.max(0.0),
            body: Body::Completion(filler_text(0xa2u64 << 40 ^ line as u64, rec.context_tokens as usize)),
            max_tokens: rec.generated_tokens.clamp(1, 1 << 16) as u32,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn loads_times_lengths_and_counts_bad_lines() {
        let mut f = tempfile::Builder::new().suffix(".csv").tempfile().unwrap();
        f.write_all(
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n\
              2023-11-16 18:15:46.6805900,374,44\n\
              yesterday,10,10\n\
              2023-11-16 18:15:50.9951690,396,109\n\
              2023-11-16 18:15:51.0000000,abc,1\n",
        )
        .unwrap();
        let t = load(f.path(), 100).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.bad_lines, 2);
        assert_eq!(t.errors[0].line, 3);
        assert!(t.errors[0].message.contains("TIMESTAMP"));
        assert_eq!(t.errors[1].line, 5);
        assert!((t.requests[1].at_ms - 4314.579).abs() < 0.01, "{}", t.requests[1].at_ms);
        assert_eq!(t.requests[0].server_prompt().len(), 374 * 4);
        assert_eq!(t.requests[1].max_tokens, 109);
    }
}
