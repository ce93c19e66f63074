//! Making one cache current on this node: resolve the source, check disk, fetch every file (parallel
//! ranged reads, resumable), verify (size, ETag via `If-Match`, sha256 when the spec gives one), then
//! switch `current` atomically ([`crate::cache_dir`]).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use futures::{stream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::{
    cache_dir::{CacheDir, ReadyMarker},
    disk::{ensure_free, FilesystemFreeSpace, FreeSpace},
    error::{AgentError, Result},
    fetch::{allocated_bytes, discard_partial, fetch_to_part, reserve_part, ChunkCallback, FetchOptions, FetchStats},
    source::{resolve, RemoteFile, SourceAuth, SourceSpec},
};

/// One cache to make current.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheRequest {
    /// Directory name under the root: `<namespace>.<name>` of the ModelCache.
    pub key: String,
    /// Where the weights come from.
    pub source: SourceSpec,
    /// Expected sha256 (hex) per file path relative to the cache; files not listed are checked by size/ETag only.
    #[serde(default)]
    pub sha256: BTreeMap<String, String>,
    /// The only version to make current (a [`fingerprint`], from `ModelCache.status.pinned`): a source
    /// that now lists anything else is refused with [`AgentError::SourceChanged`] instead of mixing
    /// versions across nodes, and a current copy of this version is kept whatever the source holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
}

impl CacheRequest {
    /// Refuses checksums that are not 64 hex characters, before anything is fetched.
    pub fn validate(&self) -> Result<()> {
        for (file, sum) in &self.sha256 {
            if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(AgentError::InvalidSource(format!(
                    "sha256 for {file:?} is {sum:?}, not 64 hex characters"
                )));
            }
        }
        Ok(())
    }
}

/// Identity of what a request asks for (source and checksums; 16 hex chars of a sha256). Written into
/// the ready marker, so a later request for the same thing can be served from the verified local copy
/// without asking the source.
pub fn request_id(req: &CacheRequest) -> String {
    let doc = serde_json::json!({ "source": req.source, "sha256": req.sha256 });
    hex::encode(&Sha256::digest(doc.to_string().as_bytes())[..crate::cache_dir::VERSION_NAME_LEN / 2])
}

/// Bytes a download leaves free on the cache filesystem unless told otherwise: 10 GiB.
pub const DEFAULT_RESERVE_BYTES: u64 = 10 << 30;

/// Agent-wide settings for syncing caches.
#[derive(Clone)]
pub struct SyncOptions {
    /// Cache root on the node (default `/opt/warmpath/models`).
    pub root: PathBuf,
    /// Fetch engine knobs (range size, concurrency, shared permits).
    pub fetch: FetchOptions,
    /// Bytes to leave free on the cache filesystem (default [`DEFAULT_RESERVE_BYTES`]).
    pub reserve_bytes: u64,
    /// Free-space source (the filesystem unless injected).
    pub free_space: Arc<dyn FreeSpace>,
    /// Credentials not in the spec.
    pub auth: SourceAuth,
    /// Files of one cache fetched at the same time.
    pub parallel_files: usize,
    /// Serve a verified local copy made for the same request without contacting the source (a pod's
    /// start: the node agent checks the source for updates on its own schedule). Default false.
    pub local_first: bool,
    /// Serialises "check free space, then allocate" between the downloads of this process, so two
    /// downloads started together cannot both count the same free bytes.
    pub space_lock: Arc<std::sync::Mutex<()>>,
}

impl SyncOptions {
    /// Defaults for `root`: 16 MiB ranges, 8 reads in flight, 10 GiB reserve, real free space.
    pub fn new(root: impl Into<PathBuf>) -> SyncOptions {
        SyncOptions {
            root: root.into(),
            fetch: FetchOptions::default(),
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            free_space: Arc::new(FilesystemFreeSpace),
            auth: SourceAuth::default(),
            parallel_files: 4,
            local_first: false,
            space_lock: Arc::default(),
        }
    }
}

/// Outcome of a successful sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncReport {
    /// Cache key.
    pub key: String,
    /// Version fingerprint now current.
    pub version: String,
    /// Files in the version.
    pub files: usize,
    /// Total bytes of the version.
    pub bytes_total: u64,
    /// Bytes read from the source in this run.
    pub bytes_fetched: u64,
    /// Bytes kept from an interrupted earlier run.
    pub bytes_resumed: u64,
    /// True when the version was already current and nothing was fetched.
    pub already_current: bool,
    /// Directory pods read (`<root>/<key>/current`).
    pub path: PathBuf,
    /// Set when the source now lists another version than the pinned one kept current (the version
    /// the source holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
}

