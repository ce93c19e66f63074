//! Trace replay input: Mooncake JSON lines and Azure LLM-inference CSV, turned into [`Request`]s.
//!
//! Bad records never stop a load silently: each one becomes a [`TraceError`] naming the line number and the
//! reason, and [`TraceLoad::bad_lines`] counts them all (the first [`MAX_KEPT_ERRORS`] are kept for printing).
//! Whitespace-only lines are not records and are ignored.

use std::path::{Path, PathBuf};

use warmpath_sim::tokens::filler_text;

use crate::workload::{Body, Request};

pub mod azure;
pub mod mooncake;

/// How many line errors a load keeps for display (all are counted).
pub const MAX_KEPT_ERRORS: usize = 20;

/// A trace record that could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    /// The trace file.
    pub file: String,
    /// 1-based line number in the file.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

/// The result of loading a trace.
#[derive(Debug, Default)]
pub struct TraceLoad {
    /// Usable requests in file order, arrival times in ms relative to the first record.
    pub requests: Vec<Request>,
    /// Records rejected (all of them, including ones beyond `errors`).
    pub bad_lines: usize,
    /// The first [`MAX_KEPT_ERRORS`] rejections.
    pub errors: Vec<TraceError>,
}

impl TraceLoad {
    pub(crate) fn reject(&mut self, file: &Path, line: usize, message: impl Into<String>) {
        self.bad_lines += 1;
        if self.errors.len() < MAX_KEPT_ERRORS {
            self.errors.push(TraceError { file: file.display().to_string(), line, message: message.into() });
        }
    }
}

/// Trace formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Mooncake JSON lines (`.jsonl`).
    Mooncake,
    /// Azure LLM inference CSV (`.csv`).
    Azure,
}

impl Format {
    /// Format from the file extension: `.jsonl`/`.json` → Mooncake, `.csv` → Azure.
    pub fn from_path(path: &Path) -> anyhow::Result<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "json") => Ok(Format::Mooncake),
            Some("csv") => Ok(Format::Azure),
            _ => anyhow::bail!("{}: unknown trace format (expected .jsonl Mooncake or .csv Azure)", path.display()),
        }
    }
}

/// Loads up to `limit` usable requests from `path` (format by extension). I/O errors fail; bad records are counted.
pub fn load(path: &Path, limit: usize) -> anyhow::Result<TraceLoad> {
    match Format::from_path(path)? {
        Format::Mooncake => mooncake::load(path, limit),
        Format::Azure => azure::load(path, limit),
    }
}

/// Most tokens [`with_system_prompt`] puts in front of a request (the largest trace prompt is far shorter).
pub const MAX_SYSTEM_PROMPT_TOKENS: u64 = 65_536;

/// Puts one system prompt of `tokens` tokens in front of every request: a completion's prompt starts with it, a
/// chat gets it as a first `system` message. A deployment usually sends one system prompt with every request, which
/// the public traces leave out (the Azure traces have no text at all, the Mooncake trace's requests share no
/// first block); every router then sees a prefix that all traffic shares, which says nothing about where to go.
/// The text is the same for every request of every run and unlike any trace block.
pub fn with_system_prompt(requests: &mut [Request], tokens: usize) {
    if tokens == 0 {
        return;
    }
    let system = filler_text(SYSTEM_PROMPT_SEED, tokens);
    for r in requests {
        match &mut r.body {
            Body::Completion(p) => p.insert_str(0, &system),
            Body::Chat(messages) => messages.insert(0, ("system".to_owned(), system.clone())),
        }
    }
}

/// Seed of [`with_system_prompt`]'s text.
const SYSTEM_PROMPT_SEED: u64 = 0x5157_e3a0_0000_0001;

/// Environment variable naming the directory that holds the public traces (the Mooncake synthetic trace and the
/// Azure LLM inference traces; they are not part of the repository, see `docs/demo.md`).
pub const TRACES_ENV: &str = "WARMPATH_TRACES";

/// The public traces directory named by [`TRACES_ENV`], or `None` when the variable is unset or empty.
/// A variable naming something that is not a directory is an error, so a typo is not mistaken for "no traces".
pub fn traces_dir() -> anyhow::Result<Option<PathBuf>> {
    match std::env::var_os(TRACES_ENV) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => {
            let dir = PathBuf::from(v);
            anyhow::ensure!(dir.is_dir(), "{TRACES_ENV}={} is not a directory", dir.display());
            Ok(Some(dir))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmpath_sim::tokens::BYTES_PER_TOKEN;

    fn request(id: usize, body: Body) -> Request {
        Request { id, at_ms: 0.0, body, max_tokens: 1 }
    }

    #[test]
    fn a_system_prompt_goes_in_front_of_every_request_and_changes_nothing_else() {
        let mut rs = vec![
            request(0, Body::Completion("first".into())),
            request(1, Body::Completion("second".into())),
            request(2, Body::Chat(vec![("user".into(), "hi".into())])),
        ];
        let before = rs.clone();
        with_system_prompt(&mut rs, 0);
        assert_eq!(rs, before, "0 tokens: no system prompt");

        with_system_prompt(&mut rs, 512);
        let system = filler_text(SYSTEM_PROMPT_SEED, 512);
        assert_eq!(system.len(), 512 * BYTES_PER_TOKEN);
        assert_eq!(rs[0].body, Body::Completion(format!("{system}first")));
        assert_eq!(rs[1].body, Body::Completion(format!("{system}second")));
        assert_eq!(rs[2].body, Body::Chat(vec![("system".into(), system.clone()), ("user".into(), "hi".into())]));
        for (a, b) in rs.iter().zip(&before) {
            assert_eq!((a.id, a.at_ms, a.max_tokens), (b.id, b.at_ms, b.max_tokens));
        }
    }
}
