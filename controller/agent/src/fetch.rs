//! Parallel, resumable ranged reads of one object into a partial file.
//!
//! The object is cut into `chunk_size` ranges fetched concurrently (`GetOptions::range`) and written at
//! their offsets into `<name>.part`. After each chunk lands (and is `fdatasync`ed), a progress record
//! `<name>.part.progress.json` is rewritten atomically. A restart reloads the record and fetches only the
//! missing chunks — if the object is still the same (same size, chunk size, ETag and, for a source without a
//! strong ETag, modification time); otherwise it starts over.
//! The caller verifies and renames the part file; nothing here writes to a final path.
//!
//! The part file's blocks are allocated up front ([`reserve_part`], `fallocate(2)` through `fs4`), not
//! left sparse: a download that would not fit fails with ENOSPC before a byte is fetched, and space
//! taken by one download is visible to the free-space check of the next.

use std::{
    collections::BTreeSet,
    fs::{File, OpenOptions},
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use futures::{stream, StreamExt};
use object_store::{path::Path as StorePath, GetOptions, GetRange, ObjectStore};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::{
    error::{AgentError, Result},
    source::RemoteFile,
};

/// Default range size: 16 MiB. AWS's S3 performance guidelines suggest byte-range GETs of 8–16 MB.
pub const DEFAULT_CHUNK_SIZE: u64 = 16 * 1024 * 1024;
/// Default ranged reads in flight per agent (shared by all files and caches).
pub const DEFAULT_CONCURRENCY: usize = 8;

/// What a fetch of one file did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FetchStats {
    /// Bytes read from the source in this run.
    pub bytes_fetched: u64,
    /// Bytes a previous, interrupted run had already fetched and that were kept.
    pub bytes_resumed: u64,
}

/// Persisted progress of one partial file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressRecord {
    /// Object size in bytes.
    pub size: u64,
    /// Range size in bytes the chunks were cut with.
    pub chunk_size: u64,
    /// ETag of the object when the download started.
    pub e_tag: Option<String>,
    /// Modification time of the object when the download started, for a source without a strong ETag
    /// ([`RemoteFile::last_modified`]; absent from records written before it was kept, which match sources with
    /// ETags as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<chrono::DateTime<chrono::Utc>>,
    /// Indices of chunks written and synced.
    pub done: BTreeSet<u64>,
}

impl ProgressRecord {
    fn chunks(&self) -> u64 {
        self.size.div_ceil(self.chunk_size)
    }
    fn chunk_range(&self, i: u64) -> std::ops::Range<u64> {
        let start = i * self.chunk_size;
        start..(start + self.chunk_size).min(self.size)
    }
    fn bytes_done(&self) -> u64 {
        self.done.iter().map(|&i| self.chunk_range(i).end - self.chunk_range(i).start).sum()
    }
}

/// Path of the progress record that belongs to a part file.
pub fn progress_path(part: &Path) -> PathBuf {
    let mut s = part.as_os_str().to_owned();
    s.push(".progress.json");
    PathBuf::from(s)
}

/// Bytes of `remote` already safely on disk in `part` (0 if no usable record): for the free-disk check.
pub fn resumable_bytes(part: &Path, remote: &RemoteFile, chunk_size: u64) -> u64 {
    load_record(part, remote, chunk_size).map(|r| r.bytes_done()).unwrap_or(0)
}

fn load_record(part: &Path, remote: &RemoteFile, chunk_size: u64) -> Option<ProgressRecord> {
    let rec: ProgressRecord = serde_json::from_slice(&std::fs::read(progress_path(part)).ok()?).ok()?;
    let part_len = std::fs::metadata(part).ok()?.len();
    let same_object = rec.size == remote.size && rec.e_tag == remote.e_tag && rec.last_modified == remote.last_modified;
    (same_object && rec.chunk_size == chunk_size && part_len == remote.size).then_some(rec)
}

fn save_record(part: &Path, rec: &ProgressRecord) -> Result<()> {
    let path = progress_path(part);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(rec).expect("record serializes")).map_err(AgentError::io("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(AgentError::io("rename", &path))
}

/// Allocates `part` to the object's full size and returns its progress record: the existing one when it
/// still matches (resume; allocating again only fills holes), else a fresh, empty one over a new file.
/// On a filesystem without `fallocate` the file is extended sparse instead (and a warning logged).
/// An allocation that does not fit fails with an `Io { op: "allocate" }` error of kind `StorageFull`.
pub fn reserve_part(part: &Path, remote: &RemoteFile, chunk_size: u64) -> Result<ProgressRecord> {
    let (rec, file) = match load_record(part, remote, chunk_size) {
        Some(rec) => (rec, OpenOptions::new().write(true).open(part).map_err(AgentError::io("open", part))?),
        None => {
            if let Some(dir) = part.parent() {
                std::fs::create_dir_all(dir).map_err(AgentError::io("create", dir))?;
            }
            let f = File::create(part).map_err(AgentError::io("create", part))?;
            let rec = ProgressRecord {
                size: remote.size,
                chunk_size,
                e_tag: remote.e_tag.clone(),
                last_modified: remote.last_modified,
                done: BTreeSet::new(),
            };
            (rec, f)
        }
    };
    if remote.size > 0 {
        match fs4::fs_std::FileExt::allocate(&file, remote.size) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                tracing::warn!(file = %part.display(), "filesystem cannot allocate ahead; the file stays sparse");
                file.set_len(remote.size).map_err(AgentError::io("truncate", part))?;
            }
            Err(e) => return Err(AgentError::Io { op: "allocate", path: part.to_path_buf(), source: e }),
        }
    }
    save_record(part, &rec)?;
    Ok(rec)
}

