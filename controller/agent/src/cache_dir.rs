//! On-disk layout of one cache on a node, and the atomic switch between versions.
//!
//! ```text
//! <root>/<key>/current            -> versions/<fingerprint>   (symlink, replaced by rename(2))
//! <root>/<key>/versions/<fp>/...  complete, verified files + .warmpath-ready.json
//! <root>/<key>/staging/<fp>/...   in-progress download: *.part, *.part.progress.json, verified files
//! ```
//! Pods mount `<root>/<key>` and read `current/`. A version directory only appears under `versions/` by
//! renaming a fully verified staging directory, and `current` only ever points at such a directory, so
//! a partial file is never visible at a path a model server reads, and a failed update leaves the
//! previous version serving.
//!
//! Ownership: the agent only ever deletes what it created. It writes [`OWNER_MARKER`] into each cache
//! directory it creates and [`ROOT_MARKER`] into the root it uses; removal and pruning touch only the
//! entries of this layout inside a marked cache directory, and a directory holding anything else is
//! refused (unless allowed explicitly) instead of being cleaned.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{AgentError, Result};

/// Length of a version's name under `versions/` and `staging/`: hex digits of its fingerprint
/// ([`crate::sync::fingerprint`]).
pub const VERSION_NAME_LEN: usize = 16;

/// Name of the marker written into a version directory once every file is verified.
pub const READY_MARKER: &str = ".warmpath-ready.json";
/// Name of the symlink pods read through.
pub const CURRENT: &str = "current";
/// File the agent writes into every cache directory it creates or adopts: only marked directories are
/// ever removed.
pub const OWNER_MARKER: &str = ".warmpath-cache";
/// File the agent writes into the root (`hostPath`) it uses.
pub const ROOT_MARKER: &str = ".warmpath-root";
/// Name of the per-cache lock file.
const LOCK: &str = ".warmpath.lock";

/// True for an entry this layout creates inside a cache directory, by name and by kind: `current` and its
/// temporary `.current.<v>` links are symlinks, `versions` and `staging` directories, the lock and the marker
/// files. A user's folder that happens to be called `current` is not one.
fn is_layout_entry(e: &std::fs::DirEntry) -> bool {
    let name = e.file_name();
    let name = name.to_string_lossy();
    let Ok(kind) = e.file_type() else { return false };
    match &*name {
        CURRENT => kind.is_symlink(),
        "versions" | "staging" => kind.is_dir(),
        LOCK | OWNER_MARKER => kind.is_file(),
        n => n.starts_with(&format!(".{CURRENT}.")) && kind.is_symlink(),
    }
}

/// [`is_layout_entry`], and for `versions` and `staging` also every entry inside: a directory named like a
/// version fingerprint ([`VERSION_NAME_LEN`] lower-case hex digits). What an unmarked directory must
/// hold for the agent to adopt it: an older agent's caches pass, a user's `versions/v1/` does not.
fn is_adoptable_entry(e: &std::fs::DirEntry) -> bool {
    if !is_layout_entry(e) {
        return false;
    }
    if !e.file_type().is_ok_and(|k| k.is_dir()) {
        return true;
    }
    let is_version = |v: &std::fs::DirEntry| {
        let name = v.file_name();
        let name = name.to_string_lossy();
        v.file_type().is_ok_and(|k| k.is_dir())
            && name.len() == VERSION_NAME_LEN
            && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    std::fs::read_dir(e.path()).is_ok_and(|rd| rd.flatten().all(|v| is_version(&v)))
}

/// Entries of `dir` for which `ours` is false (at most five, for the error message).
fn foreign_entries(dir: &Path, ours: impl Fn(&std::fs::DirEntry) -> bool) -> Result<Vec<String>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(AgentError::Io { op: "list", path: dir.to_path_buf(), source: e }),
    };
    let mut out: Vec<String> =
        rd.flatten().filter(|e| !ours(e)).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    out.sort();
    out.truncate(5);
    Ok(out)
}

