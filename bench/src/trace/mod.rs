//! Trace replay input: Mooncake JSON lines and Azure LLM-inference CSV, turned into [`Request`]s.
//!
//! Bad records never stop a load silently: each one becomes a [`TraceError`] naming the line number and the
//! reason, and [`TraceLoad::bad_lines`] counts them all (the first [`MAX_KEPT_ERRORS`] are kept for printing).
//! Whitespace-only lines are not records and are ignored.

use std::path::{Path, PathBuf};

use crate::workload::Request;

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