/// Version fingerprint: sha256 over the source, the expected checksums, the Hub commit and the listing
/// (paths, sizes, ETags, and modification dates of files without a strong ETag);
/// [`crate::cache_dir::VERSION_NAME_LEN`] hex digits. Any change in what would be downloaded gives a new version.
pub fn fingerprint(req: &CacheRequest, pin: Option<&str>, files: &[RemoteFile]) -> String {
    let doc = serde_json::json!({ "source": req.source, "sha256": req.sha256, "pin": pin, "files": files });
    hex::encode(&Sha256::digest(doc.to_string().as_bytes())[..crate::cache_dir::VERSION_NAME_LEN / 2])
}

/// The version `files` are for `req`: their [`fingerprint`], or the pinned version when that is the fingerprint
/// the same listing had before modification dates were part of it. A cache pinned by an earlier agent on a
/// source without ETags keeps its pin (its nodes stay ready and new nodes fetch it) instead of being refused as
/// changed; such a pin compares sizes only, as it did when it was made.
fn version_of(req: &CacheRequest, pin: Option<&str>, files: &[RemoteFile]) -> String {
    let version = fingerprint(req, pin, files);
    let Some(pinned) = req.pin.as_deref().filter(|p| *p != version) else { return version };
    if !files.iter().any(|f| f.last_modified.is_some()) {
        return version;
    }
    let undated: Vec<RemoteFile> = files.iter().map(|f| RemoteFile { last_modified: None, ..f.clone() }).collect();
    if fingerprint(req, pin, &undated) == pinned {
        pinned.to_string()
    } else {
        version
    }
}

/// Hex sha256 of a file (streamed; runs on a blocking thread).
pub async fn sha256_file(path: &Path) -> Result<String> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&p).map_err(AgentError::io("open", &p))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(AgentError::io("read", &p))?;
        Ok(hex::encode(h.finalize()))
    })
    .await
    .expect("hash task not cancelled")
}

fn part_path(staging: &Path, rel: &str) -> PathBuf {
    staging.join(format!("{rel}.part"))
}

/// Makes `req` current under `opts.root`. Errors leave the previous version current. A source failure or
/// a cancel keeps resumable progress (and its allocated space); any other failure (checksum, size, disk, an
/// object that changed mid-download, a source without ranged reads: [`AgentError::keeps_progress`]) removes this
/// version's staging directory, so the next attempt starts clean and no space stays taken.
///
/// With `opts.local_first`, a verified current copy made for the same request (of the pinned version,
/// when `req.pin` is set) is returned at once, without listing or HEADing the source and without
/// waiting for the cache lock.
///
/// With `req.pin`, only that version is ever fetched: the source's listing must fingerprint to it (so
/// every file has the pinned size and ETag, and every ranged read carries that ETag as `If-Match`).
/// When it does not, a current copy of the pinned version is kept (`source_version` says what the
/// source holds now) and a node without one fails with [`AgentError::SourceChanged`].
pub async fn sync_cache(
    req: &CacheRequest,
    opts: &SyncOptions,
    cancel: &CancellationToken,
    on_chunk: Option<ChunkCallback>,
) -> Result<SyncReport> {
    req.validate()?;
    let dir = CacheDir::new(&opts.root, &req.key)?;
    let kept = |m: ReadyMarker, source_version: Option<String>| SyncReport {
        key: req.key.clone(),
        version: m.version,
        files: m.files.len(),
        bytes_total: m.bytes,
        bytes_fetched: 0,
        bytes_resumed: 0,
        already_current: true,
        path: dir.current_link(),
        source_version,
    };
    if opts.local_first {
        if let Some(m) = serving_copy(req, &dir) {
            return Ok(kept(m, None));
        }
    }
    let resolved = resolve(&req.source, &opts.auth).await?;
    let _lock = dir.lock().await?;
    for name in req.sha256.keys() {
        if !resolved.files.iter().any(|f| &f.rel == name) {
            return Err(AgentError::InvalidSource(format!(
                "checksum given for {name:?}, which the source does not have"
            )));
        }
    }
    let version = version_of(req, resolved.pin.as_deref(), &resolved.files);
    if let Some(pin) = req.pin.as_deref().filter(|p| *p != version) {
        if let Some(m) = dir.current().filter(|m| m.version == pin) {
            tracing::warn!(cache = %req.key, pinned = pin, source = %version, "the source changed; keeping the pinned version");
            return Ok(kept(m, Some(version)));
        }
        // A partial download of the pinned version can no longer complete: give its space back.
        dir.prune_staging("");
        return Err(AgentError::SourceChanged { pinned: pin.to_string(), found: version });
    }
    let bytes_total: u64 = resolved.files.iter().map(|f| f.size).sum();
    let report = |stats: FetchStats, already_current| SyncReport {
        key: req.key.clone(),
        version: version.clone(),
        files: resolved.files.len(),
        bytes_total,
        bytes_fetched: stats.bytes_fetched,
        bytes_resumed: stats.bytes_resumed,
        already_current,
        path: dir.current_link(),
        source_version: None,
    };
    if dir.current().is_some_and(|m| m.version == version) {
        return Ok(report(FetchStats::default(), true));
    }

    let staging = dir.staging_dir(&version);
    // Downloads of versions no longer wanted give their space back first.
    dir.prune_staging(&version);
    let result = fetch_version(req, opts, cancel, on_chunk, &dir, &resolved, &version).await;
    match result {
        Ok(stats) => Ok(report(stats, false)),
        Err(e) => {
            if !e.keeps_progress() {
                // Not resumable: release the space and start clean next time.
                let _ = std::fs::remove_dir_all(&staging);
            }
            Err(e)
        }
    }
}