/// Bytes of `part` already allocated on disk (0 when absent), at most `size`.
pub fn allocated_bytes(part: &Path, size: u64) -> u64 {
    std::fs::File::open(part).and_then(|f| fs4::fs_std::FileExt::allocated_size(&f)).map(|a| a.min(size)).unwrap_or(0)
}

/// Removes a part file and its progress record (after a verification failure: start clean next time).
pub fn discard_partial(part: &Path) {
    let _ = std::fs::remove_file(part);
    let _ = std::fs::remove_file(progress_path(part));
}

/// Knobs of the fetch engine.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Range size in bytes (default [`DEFAULT_CHUNK_SIZE`]).
    pub chunk_size: u64,
    /// Ranged reads in flight for this file (the shared `permits` bound the agent total).
    pub concurrency: usize,
    /// Agent-wide limit on ranged reads in flight, shared by concurrent files and caches.
    pub permits: Arc<Semaphore>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            chunk_size: DEFAULT_CHUNK_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            permits: Arc::new(Semaphore::new(DEFAULT_CONCURRENCY)),
        }
    }
}

/// Called after each chunk is durable: `(file rel path, bytes of this file now on disk)`.
pub type ChunkCallback = Arc<dyn Fn(&str, u64) + Send + Sync>;

/// Fetches `remote` into `part`, resuming from its progress record when it matches. On return `Ok`, `part`
/// holds all `remote.size` bytes (unverified beyond size and ETag, or modification time without one). On error
/// or cancel, the record keeps every chunk that landed.
pub async fn fetch_to_part(
    store: &dyn ObjectStore,
    remote: &RemoteFile,
    part: &Path,
    opts: &FetchOptions,
    cancel: &CancellationToken,
    on_chunk: Option<ChunkCallback>,
) -> Result<FetchStats> {
    let chunk_size = opts.chunk_size.max(1);
    let mut rec = reserve_part(part, remote, chunk_size)?;
    let file = OpenOptions::new().write(true).open(part).map_err(AgentError::io("open", part))?;
    let resumed = rec.bytes_done();
    let file = Arc::new(file);
    let location = StorePath::from(remote.location.as_str());
    // Only a strong ETag can go in If-Match. Without one, the modification time the listing reported guards the
    // reads instead (If-Unmodified-Since; a server that ignores it is no worse off than before).
    let if_match = remote.strong_e_tag().map(str::to_string);
    let if_unmodified_since = remote.last_modified.filter(|_| if_match.is_none());
    let pending: Vec<u64> = (0..rec.chunks()).filter(|i| !rec.done.contains(i)).collect();
    let template = rec.clone();

    let mut results = stream::iter(pending)
        .map(|i| {
            let range = template.chunk_range(i);
            let (file, location, if_match) = (file.clone(), location.clone(), if_match.clone());
            async move {
                let _permit = tokio::select! {
                    p = opts.permits.acquire() => p.expect("semaphore never closed"),
                    _ = cancel.cancelled() => return Err(AgentError::Cancelled),
                };
                let get = async {
                    let options = GetOptions {
                        range: Some(GetRange::Bounded(range.clone())),
                        if_match,
                        if_unmodified_since,
                        ..Default::default()
                    };
                    store.get_opts(&location, options).await?.bytes().await
                };
                let bytes = tokio::select! {
                    b = get => b?,
                    _ = cancel.cancelled() => return Err(AgentError::Cancelled),
                };
                if bytes.len() as u64 != range.end - range.start {
                    return Err(AgentError::SizeMismatch {
                        file: location.to_string(),
                        expected: range.end - range.start,
                        actual: bytes.len() as u64,
                    });
                }
                let len = bytes.len() as u64;
                tokio::task::spawn_blocking(move || {
                    file.write_all_at(&bytes, range.start)?;
                    file.sync_data()
                })
                .await
                .expect("write task not cancelled")
                .map_err(|e| AgentError::Io {
                    op: "write",
                    path: PathBuf::from(location.as_ref()),
                    source: e,
                })?;
                Ok((i, len))
            }
        })
        .buffer_unordered(opts.concurrency.max(1));

    let mut fetched = 0;
    while let Some(r) = results.next().await {
        let (i, len) = r?;
        fetched += len;
        rec.done.insert(i);
        save_record(part, &rec)?;
        if let Some(cb) = &on_chunk {
            cb(&remote.rel, rec.bytes_done());
        }
    }
    if remote.size == 0 && cancel.is_cancelled() {
        return Err(AgentError::Cancelled);
    }
    Ok(FetchStats { bytes_fetched: fetched, bytes_resumed: resumed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_before_modification_times_were_kept_still_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("w.bin.part");
        std::fs::write(&part, vec![0u8; 100]).unwrap();
        let old = r#"{"size":100,"chunkSize":40,"eTag":"\"abc\"","done":[0,2]}"#;
        std::fs::write(progress_path(&part), old).unwrap();
        let remote = RemoteFile {
            location: "w.bin".into(),
            rel: "w.bin".into(),
            size: 100,
            e_tag: Some("\"abc\"".into()),
            last_modified: None,
        };
        assert_eq!(resumable_bytes(&part, &remote, 40), 60, "chunks 0 and 2 (40 + 20 bytes)");
        // The same record does not resume an object that now carries another validator.
        let dated = RemoteFile { e_tag: None, last_modified: Some(chrono::Utc::now()), ..remote };
        assert_eq!(resumable_bytes(&part, &dated, 40), 0);
    }
}