/// Makes sure the agent may use `root`: it carries [`ROOT_MARKER`] already, or it holds nothing but
/// cache directories of this layout (then the marker is written). Anything else is refused with
/// [`AgentError::ForeignFiles`] unless `allow_foreign` is set; foreign entries are never touched.
pub fn claim_root(root: &Path, allow_foreign: bool) -> Result<()> {
    let marker = root.join(ROOT_MARKER);
    if marker.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(root).map_err(AgentError::io("create", root))?;
    let foreign = foreign_entries(root, |e| {
        let n = e.file_name();
        n == ROOT_MARKER || (e.path().is_dir() && CacheDir { base: e.path() }.looks_ours())
    })?;
    if !foreign.is_empty() && !allow_foreign {
        return Err(AgentError::ForeignFiles { path: root.to_path_buf(), entries: foreign.join(", ") });
    }
    std::fs::write(&marker, b"warmpath node agent cache root\n").map_err(AgentError::io("write", &marker))
}

/// Contents of [`READY_MARKER`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadyMarker {
    /// Version fingerprint (directory name under `versions/`).
    pub version: String,
    /// Total bytes of the version's files.
    pub bytes: u64,
    /// File paths relative to the version directory.
    pub files: Vec<String>,
    /// What was asked for (source and checksums, [`crate::sync::request_id`]): a pod start serves this
    /// version without asking the source when its request is the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// Paths of one cache under the agent's root.
#[derive(Debug, Clone)]
pub struct CacheDir {
    base: PathBuf,
}

impl CacheDir {
    /// `<root>/<key>`; `key` must be a single safe path component (`<namespace>.<name>`).
    pub fn new(root: &Path, key: &str) -> Result<CacheDir> {
        if key.is_empty() || key.contains('/') || key == "." || key == ".." {
            return Err(AgentError::InvalidSource(format!("cache key {key:?} is not a single path component")));
        }
        Ok(CacheDir { base: root.join(key) })
    }
    /// `<root>/<key>`.
    pub fn base(&self) -> &Path {
        &self.base
    }
    /// `<root>/<key>/current`.
    pub fn current_link(&self) -> PathBuf {
        self.base.join(CURRENT)
    }
    /// Final directory of a version.
    pub fn version_dir(&self, version: &str) -> PathBuf {
        self.base.join("versions").join(version)
    }
    /// Staging directory of a version being downloaded.
    pub fn staging_dir(&self, version: &str) -> PathBuf {
        self.base.join("staging").join(version)
    }

    /// True when the agent created (or adopted) this directory: it carries [`OWNER_MARKER`].
    pub fn is_owned(&self) -> bool {
        self.base.join(OWNER_MARKER).is_file()
    }

    /// True when the directory is marked, or holds nothing but entries of this layout (an empty
    /// directory, e.g. made by the kubelet for a pod's hostPath volume, or one written by an older agent).
    fn looks_ours(&self) -> bool {
        self.is_owned() || foreign_entries(&self.base, is_adoptable_entry).is_ok_and(|f| f.is_empty())
    }