/// The verified current copy that serves `req` without asking the source: the pinned version when
/// `req.pin` is set, else a copy made for the same request (source and checksums).
pub fn serving_copy(req: &CacheRequest, dir: &CacheDir) -> Option<ReadyMarker> {
    let m = dir.current()?;
    let ok = match &req.pin {
        Some(pin) => m.version == *pin,
        None => m.request.as_deref() == Some(request_id(req).as_str()),
    };
    ok.then_some(m)
}

/// Reserves the space of one version, fetches and verifies its files, and commits it.
async fn fetch_version(
    req: &CacheRequest,
    opts: &SyncOptions,
    cancel: &CancellationToken,
    on_chunk: Option<ChunkCallback>,
    dir: &CacheDir,
    resolved: &crate::source::ResolvedSource,
    version: &str,
) -> Result<FetchStats> {
    let staging = dir.staging_dir(version);
    reserve(opts, dir, &staging, &resolved.files)?;
    let store = resolved.store.clone();
    // Owned items and boxed futures keep the stream `Send` for any caller (spawned node tasks).
    let totals: Vec<FetchStats> = stream::iter(resolved.files.clone())
        .map(|f| {
            let (store, staging, on_chunk) = (store.clone(), staging.clone(), on_chunk.clone());
            let want = req.sha256.get(&f.rel).cloned();
            let fut: futures::future::BoxFuture<'_, Result<FetchStats>> = Box::pin(async move {
                fetch_verified(store.as_ref(), &f, &staging, want.as_ref(), opts, cancel, on_chunk).await
            });
            fut
        })
        .buffer_unordered(opts.parallel_files.max(1))
        .try_collect()
        .await?;
    let stats = totals.iter().fold(FetchStats::default(), |a, s| FetchStats {
        bytes_fetched: a.bytes_fetched + s.bytes_fetched,
        bytes_resumed: a.bytes_resumed + s.bytes_resumed,
    });
    let marker = ReadyMarker {
        version: version.to_string(),
        bytes: resolved.files.iter().map(|f| f.size).sum(),
        files: resolved.files.iter().map(|f| f.rel.clone()).collect(),
        request: Some(request_id(req)),
    };
    dir.commit(&marker)?;
    Ok(stats)
}

/// Takes the disk space of every file still to fetch before a byte is downloaded: checks that it fits
/// (plus `opts.reserve_bytes`), then allocates each part file to its full size. The check counts what
/// this version already holds on disk (allocated part files, verified files), so a retry is not refused
/// because of its own earlier allocation. Another writer taking space between check and allocation
/// (a pod's fallback fetch beside the agent) makes the allocation fail with ENOSPC: reported as
/// `InsufficientDisk` and released by the caller like any other non-resumable failure.
fn reserve(opts: &SyncOptions, dir: &CacheDir, staging: &Path, files: &[RemoteFile]) -> Result<()> {
    // Within this process, one download at a time checks and allocates (a short section, no await).
    let _space = opts.space_lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut todo = Vec::new();
    let mut needed = 0u64;
    for f in files {
        if std::fs::metadata(staging.join(&f.rel)).is_ok_and(|m| m.len() == f.size) {
            continue;
        }
        let part = part_path(staging, &f.rel);
        needed += f.size - allocated_bytes(&part, f.size);
        todo.push((f, part));
    }
    // Checked on the cache's own directory: in a pod's fallback container only that directory is the node's disk.
    ensure_free(opts.free_space.as_ref(), dir.base(), needed, opts.reserve_bytes)?;
    std::fs::create_dir_all(staging).map_err(AgentError::io("create", staging))?;
    for (f, part) in todo {
        match reserve_part(&part, f, opts.fetch.chunk_size) {
            Ok(_) => {}
            Err(AgentError::Io { op: "allocate", source, .. }) if source.kind() == std::io::ErrorKind::StorageFull => {
                // What the filesystem itself has left: the allocation failed there, whatever a configured
                // free-space figure (`--free-bytes-override`) says.
                let available = FilesystemFreeSpace.available(dir.base()).unwrap_or(0);
                return Err(AgentError::InsufficientDisk {
                    path: dir.base().to_path_buf(),
                    needed,
                    reserve: opts.reserve_bytes,
                    available,
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fetches one file into staging, verifies it and renames `<rel>.part` to `<rel>` inside staging.
async fn fetch_verified(
    store: &dyn object_store::ObjectStore,
    f: &RemoteFile,
    staging: &Path,
    want_sha: Option<&String>,
    opts: &SyncOptions,
    cancel: &CancellationToken,
    on_chunk: Option<ChunkCallback>,
) -> Result<FetchStats> {
    let done = staging.join(&f.rel);
    if std::fs::metadata(&done).is_ok_and(|m| m.len() == f.size) {
        // Verified and renamed by an earlier, interrupted run of this same version.
        return Ok(FetchStats { bytes_fetched: 0, bytes_resumed: f.size });
    }
    let part = part_path(staging, &f.rel);
    let mut stats = fetch_to_part(store, f, &part, &opts.fetch, cancel, on_chunk.clone()).await?;
    let mut verdict = verify(f, &part, want_sha).await;
    if verdict.is_err() && stats.bytes_resumed > 0 {
        // The kept chunks may be what is wrong (e.g. disk corruption): one clean retry before failing.
        tracing::warn!(file = %f.rel, error = %verdict.as_ref().unwrap_err(), "verification failed after resume; refetching");
        discard_partial(&part);
        let again = fetch_to_part(store, f, &part, &opts.fetch, cancel, on_chunk).await?;
        stats = FetchStats { bytes_fetched: stats.bytes_fetched + again.bytes_fetched, bytes_resumed: 0 };
        verdict = verify(f, &part, want_sha).await;
    }
    if let Err(e) = verdict {
        discard_partial(&part);
        return Err(e);
    }
    std::fs::rename(&part, &done).map_err(AgentError::io("rename", &part))?;
    let _ = std::fs::remove_file(crate::fetch::progress_path(&part));
    Ok(stats)
}

async fn verify(f: &RemoteFile, part: &Path, want_sha: Option<&String>) -> Result<()> {
    let actual = std::fs::metadata(part).map_err(AgentError::io("stat", part))?.len();
    if actual != f.size {
        return Err(AgentError::SizeMismatch { file: f.rel.clone(), expected: f.size, actual });
    }
    if let Some(want) = want_sha {
        let got = sha256_file(part).await?;
        if !got.eq_ignore_ascii_case(want) {
            return Err(AgentError::ChecksumMismatch { file: f.rel.clone(), expected: want.clone(), actual: got });
        }
    }
    Ok(())
}

/// Removes a cache from the node (all versions, staging, `current`) if the agent created it; returns
/// false (and touches nothing) for a directory it did not create.
pub fn remove_cache(root: &Path, key: &str) -> Result<bool> {
    CacheDir::new(root, key)?.remove()
}