    /// Creates the directory if needed and marks it as the agent's; a directory that holds anything
    /// else is refused with [`AgentError::ForeignFiles`] and left as it is.
    pub fn claim(&self) -> Result<()> {
        if self.is_owned() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.base).map_err(AgentError::io("create", &self.base))?;
        let foreign = foreign_entries(&self.base, is_adoptable_entry)?;
        if !foreign.is_empty() {
            return Err(AgentError::ForeignFiles { path: self.base.clone(), entries: foreign.join(", ") });
        }
        let marker = self.base.join(OWNER_MARKER);
        std::fs::write(&marker, b"created by the warmpath node agent\n").map_err(AgentError::io("write", &marker))
    }

    /// Takes the cache's exclusive advisory lock (`flock` on `<key>/.warmpath.lock`, via `fs4`), waiting
    /// for another holder: the node agent and a pod's cold-node fallback fetch may work on the same
    /// cache at once, and the second then finds the first's result (or resumes its progress). Released
    /// when the returned file is dropped.
    pub async fn lock(&self) -> Result<std::fs::File> {
        self.claim()?;
        let path = self.base.join(LOCK);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(AgentError::io("open", &path))?;
        tokio::task::spawn_blocking(move || fs4::fs_std::FileExt::lock_exclusive(&file).map(|_| file))
            .await
            .expect("lock task not cancelled")
            .map_err(AgentError::io("lock", path))
    }

    /// The version `current` points at, if it has a ready marker.
    pub fn current(&self) -> Option<ReadyMarker> {
        let target = std::fs::read_link(self.current_link()).ok()?;
        let marker = self.base.join(target).join(READY_MARKER);
        serde_json::from_slice(&std::fs::read(marker).ok()?).ok()
    }

    /// Moves a verified staging directory to `versions/<version>`, writes its marker, points `current` at
    /// it (symlink created beside, then renamed over `current`: atomic), then removes other versions and
    /// stale staging directories.
    pub fn commit(&self, marker: &ReadyMarker) -> Result<()> {
        let staging = self.staging_dir(&marker.version);
        let marker_path = staging.join(READY_MARKER);
        std::fs::write(&marker_path, serde_json::to_vec_pretty(marker).expect("marker serializes"))
            .map_err(AgentError::io("write", &marker_path))?;
        let final_dir = self.version_dir(&marker.version);
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(AgentError::io("remove", &final_dir))?;
        }
        let versions = self.base.join("versions");
        std::fs::create_dir_all(&versions).map_err(AgentError::io("create", &versions))?;
        std::fs::rename(&staging, &final_dir).map_err(AgentError::io("rename", &staging))?;
        let tmp_link = self.base.join(format!(".{CURRENT}.{}", marker.version));
        let _ = std::fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(Path::new("versions").join(&marker.version), &tmp_link)
            .map_err(AgentError::io("symlink", &tmp_link))?;
        std::fs::rename(&tmp_link, self.current_link()).map_err(AgentError::io("rename", &tmp_link))?;
        self.prune(&marker.version);
        Ok(())
    }

    /// Removes every staging directory except `keep` (stale downloads of versions no longer wanted, whose
    /// allocated space would otherwise stay taken).
    pub fn prune_staging(&self, keep: &str) {
        if let Ok(entries) = std::fs::read_dir(self.base.join("staging")) {
            for e in entries.flatten() {
                if e.file_name() != keep {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// Best-effort removal of every version and staging directory except `keep`.
    fn prune(&self, keep: &str) {
        for sub in ["versions", "staging"] {
            if let Ok(entries) = std::fs::read_dir(self.base.join(sub)) {
                for e in entries.flatten() {
                    if e.file_name() != keep {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
    }

    /// Removes the cache from the node (finalizer cleanup): only the entries of this layout, only in a
    /// directory the agent owns, then the directory itself if nothing else is left in it. Missing is fine;
    /// a directory the agent does not own is left untouched (returns `Ok(false)`).
    pub fn remove(&self) -> Result<bool> {
        if !self.base.exists() {
            return Ok(true);
        }
        if !self.is_owned() {
            tracing::warn!(path = %self.base.display(), "not created by the agent; left in place");
            return Ok(false);
        }
        let rd = std::fs::read_dir(&self.base).map_err(AgentError::io("list", &self.base))?;
        for e in rd.flatten() {
            if !is_layout_entry(&e) || e.file_name() == OWNER_MARKER {
                continue;
            }
            let p = e.path();
            let r = if p.is_dir() && !p.is_symlink() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(AgentError::io("remove", &p))?;
        }
        let marker = self.base.join(OWNER_MARKER);
        let _ = std::fs::remove_file(&marker);
        if let Err(e) = std::fs::remove_dir(&self.base) {
            // Something the agent did not create is inside: keep it (and the directory).
            tracing::warn!(path = %self.base.display(), error = %e, "cache removed; the directory keeps files the agent did not create");
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_switches_current_and_prunes_old_version() {
        let root = tempfile::tempdir().unwrap();
        let c = CacheDir::new(root.path(), "ns.m").unwrap();
        c.claim().unwrap();
        for (v, body) in [("v1", "one"), ("v2", "two")] {
            std::fs::create_dir_all(c.staging_dir(v)).unwrap();
            std::fs::write(c.staging_dir(v).join("w.bin"), body).unwrap();
            c.commit(&ReadyMarker { version: v.into(), bytes: 3, files: vec!["w.bin".into()], request: None }).unwrap();
            assert_eq!(c.current().unwrap().version, v);
            assert_eq!(std::fs::read_to_string(c.current_link().join("w.bin")).unwrap(), body);
        }
        assert!(!c.version_dir("v1").exists(), "old version pruned after the switch");
        c.remove().unwrap();
        assert!(!c.base().exists());
        c.remove().unwrap();
    }

    #[test]
    fn only_what_the_agent_created_is_removed() {
        let root = tempfile::tempdir().unwrap();
        // A directory named like a cache that someone else made: refused, never removed.
        let theirs = CacheDir::new(root.path(), "team.checkpoints").unwrap();
        std::fs::create_dir_all(theirs.base()).unwrap();
        std::fs::write(theirs.base().join("step-1000.pt"), "weights").unwrap();
        assert_eq!(theirs.claim().unwrap_err().reason(), "ForeignFiles");
        assert!(!theirs.remove().unwrap());
        assert!(theirs.base().join("step-1000.pt").exists());
        // A cache of ours with a foreign file dropped into it: the layout goes, the file stays.
        let ours = CacheDir::new(root.path(), "ns.m").unwrap();
        ours.claim().unwrap();
        std::fs::create_dir_all(ours.staging_dir("v1")).unwrap();
        std::fs::write(ours.staging_dir("v1").join("w.bin"), "x").unwrap();
        ours.commit(&ReadyMarker { version: "v1".into(), bytes: 1, files: vec!["w.bin".into()], request: None })
            .unwrap();
        std::fs::write(ours.base().join("notes.txt"), "mine").unwrap();
        assert!(ours.remove().unwrap());
        assert!(!ours.current_link().exists() && !ours.version_dir("v1").exists());
        assert!(ours.base().join("notes.txt").exists(), "a file the agent did not create survives");
    }

    #[test]
    fn a_folder_named_like_the_layout_is_not_adopted() {
        let root = tempfile::tempdir().unwrap();
        // A user's `current/` folder (not a symlink), a `versions/v1/` that no agent wrote, a file called
        // `staging`: each refused, the files kept, and nothing removed.
        for (key, path) in [("ns.a", "current/model.safetensors"), ("ns.b", "versions/v1/ckpt.pt"), ("ns.c", "staging")]
        {
            let theirs = CacheDir::new(root.path(), key).unwrap();
            let file = theirs.base().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, "weights").unwrap();
            assert_eq!(theirs.claim().unwrap_err().reason(), "ForeignFiles", "{path}");
            assert!(!theirs.is_owned() && !theirs.remove().unwrap(), "{path}");
            assert!(file.exists(), "{path}");
        }
        // What an older agent left (no marker): a symlink `current` into `versions/<fingerprint>/`, adopted.
        let older = CacheDir::new(root.path(), "ns.d").unwrap();
        let version = older.version_dir("0123456789abcdef");
        std::fs::create_dir_all(&version).unwrap();
        std::fs::write(version.join("w.bin"), "x").unwrap();
        std::os::unix::fs::symlink("versions/0123456789abcdef", older.current_link()).unwrap();
        std::fs::create_dir_all(older.staging_dir("fedcba9876543210")).unwrap();
        older.claim().unwrap();
        assert!(older.is_owned());
        claim_root(root.path(), true).unwrap();
    }

    #[test]
    fn root_with_foreign_files_is_refused_unless_allowed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("README.txt"), "hello").unwrap();
        let err = claim_root(root.path(), false).unwrap_err();
        assert_eq!(err.reason(), "ForeignFiles");
        assert!(err.to_string().contains("README.txt") && err.to_string().contains("--allow-foreign-files"), "{err}");
        claim_root(root.path(), true).unwrap();
        claim_root(root.path(), false).unwrap();
        assert!(root.path().join("README.txt").exists());
        // An empty root, or one holding only caches of this layout, is taken without asking.
        let fresh = tempfile::tempdir().unwrap();
        CacheDir::new(fresh.path(), "ns.m").unwrap().claim().unwrap();
        claim_root(fresh.path(), false).unwrap();
    }

    #[test]
    fn rejects_keys_that_are_paths() {
        assert!(CacheDir::new(Path::new("/r"), "../x").is_err());
        assert!(CacheDir::new(Path::new("/r"), "a/b").is_err());
    }
}
